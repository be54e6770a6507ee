// {{ spec.kernel_name }}
// {{ "LayerNorm" if spec.layer else "RMSNorm" }} of each row of n elements with float32 statistics; variant "{{ spec.config.variant }}"
// (ge2jit/ops/norm/spec.py says what each one is).
//
// h is x, or with a residual x + r rounded to h's type and stored (the pre-norm residual
// stream); the statistics are those of h as stored, so y is the normalization of the very h
// returned. RMSNorm: rstd = 1 / sqrt(mean(h^2) + eps), y = h * rstd * w. LayerNorm: the mean,
// var = mean((h - mean)^2), rstd = 1 / sqrt(var + eps), y = (h - mean) * rstd * w + b. The
// variance is accurate to float32's rounding whatever the mean: from the values in registers
// by the corrected two-pass formula (deviations d from the float32 mean m, var = mean(d^2) -
// mean(d)^2: the float32 m is off the true mean by up to an ulp of m, which mean(d^2) alone
// would add squared); in the loop variant by Chan's combination of per-step two-pass
// statistics of h - K, K a value of the row (its first, h[0]), so that the means combined are
// of the spread's size, not the mean's. y is rounded once to its type. A NaN in a row makes its
// statistics and outputs NaN; an infinity makes a LayerNorm row NaN and an RMSNorm row's rstd 0
// (y NaN where h is infinite, 0 elsewhere): what the float32 formulas give, as in PyTorch.
//
// Each element is read, and its outputs written, by one thread, every read before the writes,
// so an output may be an input itself (in place). The row arrays are not __restrict__.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}
{% set t = spec.types %}
using Tx = {{ t.x.ctype }};
using Tr = {{ t.residual.ctype if t.residual else "float" }};
using Th = {{ t.h.ctype if t.h else "float" }};
using Ty = {{ t.y.ctype }};
using Tw = {{ t.weight.ctype if t.weight else "float" }};
using Tb = {{ t.bias.ctype if t.bias else "float" }};
constexpr bool RESIDUAL = {{ "true" if t.residual else "false" }};
constexpr bool WEIGHT = {{ "true" if t.weight else "false" }};
constexpr bool BIAS = {{ "true" if t.bias else "false" }};
constexpr bool STATS = {{ "true" if t.stats else "false" }};
{% include "norm/shape.cuh" %}

struct Args {
    const Tx* x;
    const Tr* r;
    Th* h;
    Ty* y;
    const Tw* __restrict__ w;
    const Tb* __restrict__ b;
    float* __restrict__ mean;
    float* __restrict__ rstd;
    long long rows, n, sx, sr, sh, sy;
    float eps;
};

// The slot of h at e0 of one row (x, r, h point at the row): v = x + r rounded to Th, which is
// stored; without a residual v = x. 0 past the row's end (n).
template <typename I>
__device__ __forceinline__ void load_h(const Tx* x, const Tr* r, Th* h, I e0, I n, float* v) {
    load_slot<VEC>(x, e0, n, v, 0.0f);
    if constexpr (RESIDUAL) {
        float rv[VEC];
        load_slot<VEC>(r, e0, n, rv, 0.0f);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = rounded(h, v[k] + rv[k]);
        store_slot<VEC>(h, e0, n, v);
    }
}

// The weight's and bias' values of the slot at e0 (1 and 0 where absent).
template <typename I>
__device__ __forceinline__ void load_affine(const Args& p, I e0, I n, float* wv, float* bv) {
    if constexpr (WEIGHT) load_slot<VEC>(p.w, e0, n, wv, 0.0f);
    if constexpr (BIAS) load_slot<VEC>(p.b, e0, n, bv, 0.0f);
}

// v = (v - mean) * rstd * w + b over one slot (RMSNorm: v * rstd * w).
__device__ __forceinline__ void normalize(float* v, float mean, float rstd, const float* wv,
                                          const float* bv) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        float u = LAYER ? (v[k] - mean) * rstd : v[k] * rstd;
        if constexpr (WEIGHT) u *= wv[k];
        if constexpr (BIAS) u += bv[k];
        v[k] = u;
    }
}

__device__ __forceinline__ void write_stats(const Args& p, long long row, float mean,
                                            float rstd) {
    if constexpr (STATS) {
        p.rstd[row] = rstd;
        if constexpr (LAYER) p.mean[row] = mean;
    }
}

// The statistics of one row whose values a thread holds in v (the slots at (j * G + g) * VEC,
// 0 past the end), `sum` adding a value over the row's threads (called in program order):
// mean (0 for RMSNorm), rstd. LayerNorm: the corrected two-pass variance, mean(d^2) - mean(d)^2
// with d = h - mean: mean(d) is the float32 mean's error (its square is what mean(d^2) has too
// much; with a mean of 300 and a spread of 0.02, up to 3e-5 of the variance of a short row).
template <int G, typename Sum>
__device__ __forceinline__ void row_stats(const float* v, int g, int n, float eps, Sum sum,
                                          float& mean, float& rstd) {
    float var;
    if constexpr (LAYER) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) s += v[i];
        mean = sum(s) / n;
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int j = 0; j < SLOTS; ++j)
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float d = v[j * VEC + k] - mean;
                if ((j * G + g) * VEC + k < n) {
                    s1 += d;
                    s2 += d * d;
                }
            }
        const float a = sum(s1) / n;
        var = sum(s2) / n - a * a;
        if (var < 0.0f) var = 0.0f;     // rounding, when every d is the same (NaN stays NaN)
    } else {
        mean = 0.0f;
        float q = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) q += v[i] * v[i];
        var = sum(q) / n;
    }
    rstd = 1.0f / sqrtf(var + eps);
}

// ---- warp: LANES lanes per row, VPT values of ROWS rows each (the slots at
// (j * LANES + g) * VEC); THREADS / LANES * ROWS rows per block and step.
__device__ __forceinline__ void norm_warp(const Args& p) {
    constexpr int GROUPS = THREADS / LANES;
    constexpr int PER_BLOCK = GROUPS * ROWS;
    const int g = threadIdx.x % LANES;
    const int q = threadIdx.x / LANES;
    const int n = static_cast<int>(p.n);
    const long long steps = (p.rows + PER_BLOCK - 1) / PER_BLOCK;
    for (long long b = blockIdx.x; b < steps; b += gridDim.x) {
        float v[ROWS][VPT];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const long long row = b * PER_BLOCK + r * GROUPS + q;
            if (row < p.rows) {
#pragma unroll
                for (int j = 0; j < SLOTS; ++j)
                    load_h(p.x + row * p.sx, p.r + row * p.sr, p.h + row * p.sh,
                           (j * LANES + g) * VEC, n, &v[r][j * VEC]);
            } else {
#pragma unroll
                for (int i = 0; i < VPT; ++i) v[r][i] = 0.0f;
            }
        }
        float mean[ROWS], rstd[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            row_stats<LANES>(v[r], g, n, p.eps, [](float s) { return group_sum<LANES>(s); },
                             mean[r], rstd[r]);
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) {     // a slot's weight and bias serve every row
            const int e0 = (j * LANES + g) * VEC;
            float wv[VEC], bv[VEC];
            load_affine(p, e0, n, wv, bv);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const long long row = b * PER_BLOCK + r * GROUPS + q;
                if (row < p.rows) {
                    normalize(&v[r][j * VEC], mean[r], rstd[r], wv, bv);
                    store_slot<VEC>(p.y + row * p.sy, e0, n, &v[r][j * VEC]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const long long row = b * PER_BLOCK + r * GROUPS + q;
            if (row < p.rows && g == 0) write_stats(p, row, mean[r], rstd[r]);
        }
    }
}

// ---- block: one block per row, each thread holding VPT values (the slots at
// (j * THREADS + t) * VEC). Consecutive block reductions take turns with two buffers.
__device__ __forceinline__ void norm_block(const Args& p) {
    __shared__ float red[2][32];
    int turn = 0;
    const int t = threadIdx.x;
    const int n = static_cast<int>(p.n);
    for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {
        float v[VPT];
#pragma unroll
        for (int j = 0; j < SLOTS; ++j)
            load_h(p.x + row * p.sx, p.r + row * p.sr, p.h + row * p.sh, (j * THREADS + t) * VEC,
                   n, &v[j * VEC]);
        float mean, rstd;
        row_stats<THREADS>(v, t, n, p.eps, [&](float s) {
            return block_reduce<THREADS, false>(s, red[turn++ & 1]);
        }, mean, rstd);
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) {
            const int e0 = (j * THREADS + t) * VEC;
            float wv[VEC], bv[VEC];
            load_affine(p, e0, n, wv, bv);
            normalize(&v[j * VEC], mean, rstd, wv, bv);
            store_slot<VEC>(p.y + row * p.sy, e0, n, &v[j * VEC]);
        }
        if (t == 0) write_stats(p, row, mean, rstd);
    }
}

// ---- loop: one block per row of any length, in steps of THREADS * VPT elements.

// Chan's combination of (count, mean, sum of squared deviations) pairs, commutative to the bit
// (every product and sum rounded on its own, no fused multiply-add), so that a butterfly leaves
// the same bits in every lane.
__device__ __forceinline__ void chan_combine(float& c, float& m, float& q, float c2, float m2,
                                             float q2) {
    const float cc = __fadd_rn(c, c2);
    if (cc == 0.0f) return;
    const float d = __fsub_rn(m2, m);
    const float mm = __fdiv_rn(__fadd_rn(__fmul_rn(c, m), __fmul_rn(c2, m2)), cc);
    q = __fadd_rn(__fadd_rn(q, q2), __fmul_rn(__fmul_rn(d, d), __fdiv_rn(__fmul_rn(c, c2), cc)));
    c = cc;
    m = mm;
}

template <int W>
__device__ __forceinline__ void group_chan(float& c, float& m, float& q) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) {
        const float c2 = __shfl_xor_sync(FULL_MASK, c, o);
        const float m2 = __shfl_xor_sync(FULL_MASK, m, o);
        const float q2 = __shfl_xor_sync(FULL_MASK, q, o);
        chan_combine(c, m, q, c2, m2, q2);
    }
}

// The second pass: y from the row as stored (h with a residual, else x) and the statistics.
template <typename T>
__device__ __forceinline__ void loop_write(const Args& p, const T* src, Ty* y, float mean,
                                           float rstd) {
    constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
    for (long long c = 0; c < p.n; c += STEP) {
        float v[VPT];
#pragma unroll
        for (int j = 0; j < SLOTS; ++j)
            load_slot<VEC>(src, c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC, p.n,
                           &v[j * VEC], 0.0f);
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) {
            const long long e0 = c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC;
            float wv[VEC], bv[VEC];
            load_affine(p, e0, p.n, wv, bv);
            normalize(&v[j * VEC], mean, rstd, wv, bv);
            store_slot<VEC>(y, e0, p.n, &v[j * VEC]);
        }
    }
}

__device__ __forceinline__ void norm_loop(const Args& p) {
    constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
    __shared__ float red[2][3][32];
    int turn = 0;
    const int t = threadIdx.x;
    for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {
        const Tx* x = p.x + row * p.sx;
        Th* h = p.h + row * p.sh;
        // LayerNorm: (count, mean, squared deviations) of the thread's values of h - K, K the
        // row's first value as stored (0 if not finite: an infinity or NaN still reaches the
        // sums), the same in every thread. Chan's combination is exact only for exact means: in
        // float32 a mean is off by up to an ulp of itself, which relative to the spread of the
        // means combined (about the row's standard deviation) is large where the mean is (a
        // mean of 300, a spread of 0.02: 1e-5 to 2e-4 of the variance); the means of h - K are
        // of the spread's size. RMSNorm: the sum of squares in q, with compensation (Kahan;
        // comp holds what q lost): a thread may add up millions of values.
        float K = 0.0f;
        if constexpr (LAYER) {
            float h0 = to_f32(x[0]);
            if constexpr (RESIDUAL) {
                h0 = rounded(h, h0 + to_f32(p.r[row * p.sr]));
                // every thread reads x[0] and r[0] before h[0] is stored (h may be x or r)
                __syncthreads();
            }
            K = isfinite(h0) ? h0 : 0.0f;
        }
        float c = 0.0f, m = 0.0f, q = 0.0f, comp = 0.0f;
        for (long long c0 = 0; c0 < p.n; c0 += STEP) {
            float v[VPT];
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                load_h(x, p.r + row * p.sr, h, c0 + static_cast<long long>(j * THREADS + t) * VEC,
                       p.n, &v[j * VEC]);
            if constexpr (LAYER) {
#pragma unroll
                for (int i = 0; i < VPT; ++i) v[i] -= K;
                const long long first = c0 + static_cast<long long>(t) * VEC;
                float cs = 0.0f, s = 0.0f;
#pragma unroll
                for (int j = 0; j < SLOTS; ++j)
#pragma unroll
                    for (int k = 0; k < VEC; ++k)
                        if (first + j * THREADS * VEC + k < p.n) {
                            cs += 1.0f;
                            s += v[j * VEC + k];
                        }
                const float ms = cs > 0.0f ? s / cs : 0.0f;
                float qs = 0.0f;
#pragma unroll
                for (int j = 0; j < SLOTS; ++j)
#pragma unroll
                    for (int k = 0; k < VEC; ++k) {
                        const float d = v[j * VEC + k] - ms;
                        if (first + j * THREADS * VEC + k < p.n) qs += d * d;
                    }
                chan_combine(c, m, q, cs, ms, qs);
            } else {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < VPT; ++i) s += v[i] * v[i];
                const float add = s - comp;
                const float sum = q + add;
                // Once the sum is infinite (an infinite value, or beyond float32's range) or NaN
                // it stays so; its compensation, (inf - q) - inf, would be NaN, and q - comp NaN
                // where the mean square is infinite (rstd 0).
                comp = isfinite(sum) ? (sum - q) - add : 0.0f;
                q = sum;
            }
        }
        float* buf = &red[turn++ & 1][0][0];
        float mean = 0.0f, var;
        if constexpr (LAYER) {
            group_chan<32>(c, m, q);
            if ((t & 31) == 0) {
                buf[t >> 5] = c;
                buf[32 + (t >> 5)] = m;
                buf[64 + (t >> 5)] = q;
            }
            __syncthreads();
            c = buf[t & (WARPS - 1)];
            m = buf[32 + (t & (WARPS - 1))];
            q = buf[64 + (t & (WARPS - 1))];
            group_chan<WARPS>(c, m, q);
            mean = K + m;
            var = q / p.n;
        } else {
            var = block_reduce<THREADS, false>(q - comp, buf) / p.n;
        }
        const float rstd = 1.0f / sqrtf(var + p.eps);
        if constexpr (RESIDUAL) {
            loop_write(p, static_cast<const Th*>(h), p.y + row * p.sy, mean, rstd);
        } else {
            loop_write(p, x, p.y + row * p.sy, mean, rstd);
        }
        if (t == 0) write_stats(p, row, mean, rstd);
    }
}

// At least 1024 threads per multiprocessor (64 registers or fewer): several blocks resident,
// so that one's reductions and stores overlap another's loads.
extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    const Args p{x, r, h, y, w, b, mean, rstd, rows, n, sx, sr, sh, sy, static_cast<float>(eps)};
    if constexpr (VARIANT == 0) {
        norm_warp(p);
    } else if constexpr (VARIANT == 1) {
        norm_block(p);
    } else {
        norm_loop(p);
    }
}
