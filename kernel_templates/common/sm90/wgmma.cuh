// wgmma (warpgroup matrix multiply-accumulate, sm_90a): operand descriptors and the fences
// around asynchronous wgmma groups. The multiply itself is in the kernel, whose register list
// depends on its tile. PTX ISA: "Warpgroup Level Matrix Multiply-Accumulate Instructions".

// A shared-memory matrix descriptor: start address, leading and stride byte offsets (all
// >> 4), 128-byte swizzle. The tiles start on 1024-byte boundaries (base offset 0).
__device__ __forceinline__ unsigned long long descriptor(unsigned addr, unsigned lbo,
                                                         unsigned sbo) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4)
         | (static_cast<unsigned long long>(lbo >> 4) << 16)
         | (static_cast<unsigned long long>(sbo >> 4) << 32)
         | (1ull << 62);
}

// The descriptor `bytes` (a multiple of 16) further on: start addresses below 256 KiB, so the
// field does not carry. One add per wgmma where a descriptor made anew takes about six.
__device__ __forceinline__ unsigned long long descriptor_plus(unsigned long long desc,
                                                              unsigned bytes) {
    return (desc & 0xFFFFFFFF00000000ull) |
           (static_cast<unsigned>(desc) + (bytes >> 4));   // (the low word: no carry)
}

// Orders this warpgroup's register and shared-memory accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Until at most N groups of this warpgroup's wgmma are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Pins registers that an asynchronous wgmma reads or writes at this point of the program
// (CUTLASS's warpgroup_fence_operand): the compiler neither moves their other uses across it
// nor reuses them before it. Placed after the wait that retires the wgmma, it keeps an A
// fragment or accumulator live while the wgmma runs, which ptxas otherwise answers by
// serializing the kernel's wgmma (C7513).
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N, int M>
__device__ __forceinline__ void fence_operands(unsigned (&r)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Keeps a wgmma.wait_group after the work that should overlap the pending wgmma: ptxas moves a
// wait up freely (to schedule what follows it early, e.g. packing the next A fragments), but
// keeps it in order with shared-memory accesses. A store of `v` (a value that needs all of that
// work) to a 4-byte slot at `addr` that nothing reads, just before the wait, anchors it there;
// one lane of a warp storing is enough (a warp issues its instructions in one stream).
__device__ __forceinline__ void anchor_wait(unsigned addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(addr), "f"(v) : "memory");
}
