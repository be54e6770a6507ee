// The fused epilogue of every GEMM kernel family, as a C++ type: from the float32 accumulator
// of element (m, n),
//     z = alpha * acc (* A's row scale * B's column scale) (+ beta * C) (+ bias),
// or, with a gate, alpha * acc * act'(C) (the backward's dZ of a layer whose saved Z, or output
// with GATE_FROM_Y, C is); Y = act(z) (a gated linear unit: act(z of an even column) * z of the
// odd one after it; its backward: the pair (dH * linear * act'(gate), dH * act(gate)) from
// dH = alpha * acc and C's pair (gate, linear)), Z = z, and for 8-bit outputs Y scaled and its
// largest |Y| kept for the amax.
//
// What a variant has is fixed by the constants and types of its template's preamble
// (common/epilogue_constants.cuh): YType, CType, BiasType; ACT, FAST_ACT; SCALAR_BIAS,
// COL_BIAS, ROW_BIAS; HAS_C, C_ROW; SAVE_Z, GLU, GATE (GATE_ACT, GATE_FROM_Y), BGRAD,
// GLU_GRAD (GLU_GRAD_ACT); SCALED_INPUTS, SCALE_A_TENSOR, SCALE_A_ROWS, SCALE_B_TENSOR,
// SCALE_B_COLS, SCALE_Y, FP8_Y, AMAX; VEC_Y. The code of the others is discarded by
// `if constexpr`.

// Stand-ins for the kernel parameters of 8-bit inputs (the scales of A and B, Y's device
// scale, the amax, Y's host scale): a kernel that has them hides these with its own; in the
// others `epilogue()` takes these, and nothing reads them.
#pragma nv_diag_suppress 177   // (a stand-in the kernel's own hides is never referenced)
constexpr decltype(nullptr) scale_a = nullptr, scale_b = nullptr, scale_y = nullptr,
                            amax = nullptr;
constexpr long long scale_a_stride = 0, scale_b_stride = 0;
constexpr double y_scale_ = 1.0;
#pragma nv_diag_default 177

// A value the epilogue reads from memory itself (the default of the terms a caller may hold
// in registers instead: a row's or a column's scale, the C element).
struct FromMemory {};

// `value` where HELD, else FromMemory (a kernel whose variants hold a term in some cases).
template <bool HELD, typename V>
__device__ __forceinline__ auto held_if(V value) {
    if constexpr (HELD) {
        return value;
    } else {
        return FromMemory{};
    }
}

// A term: `value`, or what `read()` reads for FromMemory.
template <typename V, typename F>
__device__ __forceinline__ V given_or(V value, F) { return value; }
template <typename F>
__device__ __forceinline__ auto given_or(FromMemory, F read) { return read(); }

// The column scale of column c: col_scale(c) where the kernel holds it, else FromMemory.
template <typename CS>
__device__ __forceinline__ auto column_term(CS col_scale, int c) { return col_scale(c); }
__device__ __forceinline__ FromMemory column_term(FromMemory, int) { return {}; }

template <typename YT, typename CT, typename BT>
struct Epilogue {
    // The kernel's parameters (8-bit inputs' only in their kernels: else null).
    const CT* C;
    long long ldc;
    BT* bias;
    long long bias_stride;
    YT* Y;
    long long ldy;
    YT* Z;
    long long ldz;
    const float* scale_a;
    long long scale_a_stride;
    const float* scale_b;
    long long scale_b_stride;
    unsigned* amax;
    // The scalars: the sizes, alpha (with the 8-bit inputs' per-tensor scales), beta, the
    // leaky ReLU's slope, the inverse of Y's scale (FP8_Y), the largest |Y| so far (AMAX: its
    // bits; as unsigned integers the magnitudes of floats order as the floats, NaN above
    // infinity, so that a NaN wins) and the scalar bias (SCALAR_BIAS: load_scalar_bias).
    int M, N;
    float alpha, beta, leaky_slope;
    float y_scale;
    unsigned amax_bits;
    float bias_value;

    // The scalar bias into bias_value (SCALAR_BIAS; a kernel calls it where the load suits
    // its registers).
    __device__ __forceinline__ void load_scalar_bias() {
        if constexpr (SCALAR_BIAS) bias_value = to_f32(bias[0]);
    }

    // C(m, n) as stored (HAS_C).
    template <typename I>
    __device__ __forceinline__ const CT& c_at(I m, I n) const {
        return C_ROW ? C[static_cast<long long>(m) * ldc + n]
                     : C[static_cast<long long>(n) * ldc + m];
    }
    // The 8-bit inputs' scale of row m of A (SCALE_A_ROWS) and of column n of B (SCALE_B_COLS).
    template <typename I>
    __device__ __forceinline__ float scale_a_at(I m) const {
        return __ldg(&scale_a[static_cast<long long>(m) * scale_a_stride]);
    }
    template <typename I>
    __device__ __forceinline__ float scale_b_at(I n) const {
        return __ldg(&scale_b[static_cast<long long>(n) * scale_b_stride]);
    }

    // z of accumulator value `acc` at (m, n), with the column's and the row's bias values
    // (COL_BIAS, ROW_BIAS; the scalar is bias_value). The row's and the column's scales and
    // the C element are read from memory unless given (values the kernel holds). WITH_GATE
    // false: without a gate's factor (a kernel that applies it later, to a staged block).
    template <bool WITH_GATE = true, typename I, typename RS = FromMemory,
              typename CS = FromMemory, typename CV = FromMemory>
    __device__ __forceinline__ float z(float acc, I m, I n, float col_bias, float row_bias,
                                       RS row_scale = {}, CS col_scale = {}, CV c = {}) const {
        float out = alpha * acc;
        if constexpr (SCALE_A_ROWS) out = out * given_or(row_scale, [&] { return scale_a_at(m); });
        if constexpr (SCALE_B_COLS) out = out * given_or(col_scale, [&] { return scale_b_at(n); });
        if constexpr (GATE) {
            if constexpr (WITH_GATE) out *= gate_factor(to_f32(c_at(m, n)));
        } else if constexpr (HAS_C && !GLU_GRAD) {
            out = fmaf(beta, to_f32(given_or(c, [&] { return c_at(m, n); })), out);
        }
        if constexpr (SCALAR_BIAS) {
            out += bias_value;
        } else if constexpr (COL_BIAS) {
            out += col_bias;
        } else if constexpr (ROW_BIAS) {
            out += row_bias;
        }
        return out;
    }

    // The gate's factor act'(c) for a C value c.
    __device__ __forceinline__ float gate_factor(float c) const {
        return derivative<GATE_ACT, GATE_FROM_Y, FAST_ACT>(c, leaky_slope);
    }
    // Y of a gated linear unit from a pair of z values: act(gate) * linear.
    __device__ __forceinline__ float glu_value(float gate, float linear) const {
        return activation<ACT, FAST_ACT>(gate, leaky_slope) * linear;
    }
    // Y of z (not a gated linear unit's), finished as y_finish does.
    __device__ __forceinline__ float y_of(float z, bool valid) {
        float y = activation<ACT, FAST_ACT>(z, leaky_slope);
        y_finish(y, valid);
        return y;
    }
    // Counts y in the amax where `valid` (inside the output, not a clamped copy of an edge
    // element; AMAX) and scales it for its 8-bit type (FP8_Y).
    __device__ __forceinline__ void y_finish(float& y, bool valid) {
        if constexpr (AMAX) amax_bits = max(amax_bits, valid ? __float_as_uint(fabsf(y)) : 0u);
        if constexpr (FP8_Y) y *= y_scale;
    }
    // At the end of a kernel with an amax: the warp's largest |Y| to the amax (every lane of
    // the warp must get here).
    __device__ __forceinline__ void amax_store() {
        if constexpr (AMAX) {
            amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
            if (threadIdx.x % 32 == 0 && amax_bits != 0u) atomicMax(amax, amax_bits);
        }
    }

    // Z and Y of columns nb + c, c < W, of row m: z from acc(c) and col_bias(c, n) (n the
    // column, clamped to the last: columns past N are not stored), and the row's scale and
    // col_scale(c) where the kernel holds them; stored at `out` (Y, or a
    // slice of a split K) and Z: in one vector access each where VEC_Y and `vector_ok` hold,
    // else element by element up to column N. A gated linear unit's Y holds W / 2 values,
    // for columns nb / 2.. (nb even); its backward's, 2 W (columns 2 nb..).
    template <int W, typename I, typename Acc, typename ColBias, typename RS = FromMemory,
              typename CS = FromMemory>
    __device__ __forceinline__ void finish(YT* out, I m, I nb, bool vector_ok, Acc acc,
                                           ColBias col_bias, float row_bias, RS row_scale = {},
                                           CS col_scale = {}) {
        if constexpr (GLU_GRAD) {
            finish_glu_grad<W>(out, m, nb, acc, col_bias, row_bias);
        } else {
            constexpr int YW = GLU ? W / 2 : W;
            float zv[W], yv[YW];
#pragma unroll
            for (int c = 0; c < W; ++c) {
                const I n = min(nb + c, static_cast<I>(N - 1));
                zv[c] = z(acc(c), m, n, col_bias(c, n), row_bias, row_scale,
                          column_term(col_scale, c));
                if constexpr (!GLU) yv[c] = y_of(zv[c], nb + c < N);
            }
            if constexpr (GLU) {
#pragma unroll
                for (int c = 0; c < YW; ++c) yv[c] = glu_value(zv[2 * c], zv[2 * c + 1]);
            }
            store_yz<W>(out, m, nb, vector_ok, zv, yv);
        }
    }

  private:
    template <int W, typename I, int YW>
    __device__ __forceinline__ void store_yz(YT* out, I m, I nb, bool vector_ok,
                                             const float (&zv)[W], const float (&yv)[YW]) {
        const I y_col = GLU ? nb / 2 : nb;
        if constexpr (VEC_Y) {
            if (vector_ok) {
                if constexpr (YW == 1) {
                    store(&out[static_cast<long long>(m) * ldy + y_col], yv[0]);
                } else {
                    store_vec(&out[static_cast<long long>(m) * ldy + y_col], yv);
                }
                if constexpr (SAVE_Z) store_vec(&Z[static_cast<long long>(m) * ldz + nb], zv);
                return;
            }
        }
        if constexpr (GLU) {
#pragma unroll
            for (int c = 0; c < YW; ++c)
                if (nb + 2 * c < N)   // (N is even: the pair's second column is there too)
                    store(&out[static_cast<long long>(m) * ldy + y_col + c], yv[c]);
        }
#pragma unroll
        for (int c = 0; c < W; ++c) {
            if (nb + c < N) {
                if constexpr (!GLU) store(&out[static_cast<long long>(m) * ldy + nb + c], yv[c]);
                if constexpr (SAVE_Z) store(&Z[static_cast<long long>(m) * ldz + nb + c], zv[c]);
            }
        }
    }

    // A gated linear unit's backward: for columns n = nb + c of dH = alpha * acc(c), the
    // unit's pre-activations (gate, linear) = C at columns 2 n and the one after make dZ's
    // columns 2 n and the one after: dH * linear * act'(gate) and dH * act(gate), stored as a
    // pair (Y's rows are twice as wide).
    template <int W, typename I, typename Acc, typename ColBias>
    __device__ __forceinline__ void finish_glu_grad(YT* out, I m, I nb, Acc acc,
                                                    ColBias col_bias, float row_bias) {
#pragma unroll
        for (int c = 0; c < W; ++c) {
            const I n = nb + c;
            if (n < N) {
                const float d = z(acc(c), m, n, col_bias(c, n), row_bias);
                const float gate = to_f32(c_at(m, 2 * n)), lin = to_f32(c_at(m, 2 * n + 1));
                float v[2];
                v[0] = d * lin * derivative<GLU_GRAD_ACT, false, FAST_ACT>(gate, leaky_slope);
                v[1] = d * activation<GLU_GRAD_ACT, FAST_ACT>(gate, leaky_slope);
                YT* const y = &out[static_cast<long long>(m) * ldy + 2 * n];
                if constexpr (VEC_Y) {
                    store_vec(y, v);
                } else {
                    store(y, v[0]);
                    store(y + 1, v[1]);
                }
            }
        }
    }
};

// The epilogue of a kernel from its parameters (the 8-bit ones: its own or the stand-ins):
// alpha takes the per-tensor scales of 8-bit inputs, y_scale Y's device scale.
template <typename YT, typename CT, typename BT, typename SA, typename SB, typename SY,
          typename AM>
__device__ __forceinline__ Epilogue<YT, CT, BT> epilogue(
        const CT* C, long long ldc, BT* bias, long long bias_stride, YT* Y, long long ldy,
        YT* Z, long long ldz, long long M_, long long N_, double alpha_, double beta_,
        double leaky_slope_, SA scale_a, long long scale_a_stride, SB scale_b,
        long long scale_b_stride, SY scale_y, AM amax, double y_scale_) {
    Epilogue<YT, CT, BT> ep{C, ldc, bias, bias_stride, Y, ldy, Z, ldz};
    ep.M = static_cast<int>(M_);
    ep.N = static_cast<int>(N_);
    ep.alpha = static_cast<float>(alpha_);
    if constexpr (SCALE_A_TENSOR) ep.alpha = ep.alpha * scale_a[0];
    if constexpr (SCALE_B_TENSOR) ep.alpha = ep.alpha * scale_b[0];
    ep.beta = static_cast<float>(beta_);
    ep.leaky_slope = static_cast<float>(leaky_slope_);
    ep.y_scale = 1.0f;
    if constexpr (SCALED_INPUTS) {
        ep.scale_a = scale_a;
        ep.scale_a_stride = scale_a_stride;
        ep.scale_b = scale_b;
        ep.scale_b_stride = scale_b_stride;
        ep.amax = amax;
        if constexpr (FP8_Y) ep.y_scale = static_cast<float>(y_scale_);
        if constexpr (SCALE_Y) ep.y_scale = ep.y_scale / scale_y[0];
    }
    ep.amax_bits = 0u;
    ep.bias_value = 0.0f;
    return ep;
}
