// Storage types of 16-bit (and, on sm_89+, 8-bit) floats, as raw bits (no CUDA headers
// needed), and the conversions the kernels use: every value is read into float32, and rounded
// to nearest-even when stored.
struct __align__(2) f16_t { unsigned short x; };    // IEEE binary16
struct __align__(2) bf16_t { unsigned short x; };   // bfloat16

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(f16_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}
__device__ __forceinline__ float to_f32(bf16_t v) {
    return __uint_as_float(static_cast<unsigned>(v.x) << 16);
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float v) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#else
    const unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u)                 // NaN stays a (quiet) NaN
        return static_cast<unsigned short>((u >> 16) | 0x40u);
    return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// rounded(p, v): v rounded to p's type and read back (what storing v at p keeps).
__device__ __forceinline__ float rounded(const float*, float v) { return v; }
__device__ __forceinline__ float rounded(const f16_t*, float v) {
    const f16_t t{f32_to_f16_bits(v)};
    return to_f32(t);
}
__device__ __forceinline__ float rounded(const bf16_t*, float v) {
    const bf16_t t{f32_to_bf16_bits(v)};
    return to_f32(t);
}

// store(p, v): *p = v rounded to p's type; store_vec(p, v): p[0..N) in one access (p must be
// aligned to N elements).
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(f16_t* p, float v) { p->x = f32_to_f16_bits(v); }
__device__ __forceinline__ void store(bf16_t* p, float v) { p->x = f32_to_bf16_bits(v); }
__device__ __forceinline__ void store_vec(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_vec(float* p, const float (&v)[2]) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
}
__device__ __forceinline__ void store_vec(f16_t* p, const float (&v)[2]) {
    *reinterpret_cast<unsigned*>(p) =
        f32_to_f16_bits(v[0]) | (static_cast<unsigned>(f32_to_f16_bits(v[1])) << 16);
}
__device__ __forceinline__ unsigned pack2(f16_t*, float a, float b) {
    return f32_to_f16_bits(a) | (static_cast<unsigned>(f32_to_f16_bits(b)) << 16);
}
__device__ __forceinline__ unsigned pack2(bf16_t*, float a, float b) {
    return f32_to_bf16_bits(a) | (static_cast<unsigned>(f32_to_bf16_bits(b)) << 16);
}
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[4]) {   // 4 16-bit values
    *reinterpret_cast<uint2*>(p) = make_uint2(pack2(p, v[0], v[1]), pack2(p, v[2], v[3]));
}
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[8]) {   // 8 16-bit values
    *reinterpret_cast<uint4*>(p) = make_uint4(pack2(p, v[0], v[1]), pack2(p, v[2], v[3]),
                                              pack2(p, v[4], v[5]), pack2(p, v[6], v[7]));
}
__device__ __forceinline__ void store_vec(bf16_t* p, const float (&v)[2]) {
    *reinterpret_cast<unsigned*>(p) =
        f32_to_bf16_bits(v[0]) | (static_cast<unsigned>(f32_to_bf16_bits(v[1])) << 16);
}

#if __CUDA_ARCH__ >= 890
// 8-bit floats (sm_89+): e4m3 (no infinities, largest 448) and e5m2 (largest 57344), read by
// the matrix units themselves, and stored (one, or a pair) rounded to nearest-even with
// saturation: a value past the largest finite one (an infinity too) is stored as that one, NaN
// stays NaN.
struct __align__(1) e4m3_t { unsigned char x; };
struct __align__(1) e5m2_t { unsigned char x; };

// Two values as the low (a) and high (b) bytes of 16 bits.
__device__ __forceinline__ unsigned short pack_fp8x2(const e4m3_t*, float a, float b) {
    unsigned short h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(b), "f"(a));
    return h;
}
__device__ __forceinline__ unsigned short pack_fp8x2(const e5m2_t*, float a, float b) {
    unsigned short h;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(h) : "f"(b), "f"(a));
    return h;
}
__device__ __forceinline__ void store(e4m3_t* p, float v) {
    p->x = static_cast<unsigned char>(pack_fp8x2(p, v, 0.0f));
}
__device__ __forceinline__ void store(e5m2_t* p, float v) {
    p->x = static_cast<unsigned char>(pack_fp8x2(p, v, 0.0f));
}
__device__ __forceinline__ void store_vec(e4m3_t* p, const float (&v)[2]) {
    *reinterpret_cast<unsigned short*>(p) = pack_fp8x2(p, v[0], v[1]);
}
__device__ __forceinline__ void store_vec(e5m2_t* p, const float (&v)[2]) {
    *reinterpret_cast<unsigned short*>(p) = pack_fp8x2(p, v[0], v[1]);
}
// 4 or 8 values in one access of 4 or 8 bytes.
template <typename T>
__device__ __forceinline__ unsigned pack_fp8x4(T* p, const float* v) {
    return pack_fp8x2(p, v[0], v[1]) | (static_cast<unsigned>(pack_fp8x2(p, v[2], v[3])) << 16);
}
__device__ __forceinline__ void store_vec(e4m3_t* p, const float (&v)[4]) {
    *reinterpret_cast<unsigned*>(p) = pack_fp8x4(p, v);
}
__device__ __forceinline__ void store_vec(e5m2_t* p, const float (&v)[4]) {
    *reinterpret_cast<unsigned*>(p) = pack_fp8x4(p, v);
}
__device__ __forceinline__ void store_vec(e4m3_t* p, const float (&v)[8]) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_fp8x4(p, v), pack_fp8x4(p, v + 4));
}
__device__ __forceinline__ void store_vec(e5m2_t* p, const float (&v)[8]) {
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_fp8x4(p, v), pack_fp8x4(p, v + 4));
}
#endif

// A hint: the 128-byte line holding *p into L2 (no register waits on it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}

// load_vec(p, v): p[0..N) as float32, in 16-byte accesses (p 16-byte aligned, N elements a
// whole number of 16-byte segments), or one 8-byte access for 8 bytes (p 8-byte aligned).
template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[N]) {
    constexpr int PER = 16 / sizeof(T);
    if constexpr (N * sizeof(T) == 8) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = to_f32(e[i]);
        return;
    }
    static_assert(N % PER == 0 || N * sizeof(T) == 8, "whole 16-byte segments");
#pragma unroll
    for (int q = 0; q < N / PER; ++q) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p + q * PER);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < PER; ++i) v[q * PER + i] = to_f32(e[i]);
    }
}

// ceil(a / b) for 0 <= a < 2^31: (a + b - 1) / b wraps for a near 2^31 (K = 2^31 - 1, say).
__device__ __forceinline__ int ceil_div(int a, int b) { return a / b + (a % b != 0); }

// The 32-bit shared-memory address of a generic pointer into shared memory (what the
// .shared state space's instructions take).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
