// {{ spec.kernel_name }}
// Rotary position embedding of q (B, S, Hq, D) and k (B, S, Hk, D), both in one launch, in float32
// math: pair j < half of a head, (x1, x2) = (x[j], x[j + half]) (GPT-NeoX) or (x[2j], x[2j + 1])
// (GPT-J), becomes (x1 c - x2 s, x2 c + x1 s) with c = cos[row, j], s = sin[row, j] (s = -sin[row, j]
// in the backward) and row = positions[b, s] (s without positions). Elements 2 * half to D of a
// head are copied to the output when COPY_REST, else left alone. A row outside [0, table_rows)
// reads no table: the token's rotated elements are NaN.
//
// Block (chunk lanes, head lanes, token lanes) (ge2jit/ops/rope/spec.py: launch_geometry): a
// thread takes chunk c = threadIdx.x of VEC pairs (two accesses of VEC elements) in heads
// threadIdx.y, + blockDim.y, ... (q's, then k's) of token blockIdx.x * blockDim.z + threadIdx.z,
// then grid-stride; it reads the chunk's VEC cosines and sines once per token. Any block shape is
// correct. Each element is read, then written, by one thread, and by no other: the outputs may be
// the inputs (in place). No pointer that may alias is __restrict__: loads are batched explicitly.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}

using T = {{ spec.dtype.ctype }};                 // q, k, q_out, k_out
using TT = {{ spec.table_dtype.ctype }};          // cos, sin
using P = {{ spec.position_ctype }};              // positions
constexpr bool HAS_POSITIONS = {{ "true" if spec.positions else "false" }};
constexpr bool INTERLEAVED = {{ "true" if spec.interleaved else "false" }};   // GPT-J pairs
constexpr bool BACKWARD = {{ "true" if spec.backward else "false" }};         // the opposite angle
constexpr bool COPY_REST = {{ "true" if spec.copy_rest else "false" }};       // copy [2 half, D)
constexpr int VEC = {{ spec.vec }};                 // pairs per chunk, elements per access
constexpr int THREADS = {{ spec.threads }};         // the most threads per block

static_assert(VEC * sizeof(T) <= 16, "at most 16-byte accesses");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

// Heads whose chunks a thread loads before it writes any: with 16-byte accesses one (two accesses,
// 32 bytes in flight, and the next head's lines prefetched into L2, which takes no registers; two
// heads' values would spill at 64 registers), else two.
constexpr int HEADS_AT_ONCE = VEC * sizeof(T) >= 16 ? 1 : 2;

// The chunk's 2 VEC elements (first access [0, VEC), second [VEC, 2 VEC)) hold pair i at lo(i)
// and hi(i).
__device__ __forceinline__ constexpr int lo(int i) { return INTERLEAVED ? 2 * i : i; }
__device__ __forceinline__ constexpr int hi(int i) { return INTERLEAVED ? 2 * i + 1 : VEC + i; }

// Where chunk c's two accesses start in a head: NeoX x1 at c VEC and x2 half further; GPT-J the
// 2 VEC elements from 2 c VEC.
__device__ __forceinline__ int first_at(int c, int half) {
    return INTERLEAVED ? 2 * c * VEC : c * VEC;
}
__device__ __forceinline__ int second_at(int c, int half) {
    return INTERLEAVED ? 2 * c * VEC + VEC : c * VEC + half;
}

// Every bit set: a NaN of each float type.
template <typename R> __device__ __forceinline__ R all_ones() { return static_cast<R>(~0u); }
template <> __device__ __forceinline__ uint2 all_ones<uint2>() { return make_uint2(~0u, ~0u); }
template <> __device__ __forceinline__ uint4 all_ones<uint4>() {
    return make_uint4(~0u, ~0u, ~0u, ~0u);
}

// N elements of U as raw bits, read in accesses of at most 16 bytes (the pointer aligned to N
// elements, or to 16 bytes where N elements are more) and converted to float32 only where used:
// 16-bit values take half the registers until then.
template <typename U, int N>
struct Raw {
    static constexpr int PER = N * sizeof(U) <= 16 ? N : 16 / sizeof(U);
    using R = typename RawOf<PER * sizeof(U)>::type;
    R r[N / PER];

    __device__ __forceinline__ void load(const U* p) {
#pragma unroll
        for (int q = 0; q < N / PER; ++q) r[q] = *reinterpret_cast<const R*>(p + q * PER);
    }
    __device__ __forceinline__ void fill_nan() {
#pragma unroll
        for (int q = 0; q < N / PER; ++q) r[q] = all_ones<R>();
    }
    __device__ __forceinline__ float operator[](int i) const {
        return to_f32(reinterpret_cast<const U*>(&r[i / PER])[i % PER]);
    }
};

// p[0, V) = v[0, V) rounded to T, in one access (p aligned to V elements).
template <int V>
__device__ __forceinline__ void store_full(T* p, const float* v) {
    if constexpr (V == 1) {
        store(p, v[0]);
    } else {
        float w[V];
#pragma unroll
        for (int i = 0; i < V; ++i) w[i] = v[i];
        store_vec(p, w);
    }
}

// The heads of token (b, s): q's first, then k's. Each head's address is computed from the
// parameters when it is used (which come from the constant bank), not kept per token: four 64-bit
// token offsets held through the loops would cost eight registers.
struct Token {
    const T* q;
    const T* k;
    T* qo;
    T* ko;
    long long b, s, qb, qs, qh, kb, ks, kh, qob, qos, qoh, kob, kos, koh;
    int hq;

    __device__ __forceinline__ const T* in(int h) const {
        return h < hq ? q + (b * qb + s * qs + h * qh) : k + (b * kb + s * ks + (h - hq) * kh);
    }
    __device__ __forceinline__ T* out(int h) const {
        return h < hq ? qo + (b * qob + s * qos + h * qoh)
                      : ko + (b * kob + s * kos + (h - hq) * koh);
    }
};

// Chunk c of heads h0, h0 + hstep, ... < heads, HEADS_AT_ONCE at a time, rotated by (cs, sn)
// (NaN for a row the table lacks); the chunk's two accesses start at `first` and `second`.
__device__ __forceinline__ void rotate_heads(const Token& t, int heads, int h0, int hstep,
                                             int first, int second, const Raw<TT, VEC>& cs,
                                             const Raw<TT, VEC>& sn) {
    for (int h = h0; h < heads; h += HEADS_AT_ONCE * hstep) {
        if constexpr (HEADS_AT_ONCE == 1) {
            // the next head's lines on their way into L2 while this one is read and written
            if (h + hstep < heads) {
                const T* p = t.in(h + hstep);
                prefetch_l2(p + first);
                prefetch_l2(p + second);
            }
        }
        Raw<T, VEC> e[HEADS_AT_ONCE][2];
#pragma unroll
        for (int u = 0; u < HEADS_AT_ONCE; ++u) {
            if (h + u * hstep < heads) {
                const T* p = t.in(h + u * hstep);
                e[u][0].load(p + first);
                e[u][1].load(p + second);
            }
        }
#pragma unroll
        for (int u = 0; u < HEADS_AT_ONCE; ++u) {
            if (h + u * hstep < heads) {
                float y[2 * VEC];
#pragma unroll
                for (int i = 0; i < VEC; ++i) {
                    const float x1 = e[u][lo(i) / VEC][lo(i) % VEC];
                    const float x2 = e[u][hi(i) / VEC][hi(i) % VEC];
                    const float c = cs[i], s = BACKWARD ? -sn[i] : sn[i];
                    y[lo(i)] = x1 * c - x2 * s;
                    y[hi(i)] = x2 * c + x1 * s;
                }
                T* p = t.out(h + u * hstep);
                store_full<VEC>(p + first, y);
                store_full<VEC>(p + second, y + VEC);
            }
        }
    }
}

// Elements [2 half, head_dim) of every head copied bit for bit, in accesses of VEC elements, by
// the token's `lanes` threads (this one is `lane`), two accesses loaded before either is stored.
__device__ __forceinline__ void copy_rest(const Token& t, int heads, long long head_dim,
                                          long long half, int lane, int lanes) {
    using R = typename RawOf<VEC * sizeof(T)>::type;
    const int per = static_cast<int>((head_dim - 2 * half) / VEC);     // accesses per head
    if (per <= 0) return;
    const int items = heads * per;
#pragma unroll 1
    for (int w = lane; w < items; w += 2 * lanes) {
        const int h0 = w / per, w1 = w + lanes;
        const long long e0 = 2 * half + static_cast<long long>(w - h0 * per) * VEC;
        const int h1 = w1 / per;
        const long long e1 = 2 * half + static_cast<long long>(w1 - h1 * per) * VEC;
        const R v0 = *reinterpret_cast<const R*>(t.in(h0) + e0);
        R v1;
        if (w1 < items) v1 = *reinterpret_cast<const R*>(t.in(h1) + e1);
        *reinterpret_cast<R*>(t.out(h0) + e0) = v0;
        if (w1 < items) *reinterpret_cast<R*>(t.out(h1) + e1) = v1;
    }
}

// tokens = B * S; strides in elements (see RopeSpec.params). At least 1024 threads per
// multiprocessor (64 registers or fewer).
extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    const int heads = static_cast<int>(hq + hk);
    const int chunks = static_cast<int>(half / VEC);
    const int lane = threadIdx.y * blockDim.x + threadIdx.x;      // among the token's threads
    const long long step = static_cast<long long>(gridDim.x) * blockDim.z;
    for (long long tok = static_cast<long long>(blockIdx.x) * blockDim.z + threadIdx.z;
         tok < tokens; tok += step) {
        const long long b = tok / seq, s = tok - b * seq;
        long long row = s;
        if constexpr (HAS_POSITIONS) row = static_cast<long long>(positions[b * pb + s * ps]);
        const bool valid = row >= 0 && row < table_rows;
        const Token t{q, k, q_out, k_out, b, s, qb, qs, qh, kb, ks, kh, qob, qos, qoh,
                      kob, kos, koh, static_cast<int>(hq)};
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            Raw<TT, VEC> cs, sn;
            if (valid) {
                cs.load(cos + (b * cb + row * cr + c * VEC));
                sn.load(sin + (b * sb + row * sr + c * VEC));
            } else {
                cs.fill_nan();
                sn.fill_nan();
            }
            rotate_heads(t, heads, threadIdx.y, blockDim.y, first_at(c, static_cast<int>(half)),
                         second_at(c, static_cast<int>(half)), cs, sn);
        }
        if constexpr (COPY_REST) copy_rest(t, heads, head_dim, half, lane,
                                           blockDim.x * blockDim.y);
    }
}
