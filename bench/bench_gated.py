"""The gated GEMM (SwiGLU) against a plain GEMM of the same (M, 2N, K) and PyTorch.

    python bench/bench_gated.py [--shapes 4096x11008x4096,...] [--json F] [--no-compile]
                                [--quick]

bfloat16, row-major activations, weights as PyTorch lays them out ((2N, K), read as ``w.T``).
Shapes are M x N x K with N the columns of Y (the GEMM has 2N). Per shape, timed in turns in
one process (medians of batches):

- forward: ``ge2jit.gemm_gated`` (Y only, and Y with the saved pre-activations Z), the plain
  GEMM of (M, 2N, K) by ge2jit and by cuBLAS (``torch.mm``), and PyTorch's SwiGLU (one linear
  to 2N, chunk, silu, mul) eager, ``torch.compile`` and ``torch.compile(mode=
  "reduce-overhead")``; with the peak memory each forward allocates;
- backward: ``ge2jit.gemm_gated_backward`` from the saved Z (the dZ pass and two GEMMs)
  against its two GEMMs alone (dZ @ B.T and A.T @ dZ by ge2jit) and PyTorch eager's
  autograd of the same unit;
- the next layer's dA GEMM that writes the unit's dZ (what ``ge2jit.torch.GatedMLP``'s
  backward runs: dH = gY @ W_down, of (M, N, K) with W_down (K, N), and dZ from dH and Z in
  its epilogue) on the heuristic's tile and on the 128x256 tile pinned, against the dH GEMM
  alone and PyTorch eager's autograd of ``down(silu(g) * u)`` to (g, u).
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

SHAPES = "4096x11008x4096,8192x14336x4096,16384x4096x1024"
QUICK_SHAPES = "4096x4096x1024"


def _peak_mb(torch, fn, *args) -> float:
    """The memory a call allocates at its peak beyond what was allocated before, in MB."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 1e6


def row(m, n, k, torch, compile_: bool) -> dict:
    dt = np_dtype("bfloat16")
    rng = cp.random.default_rng(0)
    sets = []
    for _ in range(2):
        x = rng.standard_normal((m, k), dtype=cp.float32).astype(dt)
        w = (rng.standard_normal((2 * n, k), dtype=cp.float32) * k ** -0.5).astype(dt)
        gy = rng.standard_normal((m, n), dtype=cp.float32).astype(dt)
        sets.append((x, w, gy))
    cases, names = [], []

    def add(name, fn, argsets):
        names.append(name)
        cases.append((fn, argsets))

    # forward
    add("ge2jit gated", lambda x, w: ge2jit.gemm_gated(x, w.T), [(s[0], s[1]) for s in sets])
    add("ge2jit gated + Z", lambda x, w: ge2jit.gemm_gated(x, w.T, save_preact=True),
        [(s[0], s[1]) for s in sets])
    add("ge2jit plain (M, 2N, K)", lambda x, w: ge2jit.gemm_bias_act(x, w.T),
        [(s[0], s[1]) for s in sets])
    peak = {}
    if torch is not None:
        F = torch.nn.functional
        tsets = [tuple(torch.from_dlpack(t) for t in s) for s in sets]

        def swiglu(x, w):
            g, u = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(g) * u

        add("cuBLAS plain (M, 2N, K)", lambda x, w: torch.mm(x, w.T),
            [(s[0], s[1]) for s in tsets])
        add("torch eager", swiglu, [(s[0], s[1]) for s in tsets])
        if compile_:
            for mode in ("default", "reduce-overhead"):
                fn = torch.compile(swiglu, mode=mode)
                add(f"torch.compile {mode}", fn, [(s[0], s[1]) for s in tsets])
        peak = {"ge2jit gated": _peak_mb(torch, lambda x, w: ge2jit.gemm_gated(x, w.T),
                                         *tsets[0][:2]),
                "torch eager": _peak_mb(torch, swiglu, *tsets[0][:2])}
    # backward (from the saved Z)
    saved = []
    for x, w, gy in sets:
        _, z = ge2jit.gemm_gated(x, w.T, save_preact=True)
        saved.append((x, w, gy, z))
    add("ge2jit gated backward", lambda x, w, gy, z:
        ge2jit.gemm_gated_backward(gy, x, w.T, z=z, needs=("a", "b")), saved)
    # dA = dZ @ W and dW = dZ.T @ X (W's (2N, K) layout), with Z standing in for dZ
    add("ge2jit its two GEMMs", lambda x, w, gy, z:
        (ge2jit.gemm_bias_act(z, w), ge2jit.gemm_bias_act(z.T, x)), saved)
    if torch is not None:
        tb = []
        for x, w, gy, _ in saved:
            tx = torch.from_dlpack(x).requires_grad_()
            tw = torch.from_dlpack(w).requires_grad_()
            tb.append((swiglu(tx, tw), tx, tw, torch.from_dlpack(gy)))
        add("torch eager backward", lambda y, tx, tw, gy:
            torch.autograd.grad(y, (tx, tw), gy, retain_graph=True), tb)
    # the next layer's dA GEMM writing the unit's dZ (``a_glu``): dH = gY2 @ W_down (W_down
    # (K, N) as PyTorch holds it), dZ from dH and Z in its epilogue; the heuristic's tile (a
    # ping-pong one from a wave of tiles up), the cooperative 128x256 tile pinned, the plain
    # dH GEMM, and PyTorch eager's autograd of down(silu(g) * u) to (g, u)
    from ge2jit.ops.gemm import op as gemm_op
    from ge2jit.ops.gemm.epilogue import Act

    downs = []
    for *_, z in saved:
        wd = (rng.standard_normal((k, n), dtype=cp.float32) * n ** -0.5).astype(dt)
        downs.append((rng.standard_normal((m, k), dtype=cp.float32).astype(dt), wd, z))
    # (timed through their prepared calls, as the layers' backward runs them: no checks or
    # plan lookups per call)
    for name, config in (("ge2jit dZ in dA", None), ("ge2jit dZ in dA, 128x256",
                                                      "wgmma_128x256_s4")):
        _, call = gemm_op.glu_grad_gemm(*downs[0], Act.SILU, 1.0, 0.01, None, config=config)
        add(name, lambda gy2, wd, z, call=call:
            gemm_op.run_prepared(call, gy2, wd, None, z, 1.0, 1.0, 0.01), downs)
    add("ge2jit dH alone", lambda gy2, wd, z: ge2jit.gemm_bias_act(gy2, wd), downs)
    if torch is not None:
        td = []
        for gy2, wd, z in downs:
            tz = torch.from_dlpack(z).requires_grad_()
            g, u = tz.chunk(2, dim=-1)
            td.append((F.linear(F.silu(g) * u, torch.from_dlpack(wd)), tz,
                       torch.from_dlpack(gy2)))
        add("torch eager dZ", lambda y, tz, gy2:
            torch.autograd.grad(y, (tz,), gy2, retain_graph=True), td)
    ms = interleaved_ms(cases)
    us = {nm: 1e3 * t for nm, t in zip(names, ms)}
    kernel = ge2jit.ops.gemm.gated.explain_gated(sets[0][0], sets[0][1].T).kernel_names[0]
    return {"shape": [m, n, k], "us": us, "peak_mb": peak, "kernel": kernel}


def parse_args(argv=None) -> argparse.Namespace:
    """The options; ``shapes`` as a list of (M, N, K)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    return parse_with_shapes(ap, argv, SHAPES, QUICK_SHAPES)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = import_torch()
    rows = [row(m, n, k, torch, not args.no_compile) for m, n, k in args.shapes]
    print_us_table(rows)
    for r in rows:
        us = r["us"]
        line = (f"{'×'.join(map(str, r['shape']))}: gated / plain ge2jit "
                f"{us['ge2jit gated'] / us['ge2jit plain (M, 2N, K)']:.3f}, backward / its "
                f"GEMMs {us['ge2jit gated backward'] / us['ge2jit its two GEMMs']:.3f}, "
                f"dZ in dA / dH alone {us['ge2jit dZ in dA'] / us['ge2jit dH alone']:.3f} "
                f"(128x256: {us['ge2jit dZ in dA, 128x256'] / us['ge2jit dH alone']:.3f})")
        if "torch eager" in us:
            cublas = us["cuBLAS plain (M, 2N, K)"]
            line += (f", gated / cuBLAS plain {us['ge2jit gated'] / cublas:.3f}"
                     f", eager / gated {us['torch eager'] / us['ge2jit gated']:.3f}")
            for mode in ("default", "reduce-overhead"):
                if f"torch.compile {mode}" in us:
                    line += (f", compile {mode} / gated "
                             f"{us[f'torch.compile {mode}'] / us['ge2jit gated']:.3f}")
            line += f", peak MB {r['peak_mb']}"
        print(line + f" [{r['kernel']}]")
    if args.json:
        Path(args.json).write_text(json.dumps({**device_meta(), "dtype": "bfloat16",
                                               "unit": "us", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
