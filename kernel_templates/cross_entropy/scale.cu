// {{ spec.kernel_name }}
// A cross-entropy gradient ({{ spec.grad_dtype.numpy_name }}) scaled in place by the loss's upstream gradient: grad[r, :] *= f[r * fs]
// (fs = 0: one factor for every row), in float32 and rounded once. A row whose factor is exactly 1,
// the usual upstream gradient of a loss, is not touched at all: no memory traffic.
{% include "common/types.cuh" %}
{% include "common/rows.cuh" %}

using TG = {{ spec.grad_dtype.ctype }};
constexpr int THREADS = {{ spec.threads }};
constexpr int VPT = {{ spec.vpt }};                 // values per thread and step
constexpr int VEC = {{ spec.vec }};                 // elements per access
constexpr int SLOTS = VPT / VEC;
constexpr long long STEP = static_cast<long long>(THREADS) * VPT;

static_assert(VPT % VEC == 0 && VEC * sizeof(TG) <= 16, "whole accesses of at most 16 bytes");

extern "C" __global__ void __launch_bounds__(THREADS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float s = f[row * fs];
        if (s == 1.0f) continue;
        TG* q = grad + row * gld;
        for (long long c = 0; c < n; c += STEP) {
            float v[VPT];
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                load_slot<VEC>(q, c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC, n,
                               &v[j * VEC], 0.0f);
#pragma unroll
            for (int i = 0; i < VPT; ++i) v[i] *= s;
#pragma unroll
            for (int j = 0; j < SLOTS; ++j)
                store_slot<VEC>(q, c + static_cast<long long>(j * THREADS + threadIdx.x) * VEC, n,
                                &v[j * VEC]);
        }
    }
}
