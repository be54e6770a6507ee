// {{ spec.kernel_name }}
// One fused optimizer step over a flat float32 parameter, in place: {% if spec.rule == "adam" %}Adam with decoupled weight
// decay (AdamW): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// p -= lr (m / c1 / (sqrt(v / c2) + eps) + wd p), with c1, c2 = 1 - b1^t, 1 - b2^t{% if spec.step_dtype %};
// t is read from the device when the kernel runs (a counter a captured CUDA graph increments){% endif %}{% else %}SGD with momentum (PyTorch's rule): g += wd p,
// buf = momentum buf + g, p -= lr ({{ "g + momentum buf" if spec.nesterov else "buf" }}){% endif %}.
// The gradient is read as {{ spec.grad_dtype.numpy_name }}{% if spec.copy_dtype %}; the updated parameter is also written as a {{ spec.copy_dtype.numpy_name }} copy (the
// weights the next forward reads){% endif %}. Grid-stride loop, one element per thread per step.
{% include "common/types.cuh" %}

extern "C" __global__ void __launch_bounds__(256)
{{ spec.kernel_name }}({{ spec.param_list() }})
{
    const float lr = static_cast<float>(lr_), wd = static_cast<float>(wd_);
    const float h1 = static_cast<float>(h1_);   // b1 (Adam) or momentum (SGD)
{% if spec.rule == "adam" %}
    const float h2 = static_cast<float>(h2_), eps = static_cast<float>(eps_);
{% if spec.step_dtype %}
    // 1 - b^t in double, as the host computes them for an int step, then rounded to float
    const double t = static_cast<double>(*step);
    const float c1 = static_cast<float>(1.0 - pow(h1_, t));
    const float c2 = static_cast<float>(1.0 - pow(h2_, t));
{% else %}
    const float c1 = static_cast<float>(c1_), c2 = static_cast<float>(c2_);
{% endif %}
{% endif %}
    for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
        float p = param[i];
        float g = to_f32(grad[i]);
{% if spec.rule == "adam" %}
        const float m = fmaf(h1, buf1[i], (1.0f - h1) * g);
        const float v = fmaf(h2, buf2[i], (1.0f - h2) * g * g);
        buf1[i] = m;
        buf2[i] = v;
        p -= lr * fmaf(wd, p, (m / c1) / (sqrtf(v / c2) + eps));
{% else %}
        g = fmaf(wd, p, g);
        const float b = fmaf(h1, buf1[i], g);
        buf1[i] = b;
        p -= lr * {{ "fmaf(h1, b, g)" if spec.nesterov else "b" }};
{% endif %}
        param[i] = p;
{% if spec.copy_dtype %}
        store(&copy[i], p);
{% endif %}
    }
}
