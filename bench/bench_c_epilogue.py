"""Epilogues that read C on Hopper: C through the main loop's ring against C read from memory.

    python bench/bench_c_epilogue.py [--shapes 4096x4096x1024,16384x4096x1024] [--json F]
                                     [--quick]

bfloat16, row-major A and B. Per shape, timed in turns in one process (medians of batches):
the plain GEMM; ``beta * C`` with a contiguous C (its rows 16-byte aligned: it arrives by TMA
through the ring, '_ct' kernels) and with C a view one element off (read from memory by the
epilogue); the gated GEMM of the backward, ``Y = A @ B * gelu_tanh'(C)``, both ways, and with
the column sums of Y (the previous layer's dBias partials, through the ring); and, with
PyTorch, ``torch.addmm(C, A, B, beta=...)`` (cuBLASLt) and ``mm`` followed by
``gelu_backward`` (the unfused gate).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import (
    cp,
    device_meta,
    import_torch,
    interleaved_ms,
    np_dtype,
    parse_with_shapes,
    print_us_table,
)

import ge2jit
from ge2jit.ops.gemm.epilogue import Act
from ge2jit.ops.gemm.op import gated_gemm

SHAPES = "4096x4096x1024,16384x4096x1024,4096x1024x4096"
QUICK_SHAPES = "4096x4096x1024"


def _inputs(m, n, k, dt, rng):
    a = rng.standard_normal((m, k), dtype=cp.float32).astype(dt)
    b = rng.standard_normal((k, n), dtype=cp.float32).astype(dt)
    c = rng.standard_normal((m, n), dtype=cp.float32).astype(dt)
    wide = rng.standard_normal((m, n + 8), dtype=cp.float32).astype(dt)
    return a, b, c, wide[:, 1:n + 1], cp.empty((m, n), dt)


def row(m, n, k, torch) -> dict:
    dt = np_dtype("bfloat16")
    rng = cp.random.default_rng(0)
    sets = [_inputs(m, n, k, dt, rng) for _ in range(2)]
    gate = Act.GELU_TANH
    cases, names = [], []

    def add(name, fn, argsets):
        names.append(name)
        cases.append((fn, argsets))

    add("plain", lambda a, b, c, y: ge2jit.gemm_bias_act(a, b, out=y),
        [(s[0], s[1], s[2], s[4]) for s in sets])
    for label, idx in (("ring", 2), ("memory", 3)):
        add(f"beta*C, C {label}",
            lambda a, b, c, y: ge2jit.gemm_bias_act(a, b, c=c, beta=0.5, out=y),
            [(s[0], s[1], s[idx], s[4]) for s in sets])
    for label, idx, bgrad in (("ring", 2, False), ("memory", 3, False), ("ring", 2, True)):
        calls = []
        for s in sets:
            _, call, sums = gated_gemm(s[0], s[1], s[idx], gate, False, 1.0, 0.01, None,
                                       bgrad=bgrad)
            calls.append((call, s[0], s[1], sums, s[idx]))
        add(f"gated {gate.value}{' + column sums' if bgrad else ''}, C {label}",
            lambda call, a, b, sums, c: call(a, b, sums, c, 1.0, 1.0, 0.01, None, None), calls)
    if torch is not None:
        tsets = [tuple(torch.from_dlpack(x) for x in s) for s in sets]
        add("torch.addmm (cuBLASLt)",
            lambda a, b, c, y: torch.addmm(c, a, b, beta=0.5, out=y),
            [(s[0], s[1], s[2], s[4]) for s in tsets])
        add("torch mm + gelu_backward",
            lambda a, b, c: torch.ops.aten.gelu_backward(a @ b, c, approximate="tanh"),
            [(s[0], s[1], s[2]) for s in tsets])
    ms = interleaved_ms(cases)
    ring = ge2jit.explain(sets[0][0], sets[0][1], c=sets[0][2], beta=0.5).kernel_names[0]
    return {"shape": [m, n, k], "us": {nm: 1e3 * t for nm, t in zip(names, ms)},
            "beta_c_kernel": ring}


def parse_args(argv=None) -> argparse.Namespace:
    """The options; ``shapes`` as a list of (M, N, K)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    return parse_with_shapes(ap, argv, SHAPES, QUICK_SHAPES)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = import_torch()
    rows = [row(m, n, k, torch) for m, n, k in args.shapes]
    print_us_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({**device_meta(), "dtype": "bfloat16",
                                               "unit": "us", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
