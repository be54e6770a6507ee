{#- Jinja macros that write one wgmma function of a given shape (imported, not included): the
    instruction's operand list grows with N, which C++ templates cannot spell. Each writes a
    plain C++ function; the kernels call it like any other. -#}
{% macro ss(name, n, ab, k=16, transposes=", 0, 0") -%}
// d (+)= A B, one k-step of m64n{{ n }}k{{ k }} ({{ ab }} inputs, float32 accumulators): A and B
// by shared-memory descriptors (transposed A, B: {{ transposes[2:] or "none" }}); `accumulate` 0
// overwrites d.
__device__ __forceinline__ void {{ name }}(float (&d)[{{ n // 2 }}], unsigned long long da,
                                           unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n // 2 + 2 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ n }}k{{ k }}.f32.{{ ab }}.{{ ab }} "
        "{ {% for i in range(n // 2) %}%{{ i }}{{ ", " if not loop.last }}{% endfor %} }, "
        "%{{ n // 2 }}, %{{ n // 2 + 1 }}, p, 1, 1{{ transposes }};\n}\n"
        : {% for i in range(n // 2) %}"+f"(d[{{ i }}]){{ ", " if not loop.last }}{% endfor %}
        : "l"(da), "l"(db), "r"(accumulate));
}
{%- endmacro %}

{% macro rs(name, n, ab, trans_b=1) -%}
// d (+)= A B, one k16 step of m64n{{ n }}k16 ({{ ab }} inputs, float32 accumulators): A from
// registers (a warp's 16 rows, mma.sync's A fragment layout), B by a shared-memory descriptor
// ({{ "N-major" if trans_b else "K-major" }}); `accumulate` 0 overwrites d.
__device__ __forceinline__ void {{ name }}(float (&d)[{{ n // 2 }}], const unsigned (&a)[4],
                                           unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ n // 2 + 5 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ n }}k16.f32.{{ ab }}.{{ ab }} "
        "{ {% for i in range(n // 2) %}%{{ i }}{{ ", " if not loop.last }}{% endfor %} }, "
        "{ %{{ n // 2 }}, %{{ n // 2 + 1 }}, %{{ n // 2 + 2 }}, %{{ n // 2 + 3 }} }, "
        "%{{ n // 2 + 4 }}, p, 1, 1, {{ trans_b }};\n}\n"
        : {% for i in range(n // 2) %}"+f"(d[{{ i }}]){{ ", " if not loop.last }}{% endfor %}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
{%- endmacro %}
