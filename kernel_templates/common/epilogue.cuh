{# The fused epilogue, shared by every GEMM kernel family.
   compute_z emits `float <out> = alpha * acc (+ beta * C) (+ bias);` for element (m, n), or,
   for a spec with a gate, `alpha * acc * gate'(C)` (the derivative from Z, or from Y when
   gate_from_y: the backward's dZ of the layer whose saved Z or output C is).
   In scope it needs: alpha, beta, C_AT (when the spec has C; `c_value`, an expression, gives
   the C element instead), the bias value named by `col_bias` / `row_bias` / `bias_value`, and
   the per-row and per-column scales of 8-bit inputs: `row_scale` / `col_scale` (expressions)
   where given, else SCALE_A_AT / SCALE_B_AT. #}
{% macro compute_z(spec, out, acc, m, n, col_bias="col_bias", row_bias="row_bias", gate=True, c_value=None, row_scale=None, col_scale=None) %}
float {{ out }} = alpha * ({{ acc }}){{ scale_factors(spec, m, n, row_scale, col_scale) }};
{% if spec.epilogue.gate %}
{% if gate %}
{{ out }} *= {{ gate_factor(spec, "to_f32(C_AT(" ~ m ~ ", " ~ n ~ "))") }};
{% endif %}
{% elif spec.epilogue.layout_c and not spec.epilogue.glu_grad %}
{{ out }} = fmaf(beta, to_f32({{ c_value or "C_AT(" ~ m ~ ", " ~ n ~ ")" }}), {{ out }});
{% endif %}
{% if spec.epilogue.bias.value == "scalarbias" %}
{{ out }} += bias_value;
{% elif spec.epilogue.bias.value == "colbias" %}
{{ out }} += {{ col_bias }};
{% elif spec.epilogue.bias.value == "rowbias" %}
{{ out }} += {{ row_bias }};
{% endif %}
{% endmacro %}

{# act'(x) for an expression x (from the output y = act(z) with from_y; the fast forms with
   fast), ``slope`` the leaky ReLU's: common/activations.cuh's dact_ functions. #}
{% macro dact(act, x, slope, from_y=False, fast=False) -%}
dact_{{ "y_" if from_y }}{{ act.value }}{{ "_fast" if fast }}({{ x }}, {{ slope }})
{%- endmacro %}

{# The gate's factor act'(c) for a C value c (an expression): the fast forms for 16-bit
   outputs, as the activations. #}
{% macro gate_factor(spec, c) -%}
{{ dact(spec.epilogue.gate, c, "leaky_slope", spec.epilogue.gate_from_y, spec.fast_act) }}
{%- endmacro %}

{% macro accessors(spec) %}
{% if spec.layout_a.value == "r" %}
#define A_AT(m, k) A[(long long)(m) * lda + (k)]
{% else %}
#define A_AT(m, k) A[(long long)(k) * lda + (m)]
{% endif %}
{% if spec.layout_b.value == "r" %}
#define B_AT(k, n) B[(long long)(k) * ldb + (n)]
{% else %}
#define B_AT(k, n) B[(long long)(n) * ldb + (k)]
{% endif %}
{{ c_accessor(spec) }}
{% endmacro %}

{# The factors of the 8-bit inputs' per-row and per-column scales of element (m, n), to
   multiply a product by (per-tensor scales are in alpha): `row_scale` / `col_scale` where
   given (expressions: values the kernel holds), else read with SCALE_A_AT / SCALE_B_AT. #}
{% macro scale_factors(spec, m, n, row_scale=None, col_scale=None) -%}
{% if spec.epilogue.scale_a.value == "r" %} * {{ row_scale or "SCALE_A_AT(" ~ m ~ ")" }}{% endif %}
{%- if spec.epilogue.scale_b.value == "c" %} * {{ col_scale or "SCALE_B_AT(" ~ n ~ ")" }}{% endif %}
{%- endmacro %}

{# The largest |Y| (its bits: as unsigned integers the magnitudes of floats order as the
   floats, NaN above infinity, so that a NaN wins) in `amax_bits`, counting `y` where `valid`
   (an expression: inside the output, not a clamped copy of an edge element), and Y scaled for
   its 8-bit type, of the expression `y` (an lvalue) where the spec asks. #}
{% macro y_finish(spec, y, valid) %}
{% if spec.epilogue.amax %}
amax_bits = max(amax_bits, ({{ valid }}) ? __float_as_uint(fabsf({{ y }})) : 0u);
{% endif %}
{% if spec.epilogue.out_dtype.is_fp8 %}
{{ y }} *= y_scale;
{% endif %}
{% endmacro %}

{# At the end of a kernel with an amax: the warp's largest |Y| to the amax (every lane of the
   warp must get here). #}
{% macro amax_store(spec) %}
{% if spec.epilogue.amax %}
amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
if (threadIdx.x % 32 == 0 && amax_bits != 0u) atomicMax(amax, amax_bits);
{% endif %}
{% endmacro %}

{% macro c_accessor(spec) %}
{% if spec.epilogue.scale_a.value == "r" %}
#define SCALE_A_AT(m) __ldg(&scale_a[(long long)(m) * scale_a_stride])
{% endif %}
{% if spec.epilogue.scale_b.value == "c" %}
#define SCALE_B_AT(n) __ldg(&scale_b[(long long)(n) * scale_b_stride])
{% endif %}
{% if spec.epilogue.layout_c and spec.epilogue.layout_c.value == "r" %}
#define C_AT(m, n) C[(long long)(m) * ldc + (n)]
{% elif spec.epilogue.layout_c %}
#define C_AT(m, n) C[(long long)(n) * ldc + (m)]
{% endif %}
{% endmacro %}

{# The int and float32 locals of the kernel parameters M_, N_, K_, alpha_, beta_ and
   leaky_slope_ (the spec's `params`); with 8-bit inputs (`spec` given), alpha holds the
   per-tensor scales of A and B, `y_scale` the inverse of Y's scale, `amax_bits` the largest
   |Y| so far. #}
{% macro scalars(sizes=True, spec=None) %}
{% if sizes %}
const int M = static_cast<int>(M_), N = static_cast<int>(N_), K = static_cast<int>(K_);
{% endif %}
{% set ep = spec.epilogue if spec is not none and spec.dtype.is_fp8 else none %}
const float alpha = static_cast<float>(alpha_){% if ep and ep.scale_a.value == "t" %} * scale_a[0]{% endif %}{% if ep and ep.scale_b.value == "t" %} * scale_b[0]{% endif %}, beta = static_cast<float>(beta_);
const float leaky_slope = static_cast<float>(leaky_slope_);
{% if ep and ep.out_dtype.is_fp8 %}
const float y_scale = static_cast<float>(y_scale_){% if ep.scale_y %} / scale_y[0]{% endif %};
{% endif %}
{% if ep and ep.amax %}
unsigned amax_bits = 0u;
{% endif %}
{% endmacro %}

{# Stores yv[0..width) (and zv) at row m, columns nb.., of Y (and Z): in one vector access
   when the spec allows it and `vector_ok` holds, else element by element up to column N.
   A gated linear unit's (spec.epilogue.glu) Y holds width / 2 values, for columns nb / 2..
   of Y. Inside a loop: the vector path ends the iteration with `continue`. #}
{% macro store_yz(spec, width, vector_ok, m="m", nb="nb") %}
{% set glu = spec.epilogue.glu %}
{% set y_width = width // 2 if glu else width %}
{% set y_col = "(" ~ nb ~ ") / 2" if glu else nb %}
{% if spec.vec_y %}
if ({{ vector_ok }}) {
{% if y_width == 1 %}
    store(&Y[static_cast<long long>({{ m }}) * ldy + {{ y_col }}], yv[0]);
{% else %}
    store_vec(&Y[static_cast<long long>({{ m }}) * ldy + {{ y_col }}], yv);
{% endif %}
{% if spec.epilogue.save_z %}
    store_vec(&Z[static_cast<long long>({{ m }}) * ldz + {{ nb }}], zv);
{% endif %}
    continue;
}
{% endif %}
{% if glu %}
#pragma unroll
for (int c = 0; c < {{ y_width }}; ++c)
    if ({{ nb }} + 2 * c < N)   // (N is even: the pair's second column is there too)
        store(&Y[static_cast<long long>({{ m }}) * ldy + {{ y_col }} + c], yv[c]);
{% endif %}
#pragma unroll
for (int c = 0; c < {{ width }}; ++c) {
    if ({{ nb }} + c < N) {
{% if not glu %}
        store(&Y[static_cast<long long>({{ m }}) * ldy + {{ nb }} + c], yv[c]);
{% endif %}
{% if spec.epilogue.save_z %}
        store(&Z[static_cast<long long>({{ m }}) * ldz + {{ nb }} + c], zv[c]);
{% endif %}
    }
}
{% endmacro %}

{# The output of a gated linear unit from a pair of Z values: act(gate) * linear. #}
{% macro glu_value(spec, gate, linear) -%}
act_{{ spec.epilogue.act.value }}{{ "_fast" if spec.fast_act else "" }}({{ gate }}, leaky_slope) * ({{ linear }})
{%- endmacro %}

{# zv[c], yv[c] for columns nb + c, c < width, of row m: Z and act(Z), from accumulator `acc`
   (an expression of c), then stored with store_yz. A gated linear unit's yv holds width / 2
   values: act(Z) of each even column times Z of the odd one after it (nb is even). #}
{% macro finish(spec, width, acc, col_bias, vector_ok, m="m", nb="nb", row_scale=None, col_scale=None) %}
{% if spec.epilogue.glu_grad %}
{{ finish_glu_grad(spec, width, acc, m, nb) }}
{% else %}
float zv[{{ width }}], yv[{{ width // 2 if spec.epilogue.glu else width }}];
#pragma unroll
for (int c = 0; c < {{ width }}; ++c) {
    const auto n = min({{ nb }} + c, N - 1);   // clamped: columns past N are not stored
    {{ compute_z(spec, "z", acc, m, "n", col_bias, "row_bias", row_scale=row_scale, col_scale=col_scale) | indent(4) }}
    zv[c] = z;
{% if not spec.epilogue.glu %}
    yv[c] = act_{{ spec.epilogue.act.value }}{{ "_fast" if spec.fast_act else "" }}(z, leaky_slope);
    {{ y_finish(spec, "yv[c]", nb ~ " + c < N") | indent(4) }}
{% endif %}
}
{% if spec.epilogue.glu %}
#pragma unroll
for (int c = 0; c < {{ width // 2 }}; ++c) yv[c] = {{ glu_value(spec, "zv[2 * c]", "zv[2 * c + 1]") }};
{% endif %}
{{ store_yz(spec, width, vector_ok, m, nb) }}
{% endif %}
{%- endmacro %}

{# A gated linear unit's backward (spec.epilogue.glu_grad): for columns nb + c, c < width, of
   row m, dH = alpha * acc and the unit's pre-activations (gate, linear) = C at columns
   2 (nb + c) and the one after make Y's (dZ's) columns 2 (nb + c) and the one after:
   dH * linear * act'(gate) and dH * act(gate), stored as pairs (Y's rows are twice as wide). #}
{% macro finish_glu_grad(spec, width, acc, m, nb) %}
{% set act = spec.epilogue.glu_grad %}
#pragma unroll
for (int c = 0; c < {{ width }}; ++c) {
    const auto n = {{ nb }} + c;
    if (n < N) {
        {{ compute_z(spec, "d", acc, m, "n") | indent(8) }}
        const float gate = to_f32(C_AT({{ m }}, 2 * n)), lin = to_f32(C_AT({{ m }}, 2 * n + 1));
        float v[2];
        v[0] = d * lin * {{ dact(act, "gate", "leaky_slope", False, spec.fast_act) }};
        v[1] = d * act_{{ act.value }}{{ "_fast" if spec.fast_act else "" }}(gate, leaky_slope);
        auto* const y = &Y[static_cast<long long>({{ m }}) * ldy + 2 * n];
{% if spec.vec_y %}
        store_vec(y, v);
{% else %}
        store(y, v[0]);
        store(y + 1, v[1]);
{% endif %}
    }
}
{%- endmacro %}
