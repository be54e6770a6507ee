"""rms_norm's and layer_norm's layout cases (``runtime.cases``), forward and backward: rows of
``n`` with a weight (and bias), a residual stream and the saved statistics, in each type."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import ROUNDING, Case, host_dtype, normal, rng_for
from .op import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from .reference import (
    layer_norm_backward_ref,
    layer_norm_ref,
    rms_norm_backward_ref,
    rms_norm_ref,
)

ROWS = 3
EPS = 1e-5
#: (x's type, the weight's type, h's type: the residual stream's) of the cases
TYPES = (("float32", "float32", "float32"), ("float16", "float16", "float32"),
         ("bfloat16", "float32", "bfloat16"))
#: the statistics (float32 sums of float32 values), relative to their largest
STATS_TOL = 2.0 ** -16


#: outputs are written as rows along a unit-stride axis: a column-major one is refused
REFUSED = frozenset({"transposed"})


def forward_cases(kind: str):
    layer = kind == "layer"

    def cases(n: int) -> list[Case]:
        out = []
        for x_t, w_t, h_t in TYPES:
            rng = rng_for(kind, n, x_t)
            x = normal(rng, (ROWS, n), host_dtype(x_t), 2.0)
            res = normal(rng, (ROWS, n), host_dtype(h_t))
            arrays = {"x": x, "residual": res, "weight": normal(rng, n, host_dtype(w_t))}
            if layer:
                arrays["bias"] = normal(rng, n, host_dtype(w_t))
                y, h, mean, rstd = layer_norm_ref(x, arrays["weight"], arrays["bias"], eps=EPS,
                                                  residual=res)
            else:
                y, h, rstd = rms_norm_ref(x, arrays["weight"], eps=EPS, residual=res)

            def run(a):
                kw = {k: a[k] for k in ("residual", "out", "residual_out") if k in a}
                if layer:
                    r = layer_norm(a["x"], a["weight"], a["bias"], eps=EPS, save_stats=True,
                                   **kw)
                else:
                    r = rms_norm(a["x"], a["weight"], eps=EPS, save_stats=True, **kw)
                got = {"out": r.y, "residual_out": r.h, "rstd": r.rstd}
                return {**got, "mean": r.mean} if layer else got

            expected = {"out": y, "residual_out": h, "rstd": rstd}
            tol = {"out": 32 * ROUNDING[x_t] + STATS_TOL, "residual_out": 0.0,
                   "rstd": STATS_TOL, "mean": STATS_TOL}
            magnitude = {}
            if layer:
                expected["mean"] = mean
                # the mean of terms that cancel: its float32 sum's error is the terms' size
                magnitude["mean"] = float(np.abs(np.asarray(h, np.float64)).max())
            out.append(Case(
                f"x {x_t}, weight {w_t}, residual {h_t}", arrays, run, expected, tol,
                outputs={"out": ((ROWS, n), host_dtype(x_t)),
                         "residual_out": ((ROWS, n), host_dtype(h_t))},
                transposed=frozenset({"x", "residual", "out", "residual_out"}),
                refused={"out": REFUSED, "residual_out": REFUSED}, magnitude=magnitude))
        return out

    return cases


def backward_cases(kind: str):
    layer = kind == "layer"

    def cases(n: int) -> list[Case]:
        out = []
        for x_t, w_t, h_t in TYPES:
            rng = rng_for(f"{kind}_backward", n, x_t)
            h = normal(rng, (ROWS, n), host_dtype(h_t), 2.0)
            arrays = {"dy": normal(rng, (ROWS, n), host_dtype(x_t)), "h": h,
                      "weight": normal(rng, n, host_dtype(w_t)),
                      "dh": normal(rng, (ROWS, n), host_dtype(h_t))}
            if layer:
                _, _, mean, rstd = layer_norm_ref(h, eps=EPS)
                arrays["mean"] = mean.astype(np.float32)
                dx, dw, db = layer_norm_backward_ref(arrays["dy"], h, arrays["weight"],
                                                     eps=EPS, dh=arrays["dh"])
            else:
                _, _, rstd = rms_norm_ref(h, eps=EPS)
                dx, dw = rms_norm_backward_ref(arrays["dy"], h, arrays["weight"], eps=EPS,
                                               dh=arrays["dh"])
            arrays["rstd"] = rstd.astype(np.float32)

            def run(a):
                if layer:
                    g = layer_norm_backward(a["dy"], a["h"], a["weight"], a["mean"], a["rstd"],
                                            bias=a["weight"], dh=a["dh"])
                    return {"dx": g.dx, "dweight": g.dweight, "dbias": g.dbias}
                g = rms_norm_backward(a["dy"], a["h"], a["weight"], a["rstd"], dh=a["dh"])
                return {"dx": g.dx, "dweight": g.dweight}

            expected = {"dx": dx, "dweight": dw}
            if layer:
                expected["dbias"] = db
            tol = 64 * ROUNDING[h_t] + 64 * ROUNDING[w_t] + STATS_TOL
            out.append(Case(f"dy {x_t}, weight {w_t}, h {h_t}", arrays, run, expected, tol,
                            transposed=frozenset({"dy", "h", "dh"})))
        return out

    return cases
