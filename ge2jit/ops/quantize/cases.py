"""quantize_fp8's layout cases (``runtime.cases``): rows of ``n`` in each input type to each
format, per tensor and per row, with dynamic scales (and the amax) or given device scales."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import Case, host_dtype, normal, rng_for
from ...runtime.dtypes import as_fp8
from .op import quantize_fp8
from .reference import amax, dynamic_scale, quantize

ROWS = 3


def layout_cases(n: int) -> list[Case]:
    cases = []
    for dtype, fmt, per_row, given in (
            ("float32", "e4m3", False, False), ("bfloat16", "e4m3", True, False),
            ("float16", "e5m2", True, True), ("bfloat16", "e5m2", False, True)):
        rng = rng_for("quantize_fp8", n, dtype, fmt, per_row, given)
        x = normal(rng, (ROWS, n), host_dtype(dtype), 100.0)
        scale = dynamic_scale(amax(x, -1 if per_row else None), fmt).reshape(-1)
        arrays, outputs = {"x": x}, {"out": ((ROWS, n), as_fp8(fmt).numpy_dtype)}
        expected = {}
        if given:   # a device scale of its own: per row, or one element
            scale = (scale * np.float32(1.5)).astype(np.float32)
            arrays["scale"] = scale
        else:       # the dynamic scale, and max |x| for delayed scaling
            outputs["amax_out"] = ((1,), np.dtype(np.float32))
            expected["amax_out"] = amax(x).reshape(1)
            expected["scale"] = scale
        expected["out"] = quantize(x, scale if per_row else float(scale[0]), fmt)

        def run(a, fmt=fmt, per_row=per_row):
            q, s = quantize_fp8(a["x"], fmt=fmt, per_row=per_row, scale=a.get("scale"),
                                out=a.get("out"), amax_out=a.get("amax_out"))
            got = {"out": q, "amax_out": a.get("amax_out")}
            return got if "scale" in a else {**got, "scale": s.reshape(-1)}

        cases.append(Case(
            f"{dtype} -> {fmt}, {'per row' if per_row else 'per tensor'}, "
            f"{'given' if given else 'dynamic'} scale", arrays, run,
            {k: np.asarray(v).astype(np.float64) for k, v in expected.items()}, 0.0,
            outputs=outputs, transposed=frozenset({"x", "out"}),
            refused={"out": frozenset({"transposed"})},
            required=frozenset(outputs) - {"out"}))
    return cases
