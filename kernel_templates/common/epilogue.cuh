{# The fused epilogue, shared by every GEMM kernel family.
   compute_z emits `float <out> = alpha * acc (+ beta * C) (+ bias);` for element (m, n).
   In scope it needs: alpha, beta, C_AT (when the spec has C), and the bias value named by
   `col_bias` / `row_bias` / `bias_value`. #}
{% macro compute_z(spec, out, acc, m, n, col_bias="col_bias", row_bias="row_bias") %}
float {{ out }} = alpha * ({{ acc }});
{% if spec.layout_c %}
{{ out }} = fmaf(beta, C_AT({{ m }}, {{ n }}), {{ out }});
{% endif %}
{% if spec.bias.value == "scalarbias" %}
{{ out }} += bias_value;
{% elif spec.bias.value == "colbias" %}
{{ out }} += {{ col_bias }};
{% elif spec.bias.value == "rowbias" %}
{{ out }} += {{ row_bias }};
{% endif %}
{% endmacro %}

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

{% macro c_accessor(spec) %}
{% if spec.layout_c and spec.layout_c.value == "r" %}
#define C_AT(m, n) C[(long long)(m) * ldc + (n)]
{% elif spec.layout_c %}
#define C_AT(m, n) C[(long long)(n) * ldc + (m)]
{% endif %}
{% endmacro %}

{# The parameter list every GEMM kernel family takes, in the order the launcher packs them
   (ge2jit/ops/gemm/op.py, _GEMM_PARAMS): every parameter is 8 bytes. #}
{% macro gemm_params(spec) %}
{{ spec.kernel_name }}(const float* __restrict__ A, long long lda,
                       const float* __restrict__ B, long long ldb,
                       const float* __restrict__ C, long long ldc,
                       const float* __restrict__ bias, long long bias_stride,
                       float* __restrict__ Y, long long ldy,
                       float* __restrict__ Z, long long ldz,
                       long long M_, long long N_, long long K_,
                       double alpha_, double beta_, double leaky_slope_,
                       long long k_tiles_per_split)
{% endmacro %}
