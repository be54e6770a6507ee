// {{ spec.kernel_name }}
// Sums the split-K partial products in a fixed order (deterministic), then applies the fused
// epilogue once: Y = act(alpha * sum{% if spec.epilogue.has_c %} + beta * C{% endif %}{% if spec.epilogue.bias.value != "nobias" %} + bias{% endif %}).
{% import "common/epilogue_constants.cuh" as ep %}
{% include "common/types.cuh" %}
{% include "common/activations.cuh" %}
{{ ep.constants(spec) }}
{% include "common/epilogue.cuh" %}

constexpr int THREADS = 256;
constexpr int MIN_BLOCKS = 4;   // without it ptxas aims at full occupancy (32 registers) and spills

__device__ __forceinline__ float component(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    auto ep = epilogue(C, ldc, bias, bias_stride, Y, ldy, Z, ldz, M, N, alpha_, beta_,
                       leaky_slope_, scale_a, scale_a_stride, scale_b, scale_b_stride, scale_y,
                       amax, y_scale_);
    const long long groups = (N + 3) / 4;             // 4 consecutive columns per thread
    const long long slice = M * ldw;
    ep.load_scalar_bias();
    for (long long g = blockIdx.x * static_cast<long long>(THREADS) + threadIdx.x; g < M * groups;
         g += static_cast<long long>(gridDim.x) * THREADS) {
        const long long m = g / groups, nb = (g % groups) * 4;
        const float* w = W + m * ldw + nb;
        float4 s = *reinterpret_cast<const float4*>(w);
        for (long long z = 1; z < splits; ++z) {
            const float4 v = *reinterpret_cast<const float4*>(w + z * slice);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
        const float row_bias = ROW_BIAS ? to_f32(bias[m * bias_stride]) : 0.0f;
        ep.finish<4>(Y, m, nb, nb + 3 < N, [&](int c) { return component(s, c); },
                     [&](int, long long n) {
                         return COL_BIAS ? to_f32(bias[n * bias_stride]) : 0.0f;
                     },
                     row_bias);
    }
}
