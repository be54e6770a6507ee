// {{ spec.kernel_name }}
// The backward of {{ "LayerNorm" if spec.layer else "RMSNorm" }} over rows of n elements; variant "{{ spec.config.variant }}" (ge2jit/ops/norm/spec.py).
//
// With x-hat = (h - mean) * rstd (RMSNorm: h * rstd) and g = dy * w (dy without a weight), per
// row: dx = rstd * (g - c2 - x-hat * c1) + dh, where c1 = mean(g * x-hat) and c2 = mean(g)
// (RMSNorm: c2 = 0), in float32 and rounded once to dx's type. The block's partial sums of
// dweight (dy * x-hat) and dbias (dy) over the rows it takes are written to its row of pw and
// pb (float32, n per block); norm/sums.cu adds those rows up in a fixed order. A block walks
// the same rows in the same order every time: the same inputs give the same bits.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}
{% set t = spec.types %}
using Tdy = {{ t.dy.ctype }};
using Th = {{ t.h.ctype }};
using Tdx = {{ t.dx.ctype }};
using Tw = {{ t.weight.ctype if t.weight else "float" }};
using Tdh = {{ t.dh.ctype if t.dh else "float" }};
constexpr bool WEIGHT = {{ "true" if t.weight else "false" }};    // dweight's sums too
constexpr bool BGRAD = {{ "true" if t.bias else "false" }};       // dbias' sums
constexpr bool DH = {{ "true" if t.dh else "false" }};
{% include "norm/shape.cuh" %}

struct Args {
    const Tdy* __restrict__ dy;
    const Th* __restrict__ h;
    const Tw* __restrict__ w;
    const float* __restrict__ mean;
    const float* __restrict__ rstd;
    const Tdh* __restrict__ dh;
    Tdx* __restrict__ dx;
    float* __restrict__ pw;
    float* __restrict__ pb;
    long long rows, n, sdy, sh, sdh, sdx;
};

// One slot of a row at e0: x-hat (xh) and g = dy * w (gv) of its VEC elements (0 past the
// end, n); with SUMS, dy * x-hat and dy added to the sums aw and ab where `active`; the slot's
// terms of sum(g * x-hat) and sum(g) added to s1 and s2.
template <bool SUMS, typename I>
__device__ __forceinline__ void slot_grad(const Args& p, long long row, I e0, I n, float mu,
                                          float rs, bool active, float* xh, float* gv,
                                          float* aw, float* ab, float& s1, float& s2) {
    load_slot<VEC>(p.h + row * p.sh, e0, n, xh, 0.0f);
    load_slot<VEC>(p.dy + row * p.sdy, e0, n, gv, 0.0f);
    float wv[VEC];
    if constexpr (WEIGHT) load_slot<VEC>(p.w, e0, n, wv, 0.0f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        xh[k] = LAYER ? (xh[k] - mu) * rs : xh[k] * rs;
        if constexpr (SUMS && WEIGHT) aw[k] += active ? gv[k] * xh[k] : 0.0f;
        if constexpr (SUMS && BGRAD) ab[k] += active ? gv[k] : 0.0f;
        if constexpr (WEIGHT) gv[k] *= wv[k];
        s1 += gv[k] * xh[k];
        s2 += gv[k];
    }
}

// dx of one slot from its x-hat and g and the row's c1, c2 (plus dh); stored where `active`.
template <typename I>
__device__ __forceinline__ void slot_dx(const Args& p, long long row, I e0, I n, float rs,
                                        float c1, float c2, bool active, float* xh,
                                        const float* gv) {
    float dv[VEC];
    if constexpr (DH) load_slot<VEC>(p.dh + row * p.sdh, e0, n, dv, 0.0f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        float u = rs * (gv[k] - c2 - xh[k] * c1);
        if constexpr (DH) u += dv[k];
        xh[k] = u;
    }
    if (active) store_slot<VEC>(p.dx + row * p.sdx, e0, n, xh);
}

// One row held in registers: a thread takes the slots at (j * G + g) * VEC; `sum` adds a value
// over the row's threads (every thread runs it; one whose group has no row passes `active`
// false: it reads the row given, adds nothing and stores nothing).
template <int G, typename Sum>
__device__ __forceinline__ void row_grad(const Args& p, long long row, int g, bool active,
                                         float* aw, float* ab, Sum sum) {
    const int n = static_cast<int>(p.n);
    const float rs = p.rstd[row];
    const float mu = LAYER ? p.mean[row] : 0.0f;
    float xh[VPT], gv[VPT];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j)
        slot_grad<true>(p, row, (j * G + g) * VEC, n, mu, rs, active, &xh[j * VEC],
                        &gv[j * VEC], &aw[j * VEC], &ab[j * VEC], s1, s2);
    const float c1 = sum(s1) / n;
    const float c2 = LAYER ? sum(s2) / n : 0.0f;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j)
        slot_dx(p, row, (j * G + g) * VEC, n, rs, c1, c2, active, &xh[j * VEC], &gv[j * VEC]);
}

// The block's partial sums of its columns (a thread's slots at (j * G + g) * VEC) into its
// rows of pw and pb.
template <int G>
__device__ __forceinline__ void write_partials(const Args& p, int g, const float* aw,
                                               const float* ab) {
    const long long base = static_cast<long long>(blockIdx.x) * p.n;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const long long e = (j * G + g) * VEC + k;
            if (e < p.n) {
                if constexpr (WEIGHT) p.pw[base + e] = aw[j * VEC + k];
                if constexpr (BGRAD) p.pb[base + e] = ab[j * VEC + k];
            }
        }
}

// ---- warp: LANES lanes per row, THREADS / LANES rows per block and step. At the end the lane
// groups' sums are added over the warp (a butterfly over the lane bits above the group's), then
// the warps' in order.
__device__ __forceinline__ void grad_warp(const Args& p) {
    constexpr int GROUPS = THREADS / LANES;
    // the other warps' sums (this function is compiled with every variant: sized for warp's)
    __shared__ float spare[2][VARIANT == 0 ? WARPS - 1 : 1][VARIANT == 0 ? LANES * VPT : 1];
    const int g = threadIdx.x % LANES;
    const int q = threadIdx.x / LANES;
    float aw[VPT], ab[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) aw[i] = ab[i] = 0.0f;
    for (long long base = static_cast<long long>(blockIdx.x) * GROUPS; base < p.rows;
         base += static_cast<long long>(gridDim.x) * GROUPS) {
        const long long row = base + q;
        // every lane runs the shuffles, also where its group has no row (it reads the last)
        row_grad<LANES>(p, row < p.rows ? row : p.rows - 1, g, row < p.rows, aw, ab,
                        [](float s) { return group_sum<LANES>(s); });
    }
    if constexpr (WEIGHT || BGRAD) {
#pragma unroll
        for (int o = LANES; o < 32; o *= 2)
#pragma unroll
            for (int i = 0; i < VPT; ++i) {
                if constexpr (WEIGHT) aw[i] += __shfl_xor_sync(FULL_MASK, aw[i], o);
                if constexpr (BGRAD) ab[i] += __shfl_xor_sync(FULL_MASK, ab[i], o);
            }
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (warp > 0 && lane < LANES) {
#pragma unroll
            for (int i = 0; i < VPT; ++i) {
                spare[0][warp - 1][lane * VPT + i] = aw[i];
                spare[1][warp - 1][lane * VPT + i] = ab[i];
            }
        }
        __syncthreads();
        if (warp == 0 && lane < LANES) {
#pragma unroll
            for (int u = 0; u < WARPS - 1; ++u)
#pragma unroll
                for (int i = 0; i < VPT; ++i) {
                    aw[i] += spare[0][u][lane * VPT + i];
                    ab[i] += spare[1][u][lane * VPT + i];
                }
            write_partials<LANES>(p, lane, aw, ab);
        }
    }
}

// ---- block: one block per row; a thread's columns are the same in every row, so its sums stay
// in registers. Consecutive block reductions take turns with two buffers.
__device__ __forceinline__ void grad_block(const Args& p) {
    __shared__ float red[2][32];
    int turn = 0;
    float aw[VPT], ab[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) aw[i] = ab[i] = 0.0f;
    for (long long row = blockIdx.x; row < p.rows; row += gridDim.x)
        row_grad<THREADS>(p, row, threadIdx.x, true, aw, ab, [&](float s) {
            return block_reduce<THREADS, false>(s, red[turn++ & 1]);
        });
    write_partials<THREADS>(p, threadIdx.x, aw, ab);
}

// ---- loop: one block per pair of rows of any length (two rows in flight: each pass's loads
// of both go out together, and their four sums meet in one reduction), two passes over dy and
// h: the rows' c1 and c2, then dx. A thread's columns are the same in every row: it adds its
// terms of dweight and dbias to its elements of the block's sums: in shared memory (SMEM_COLS,
// rows of at most that many elements), written to the block's rows of pw and pb at the end,
// else in those rows (the first pair writes them). A pair's second row past the last is not
// there: it reads the last row and adds and stores nothing.
constexpr int SMEM_COLS = {{ spec.smem_cols }};
constexpr int PAIR = {{ spec.loop_rows }};   // rows a block takes at once

// The sums of v[0..K) over the block's threads (every thread gets them), through one barrier:
// the warps' sums in `buf` (K x 32 floats), then each thread adds the warps' in order. A second
// call must wait for every thread to have read `buf` (the caller's barrier).
template <int K>
__device__ __forceinline__ void block_sums(float (&v)[K], float* buf) {
#pragma unroll
    for (int i = 0; i < K; ++i) v[i] = group_sum<32>(v[i]);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int i = 0; i < K; ++i) buf[i * 32 + (threadIdx.x >> 5)] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < K; ++i) v[i] = group_sum<WARPS>(buf[i * 32 + (threadIdx.x & (WARPS - 1))]);
}

__device__ __forceinline__ void grad_loop(const Args& p) {
    constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
    __shared__ float red[2][2 * PAIR * 32];
    int turn = 0;
    const long long base = static_cast<long long>(blockIdx.x) * p.n;
    // (dweight's sums first, then dbias')
    extern __shared__ float smem_sums[];
    float* const sw = smem_sums;
    float* const sb = smem_sums + (WEIGHT ? SMEM_COLS : 0);
    bool first = true;
    for (long long row0 = static_cast<long long>(blockIdx.x) * PAIR; row0 < p.rows;
         row0 += static_cast<long long>(gridDim.x) * PAIR, first = false) {
        long long row[PAIR];
        bool active[PAIR];
        float rs[PAIR], mu[PAIR], st[2 * PAIR];
#pragma unroll
        for (int r = 0; r < PAIR; ++r) {
            active[r] = row0 + r < p.rows;
            row[r] = active[r] ? row0 + r : p.rows - 1;
            rs[r] = p.rstd[row[r]];
            mu[r] = LAYER ? p.mean[row[r]] : 0.0f;
            st[2 * r] = st[2 * r + 1] = 0.0f;
        }
        for (long long c = 0; c < p.n; c += STEP) {
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
#pragma unroll
                for (int r = 0; r < PAIR; ++r) {
                    float xh[VEC], gv[VEC];
                    slot_grad<false>(p, row[r],
                                     c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC,
                                     p.n, mu[r], rs[r], true, xh, gv, nullptr, nullptr,
                                     st[2 * r], st[2 * r + 1]);
                }
        }
        // (the two buffers take turns: a pair's reduction cannot overtake the last one's reads)
        block_sums(st, red[turn++ & 1]);
        float c1[PAIR], c2[PAIR];
#pragma unroll
        for (int r = 0; r < PAIR; ++r) {
            c1[r] = st[2 * r] / p.n;
            c2[r] = LAYER ? st[2 * r + 1] / p.n : 0.0f;
        }
        for (long long c = 0; c < p.n; c += STEP) {
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                const long long e0 = c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC;
                float aw[VEC], ab[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) aw[k] = ab[k] = 0.0f;
#pragma unroll
                for (int r = 0; r < PAIR; ++r) {
                    float xh[VEC], gv[VEC];
                    float t1 = 0.0f, t2 = 0.0f;
                    slot_grad<true>(p, row[r], e0, p.n, mu[r], rs[r], active[r], xh, gv, aw, ab,
                                    t1, t2);
                    slot_dx(p, row[r], e0, p.n, rs[r], c1[r], c2[r], active[r], xh, gv);
                }
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    if (e0 + k < p.n) {
                        if constexpr (SMEM_COLS > 0) {   // (a thread's own elements)
                            if constexpr (WEIGHT) sw[e0 + k] = (first ? 0.0f : sw[e0 + k]) + aw[k];
                            if constexpr (BGRAD) sb[e0 + k] = (first ? 0.0f : sb[e0 + k]) + ab[k];
                        } else {
                            if constexpr (WEIGHT)
                                p.pw[base + e0 + k] = (first ? 0.0f : p.pw[base + e0 + k]) + aw[k];
                            if constexpr (BGRAD)
                                p.pb[base + e0 + k] = (first ? 0.0f : p.pb[base + e0 + k]) + ab[k];
                        }
                    }
                }
            }
        }
    }
    if constexpr (SMEM_COLS > 0) {
        // the block's sums out, a thread its own elements (a block without rows writes zeros)
        for (long long c = 0; c < p.n; c += STEP)
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const long long e = c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC + k;
                    if (e < p.n) {
                        if constexpr (WEIGHT) p.pw[base + e] = first ? 0.0f : sw[e];
                        if constexpr (BGRAD) p.pb[base + e] = first ? 0.0f : sb[e];
                    }
                }
    }
}

// At least 1024 threads per multiprocessor (64 registers or fewer).
extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    const Args p{dy, h, w, mean, rstd, dh, dx, pw, pb, rows, n, sdy, sh, sdh, sdx};
    if constexpr (VARIANT == 0) {
        grad_warp(p);
    } else if constexpr (VARIANT == 1) {
        grad_block(p);
    } else {
        grad_loop(p);
    }
}
