// {{ spec.kernel_name }}
// Row-wise softmax, y = e^(x - max) / sum(e^(x - max)), in float32 math: {{ spec.in_dtype.numpy_name }} in,
// {{ spec.out_dtype.numpy_name }} out; variant "{{ spec.variant }}" (ge2jit/ops/softmax/spec.py says what each one is).
//
// Semantics (those of a float64 reference e = exp(x - max(x)); e / sum(e)): -inf entries give 0;
// a row holding +inf or NaN is NaN everywhere; a row of -inf only is NaN (0/0); n = 1 gives 1.
//
// Each element is read into a register before any element of its row is written (a whole row in
// the warp and block variants; the loop and strided variants write only after every thread of
// the row has finished its first pass), so y may be x itself (in place). x and y are not
// __restrict__: loads are batched explicitly instead.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}

using Tin = {{ spec.in_dtype.ctype }};
using Tout = {{ spec.out_dtype.ctype }};
constexpr int VARIANT = {{ spec.variant_code }};    // 0 warp, 1 block, 2 loop, 3 strided
constexpr int THREADS = {{ spec.threads }};
constexpr int VPT = {{ spec.vpt }};                 // values per thread (per row; per pass step)
constexpr int VEC = {{ spec.vec }};                 // elements per access
constexpr int LANES = {{ spec.lanes }};             // warp variant: lanes per row
constexpr int ROWS = {{ spec.rows }};               // warp variant: rows per lane group and step

static_assert(VPT % VEC == 0, "whole vectors per thread");
static_assert(VEC * sizeof(Tin) <= 16 && VEC * sizeof(Tout) <= 16, "at most 16-byte accesses");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

// Slots past the end of a row hold -inf: they add e^(-inf - max) = 0 to the sum (and are never
// stored). When the maximum itself is -inf (-inf and NaN only), the row is NaN whatever they add.
#define SOFTMAX_NEG_INF __int_as_float(0xff800000u)

// e^(v - m). The difference is taken first: v * log2(e) - m * log2(e) overflows for |v| near
// float32's maximum.
__device__ __forceinline__ float exp_diff(float v, float m) {
    return exp2f((v - m) * 1.4426950408889634f);
}

// Online (max, sum) pairs: (m, s) stands for s * e^m. m = -inf with s = 0 is the empty pair.
// scale(m, mm) = e^(m - mm) for m <= mm, exactly 1 when they are equal (also both -inf or both
// +inf, where the difference would be NaN).
__device__ __forceinline__ float pair_scale(float m, float mm) {
    return m == mm ? 1.0f : exp_diff(m, mm);
}
// Commutative to the bit (products rounded on their own, no fused multiply-add).
__device__ __forceinline__ void pair_combine(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    s = __fmul_rn(s, pair_scale(m, mm)) + __fmul_rn(s2, pair_scale(m2, mm));
    m = mm;
}
template <int W>
__device__ __forceinline__ void group_pair(float& m, float& s) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, o);
        const float s2 = __shfl_xor_sync(FULL_MASK, s, o);
        pair_combine(m, s, m2, s2);
    }
}

// Adds values v[0..N) to the thread's running pair (padding past the row's end is -inf, which
// adds 0). With m = -inf so far (only -inf or NaN seen), the values are taken relative to 0,
// so -inf adds 0 and NaN adds NaN. Each step's sum is added with compensation (Kahan; `comp`
// holds what the running sum lost): a thread of the loop or strided variant may add up
// millions of steps, where a plain float32 sum drifts by percents.
template <int N>
__device__ __forceinline__ void pair_add(float& m, float& s, float& comp, const float* v) {
    float cm = SOFTMAX_NEG_INF;
#pragma unroll
    for (int i = 0; i < N; ++i) cm = fmaxf(cm, v[i]);
    const float mm = fmaxf(m, cm);
    const float scale = pair_scale(m, mm);
    s *= scale;
    comp *= scale;
    m = mm;
    const float ref = m == SOFTMAX_NEG_INF ? 0.0f : m;
    float step = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) step += exp_diff(v[i], ref);
    const float add = step - comp;
    const float t = s + add;
    comp = (t - s) - add;
    s = t;
}

// ---- warp: LANES lanes per row (a whole warp, or a part of one for short rows), each holding
// VPT values of ROWS rows in registers; THREADS / LANES * ROWS rows per block and step. Lane g
// of a group holds the vectors at (j * LANES + g) * VEC, j < VPT / VEC.
__device__ __forceinline__ void softmax_warp(const Tin* x, Tout* y, long long rows, int n,
                                             long long sx, long long sy) {
    constexpr int SLOTS = VPT / VEC;
    constexpr int GROUPS = THREADS / LANES;
    constexpr int PER_BLOCK = GROUPS * ROWS;
    const int g = threadIdx.x % LANES;
    const int q = threadIdx.x / LANES;
    const long long steps = (rows + PER_BLOCK - 1) / PER_BLOCK;
    for (long long b = blockIdx.x; b < steps; b += gridDim.x) {
        float v[ROWS][VPT];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const long long row = b * PER_BLOCK + r * GROUPS + q;
            if (row < rows) {
                const Tin* p = x + row * sx;
#pragma unroll
                for (int j = 0; j < SLOTS; ++j)
                    load_slot<VEC>(p, (j * LANES + g) * VEC, n, &v[r][j * VEC], SOFTMAX_NEG_INF);
            } else {
#pragma unroll
                for (int i = 0; i < VPT; ++i) v[r][i] = SOFTMAX_NEG_INF;
            }
        }
        float m[ROWS], s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            m[r] = SOFTMAX_NEG_INF;
#pragma unroll
            for (int i = 0; i < VPT; ++i) m[r] = fmaxf(m[r], v[r][i]);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) m[r] = group_max<LANES>(m[r]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            s[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < VPT; ++i) {
                v[r][i] = exp_diff(v[r][i], m[r]);
                s[r] += v[r][i];
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = group_sum<LANES>(s[r]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const long long row = b * PER_BLOCK + r * GROUPS + q;
            if (row < rows) {
                const float inv = 1.0f / s[r];
#pragma unroll
                for (int i = 0; i < VPT; ++i) v[r][i] *= inv;
                Tout* p = y + row * sy;
#pragma unroll
                for (int j = 0; j < SLOTS; ++j)
                    store_slot<VEC>(p, (j * LANES + g) * VEC, n, &v[r][j * VEC]);
            }
        }
    }
}

// ---- block: one block per row, each thread holding VPT values (the vectors at
// (j * THREADS + t) * VEC); one read and one write of each element.
__device__ __forceinline__ void softmax_block(const Tin* x, Tout* y, long long rows, int n,
                                              long long sx, long long sy) {
    constexpr int SLOTS = VPT / VEC;
    __shared__ float red[2][32];
    const int t = threadIdx.x;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const Tin* p = x + row * sx;
        float v[VPT];
#pragma unroll
        for (int j = 0; j < SLOTS; ++j)
            load_slot<VEC>(p, (j * THREADS + t) * VEC, n, &v[j * VEC], SOFTMAX_NEG_INF);
        float m = SOFTMAX_NEG_INF;
#pragma unroll
        for (int i = 0; i < VPT; ++i) m = fmaxf(m, v[i]);
        m = block_reduce<THREADS, true>(m, red[0]);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            v[i] = exp_diff(v[i], m);
            s += v[i];
        }
        const float inv = 1.0f / block_reduce<THREADS, false>(s, red[1]);
#pragma unroll
        for (int i = 0; i < VPT; ++i) v[i] *= inv;
        Tout* q = y + row * sy;
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) store_slot<VEC>(q, (j * THREADS + t) * VEC, n, &v[j * VEC]);
    }
}

// ---- loop: one block per row of any length, in steps of THREADS * VPT elements: a first pass
// keeps each thread's online (max, sum) pair, the block combines them, and a second pass reads
// the row again and writes it. Reads the row twice.
__device__ __forceinline__ void softmax_loop(const Tin* x, Tout* y, long long rows, long long n,
                                             long long sx, long long sy) {
    constexpr int SLOTS = VPT / VEC;
    constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
    constexpr int WARPS = THREADS / 32;
    __shared__ float red_m[32], red_s[32];
    const int t = threadIdx.x;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const Tin* p = x + row * sx;
        float m = SOFTMAX_NEG_INF, s = 0.0f, comp = 0.0f;
        for (long long c = 0; c < n; c += STEP) {
            float v[VPT];
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                load_slot<VEC>(p, c + static_cast<long long>(j * THREADS + t) * VEC, n,
                               &v[j * VEC], SOFTMAX_NEG_INF);
            pair_add<VPT>(m, s, comp, v);
        }
        s -= comp;
        group_pair<32>(m, s);
        if ((t & 31) == 0) {
            red_m[t >> 5] = m;
            red_s[t >> 5] = s;
        }
        __syncthreads();
        m = red_m[t & (WARPS - 1)];
        s = red_s[t & (WARPS - 1)];
        group_pair<WARPS>(m, s);
        __syncthreads();   // every thread has read red_m/red_s (the next row overwrites them)
        // m is the row's maximum, s the sum of e^(x - m); a row of -inf (m = -inf) gives NaN
        // below, as 0/0 does.
        const float inv = 1.0f / s;
        Tout* q = y + row * sy;
        for (long long c = 0; c < n; c += STEP) {
            float v[VPT];
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                load_slot<VEC>(p, c + static_cast<long long>(j * THREADS + t) * VEC, n,
                               &v[j * VEC], SOFTMAX_NEG_INF);
#pragma unroll
            for (int i = 0; i < VPT; ++i) v[i] = exp_diff(v[i], m) * inv;
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                store_slot<VEC>(q, c + static_cast<long long>(j * THREADS + t) * VEC, n, &v[j * VEC]);
        }
    }
}

// ---- strided: one thread per (outer, inner) column of n elements, apart by a stride (softmax
// over an axis that is not a unit-stride last axis). An online pass, then a pass that reads
// again and writes; VPT elements per access step.
__device__ __forceinline__ void softmax_strided(const Tin* x, Tout* y, long long cols,
                                                long long n, long long inner,
                                                long long xo, long long xn, long long xi,
                                                long long yo, long long yn, long long yi) {
    for (long long c = blockIdx.x * static_cast<long long>(THREADS) + threadIdx.x; c < cols;
         c += static_cast<long long>(gridDim.x) * THREADS) {
        const long long o = c / inner, i = c - o * inner;
        const Tin* p = x + o * xo + i * xi;
        float m = SOFTMAX_NEG_INF, s = 0.0f, comp = 0.0f;
        for (long long k0 = 0; k0 < n; k0 += VPT) {
            float v[VPT];
#pragma unroll
            for (int u = 0; u < VPT; ++u)
                v[u] = k0 + u < n ? to_f32(p[(k0 + u) * xn]) : SOFTMAX_NEG_INF;
            pair_add<VPT>(m, s, comp, v);
        }
        const float inv = 1.0f / (s - comp);
        Tout* q = y + o * yo + i * yi;
        for (long long k0 = 0; k0 < n; k0 += VPT) {
            float v[VPT];
#pragma unroll
            for (int u = 0; u < VPT; ++u)
                v[u] = k0 + u < n ? to_f32(p[(k0 + u) * xn]) : SOFTMAX_NEG_INF;
#pragma unroll
            for (int u = 0; u < VPT; ++u)
                if (k0 + u < n) store(q + (k0 + u) * yn, exp_diff(v[u], m) * inv);
        }
    }
}

template <int V>
__device__ __forceinline__ void dispatch(const Tin* x, Tout* y, long long rows, long long n,
                                         long long inner, long long xo, long long xn,
                                         long long xi, long long yo, long long yn,
                                         long long yi) {
    if constexpr (V == 0) {
        softmax_warp(x, y, rows, static_cast<int>(n), xo, yo);
    } else if constexpr (V == 1) {
        softmax_block(x, y, rows, static_cast<int>(n), xo, yo);
    } else if constexpr (V == 2) {
        softmax_loop(x, y, rows, n, xo, yo);
    } else {
        softmax_strided(x, y, rows, n, inner, xo, xn, xi, yo, yn, yi);
    }
}

// rows: rows (warp, block, loop) or columns (strided: outer * inner); strides in elements:
// x's and y's between rows (outer), along a row (n; 1 except for strided) and between inner
// columns (strided). At least 1024 threads per multiprocessor (64 registers or fewer): several
// blocks resident, so that one's reductions and stores overlap another's loads.
extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    dispatch<VARIANT>(x, y, rows, n, inner, xo, xn, xi, yo, yn, yi);
}
