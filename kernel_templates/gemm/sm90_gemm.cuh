// Plain C++ helpers of the Hopper GEMM (gemm/wgmma.cu) that do not depend on its variant:
// the activations picked by a constant, and the kernel parameters only some variants have.

// The activations of common/activations.cuh, named by a constant (the variant's, from the
// template's preamble) rather than by their function's name.
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

// Stand-ins for the names that only some variants have: the TMA maps of Y and Z (TMA stores)
// and of C (C through the ring), and 8-bit inputs' scales and amax (kernel parameters), and
// Y's scale and the amax so far (locals of the epilogue's scalars). Where the kernel has one,
// its parameter or local of that name hides the stand-in; else the kernel's set-up, which
// names them all in every variant, finds these, and the variant never reads them.
#pragma nv_diag_suppress 177   // (a stand-in the kernel's own hides is never referenced)
constexpr decltype(nullptr) tma_y = nullptr, tma_z = nullptr, tma_c = nullptr;
constexpr decltype(nullptr) scale_a = nullptr, scale_b = nullptr, amax = nullptr;
constexpr long long scale_a_stride = 0, scale_b_stride = 0;
constexpr float y_scale = 1.0f;
constexpr unsigned amax_bits = 0u;
#pragma nv_diag_default 177

// The generic address of a tensor map parameter (__grid_constant__: the TMA reads it where
// the kernel's parameters are), or null for a stand-in.
__device__ __forceinline__ const TensorMap* map_address(const TensorMap& map) { return &map; }
__device__ __forceinline__ const TensorMap* map_address(decltype(nullptr)) { return nullptr; }
