"""The GEMM family's layout cases (``runtime.cases``): gemm_bias_act (32-bit, 16-bit and 8-bit
operands), its backward, and the gated GEMM forward and backward, each with N, K or M of
``n``, a bias, a residual C and the saved pre-activation."""

from __future__ import annotations

from ...runtime.cases import ROUNDING, Case, host_dtype, normal, rng_for
from .backward import gemm_bias_act_backward
from .gated import gemm_gated, gemm_gated_backward
from .op import gemm_bias_act
from .reference import (
    gemm_bias_act_backward_ref,
    gemm_bias_act_ref,
    gemm_gated_backward_ref,
    gemm_gated_ref,
)

ALPHA, BETA = 0.75, 0.5
#: outputs are row-major (rows of a wider array allowed): a column-major one is refused
REFUSED = frozenset({"transposed"})


def _shapes(n: int) -> tuple[tuple[int, int, int], ...]:
    """(M, N, K) with each of N, K and M in turn ``n``."""
    return (29, n, 24), (21, 40, n), (n, 24, 17)


def _tol(dtype: str, out: str) -> float:
    """Float32 sums (every 128 of K for 8-bit operands), the result rounded once to ``out``:
    relative to the result's largest element."""
    sums = 2.0 ** -11 if dtype.startswith("float8") else 64 * ROUNDING["float32"]
    return sums + 4 * ROUNDING[out]


def forward_cases(n: int) -> list[Case]:
    cases = []
    for dtype in ("float32", "bfloat16", "float8_e4m3fn"):
        out_t = "bfloat16" if dtype.startswith("float8") else dtype
        side_t = "bfloat16" if dtype.startswith("float8") else dtype
        for m, nn, k in _shapes(n)[: 2 if dtype.startswith("float8") else 3]:
            rng = rng_for("gemm_bias_act", n, dtype, m, nn, k)
            arrays = {"a": normal(rng, (m, k), host_dtype(dtype)),
                      "b": normal(rng, (k, nn), host_dtype(dtype)),
                      "c": normal(rng, (m, nn), host_dtype(side_t)),
                      "bias": normal(rng, nn, host_dtype("float32"))}
            y, z = gemm_bias_act_ref(arrays["a"], arrays["b"], arrays["bias"], act="gelu",
                                     c=arrays["c"], alpha=ALPHA, beta=BETA)

            def run(x):
                y, z = gemm_bias_act(x["a"], x["b"], x["bias"], act="gelu", c=x["c"],
                                     alpha=ALPHA, beta=BETA, save_preact=True,
                                     out=x.get("out"), preact_out=x.get("preact_out"))
                return {"out": y, "preact_out": z}

            cases.append(Case(
                f"{dtype} {m}x{nn}x{k}", arrays, run, {"out": y, "preact_out": z},
                _tol(dtype, out_t),
                outputs={"out": ((m, nn), host_dtype(out_t)),
                         "preact_out": ((m, nn), host_dtype(out_t))},
                transposed=frozenset({"a", "b", "c", "out", "preact_out"}),
                refused={"out": REFUSED, "preact_out": REFUSED}))
    return cases


def backward_cases(n: int) -> list[Case]:
    cases = []
    for dtype in ("float32", "bfloat16"):
        for m, nn, k in _shapes(n):
            rng = rng_for("gemm_bias_act_backward", n, dtype, m, nn, k)
            t = host_dtype(dtype)
            arrays = {"gy": normal(rng, (m, nn), t), "a": normal(rng, (m, k), t),
                      "b": normal(rng, (k, nn), t), "c": normal(rng, (m, nn), t),
                      "bias": normal(rng, nn, t)}
            _, z = gemm_bias_act_ref(arrays["a"], arrays["b"], arrays["bias"], act="gelu",
                                     c=arrays["c"], alpha=ALPHA, beta=BETA)
            arrays["z"] = z.astype(t)
            da, db, dbias, dc = gemm_bias_act_backward_ref(
                arrays["gy"], arrays["a"], arrays["b"], arrays["bias"], act="gelu",
                c=arrays["c"], alpha=ALPHA, beta=BETA)

            def run(x):
                g = gemm_bias_act_backward(x["gy"], x["a"], x["b"], x["bias"], act="gelu",
                                           z=x["z"], c=x["c"], alpha=ALPHA, beta=BETA)
                return {"da": g.a, "db": g.b, "dbias": g.bias, "dc": g.c}

            # act'(z) is taken of the stored z (rounded to the type), the reference's of the
            # exact one: a 16-bit z moves dZ by about its rounding
            tol = _tol(dtype, dtype) + 4 * ROUNDING[dtype]
            cases.append(Case(
                f"{dtype} {m}x{nn}x{k}", arrays, run,
                {"da": da, "db": db, "dbias": dbias, "dc": dc}, tol,
                transposed=frozenset({"gy", "a", "b", "c", "z"})))
    return cases


def gated_cases(n: int) -> list[Case]:
    cases = []
    for dtype in ("float32", "bfloat16"):
        for m, nn, k in _shapes(n):
            rng = rng_for("gemm_gated", n, dtype, m, nn, k)
            t = host_dtype(dtype)
            arrays = {"a": normal(rng, (m, k), t), "b": normal(rng, (k, 2 * nn), t),
                      "bias": normal(rng, 2 * nn, host_dtype("float32"))}
            y, z = gemm_gated_ref(arrays["a"], arrays["b"], arrays["bias"], act="silu",
                                  alpha=ALPHA)

            def run(x):
                y, z = gemm_gated(x["a"], x["b"], x["bias"], act="silu", alpha=ALPHA,
                                  save_preact=True, out=x.get("out"),
                                  preact_out=x.get("preact_out"))
                return {"out": y, "preact_out": z}

            cases.append(Case(
                f"{dtype} {m}x{nn}x{k}", arrays, run, {"out": y, "preact_out": z},
                2 * _tol(dtype, dtype),
                outputs={"out": ((m, nn), t), "preact_out": ((m, 2 * nn), t)},
                transposed=frozenset({"a", "b", "out", "preact_out"}),
                refused={"out": REFUSED, "preact_out": REFUSED}))
    return cases


def gated_backward_cases(n: int) -> list[Case]:
    cases = []
    for dtype in ("float32", "bfloat16"):
        for m, nn, k in _shapes(n):
            rng = rng_for("gemm_gated_backward", n, dtype, m, nn, k)
            t = host_dtype(dtype)
            arrays = {"gy": normal(rng, (m, nn), t), "a": normal(rng, (m, k), t),
                      "b": normal(rng, (k, 2 * nn), t), "bias": normal(rng, 2 * nn, t)}
            _, z = gemm_gated_ref(arrays["a"], arrays["b"], arrays["bias"], act="silu",
                                  alpha=ALPHA)
            arrays["z"] = z.astype(t)
            da, db, dbias = gemm_gated_backward_ref(arrays["gy"], arrays["a"], arrays["b"],
                                                    arrays["bias"], act="silu", alpha=ALPHA)

            def run(x):
                g = gemm_gated_backward(x["gy"], x["a"], x["b"], x["bias"], act="silu",
                                        z=x["z"], alpha=ALPHA)
                return {"da": g.a, "db": g.b, "dbias": g.bias}

            cases.append(Case(
                f"{dtype} {m}x{nn}x{k}", arrays, run, {"da": da, "db": db, "dbias": dbias},
                2 * _tol(dtype, dtype) + 8 * ROUNDING[dtype],
                transposed=frozenset({"gy", "a", "b", "z"})))
    return cases
