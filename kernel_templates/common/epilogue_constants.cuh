{# The preamble of a GEMM kernel's epilogue: the types and constants of its variant (`spec`: a
   kernel spec with an `epilogue` and the inputs' `dtype`), which common/epilogue.cuh's
   Epilogue reads. `vec_y`: Y and Z may be stored in vector accesses. #}
{% macro constants(spec) %}
{% set e = spec.epilogue %}
{% set scaled = spec.dtype.is_fp8 %}
{% macro flag(value) %}{{ "true" if value else "false" }}{% endmacro %}
#pragma nv_diag_suppress 177   // (a constant only other variants' code reads is never referenced)
using YType = {{ e.y_ctype }};   // Y and Z
using CType = {{ (e.c_dtype or spec.dtype).ctype }};   // C (beta's term, a gate's input, a gated linear unit's Z)
using BiasType = {{ "float" if e.bgrad else "const " ~ (e.bias_dtype or spec.dtype).ctype }};   // (bgrad: the float32 column sums written in its place)
constexpr Act ACT = Act::{{ e.act.value }};
constexpr bool FAST_ACT = {{ flag(spec.fast_act) }};   // the fast activations (16-bit outputs)
constexpr bool SCALAR_BIAS = {{ flag(e.bias.value == "scalarbias") }};
constexpr bool COL_BIAS = {{ flag(e.bias.value == "colbias") }};
constexpr bool ROW_BIAS = {{ flag(e.bias.value == "rowbias") }};
constexpr bool HAS_C = {{ flag(e.has_c) }};
constexpr bool C_ROW = {{ flag(e.layout_c and e.layout_c.value == "r") }};   // C row-major, else column-major
constexpr bool SAVE_Z = {{ flag(e.save_z) }};
constexpr bool GLU = {{ flag(e.glu) }};   // a gated linear unit: Y = act(Z[:, 0::2]) * Z[:, 1::2]
constexpr bool GATE = {{ flag(e.gate) }};   // Y = alpha * A @ B * act'(C)
constexpr Act GATE_ACT = Act::{{ e.gate.value if e.gate else "none" }};
constexpr bool GATE_FROM_Y = {{ flag(e.gate_from_y) }};   // act' from its output
constexpr bool BGRAD = {{ flag(e.bgrad) }};   // column sums of the gated Y
constexpr bool GLU_GRAD = {{ flag(e.glu_grad) }};   // a gated linear unit's backward (Y: dZ, C: Z)
constexpr Act GLU_GRAD_ACT = Act::{{ e.glu_grad.value if e.glu_grad else "none" }};
constexpr bool SCALED_INPUTS = {{ flag(scaled) }};   // 8-bit inputs (their scales' parameters)
constexpr bool SCALE_A_TENSOR = {{ flag(scaled and e.scale_a.value == "t") }};
constexpr bool SCALE_A_ROWS = {{ flag(e.scale_a.value == "r") }};
constexpr bool SCALE_B_TENSOR = {{ flag(scaled and e.scale_b.value == "t") }};
constexpr bool SCALE_B_COLS = {{ flag(e.scale_b.value == "c") }};
constexpr bool FP8_Y = {{ flag(e.out_dtype.is_fp8) }};   // Y scaled for its 8-bit type
constexpr bool SCALE_Y = {{ flag(scaled and e.scale_y) }};   // ... by a device scale too
constexpr bool AMAX = {{ flag(e.amax) }};
constexpr bool VEC_Y = {{ flag(spec.vec_y) }};
#pragma nv_diag_default 177
{% endmacro %}
