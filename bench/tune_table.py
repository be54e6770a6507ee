"""Print the autotuner's table (every candidate's time) for a few shapes and layouts.

    python bench/tune_table.py [M N K ...] [--precision tf32x3] [--layouts rr,rc,cr]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402

import ge2jit  # noqa: E402


def operand(rows, cols, layout, dtype):
    x = cp.random.standard_normal((rows, cols) if layout == "r" else (cols, rows),
                                  dtype=cp.float32).astype(dtype)
    return x if layout == "r" else x.T


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, help="M N K, repeated")
    parser.add_argument("--precision", default=None, help="float32 mode: ieee, tf32, tf32x3")
    parser.add_argument("--layouts", default="rr,rc,cr", help="comma-separated, of rr rc cr cc")
    parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    args = parser.parse_args(argv)
    nums = args.sizes or [4096, 4096, 4096, 8192, 1024, 1024, 8192, 64, 4096]
    if len(nums) % 3:
        parser.error("sizes: expected M N K triples")
    shapes = [tuple(nums[i:i + 3]) for i in range(0, len(nums), 3)]
    for m, n, k in shapes:
        for la, lb in args.layouts.split(","):
            dtype = args.dtype
            if dtype == "bfloat16":
                import ml_dtypes

                dtype = ml_dtypes.bfloat16
            a, b = operand(m, k, la, dtype), operand(k, n, lb, dtype)
            bias = cp.random.standard_normal(n, dtype=cp.float32).astype(dtype)
            heur = ge2jit.explain(a, b, bias, act="gelu_tanh", precision=args.precision)
            result = ge2jit.tune(a, b, bias, act="gelu_tanh", reps=10,
                                 precision=args.precision)
            print(f"== {m}x{n}x{k} {la}{lb} {args.dtype} {args.precision or ''}: heuristic "
                  f"{heur.config}")
            print(result, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
