// mma.sync m16n8k16 with 16-bit inputs (f16 or bf16), m16n8k8 with tf32 inputs, float32
// accumulators (sm_80+), and the packing of two float32 values into one 16-bit pair register
// (an A or B operand register). Needs f16_t / bf16_t from common/types.cuh. PTX ISA:
// "mma.sync.aligned.m16n8k16", "mma.sync.aligned.m16n8k8", "cvt" (f16x2/bf16x2 packing).
//
// Fragment layouts (g = lane / 4, t = lane % 4; a register of an A/B operand holds two
// 16-bit elements, the lower-indexed one in its low half):
//   A (16 x 16, row-major, rows m, columns k):  a[0] = (m g,     k 2t, 2t+1)
//                                              a[1] = (m g + 8, k 2t, 2t+1)
//                                              a[2] = (m g,     k 2t+8, 2t+9)
//                                              a[3] = (m g + 8, k 2t+8, 2t+9)
//   B (16 x 8, "col": k runs within a register): b[0] = (k 2t, 2t+1,   n g)
//                                              b[1] = (k 2t+8, 2t+9, n g)
//   C/D (16 x 8 float32):                      d[0], d[1] = (m g,     n 2t, 2t+1)
//                                              d[2], d[3] = (m g + 8, n 2t, 2t+1)
// ldmatrix (common/sm80/ldmatrix.cuh) of an 8 x 8 block of 16-bit rows gives lane (g, t) the
// elements (row g, columns 2t, 2t+1): a row-major A block, or a B block whose rows are n (K
// stored n-major); ldmatrix .trans gives (rows 2t, 2t+1, column g): a B block whose rows are k.

// d += a * b for 16-bit inputs of type T (f16_t or bf16_t).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<f16_t>(float (&d)[4], const unsigned (&a)[4],
                                                    const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<bf16_t>(float (&d)[4], const unsigned (&a)[4],
                                                     const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a * b for tf32 inputs (m16n8k8): each operand register holds one float32's bits, of
// which the tensor cores read the top 19 (sign, exponent, 10 mantissa bits). Fragments as
// above with k halved: a[0] = (m g, k t), a[1] = (m g + 8, k t), a[2] = (m g, k t + 4),
// a[3] = (m g + 8, k t + 4); b[0] = (k t, n g), b[1] = (k t + 4, n g).
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4],
                                                 const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// (lo, hi) rounded to nearest-even into one register: lo in bits 0-15 (the lower column of an
// operand register), hi in bits 16-31. cvt's first source goes to the upper half.
template <typename T>
__device__ __forceinline__ unsigned pack_f32x2(float lo, float hi);

template <>
__device__ __forceinline__ unsigned pack_f32x2<f16_t>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <>
__device__ __forceinline__ unsigned pack_f32x2<bf16_t>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
