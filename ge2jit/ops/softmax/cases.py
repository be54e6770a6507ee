"""softmax's and softmax_backward's layout cases (``runtime.cases``): rows of ``n`` along the
last axis, in each type, and a 16-bit input with a float32 result."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import FLOATS, ROUNDING, Case, host_dtype, normal, rng_for
from .op import softmax, softmax_backward
from .reference import softmax_backward_ref, softmax_ref

ROWS = 3
#: (input type, result type) of the cases
TYPES = (*((d, d) for d in FLOATS), ("bfloat16", "float32"))


def forward_cases(n: int) -> list[Case]:
    cases = []
    for dtype, out_dtype in TYPES:
        x = normal(rng_for("softmax", n, dtype, out_dtype), (ROWS, n), host_dtype(dtype), 4.0)

        def run(a):
            return {"out": softmax(a["x"], out=a.get("out"))}

        cases.append(Case(
            f"{dtype} -> {out_dtype}", {"x": x}, run, {"out": softmax_ref(x.astype(np.float64))},
            16 * ROUNDING[out_dtype] + 2.0 ** -17,
            outputs={"out": ((ROWS, n), host_dtype(out_dtype))},
            transposed=frozenset({"x", "out"}), required=_required(dtype, out_dtype)))
    return cases


def _required(dtype: str, out_dtype: str) -> frozenset[str]:
    """A result type other than the input's is asked for by giving ``out``."""
    return frozenset({"out"} if dtype != out_dtype else ())


def backward_cases(n: int) -> list[Case]:
    cases = []
    for dtype, out_dtype in TYPES:
        rng = rng_for("softmax_backward", n, dtype, out_dtype)
        y = softmax_ref(normal(rng, (ROWS, n), np.float64, 4.0)).astype(host_dtype(dtype))
        dy = normal(rng, (ROWS, n), host_dtype(dtype))

        def run(a):
            return {"out": softmax_backward(a["dy"], a["y"], out=a.get("out"))}

        ref = softmax_backward_ref(dy.astype(np.float64), y.astype(np.float64))
        cases.append(Case(
            f"{dtype} -> {out_dtype}", {"dy": dy, "y": y}, run, {"out": ref},
            64 * ROUNDING[out_dtype] + 2.0 ** -15,
            outputs={"out": ((ROWS, n), host_dtype(out_dtype))},
            transposed=frozenset({"dy", "y", "out"}), required=_required(dtype, out_dtype)))
    return cases
