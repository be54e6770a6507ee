"""attention's layout cases (``runtime.cases``): one sequence of ``n`` queries against 70 keys
(the float64 reference costs n x 70 per head, and causal masks are aligned bottom-right with
S_q != S_k), q, k and v as matrices of (tokens x heads) rows of head_dim (the test pads and
offsets their rows: the op sees a sequence stride and a head stride), out likewise; lse as a
(heads x n) matrix. The kernel's 16-byte copies refuse rows not 16-byte aligned: pads that are
not multiples of 8 elements, an offset of one element, a transposed view."""

from __future__ import annotations

import numpy as np

from ...runtime.cases import (
    MATRIX_LAYOUTS,
    ROUNDING,
    Case,
    host_dtype,
    new_like,
    normal,
    rng_for,
)
from .backward import attention_backward
from .op import attention
from .reference import attention_backward_ref, attention_ref

H, KEYS, D = 4, 70, 64
#: tanh.approx.f32's relative error (soft-capped scores)
TANH_APPROX = 2.0 ** -11
#: (kv heads, causal, window, softcap, lse) of the cases
OPTIONS = ((4, False, None, None, False), (2, True, None, None, True),
           (1, False, (20, 5), 10.0, True))
#: every matrix layout whose rows are not 16-byte aligned (the kernel's copies)
REFUSED = frozenset(lay for lay in MATRIX_LAYOUTS if lay not in ("contiguous", "pad8"))


def forward_cases(n: int) -> list[Case]:
    cases = []
    for dtype in ("float16", "bfloat16"):
        for h_kv, causal, window, softcap, lse in OPTIONS:
            rng = rng_for("attention", n, dtype, h_kv, causal)
            dt = host_dtype(dtype)
            arrays = {"q": normal(rng, (n * H, D), dt), "k": normal(rng, (KEYS * h_kv, D), dt),
                      "v": normal(rng, (KEYS * h_kv, D), dt)}
            options = dict(causal=causal, window=window, softcap=softcap)

            def run(a, lse=lse, h_kv=h_kv, options=options):
                out = a.get("out")
                got = attention(_heads(a["q"], n, H), _heads(a["k"], KEYS, h_kv),
                                _heads(a["v"], KEYS, h_kv), return_lse=lse,
                                out=None if out is None else _heads(out, n, H), **options)
                o, m = got if lse else (got, None)
                results = {"out": o.reshape(n * H, D)}
                if lse:
                    results["lse"] = m.reshape(H, n)
                return results

            host = {name: x.astype(np.float64).reshape(1, -1, x.shape[0] // (
                n if name == "q" else KEYS), D) for name, x in arrays.items()}
            ref_o, ref_lse = attention_ref(host["q"], host["k"], host["v"], **options)
            expected = {"out": ref_o.reshape(n * H, D)}
            if lse:
                expected["lse"] = ref_lse.reshape(H, n)
            cases.append(Case(
                f"{dtype} kv_heads {h_kv}{' causal' if causal else ''}"
                f"{f' window {window}' if window else ''}{f' softcap {softcap}' if softcap else ''}"
                f"{' lse' if lse else ''}", arrays, run, expected,
                # P rounded to 16 bits before P V and the output's rounding; a soft-capped
                # score off by softcap * tanh.approx's error
                {"out": 8 * ROUNDING[dtype] + 2 * (softcap or 0) * TANH_APPROX,
                 "lse": 1e-4 + (softcap or 0) * TANH_APPROX},
                outputs={"out": ((n * H, D), dt)},
                magnitude={"out": float(np.abs(arrays["v"].astype(np.float64)).max())},
                refused={name: REFUSED for name in ("q", "k", "v", "out")}))
    return cases


def backward_cases(n: int) -> list[Case]:
    """The backward of the forward cases: do, q, k, v and o as matrices (o and lse the float64
    forward's, rounded), lse contiguous; dq, dk, dv against the float64 backward."""
    cases = []
    for dtype in ("float16", "bfloat16"):
        for h_kv, causal, window, softcap, _ in OPTIONS:
            rng = rng_for("attention_backward", n, dtype, h_kv, causal)
            dt = host_dtype(dtype)
            arrays = {"do": normal(rng, (n * H, D), dt), "q": normal(rng, (n * H, D), dt),
                      "k": normal(rng, (KEYS * h_kv, D), dt),
                      "v": normal(rng, (KEYS * h_kv, D), dt)}
            options = dict(causal=causal, window=window, softcap=softcap)
            host = {name: x.astype(np.float64).reshape(
                1, -1, x.shape[0] // (KEYS if name in "kv" else n), D)
                for name, x in arrays.items()}
            o, lse = attention_ref(host["q"], host["k"], host["v"], **options)
            arrays["o"] = o.reshape(n * H, D).astype(np.float32).astype(dt)
            arrays["lse"] = lse.reshape(H, n).astype(np.float32)
            ref = attention_backward_ref(host["do"], host["q"], host["k"], host["v"],
                                         arrays["o"].astype(np.float64).reshape(1, n, H, D),
                                         arrays["lse"].reshape(1, H, n), **options)
            shapes = {"dq": (n * H, D), "dk": (KEYS * h_kv, D), "dv": (KEYS * h_kv, D)}

            def run(a, h_kv=h_kv, options=options, shapes=shapes):
                def rows(x, arg):
                    query_side = arg in ("do", "q", "o", "dq")
                    return _heads(x, n if query_side else KEYS, H if query_side else h_kv)

                out = None
                if any(g in a for g in shapes):   # one given: the others made here
                    out = tuple(rows(a[g] if g in a else new_like(a["q"], shapes[g]), g)
                                for g in shapes)
                grads = attention_backward(*(rows(a[x], x) for x in ("do", "q", "k", "v", "o")),
                                           a["lse"].reshape(1, H, n), out=out, **options)
                return {g: x.reshape(shapes[g]) for g, x in zip(shapes, grads)}

            cases.append(Case(
                f"{dtype} backward kv_heads {h_kv}{' causal' if causal else ''}"
                f"{f' window {window}' if window else ''}"
                f"{f' softcap {softcap}' if softcap else ''}", arrays, run,
                {g: x.reshape(shapes[g]) for g, x in zip(shapes, ref)},
                # P and dS rounded to 16 bits before their products (layouts are this test's
                # subject: the kernel's own test bounds each element)
                16 * ROUNDING[dtype] + 4 * (softcap or 0) * TANH_APPROX,
                outputs={g: (shape, dt) for g, shape in shapes.items()},
                refused={name: REFUSED for name in ("do", "q", "k", "v", "o", *shapes)},
                fixed=frozenset({"lse"})))
    return cases


def _heads(x, s: int, h: int):
    """A (s * h, D) matrix as (1, s, h, D): its rows' stride is the head stride."""
    return x.reshape(1, s, h, D)
