// Warpgroup specialization on sm_90: named barriers between the warps of some warpgroups and
// the register reallocation (setmaxnreg) that moves registers from a producer warpgroup to
// the consumers. PTX ISA: "bar", "setmaxnreg".

// bar.sync on barrier `id` (1..15; 0 is __syncthreads) for `count` threads (whole warps).
__device__ __forceinline__ void named_barrier(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
// bar.arrive: counts this warp's threads toward barrier `id`'s `count` without waiting (the
// warps that bar.sync on it wait for them): one warpgroup lets another go.
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
// This warpgroup keeps at most N registers a thread (a producer that needs few).
template <int N>
__device__ __forceinline__ void warpgroup_registers_down() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
// This warpgroup takes N registers a thread (a consumer, from those the producer gave up).
template <int N>
__device__ __forceinline__ void warpgroup_registers_up() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
