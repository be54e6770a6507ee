// {{ spec.kernel_name }}
// Cross-entropy of each row of {{ spec.logits_dtype.numpy_name }} logits against a class index ({{ spec.target_dtype }}), in float32
// math{% if spec.grad_dtype %}, with its gradient ({{ spec.grad_dtype.numpy_name }}) written in the same kernel{% endif %}; variant
// "{{ spec.variant }}" (ge2jit/ops/cross_entropy/spec.py says what each one is).
//
// Per row r with class t = targets[r] and V = n classes (PyTorch's semantics, label smoothing e):
//   loss = log(sum_j e^x_j) - (1 - e) x_t - e mean_j(x_j)
//   grad = (softmax(x) - (1 - e) onehot(t) - e / V) * scale,  scale = grad_scale (/ count: mean)
// computed as m + log(s) with m the row's maximum and s = sum_j e^(x_j - m) (an online pass).
// A row whose class is ignore_index reads nothing and gets loss 0 and a zero gradient. A class
// outside [0, V) is never read: that row's loss and gradient are NaN (the call checks the
// classes first unless told not to). The gradient may be written over the logits (in place):
// every element is read before it is written, and the target's logit before any is written.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}

using T = {{ spec.logits_dtype.ctype }};
using TG = {{ spec.grad_ctype }};
constexpr int VARIANT = {{ spec.variant_code }};    // 0 warp (a warp per row), 1 block (a block per row)
constexpr int THREADS = {{ spec.threads }};
constexpr int VPT = {{ spec.vpt }};                 // values per thread and step of the first pass
constexpr int VPT2 = VPT < 16 ? VPT : 16;          // ... of the gradient's pass (registers: no spills)
constexpr int VEC = {{ spec.vec }};                 // elements per access
constexpr bool GRAD = {{ "true" if spec.grad_dtype else "false" }};
constexpr bool SMOOTH = {{ "true" if spec.smoothing else "false" }};    // keep the rows' logit sums
constexpr bool MEAN = {{ "true" if spec.mean else "false" }};           // gradient / rows not ignored
constexpr int LANES = VARIANT == 0 ? 32 : THREADS;  // threads per row
constexpr int ROWS_PER_BLOCK = THREADS / LANES;
constexpr int SLOTS = VPT / VEC;
constexpr int SLOTS2 = VPT2 / VEC;
constexpr long long STEP = static_cast<long long>(LANES) * VPT;
constexpr long long STEP2 = static_cast<long long>(LANES) * VPT2;

static_assert(VPT % VEC == 0 && VPT2 % VEC == 0, "whole vectors per thread");
static_assert(VEC * sizeof(T) <= 16 && (!GRAD || VEC * sizeof(TG) <= 16),
              "at most 16-byte accesses");
static_assert(THREADS % 32 == 0 && (THREADS & (THREADS - 1)) == 0, "a power of two of warps");

#define XENT_NAN __int_as_float(0x7fffffff)

// The row's threads combine their (max, sum) pairs, or add a value: a warp by shuffles, a block
// through shared memory (every call has its own buffers; block_pair ends with a barrier, and
// each row's block_pair lies between one row's block_reduce and the next's).
__device__ __forceinline__ void row_pair(float& m, float& s, float* bm, float* bs) {
    if constexpr (VARIANT == 0) {
        group_pair<32>(m, s);
    } else {
        block_pair<THREADS>(m, s, bm, bs);
    }
}
__device__ __forceinline__ float row_sum(float v, float* buf) {
    if constexpr (VARIANT == 0) {
        return group_sum<32>(v);
    } else {
        return block_reduce<THREADS, false>(v, buf);
    }
}

// The element of slot j of a pass step starting at c, for this thread.
__device__ __forceinline__ long long slot_start(long long c, int j, int lane) {
    return c + static_cast<long long>(j * LANES + lane) * VEC;
}

// The sum of the values of a slot that lie inside the row.
__device__ __forceinline__ float slot_sum(const float* v, long long e0, long long n) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
        if (e0 + k < n) s += v[k];
    return s;
}

// rows, n: the logits' shape; ld, gld: the logits' and the gradient's row strides, ts the class
// indices' stride (elements); ws: the targets kernel's output (ws[0]: rows not ignored).
extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    __shared__ float bm[32], bs[32], bx[32];
    const int lane = threadIdx.x % LANES;
    const int sub = threadIdx.x / LANES;
    const float eps = static_cast<float>(smoothing);
    const float on = static_cast<float>(1.0 - smoothing);                  // the target's share
    const float off = static_cast<float>(smoothing / static_cast<double>(n));  // each class's
    float scale = static_cast<float>(grad_scale);
    if constexpr (MEAN) scale = static_cast<float>(grad_scale / static_cast<double>(ws[0]));
    for (long long row = static_cast<long long>(blockIdx.x) * ROWS_PER_BLOCK + sub; row < rows;
         row += static_cast<long long>(gridDim.x) * ROWS_PER_BLOCK) {
        const long long t = static_cast<long long>(targets[row * ts]);
        if (t == ignore_index) {
            if (lane == 0) losses[row] = 0.0f;
            if constexpr (GRAD) {
                float z[VPT2];
#pragma unroll
                for (int i = 0; i < VPT2; ++i) z[i] = 0.0f;
                TG* q = grad + row * gld;
                for (long long c = 0; c < n; c += STEP2) {
#pragma unroll
                    for (int j = 0; j < SLOTS2; ++j)
                        store_slot<VEC>(q, slot_start(c, j, lane), n, &z[j * VEC]);
                }
            }
            continue;
        }
        const bool valid = 0 <= t && t < n;
        const T* p = logits + row * ld;
        float m = ROWS_NEG_INF, s = 0.0f, comp = 0.0f, sx = 0.0f, sx_comp = 0.0f;
        for (long long c = 0; c < n; c += STEP) {
            float v[VPT];
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                load_slot<VEC>(p, slot_start(c, j, lane), n, &v[j * VEC], ROWS_NEG_INF);
            pair_add<VPT>(m, s, comp, v);
            if constexpr (SMOOTH) {
                float step = 0.0f;
#pragma unroll
                for (int j = 0; j < SLOTS; ++j) step += slot_sum(&v[j * VEC], slot_start(c, j, lane), n);
                kahan_add(sx, sx_comp, step);
            }
        }
        s -= comp;
        // the target's logit: read before the row's threads meet, so before any of them writes
        const float xt = valid ? to_f32(p[valid ? t : 0]) : XENT_NAN;
        row_pair(m, s, bm, bs);
        const float lse_m = logf(s);   // log(sum e^x) - m
        float loss = (m - xt) + lse_m;
        if constexpr (SMOOTH) {
            sx = row_sum(sx - sx_comp, bx);
            loss = lse_m + on * (m - xt) + eps * (m - sx / static_cast<float>(n));
        }
        if (lane == 0) losses[row] = valid ? loss : XENT_NAN;
        if constexpr (GRAD) {
            // the second pass's slots are not the first's: in place, a lane writes what other
            // lanes read (the row's reduction orders a block; a warp's memory, this barrier)
            if constexpr (VARIANT == 0) __syncwarp();
            const float inv = 1.0f / s;
            const float sc = valid ? scale : XENT_NAN;
            TG* q = grad + row * gld;
            for (long long c = 0; c < n; c += STEP2) {
                float v[VPT2];
#pragma unroll
                for (int j = 0; j < SLOTS2; ++j)
                    load_slot<VEC>(p, slot_start(c, j, lane), n, &v[j * VEC], 0.0f);
                // the target's place in this step (-1: not in it), in 32 bits
                const int hit = t >= c && t - c < STEP2 ? static_cast<int>(t - c) : -1;
#pragma unroll
                for (int j = 0; j < SLOTS2; ++j) {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) {
                        const int e = (j * LANES + lane) * VEC + k;
                        const float g = exp_diff(v[j * VEC + k], m) * inv - off
                                        - (e == hit ? on : 0.0f);
                        v[j * VEC + k] = g * sc;
                    }
                }
#pragma unroll
                for (int j = 0; j < SLOTS2; ++j)
                    store_slot<VEC>(q, slot_start(c, j, lane), n, &v[j * VEC]);
            }
        }
    }
}
