// {{ spec.kernel_name }}
{% if spec.stage.value == "amax" -%}
// The amax stage of a per-tensor FP8 quantization: max |x| of {{ spec.in_dtype.numpy_name }} rows, kept as the largest float32
// bit pattern of |x| (NaN above infinity above any number) with atomicMax in a zeroed word.
{% else -%}
// FP8 quantization, {{ spec.in_dtype.numpy_name }} to {{ spec.fmt.numpy_name }}: q = x * (1 / scale) rounded to nearest-even and
// saturated at +-{{ spec.fmt.largest }} (NaN stays NaN), the scale from "{{ spec.source.value }}" (ge2jit/ops/quantize/spec.py).
// A dynamic scale is amax / {{ spec.fmt.largest }} of the values it covers (1 where their amax is 0); amax is the
// largest |x| with NaN above infinity, so a NaN gives a NaN scale and an infinity an infinite one.
{% endif -%}
// Variant "{{ spec.variant }}". Every division and reciprocal is IEEE-rounded: the same bits as
// float32 arithmetic on the host.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}

using Tin = {{ spec.in_dtype.ctype }};
using Tq = {{ spec.q_ctype }};
constexpr int VARIANT = {{ spec.variant_code }};    // 0 warp, 1 block, 2 loop, 3 flat
constexpr int THREADS = {{ spec.threads }};
constexpr int VPT = {{ spec.vpt }};                 // values per thread (per row; per step)
constexpr int VEC = {{ spec.vec }};                 // elements per access
constexpr int LANES = {{ spec.lanes }};             // warp variant: lanes per row
constexpr int SLOTS = VPT / VEC;
constexpr bool AMAX_STAGE = {{ "true" if spec.stage.value == "amax" else "false" }};
// 0: the row's own amax, 1: the amax stage's word, 2: a device array, 3: a host number
constexpr int SOURCE = {{ ["row", "tensor", "device", "host"].index(spec.source.value) if spec.source else 0 }};
constexpr bool KEEP_AMAX = AMAX_STAGE || {{ "true" if spec.amax else "false" }};
constexpr bool ROW_AMAX = !AMAX_STAGE && SOURCE == 0;
constexpr float LARGEST = {{ "%.1ff" % spec.fmt.largest if spec.fmt else "1.0f" }};

static_assert(VPT % VEC == 0 && VEC * sizeof(Tin) <= 16, "whole accesses of at most 16 bytes");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps");

// The scale of values whose largest |x| has the bits `bits`.
__device__ __forceinline__ float dynamic_scale(unsigned bits) {
    const float a = __uint_as_float(bits);
    return a == 0.0f ? 1.0f : __fdiv_rn(a, LARGEST);
}

// The largest |v| bits of the thread's values.
__device__ __forceinline__ unsigned values_amax(const float* v) {
    unsigned m = 0u;
#pragma unroll
    for (int i = 0; i < VPT; ++i) m = max(m, absolute_bits(v[i]));
    return m;
}

// q[e0 ..] of the values scaled by inv (VPT values at slots (j * STRIDE + lane) * VEC).
template <int STRIDE, typename I>
__device__ __forceinline__ void store_values(Tq* q, I c, I n, int lane, float* v, float inv) {
    if constexpr (!AMAX_STAGE) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) v[i] = __fmul_rn(v[i], inv);
#pragma unroll
        for (int j = 0; j < SLOTS; ++j)
            store_slot<VEC>(q, c + static_cast<I>(j * STRIDE + lane) * VEC, n, &v[j * VEC]);
    }
}

template <int STRIDE, typename I>
__device__ __forceinline__ void load_values(const Tin* x, I c, I n, int lane, float* v) {
#pragma unroll
    for (int j = 0; j < SLOTS; ++j)
        load_slot<VEC>(x, c + static_cast<I>(j * STRIDE + lane) * VEC, n, &v[j * VEC], 0.0f);
}

// 1 / scale for `row` from a source that is not the row's own amax (`tensor_inv`: the tensor
// source's, computed once).
__device__ __forceinline__ float given_inv(const float* scale, long long row, long long ss,
                                           float tensor_inv, double host_inv) {
    if constexpr (SOURCE == 1) return tensor_inv;
    else if constexpr (SOURCE == 2) return __frcp_rn(scale[row * ss]);
    else return static_cast<float>(host_inv);
}

// The block's largest |x| bits to *amax (one atomic per block); every thread calls it.
__device__ __forceinline__ void keep_amax(unsigned m, unsigned* amax) {
    if constexpr (KEEP_AMAX) {
        __shared__ unsigned red[32];
        m = block_umax<THREADS>(m, red);
        if (threadIdx.x == 0 && m != 0u) atomicMax(amax, m);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1024 / THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    float tensor_inv = 1.0f;
    if constexpr (SOURCE == 1 && !AMAX_STAGE) {
        const float s = dynamic_scale(*amax_in);
        tensor_inv = __frcp_rn(s);
        if (blockIdx.x == 0 && threadIdx.x == 0) scale[0] = s;
    }
    unsigned kept = 0u;       // the largest |x| bits this thread has seen
    if constexpr (VARIANT == 0) {
        // warp: LANES lanes per row, THREADS / LANES rows per block and step
        constexpr int GROUPS = THREADS / LANES;
        const int lane = threadIdx.x % LANES;
        for (long long b = blockIdx.x; b * GROUPS < rows; b += gridDim.x) {
            const long long row = b * GROUPS + threadIdx.x / LANES;
            const bool live = row < rows;
            float v[VPT];
#pragma unroll
            for (int i = 0; i < VPT; ++i) v[i] = 0.0f;
            if (live) load_values<LANES>(x + row * xs, 0, static_cast<int>(n), lane, v);
            unsigned m = values_amax(v);
            kept = max(kept, m);
            if constexpr (ROW_AMAX) {
                m = group_umax<LANES>(m);      // every lane of the warp: shuffles of all 32
                const float s = dynamic_scale(m);
                if (live && lane == 0) scale[row * ss] = s;
                if (live) store_values<LANES>(q + row * qs, 0, static_cast<int>(n), lane, v, __frcp_rn(s));
            } else if (live) {
                store_values<LANES>(q + row * qs, 0, static_cast<int>(n), lane, v,
                                    given_inv(scale, row, ss, tensor_inv, host_inv));
            }
        }
    } else if constexpr (VARIANT == 1) {
        // block: a row per block, VPT values per thread
        __shared__ unsigned red[32];
        for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
            float v[VPT];
            load_values<THREADS>(x + row * xs, 0, static_cast<int>(n), threadIdx.x, v);
            unsigned m = values_amax(v);
            kept = max(kept, m);
            float inv;
            if constexpr (ROW_AMAX) {
                const float s = dynamic_scale(block_umax<THREADS>(m, red));
                if (threadIdx.x == 0) scale[row * ss] = s;
                inv = __frcp_rn(s);
            } else {
                inv = given_inv(scale, row, ss, tensor_inv, host_inv);
            }
            store_values<THREADS>(q + row * qs, 0, static_cast<int>(n), threadIdx.x, v, inv);
            if constexpr (ROW_AMAX) __syncthreads();   // every thread has read red
        }
    } else if constexpr (VARIANT == 2) {
        // loop: a row per block, in steps of THREADS * VPT (per-row scales: two passes)
        constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
        __shared__ unsigned red[32];
        for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
            const Tin* p = x + row * xs;
            float inv;
            if constexpr (ROW_AMAX) {
                unsigned m = 0u;
                for (long long c = 0; c < n; c += STEP) {
                    float v[VPT];
                    load_values<THREADS>(p, c, n, threadIdx.x, v);
                    m = max(m, values_amax(v));
                }
                kept = max(kept, m);
                const float s = dynamic_scale(block_umax<THREADS>(m, red));
                if (threadIdx.x == 0) scale[row * ss] = s;
                inv = __frcp_rn(s);
                __syncthreads();   // every thread has read red
            } else {
                inv = given_inv(scale, row, ss, tensor_inv, host_inv);
            }
            for (long long c = 0; c < n; c += STEP) {      // (the amax stage: its one pass)
                float v[VPT];
                load_values<THREADS>(p, c, n, threadIdx.x, v);
                if constexpr (!ROW_AMAX) kept = max(kept, values_amax(v));
                store_values<THREADS>(q + row * qs, c, n, threadIdx.x, v, inv);
            }
        }
    } else {
        // flat: rows * n elements laid end to end, in steps of THREADS * VPT over every block
        constexpr long long STEP = static_cast<long long>(THREADS) * VPT;
        const long long total = rows * n;
        const float inv = given_inv(scale, 0, 0, tensor_inv, host_inv);
        for (long long c = blockIdx.x * STEP; c < total; c += gridDim.x * STEP) {
            float v[VPT];
            load_values<THREADS>(x, c, total, threadIdx.x, v);
            kept = max(kept, values_amax(v));
            store_values<THREADS>(q, c, total, threadIdx.x, v, inv);
        }
    }
    keep_amax(kept, amax);
}
