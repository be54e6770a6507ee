// {{ spec.kernel_name }}
{% if spec.backward -%}
// Softmax backward along rows, dx = y * (dy - sum(dy * y)), in float32 math: dy and y {{ spec.in_dtype.numpy_name }},
// dx {{ spec.out_dtype.numpy_name }}; variant "{{ spec.variant }}" (ge2jit/ops/softmax/spec.py says what each one is).
//
// Semantics those of a float64 reference of the same formula: NaN anywhere in a row's dy or y makes
// the row NaN; an infinite dy makes the dot product infinite (PyTorch's formula, to the letter).
{% else -%}
// Row-wise softmax, y = e^(x - max) / sum(e^(x - max)), in float32 math: {{ spec.in_dtype.numpy_name }} in,
// {{ spec.out_dtype.numpy_name }} out; variant "{{ spec.variant }}" (ge2jit/ops/softmax/spec.py says what each one is).
//
// Semantics (those of a float64 reference e = exp(x - max(x)); e / sum(e)): -inf entries give 0;
// a row holding +inf or NaN is NaN everywhere; a row of -inf only is NaN (0/0); n = 1 gives 1.
{% endif -%}
//
// Each element is read into a register before any element of its row is written (a whole row in
// the warp and block variants; the loop and strided variants write only after every thread of
// the row has finished its first pass), so the output may be an input itself (in place). No
// pointer is __restrict__: loads are batched explicitly instead.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}

using Tin = {{ spec.in_dtype.ctype }};
using Tout = {{ spec.out_dtype.ctype }};
constexpr int VARIANT = {{ spec.variant_code }};    // 0 warp, 1 block, 2 loop, 3 strided
constexpr int THREADS = {{ spec.threads }};
constexpr int VPT = {{ spec.vpt }};                 // values per thread and array (per row; per pass step)
constexpr int VEC = {{ spec.vec }};                 // elements per access
constexpr int LANES = {{ spec.lanes }};             // warp variant: lanes per row
constexpr int ROWS = {{ spec.rows }};               // warp variant: rows per lane group and step

static_assert(VPT % VEC == 0, "whole vectors per thread");
static_assert(VEC * sizeof(Tin) <= 16 && VEC * sizeof(Tout) <= 16, "at most 16-byte accesses");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

// Slots past the end of a row hold -inf in the forward: they add e^(-inf - max) = 0 to the sum
// (and are never stored). When the maximum itself is -inf (-inf and NaN only), the row is NaN
// whatever they add. The backward pads with 0: 0 * 0 adds nothing to its dot product.
#define SOFTMAX_NEG_INF ROWS_NEG_INF

// ---- warp: LANES lanes per row (a whole warp, or a part of one for short rows), each holding
// VPT values of ROWS rows in registers; THREADS / LANES * ROWS rows per block and step. Lane g
// of a group holds the vectors at (j * LANES + g) * VEC, j < VPT / VEC.
constexpr int GROUPS = THREADS / LANES;
constexpr int PER_BLOCK = GROUPS * ROWS;

// f(r, row) for each row r < ROWS of this thread's lane group in step b (the step's rows start
// at b * PER_BLOCK) that exists.
template <typename F>
__device__ __forceinline__ void warp_rows(long long b, long long rows, F f) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const long long row = b * PER_BLOCK + r * GROUPS + threadIdx.x / LANES;
        if (row < rows) f(r, row);
    }
}

// v[r] = the sum of v[r] over the lane group, for each row r.
__device__ __forceinline__ void group_sums(float (&v)[ROWS]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) v[r] = group_sum<LANES>(v[r]);
}

__device__ __forceinline__ void softmax_warp(const Tin* x, Tout* y, long long rows, int n,
                                             long long sx, long long sy) {
    constexpr int SLOTS = VPT / VEC;
    const int g = threadIdx.x % LANES;
    for (long long b = blockIdx.x; b * PER_BLOCK < rows; b += gridDim.x) {
        float v[ROWS][VPT];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int i = 0; i < VPT; ++i) v[r][i] = SOFTMAX_NEG_INF;   // rows past the end
        warp_rows(b, rows, [&](int r, long long row) {
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                load_slot<VEC>(x + row * sx, (j * LANES + g) * VEC, n, &v[r][j * VEC],
                               SOFTMAX_NEG_INF);
        });
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
        group_sums(s);
        warp_rows(b, rows, [&](int r, long long row) {
            const float inv = 1.0f / s[r];
#pragma unroll
            for (int i = 0; i < VPT; ++i) v[r][i] *= inv;
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                store_slot<VEC>(y + row * sy, (j * LANES + g) * VEC, n, &v[r][j * VEC]);
        });
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
        block_pair<THREADS>(m, s, red_m, red_s);
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

// f(o, i) for each (outer, inner) column of the cols = outer * inner that this thread takes.
template <typename F>
__device__ __forceinline__ void strided_columns(long long cols, long long inner, F f) {
    for (long long c = blockIdx.x * static_cast<long long>(THREADS) + threadIdx.x; c < cols;
         c += static_cast<long long>(gridDim.x) * THREADS) {
        const long long o = c / inner;
        f(o, c - o * inner);
    }
}

__device__ __forceinline__ void softmax_strided(const Tin* x, Tout* y, long long cols,
                                                long long n, long long inner,
                                                long long xo, long long xn, long long xi,
                                                long long yo, long long yn, long long yi) {
    strided_columns(cols, inner, [&](long long o, long long i) {
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
    });
}

// ---- the backward's variants: the same shapes, two arrays read (dy and y, VPT values of each
// per thread), one dot product per row instead of the (max, sum) pair.

// dx = y * (dy - dot) for N values.
template <int N>
__device__ __forceinline__ void backward_values(float* g, const float* v, float dot) {
#pragma unroll
    for (int i = 0; i < N; ++i) g[i] = v[i] * (g[i] - dot);
}

__device__ __forceinline__ void backward_warp(const Tin* dy, const Tin* y, Tout* dx,
                                              long long rows, int n, long long sg,
                                              long long sy, long long sd) {
    constexpr int SLOTS = VPT / VEC;
    const int l = threadIdx.x % LANES;
    for (long long b = blockIdx.x; b * PER_BLOCK < rows; b += gridDim.x) {
        float g[ROWS][VPT], v[ROWS][VPT];
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int i = 0; i < VPT; ++i) g[r][i] = v[r][i] = 0.0f;      // rows past the end
        warp_rows(b, rows, [&](int r, long long row) {
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                load_slot<VEC>(dy + row * sg, (j * LANES + l) * VEC, n, &g[r][j * VEC], 0.0f);
                load_slot<VEC>(y + row * sy, (j * LANES + l) * VEC, n, &v[r][j * VEC], 0.0f);
            }
        });
        float dot[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            dot[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < VPT; ++i) dot[r] += g[r][i] * v[r][i];
        }
        group_sums(dot);
        warp_rows(b, rows, [&](int r, long long row) {
            backward_values<VPT>(g[r], v[r], dot[r]);
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                store_slot<VEC>(dx + row * sd, (j * LANES + l) * VEC, n, &g[r][j * VEC]);
        });
    }
}

__device__ __forceinline__ void backward_block(const Tin* dy, const Tin* y, Tout* dx,
                                               long long rows, int n, long long sg,
                                               long long sy, long long sd) {
    constexpr int SLOTS = VPT / VEC;
    __shared__ float red[32];
    const int t = threadIdx.x;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        float g[VPT], v[VPT];
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) {
            load_slot<VEC>(dy + row * sg, (j * THREADS + t) * VEC, n, &g[j * VEC], 0.0f);
            load_slot<VEC>(y + row * sy, (j * THREADS + t) * VEC, n, &v[j * VEC], 0.0f);
        }
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) dot += g[i] * v[i];
        dot = block_reduce<THREADS, false>(dot, red);
        backward_values<VPT>(g, v, dot);
#pragma unroll
        for (int j = 0; j < SLOTS; ++j)
            store_slot<VEC>(dx + row * sd, (j * THREADS + t) * VEC, n, &g[j * VEC]);
        __syncthreads();   // every thread has read red (the next row overwrites it)
    }
}

// A pass step of the loop variant: VPT values of dy and y at c + (j * THREADS + t) * VEC.
__device__ __forceinline__ void backward_step(const Tin* dy, const Tin* y, long long c,
                                              long long n, float* g, float* v) {
    constexpr int SLOTS = VPT / VEC;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
        const long long e0 = c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC;
        load_slot<VEC>(dy, e0, n, &g[j * VEC], 0.0f);
        load_slot<VEC>(y, e0, n, &v[j * VEC], 0.0f);
    }
}

__device__ __forceinline__ void backward_loop(const Tin* dy, const Tin* y, Tout* dx,
                                              long long rows, long long n, long long sg,
                                              long long sy, long long sd) {
    constexpr int SLOTS = VPT / VEC;
    constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
    __shared__ float red[32];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const Tin* pg = dy + row * sg;
        const Tin* py = y + row * sy;
        float dot = 0.0f, comp = 0.0f;
        for (long long c = 0; c < n; c += STEP) {
            float g[VPT], v[VPT];
            backward_step(pg, py, c, n, g, v);
            float step = 0.0f;
#pragma unroll
            for (int i = 0; i < VPT; ++i) step += g[i] * v[i];
            kahan_add(dot, comp, step);
        }
        dot = block_reduce<THREADS, false>(dot - comp, red);
        __syncthreads();   // every thread has read red (the next row overwrites it)
        Tout* q = dx + row * sd;
        for (long long c = 0; c < n; c += STEP) {
            float g[VPT], v[VPT];
            backward_step(pg, py, c, n, g, v);
            backward_values<VPT>(g, v, dot);
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                store_slot<VEC>(q, c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC, n,
                                &g[j * VEC]);
        }
    }
}

__device__ __forceinline__ void backward_strided(const Tin* dy, const Tin* y, Tout* dx,
                                                 long long cols, long long n, long long inner,
                                                 long long go, long long gn, long long gi,
                                                 long long yo, long long yn, long long yi,
                                                 long long xo, long long xn, long long xi) {
    strided_columns(cols, inner, [&](long long o, long long i) {
        const Tin* pg = dy + o * go + i * gi;
        const Tin* py = y + o * yo + i * yi;
        float dot = 0.0f, comp = 0.0f;
        for (long long k0 = 0; k0 < n; k0 += VPT) {
            float step = 0.0f;
#pragma unroll
            for (int u = 0; u < VPT; ++u)
                if (k0 + u < n) step += to_f32(pg[(k0 + u) * gn]) * to_f32(py[(k0 + u) * yn]);
            kahan_add(dot, comp, step);
        }
        dot -= comp;
        Tout* q = dx + o * xo + i * xi;
        for (long long k0 = 0; k0 < n; k0 += VPT) {
            float g[VPT], v[VPT];
#pragma unroll
            for (int u = 0; u < VPT; ++u) {
                g[u] = k0 + u < n ? to_f32(pg[(k0 + u) * gn]) : 0.0f;
                v[u] = k0 + u < n ? to_f32(py[(k0 + u) * yn]) : 0.0f;
            }
            backward_values<VPT>(g, v, dot);
#pragma unroll
            for (int u = 0; u < VPT; ++u)
                if (k0 + u < n) store(q + (k0 + u) * xn, g[u]);
        }
    });
}

// rows: rows (warp, block, loop) or columns (strided: outer * inner); strides in elements, of
// each array: between rows (outer), along a row (n; 1 except for strided) and between inner
// columns (strided). At least 1024 threads per multiprocessor (64 registers or fewer): several
// blocks resident, so that one's reductions and stores overlap another's loads.
extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
{% if spec.backward %}
    if constexpr (VARIANT == 0) {
        backward_warp(dy, y, dx, rows, static_cast<int>(n), dyo, yo, dxo);
    } else if constexpr (VARIANT == 1) {
        backward_block(dy, y, dx, rows, static_cast<int>(n), dyo, yo, dxo);
    } else if constexpr (VARIANT == 2) {
        backward_loop(dy, y, dx, rows, n, dyo, yo, dxo);
    } else {
        backward_strided(dy, y, dx, rows, n, inner, dyo, dyn, dyi, yo, yn, yi, dxo, dxn, dxi);
    }
{% else %}
    if constexpr (VARIANT == 0) {
        softmax_warp(x, y, rows, static_cast<int>(n), xo, yo);
    } else if constexpr (VARIANT == 1) {
        softmax_block(x, y, rows, static_cast<int>(n), xo, yo);
    } else if constexpr (VARIANT == 2) {
        softmax_loop(x, y, rows, n, xo, yo);
    } else {
        softmax_strided(x, y, rows, n, inner, xo, xn, xi, yo, yn, yi);
    }
{% endif %}
}
