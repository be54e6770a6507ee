// Activations of the fused epilogue, in float32. Every one propagates NaN: relu(NaN) is NaN
// (the comparisons below are false for NaN, so x itself is returned).
__device__ __forceinline__ float act_none(float x, float) { return x; }
__device__ __forceinline__ float act_relu(float x, float) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float act_leaky_relu(float x, float slope) {
    return x < 0.0f ? x * slope : x;
}
// Exact GELU (erf form, PyTorch's default).
__device__ __forceinline__ float act_gelu(float x, float) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
// tanh approximation of GELU (cuBLASLt's GELU epilogue).
__device__ __forceinline__ float act_gelu_tanh(float x, float) {
    const float inner = 0.79788456080286536f * fmaf(0.044715f * x, x * x, x);
    return 0.5f * x * (1.0f + tanhf(inner));
}
__device__ __forceinline__ float act_sigmoid(float x, float) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float act_tanh(float x, float) { return tanhf(x); }
// x * sigmoid(x), written as a quotient so that large negative x gives -0 rather than NaN.
__device__ __forceinline__ float act_silu(float x, float) { return x / (1.0f + expf(-x)); }

// Fast forms for 16-bit outputs (sm_75+), whose rounding (2^-8 or 2^-11) is larger than these
// approximations' errors: tanh.approx (relative error about 2^-11), ex2.approx and rcp.approx
// (a few ulp).
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float exp2_approx(float x) {   // 2^x, ex2.approx (2^-inf = 0; flushes to 0)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float exp_approx(float x) {   // e^x
    return exp2_approx(x * 1.44269504088896341f);
}
__device__ __forceinline__ float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// 1 / (1 + 2^(-x log2 e)) on the special-function unit: ex2 and rcp, flushing subnormal
// results to zero (sigmoid(x) below 2^-126, x < -87: 0). Limits: x = -inf gives 0 (ex2 is inf,
// its reciprocal 0), +inf gives 1, NaN stays NaN.
__device__ __forceinline__ float sigmoid_approx(float x) {
    return rcp_approx(1.0f + exp_approx(-x));
}
__device__ __forceinline__ float act_none_fast(float x, float s) { return act_none(x, s); }
__device__ __forceinline__ float act_relu_fast(float x, float s) { return act_relu(x, s); }
__device__ __forceinline__ float act_leaky_relu_fast(float x, float s) { return act_leaky_relu(x, s); }
__device__ __forceinline__ float act_gelu_fast(float x, float s) { return act_gelu(x, s); }
__device__ __forceinline__ float act_gelu_tanh_fast(float x, float) {
    const float inner = 0.79788456080286536f * fmaf(0.044715f * x, x * x, x);
    return 0.5f * x * (1.0f + tanh_approx(inner));
}
__device__ __forceinline__ float act_sigmoid_fast(float x, float) { return sigmoid_approx(x); }
__device__ __forceinline__ float act_tanh_fast(float x, float) { return tanh_approx(x); }
__device__ __forceinline__ float act_silu_fast(float x, float) { return x * sigmoid_approx(x); }

// Derivatives act'(z), exact, in float32 (the backward's dZ = gY * act'(Z)). At a kink the
// derivative of the side z <= 0 is taken, as PyTorch does; NaN in z gives NaN (or, for the
// ReLUs, passes the gradient through, as PyTorch's threshold does).
__device__ __forceinline__ float dact_none(float, float) { return 1.0f; }
__device__ __forceinline__ float dact_relu(float z, float) { return z <= 0.0f ? 0.0f : 1.0f; }
__device__ __forceinline__ float dact_leaky_relu(float z, float slope) {
    return z <= 0.0f ? slope : 1.0f;
}
// d/dz [z Phi(z)] = Phi(z) + z phi(z)
__device__ __forceinline__ float dact_gelu(float z, float) {
    const float cdf = 0.5f * (1.0f + erff(z * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * z * z);
    return fmaf(z, pdf, cdf);
}
// d/dz [z (1 + tanh u) / 2], u = sqrt(2/pi) (z + 0.044715 z^3)
__device__ __forceinline__ float dact_gelu_tanh(float z, float) {
    const float k = 0.79788456080286536f;
    // tanh u = 1 - 2 / (1 + e^(2u)): absolute error ~1e-7 (all the derivative needs), with
    // fewer registers than tanhf, whose slow path spilled in the GEMMs' gating epilogue
    const float th = 1.0f - 2.0f / (1.0f + expf(2.0f * k * fmaf(0.044715f * z, z * z, z)));
    const float du = k * fmaf(3.0f * 0.044715f * z, z, 1.0f);
    return fmaf(0.5f * z * (1.0f - th * th), du, 0.5f * (1.0f + th));
}
__device__ __forceinline__ float dact_sigmoid(float z, float) {
    const float s = 1.0f / (1.0f + expf(-z));
    return s * (1.0f - s);
}
__device__ __forceinline__ float dact_tanh(float z, float) {
    const float t = tanhf(z);
    return 1.0f - t * t;
}
// d/dz [z s(z)] = s (1 + z (1 - s))
__device__ __forceinline__ float dact_silu(float z, float) {
    const float s = 1.0f / (1.0f + expf(-z));
    return s * fmaf(z, 1.0f - s, 1.0f);
}
// The same from the output y = act(z), for the activations whose derivative is a function of
// their output (ReLUs with slope >= 0: y > 0 exactly where z > 0).
__device__ __forceinline__ float dact_y_none(float, float) { return 1.0f; }
__device__ __forceinline__ float dact_y_relu(float y, float) { return y <= 0.0f ? 0.0f : 1.0f; }
__device__ __forceinline__ float dact_y_leaky_relu(float y, float slope) {
    return y <= 0.0f ? slope : 1.0f;
}
__device__ __forceinline__ float dact_y_sigmoid(float y, float) { return y * (1.0f - y); }
__device__ __forceinline__ float dact_y_tanh(float y, float) { return 1.0f - y * y; }

// Fast forms of the derivatives, for 16-bit outputs (the GEMMs' gating epilogue, a 16-bit
// dZ), on the special-function unit as the fast activations: ex2.approx and rcp.approx (a few
// ulp), tanh.approx (relative error about 2^-11, as the forward's fast GELU-tanh). The logistic
// and tanh derivatives are written in e = exp(-|z|) (symmetric in z, no cancellation near 0).
__device__ __forceinline__ float dact_none_fast(float z, float s) { return dact_none(z, s); }
__device__ __forceinline__ float dact_relu_fast(float z, float s) { return dact_relu(z, s); }
__device__ __forceinline__ float dact_leaky_relu_fast(float z, float s) {
    return dact_leaky_relu(z, s);
}
// Phi(z) + z phi(z), with 1 - Phi(|z|) = erfc(|z| / sqrt 2) / 2 by Abramowitz and Stegun's
// 7.1.26 (absolute error below 1.5e-7): a polynomial in 1 / (1 + p |z| / sqrt 2) times
// e^(-z^2 / 2), the exponential phi(z) needs too.
__device__ __forceinline__ float dact_gelu_fast(float z, float) {
    const float t = rcp_approx(fmaf(0.3275911f * 0.70710678118654752f, fabsf(z), 1.0f));
    const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f),
                                                1.421413741f), -0.284496736f), 0.254829592f);
    const float e = exp_approx(-0.5f * z * z);
    const float tail = 0.5f * poly * e;   // 1 - Phi(|z|)
    return fmaf(z, 0.39894228040143268f * e, z >= 0.0f ? 1.0f - tail : tail);
}
__device__ __forceinline__ float dact_gelu_tanh_fast(float z, float) {
    const float k = 0.79788456080286536f;
    const float th = tanh_approx(k * fmaf(0.044715f * z, z * z, z));
    const float du = k * fmaf(3.0f * 0.044715f * z, z, 1.0f);
    return fmaf(0.5f * z * (1.0f - th * th), du, 0.5f * (1.0f + th));
}
// s (1 - s) = e / (1 + e)^2
__device__ __forceinline__ float dact_sigmoid_fast(float z, float) {
    const float e = exp_approx(-fabsf(z)), r = rcp_approx(1.0f + e);
    return e * r * r;
}
// 1 - tanh^2 = 4 e^2 / (1 + e^2)^2
__device__ __forceinline__ float dact_tanh_fast(float z, float) {
    const float e = exp_approx(-2.0f * fabsf(z)), r = rcp_approx(1.0f + e);
    return 4.0f * e * r * r;
}
__device__ __forceinline__ float dact_silu_fast(float z, float) {
    const float s = sigmoid_approx(z);
    return s * fmaf(z, 1.0f - s, 1.0f);
}
__device__ __forceinline__ float dact_y_none_fast(float y, float s) { return dact_y_none(y, s); }
__device__ __forceinline__ float dact_y_relu_fast(float y, float s) { return dact_y_relu(y, s); }
__device__ __forceinline__ float dact_y_leaky_relu_fast(float y, float s) {
    return dact_y_leaky_relu(y, s);
}
__device__ __forceinline__ float dact_y_sigmoid_fast(float y, float s) {
    return dact_y_sigmoid(y, s);
}
__device__ __forceinline__ float dact_y_tanh_fast(float y, float s) { return dact_y_tanh(y, s); }

// The activations above, named by a constant (a kernel variant's, from its template's
// preamble) rather than by their functions' names.
enum class Act { none, relu, leaky_relu, gelu, gelu_tanh, sigmoid, tanh, silu };

// act(x) (the fast form with FAST; `slope` the leaky ReLU's).
template <Act A, bool FAST>
__device__ __forceinline__ float activation(float x, float slope) {
    if constexpr (A == Act::none) {
        return FAST ? act_none_fast(x, slope) : act_none(x, slope);
    } else if constexpr (A == Act::relu) {
        return FAST ? act_relu_fast(x, slope) : act_relu(x, slope);
    } else if constexpr (A == Act::leaky_relu) {
        return FAST ? act_leaky_relu_fast(x, slope) : act_leaky_relu(x, slope);
    } else if constexpr (A == Act::gelu) {
        return FAST ? act_gelu_fast(x, slope) : act_gelu(x, slope);
    } else if constexpr (A == Act::gelu_tanh) {
        return FAST ? act_gelu_tanh_fast(x, slope) : act_gelu_tanh(x, slope);
    } else if constexpr (A == Act::sigmoid) {
        return FAST ? act_sigmoid_fast(x, slope) : act_sigmoid(x, slope);
    } else if constexpr (A == Act::tanh) {
        return FAST ? act_tanh_fast(x, slope) : act_tanh(x, slope);
    } else {
        return FAST ? act_silu_fast(x, slope) : act_silu(x, slope);
    }
}

// act'(x), from the pre-activation z, or from the output y = act(z) with FROM_Y (only the
// activations whose derivative is a function of their output have that form).
template <Act A, bool FROM_Y, bool FAST>
__device__ __forceinline__ float derivative(float x, float slope) {
    if constexpr (FROM_Y) {
        if constexpr (A == Act::none) {
            return FAST ? dact_y_none_fast(x, slope) : dact_y_none(x, slope);
        } else if constexpr (A == Act::relu) {
            return FAST ? dact_y_relu_fast(x, slope) : dact_y_relu(x, slope);
        } else if constexpr (A == Act::leaky_relu) {
            return FAST ? dact_y_leaky_relu_fast(x, slope) : dact_y_leaky_relu(x, slope);
        } else if constexpr (A == Act::sigmoid) {
            return FAST ? dact_y_sigmoid_fast(x, slope) : dact_y_sigmoid(x, slope);
        } else {
            static_assert(A == Act::tanh, "no derivative of this activation from its output");
            return FAST ? dact_y_tanh_fast(x, slope) : dact_y_tanh(x, slope);
        }
    } else if constexpr (A == Act::none) {
        return FAST ? dact_none_fast(x, slope) : dact_none(x, slope);
    } else if constexpr (A == Act::relu) {
        return FAST ? dact_relu_fast(x, slope) : dact_relu(x, slope);
    } else if constexpr (A == Act::leaky_relu) {
        return FAST ? dact_leaky_relu_fast(x, slope) : dact_leaky_relu(x, slope);
    } else if constexpr (A == Act::gelu) {
        return FAST ? dact_gelu_fast(x, slope) : dact_gelu(x, slope);
    } else if constexpr (A == Act::gelu_tanh) {
        return FAST ? dact_gelu_tanh_fast(x, slope) : dact_gelu_tanh(x, slope);
    } else if constexpr (A == Act::sigmoid) {
        return FAST ? dact_sigmoid_fast(x, slope) : dact_sigmoid(x, slope);
    } else if constexpr (A == Act::tanh) {
        return FAST ? dact_tanh_fast(x, slope) : dact_tanh(x, slope);
    } else {
        return FAST ? dact_silu_fast(x, slope) : dact_silu(x, slope);
    }
}
