"""Benchmark of gemm_bias_act_backward against cuBLAS and PyTorch, side by side in one process.

    python bench/bench_backward.py [--dtypes bfloat16,float32] [--shapes MxNxK,...]
                                   [--act gelu_tanh] [--out bench/results_backward.json]
                                   [--quick]

For each dtype and shape (a Linear layer: A is (M, K) activations, B (K, N) weights, a bias per
column): ge2jit's whole backward (dA, dB, dBias from the saved Z), against the two plain cuBLAS
GEMMs of the same sizes (dZ @ B.T and A.T @ dZ through torch.mm, dZ given); the same layer
inside a network ("chained": its gradient arrives as dZ with its dBias, from the next
layer's a_act/a_bias epilogue, and its dA leaves as the previous layer's dZ through ``a_act``
with that layer's dBias through ``a_bias``, so the layer's share of the backward is dA and dB
with an act' application and a dBias, against the same two GEMMs); and
one training step of the layer, forward + backward: ge2jit's forward (saving Z) and
backward, against PyTorch's linear + activation + autograd. All implementations of a row are
timed in turns (bench_gemm.interleaved_ms). float32 runs with ``--precision`` (default:
exact float32).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from common import add_quick, commit, cp, import_torch, interleaved_ms, np_dtype, parse_shapes

import ge2jit

MLP = [(m, n, k) for m in (512, 4096, 16384)
       for (k, n) in ((1024, 1024), (1024, 4096), (4096, 1024), (4096, 16384))]


def bench_row(m, n, k, dtype, act, precision, torch) -> dict:
    dt = np_dtype(dtype)
    rng = cp.random.default_rng(0)

    def rand(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=cp.float32) * np.float32(scale)).astype(dt)

    a, b, bias = rand(m, k), rand(k, n, scale=1 / np.sqrt(k)), rand(n)
    gy = rand(m, n)
    a_z = rand(m, k)   # the previous layer's pre-activation (A stands for act(a_z))
    a_bias = rand(k)   # and its bias
    _, z = ge2jit.gemm_bias_act(a, b, bias, act=act, save_preact=True, precision=precision)
    sets = [(a, b, bias, gy, z)]

    def ours_backward(a, b, bias, gy, z):
        ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act, z=z, precision=precision)

    def ours_chained(a, b, bias, gy, z):   # gy stands for dZ here
        # dBias of this layer came with its dZ (the next layer's a_bias); this call makes the
        # previous layer's dZ and dBias
        ge2jit.gemm_bias_act_backward(gy, a, b, bias, needs=("a", "b"), a_act=act, a_z=a_z,
                                      a_bias=a_bias, precision=precision)

    def ours_step(a, b, bias, gy, z):
        _, z2 = ge2jit.gemm_bias_act(a, b, bias, act=act, save_preact=True,
                                     precision=precision)
        ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act, z=z2, precision=precision)

    cases = {"ge2jit_backward": (ours_backward, sets), "ge2jit_chained": (ours_chained, sets),
             "ge2jit_step": (ours_step, sets)}
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        F = torch.nn.functional
        ta, tb, tbias, tgy, tz = (torch.from_dlpack(x) for x in (a, b, bias, gy, z))
        tw = tb.t().contiguous().requires_grad_(True)      # a Linear's (out, in) weight
        tbias_p = tbias.clone().requires_grad_(True)
        tx = ta.clone().requires_grad_(True)
        act_fn = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
                  "gelu": F.gelu, "relu": F.relu, "silu": F.silu}[act]

        def gemms(*_):
            torch.mm(tz, tb.t())
            torch.mm(ta.t(), tz)

        def torch_step(*_):
            out = act_fn(F.linear(tx, tw, tbias_p))
            out.backward(tgy)

        cases["cublas_two_gemms"] = (gemms, [()])
        cases["torch_step"] = (torch_step, [()])
    times = interleaved_ms(list(cases.values()))
    row = {"m": m, "n": n, "k": k, "dtype": dtype, "act": act, "precision": precision,
           **dict(zip(cases, times))}
    return row


def bench_sources(m, n, k, dtype, act, precision=None) -> dict:
    """The backward's time by where act' comes from: the saved Z, Y, or Z recomputed."""
    dt = np_dtype(dtype)
    rng = cp.random.default_rng(1)
    a = rng.standard_normal((m, k), dtype=cp.float32).astype(dt)
    b = (rng.standard_normal((k, n), dtype=cp.float32) / np.float32(np.sqrt(k))).astype(dt)
    bias, gy = rng.standard_normal(n, dtype=cp.float32).astype(dt), \
        rng.standard_normal((m, n), dtype=cp.float32).astype(dt)
    y, z = ge2jit.gemm_bias_act(a, b, bias, act=act, save_preact=True, precision=precision)
    cases = {
        "from_z": (lambda: ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act, z=z,
                                                         precision=precision), [()]),
        "from_y": (lambda: ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act, y=y,
                                                         precision=precision), [()]),
        "recompute": (lambda: ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act,
                                                            precision=precision), [()]),
    }
    row = {"m": m, "n": n, "k": k, "dtype": dtype, "act": act, "precision": precision,
           "kept_bytes_z": m * n * dt.itemsize, **dict(zip(cases, interleaved_ms(
               list(cases.values()))))}
    print(f"sources {dtype} {m}x{n}x{k} {act}: " + ", ".join(
        f"{key} {row[key]:.4f} ms" for key in cases), flush=True)
    return row


#: the shapes of the from-Z / from-Y / recompute comparison
SOURCE_SHAPES = [(4096, 4096, 1024), (16384, 4096, 1024)]
#: --quick: one shape of the MLP sweep, one of the comparison
QUICK_SHAPES = [(4096, 1024, 4096)]
QUICK_SOURCE_SHAPES = SOURCE_SHAPES[:1]


def parse_args(argv=None) -> argparse.Namespace:
    """The options; ``shapes`` and ``source_shapes`` as lists of (M, N, K)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--shapes", default=None, help="MxNxK,... instead of the MLP shapes")
    parser.add_argument("--act", default="gelu_tanh")
    parser.add_argument("--precision", default=None, help="for float32: ieee, tf32, tf32x3")
    parser.add_argument("--sources-act", default="relu",
                        help="activation for the from-Z / from-Y / recompute comparison")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results_backward.json"))
    add_quick(parser, f"shapes {QUICK_SHAPES}, the comparison on {QUICK_SOURCE_SHAPES}")
    args = parser.parse_args(argv)
    args.shapes = (parse_shapes(parser, args.shapes) if args.shapes
                   else QUICK_SHAPES if args.quick else MLP)
    args.source_shapes = QUICK_SOURCE_SHAPES if args.quick else SOURCE_SHAPES
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    shapes = args.shapes
    torch = import_torch()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    meta = {"device": props["name"].decode(), "date": time.strftime("%Y-%m-%d"),
            "torch": getattr(torch, "__version__", None), "commit": commit()}
    rows, sources = [], []
    for dtype in args.dtypes.split(","):
        precision = args.precision if dtype == "float32" else None
        for (m, n, k) in shapes:
            row = bench_row(m, n, k, dtype, args.act, precision, torch)
            rows.append(row)
            two = row.get("cublas_two_gemms")
            step = row.get("torch_step")
            print(f"{dtype:8s} {m:6d} {n:6d} {k:6d} backward {row['ge2jit_backward']:.4f} ms"
                  + (f" ({row['ge2jit_backward'] / two:.2f}x two cuBLAS GEMMs {two:.4f})"
                     if two else "")
                  + f" | chained {row['ge2jit_chained']:.4f} ms"
                  + (f" ({row['ge2jit_chained'] / two:.2f}x)" if two else "")
                  + f" | step {row['ge2jit_step']:.4f} ms"
                  + (f" (torch {step:.4f}: {step / row['ge2jit_step']:.2f}x)" if step else ""),
                  flush=True)
            Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        for (m, n, k) in args.source_shapes:
            sources.append(bench_sources(m, n, k, dtype, args.sources_act,
                                         args.precision if dtype == "float32" else None))
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows, "sources": sources},
                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
