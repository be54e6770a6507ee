"""Print the autotuner's table (every candidate's time) for a few shapes and layouts.

    python bench/tune_table.py [M N K ...] [--precision tf32x3] [--layouts rr,rc,cr] [--quick]

Each table is also stored in the tuning database, as ``ge2jit.tune`` does.
"""

from __future__ import annotations

import argparse
import sys

from common import add_quick, cp, quick_defaults

import ge2jit

SIZES = [4096, 4096, 4096, 8192, 1024, 1024, 8192, 64, 4096]
#: --quick: one small shape, one layout, fewer repetitions per candidate
QUICK_SIZES, QUICK_LAYOUTS, QUICK_REPS = [1024, 1024, 1024], "rr", 3


def operand(rows, cols, layout, dtype):
    x = cp.random.standard_normal((rows, cols) if layout == "r" else (cols, rows),
                                  dtype=cp.float32).astype(dtype)
    return x if layout == "r" else x.T


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked; ``shapes`` as a list of (M, N, K)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, help="M N K, repeated")
    parser.add_argument("--precision", default=None, help="float32 mode: ieee, tf32, tf32x3")
    parser.add_argument("--layouts", default=None,
                        help="comma-separated, of rr rc cr cc (default rr,rc,cr)")
    parser.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    parser.add_argument("--reps", type=int, default=None, help="timings per candidate "
                                                               "(default 10)")
    add_quick(parser, f"sizes {QUICK_SIZES}, layouts {QUICK_LAYOUTS}, {QUICK_REPS} reps")
    args = parser.parse_args(argv)
    nums = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    if len(nums) % 3:
        parser.error("sizes: expected M N K triples")
    args.shapes = [tuple(nums[i:i + 3]) for i in range(0, len(nums), 3)]
    quick_defaults(args, layouts=("rr,rc,cr", QUICK_LAYOUTS), reps=(10, QUICK_REPS))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    for m, n, k in args.shapes:
        for la, lb in args.layouts.split(","):
            dtype = args.dtype
            if dtype == "bfloat16":
                import ml_dtypes

                dtype = ml_dtypes.bfloat16
            a, b = operand(m, k, la, dtype), operand(k, n, lb, dtype)
            bias = cp.random.standard_normal(n, dtype=cp.float32).astype(dtype)
            heur = ge2jit.explain(a, b, bias, act="gelu_tanh", precision=args.precision)
            result = ge2jit.tune(a, b, bias, act="gelu_tanh", reps=args.reps,
                                 precision=args.precision)
            print(f"== {m}x{n}x{k} {la}{lb} {args.dtype} {args.precision or ''}: heuristic "
                  f"{heur.config}")
            print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
