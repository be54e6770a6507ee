// {{ spec.kernel_name }}
// Sums the split-K partial products in a fixed order (deterministic), then applies the fused
// epilogue once: Y = act(alpha * sum{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}).
{% import "common/epilogue.cuh" as ep %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{{ ep.c_accessor(spec) }}

constexpr int THREADS = 256;
constexpr int MIN_BLOCKS = 4;   // without it ptxas aims at full occupancy (32 registers) and spills

__device__ __forceinline__ float component(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    {{ ep.scalars(sizes=False) | indent(4) }}
    const long long groups = (N + 3) / 4;             // 4 consecutive columns per thread
    const long long slice = M * ldw;
{% if spec.epilogue.bias.value == "scalarbias" %}
    const float bias_value = to_f32(bias[0]);
{% endif %}
    for (long long g = blockIdx.x * static_cast<long long>(THREADS) + threadIdx.x; g < M * groups;
         g += static_cast<long long>(gridDim.x) * THREADS) {
        const long long m = g / groups, nb = (g % groups) * 4;
        const float* w = W + m * ldw + nb;
        float4 s = *reinterpret_cast<const float4*>(w);
        for (long long z = 1; z < splits; ++z) {
            const float4 v = *reinterpret_cast<const float4*>(w + z * slice);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
{% if spec.epilogue.bias.value == "rowbias" %}
        const float row_bias = to_f32(bias[m * bias_stride]);
{% endif %}
        {{ ep.finish(spec, 4, "component(s, c)", "to_f32(bias[n * bias_stride])", "nb + 3 < N") | indent(8) }}
    }
}
