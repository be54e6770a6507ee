// mbarrier: shared-memory barriers that count thread arrivals and the bytes of asynchronous
// copies (TMA), on Hopper (sm_90). `bar` is the barrier's address in the shared window
// (a 32-bit address: `smem_u32`). PTX ISA: "Parallel Synchronization and Communication
// Instructions: mbarrier".

// Initializes the barrier for `count` arrivals a phase.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count));
}
// Makes barrier initializations visible to the other threads and to the async proxy (TMA)
// before any of them uses the barriers.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives, and adds `bytes` to the transaction count the phase waits for (the copies that
// complete on this barrier).
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}
