"""cross_entropy's layout cases (``runtime.cases``): the loss and its gradient over ``n``
classes, in each logits type, with ignored rows, label smoothing and both index types."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import ROUNDING, Case, host_dtype, normal, rng_for
from .op import cross_entropy
from .reference import cross_entropy_grad_ref, cross_entropy_ref

ROWS = 4


def layout_cases(n: int) -> list[Case]:
    cases = []
    for dtype, targets, reduction, smoothing in (
            ("float32", "int64", "mean", 0.1), ("float16", "int32", "sum", 0.0),
            ("bfloat16", "int64", "mean", 0.0), ("bfloat16", "int32", "none", 0.2)):
        rng = rng_for("cross_entropy", n, dtype, reduction)
        x = normal(rng, (ROWS, n), host_dtype(dtype), 3.0)
        t = rng.integers(0, n, ROWS).astype(targets)
        t[1] = -100   # an ignored row
        x64 = x.astype(np.float64)
        kw = dict(reduction=reduction, label_smoothing=smoothing)

        def run(a, kw=kw):
            loss, grad = cross_entropy(a["logits"], a["targets"], grad=True,
                                       out=a.get("out"), **kw)
            return {"loss": loss, "out": grad}

        tol = 64 * ROUNDING[dtype]
        cases.append(Case(
            f"{dtype} logits, {targets} targets, {reduction}, smoothing {smoothing}",
            {"logits": x, "targets": t}, run,
            {"loss": np.asarray(cross_entropy_ref(x64, t, **kw)),
             "out": cross_entropy_grad_ref(x64, t, **kw)},
            {"loss": 64 * ROUNDING["float32"] * max(1.0, np.log(n)), "out": tol},
            outputs={"out": ((ROWS, n), host_dtype(dtype))},
            transposed=frozenset({"logits", "out"}),
            refused={"out": frozenset({"transposed"})}))
    return cases
