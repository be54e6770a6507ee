"""adam_update's and sgd_update's layout cases (``runtime.cases``): one step over a (3, n)
parameter with each gradient type and a 16-bit copy of the weights. The steps read flat,
C-contiguous arrays: the test proves that every other layout is refused."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import FLOATS, PADS, ROUNDING, Case, host_dtype, normal, rng_for
from . import adam_update, sgd_update

ROWS = 3
LR, BETAS, EPS, WD, MOMENTUM, STEP = 1e-2, (0.9, 0.999), 1e-8, 0.01, 0.9, 3


#: every layout that is not C-contiguous
REFUSED = frozenset({*(f"pad{p}" for p in PADS), "offset_pad3", "transposed"})


def _adam_ref(p, g, m, v):
    b1, b2 = BETAS
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - LR * (WD * p + (m / (1 - b1 ** STEP)) / (np.sqrt(v / (1 - b2 ** STEP)) + EPS))
    return p, m, v


def _sgd_ref(p, g, buf, nesterov):
    g = g + WD * p
    buf = MOMENTUM * buf + g
    return p - LR * (g + MOMENTUM * buf if nesterov else buf), buf


def cases_of(rule: str):
    def cases(n: int) -> list[Case]:
        out = []
        for g_t, copy_t in zip(FLOATS, ("bfloat16", "float16", "bfloat16")):
            rng = rng_for(rule, n, g_t)
            f32 = host_dtype("float32")
            p = normal(rng, (ROWS, n), f32)
            g = normal(rng, (ROWS, n), host_dtype(g_t))
            p64, g64 = p.astype(np.float64), g.astype(np.float64)
            if rule == "adam":
                m = normal(rng, (ROWS, n), f32, 0.1)
                v = np.abs(normal(rng, (ROWS, n), f32, 0.1))
                arrays = {"param": p, "grad": g, "m": m, "v": v}
                new_p, new_m, new_v = _adam_ref(p64, g64, m.astype(np.float64),
                                                v.astype(np.float64))
                expected = {"param": new_p, "m": new_m, "v": new_v}

                def run(a):
                    adam_update(a["param"], a["grad"], a["m"], a["v"], step=STEP, lr=LR,
                                betas=BETAS, eps=EPS, weight_decay=WD,
                                param_copy=a.get("param_copy"))
                    return {k: a.get(k) for k in ("param", "m", "v", "param_copy")}
            else:
                nesterov = g_t == "bfloat16"
                buf = normal(rng, (ROWS, n), f32, 0.1)
                arrays = {"param": p, "grad": g, "momentum_buffer": buf}
                new_p, new_buf = _sgd_ref(p64, g64, buf.astype(np.float64), nesterov)
                expected = {"param": new_p, "momentum_buffer": new_buf}

                def run(a, nesterov=nesterov):
                    sgd_update(a["param"], a["grad"], a["momentum_buffer"], lr=LR,
                               momentum=MOMENTUM, weight_decay=WD, nesterov=nesterov,
                               param_copy=a.get("param_copy"))
                    return {k: a.get(k) for k in ("param", "momentum_buffer", "param_copy")}

            tol = {k: 2.0 ** -20 for k in expected}
            expected["param_copy"] = expected["param"]
            tol["param_copy"] = 2 * ROUNDING[copy_t]
            out.append(Case(
                f"{g_t} gradient, {copy_t} copy", arrays, run, expected, tol,
                outputs={"param_copy": ((ROWS, n), host_dtype(copy_t))},
                transposed=frozenset({*arrays, "param_copy"}),
                refused={k: REFUSED for k in (*arrays, "param_copy")}))
        return out

    return cases
