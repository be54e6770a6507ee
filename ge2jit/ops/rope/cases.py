"""rope's and rope_backward's layout cases (``runtime.cases``): ``n`` tokens of one sequence,
q and k as matrices of (tokens x heads) rows of head_dim (the test pads and offsets their
rows: the op sees a sequence stride and a head stride), the tables as (rows, half)
matrices, the positions as a vector."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import FLOATS, ROUNDING, Case, host_dtype, new_like, normal, rng_for
from .op import rope, rope_backward
from .reference import rope_reference

HQ, HK = 2, 1
#: (head_dim, half, interleaved, positions, table type: None for q's) of the cases
SHAPES = ((16, 8, False, None, None), (6, 3, True, "int64", None),
          (12, 4, False, "int32", "float32"))


def _cases(n: int, backward: bool) -> list[Case]:
    function, name = (rope_backward, "rope_backward") if backward else (rope, "rope")
    cases = []
    for dtype in FLOATS:
        for d, half, interleaved, pos, table in SHAPES:
            rng = rng_for(name, n, dtype, d, half)
            rows = n + 3 if pos else n
            angles = rng.uniform(-np.pi, np.pi, (rows, half))
            tdt = host_dtype(table or dtype)
            arrays = {"q": normal(rng, (n * HQ, d), host_dtype(dtype)),
                      "k": normal(rng, (n * HK, d), host_dtype(dtype)),
                      "cos": np.cos(angles).astype(np.float32).astype(tdt),
                      "sin": np.sin(angles).astype(np.float32).astype(tdt)}
            if pos:
                arrays["positions"] = rng.integers(0, rows, n).astype(pos)

            def run(a, d=d, interleaved=interleaved):
                def heads(x):
                    return None if x is None else x.reshape(1, n, -1, d)

                out = None
                if "q_out" in a or "k_out" in a:   # one given: the other made here
                    out = tuple(heads(a[o] if o in a else new_like(a[x], a[x].shape))
                                for o, x in (("q_out", "q"), ("k_out", "k")))
                qo, ko = function(heads(a["q"]), heads(a["k"]), a["cos"], a["sin"],
                                  interleaved=interleaved, positions=a.get("positions"),
                                  out=out)
                return {"q_out": qo.reshape(n * HQ, d), "k_out": ko.reshape(n * HK, d)}

            host = {k: v.astype(np.float64) for k, v in arrays.items() if k != "positions"}
            ref_q, ref_k = rope_reference(
                host["q"].reshape(1, n, HQ, d), host["k"].reshape(1, n, HK, d), host["cos"],
                host["sin"], interleaved=interleaved, positions=arrays.get("positions"),
                backward=backward)
            cases.append(Case(
                f"{dtype} d{d} half{half}{' gptj' if interleaved else ''} {pos or 'no'} "
                f"positions, {table or dtype} tables", arrays, run,
                {"q_out": ref_q.reshape(n * HQ, d), "k_out": ref_k.reshape(n * HK, d)},
                8 * ROUNDING[dtype] + 2.0 ** -20,
                outputs={"q_out": ((n * HQ, d), host_dtype(dtype)),
                         "k_out": ((n * HK, d), host_dtype(dtype))},
                required=frozenset({"q_out", "k_out"}) if d == 12 else frozenset()))
    return cases


def forward_cases(n: int) -> list[Case]:
    return _cases(n, False)


def backward_cases(n: int) -> list[Case]:
    return _cases(n, True)
