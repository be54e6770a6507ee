// TMA (the tensor memory accelerator, sm_90): 2-D tiles between global and shared memory
// described by a tensor map (the driver's CUtensorMap, made on the host with
// cuTensorMapEncodeTiled and passed as a __grid_constant__ kernel parameter). Loads complete
// on an mbarrier (mbarrier.cuh), in bytes; stores complete in bulk async-groups. PTX ISA:
// "Data Movement and Conversion Instructions: cp.async.bulk.tensor".

// The driver's CUtensorMap: 128 opaque bytes, passed by value.
struct __align__(64) TensorMap { unsigned long long opaque[16]; };

// A 2-D box of the tensor `map` at coordinates (inner, outer) into shared memory at `dst`;
// completion is counted on `bar` in bytes.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, int inner,
                                         int outer, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, { %2, %3 }], [%4];\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(inner), "r"(outer),
           "r"(bar) : "memory");
}

// A 3-D box of the tensor `map` at coordinates (c0 innermost, c1, c2), and a 4-D one at (c0,
// c1, c2, c3): the element strides of the outer dimensions are free (a head and a batch
// stride, say); completion counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TensorMap* map, int c0, int c1,
                                            int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, { %2, %3, %4 }], [%5];\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2),
           "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap* map, int c0, int c1,
                                            int c2, int c3, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, { %2, %3, %4, %5 }], [%6];\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2),
           "r"(c3), "r"(bar) : "memory");
}

// The same box into the shared memory of every CTA of the cluster that `mask` names (bit i:
// the CTA of rank i), at the same offset `dst` in each, each counting on its own barrier at
// offset `bar`: one read of global memory for the CTAs that share an operand tile.
__device__ __forceinline__ void tma_load_multicast(unsigned dst, const TensorMap* map,
                                                   int inner, int outer, unsigned bar,
                                                   unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, { %2, %3 }], [%4], %5;\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(inner), "r"(outer),
           "r"(bar), "h"(mask) : "memory");
}

// A 2-D box of shared memory at `src` (the map's box, as its swizzle lays it out) to the
// tensor `map` at (inner, outer); elements outside the tensor are skipped. Completion: bulk
// async-groups (bulk_commit, bulk_wait).
__device__ __forceinline__ void tma_store(const TensorMap* map, unsigned src, int inner,
                                          int outer) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, { %1, %2 }], [%3];\n"
        :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(inner), "r"(outer), "r"(src)
        : "memory");
}
// Closes this thread's bulk async-group of stores issued so far.
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
// Until at most N of this thread's bulk groups are incomplete.
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory");
}
// Adds `bytes` (a multiple of 16) of float32 at shared address `src` into global `dst` (both
// 16-byte aligned) by the copy engine, element by element (an atomic reduction in L2), in this
// thread's current bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
// Makes this thread's shared-memory writes visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
