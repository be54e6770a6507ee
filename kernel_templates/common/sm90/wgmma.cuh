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
