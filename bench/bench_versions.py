"""Kernel times of this checkout against another version of ge2jit, in turns in one process.

    git archive REF ge2jit kernel_templates | tar -x -C BASE_DIR     # once, where git is
    python bench/bench_versions.py BASE_DIR [--rows forward,backward] [--json PATH]
    python bench/bench_versions.py --quick          # one row of each, this checkout twice

The other version is imported from ``BASE_DIR/ge2jit`` under the name ``ge2jit_base`` (its
templates from ``BASE_DIR/kernel_templates``), beside this checkout's ``ge2jit``; every row
times both on the same inputs, a batch of each per round (``bench_gemm.interleaved_ms``), so
the clock drift of a power-limited GPU falls on both alike. Ratios are base time / this time:
above 1 means this checkout is faster.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT, add_quick, commit, cp, interleaved_ms, np_dtype

import ge2jit

#: (dtype, precision, M, N, K, act): the forward rows.
FORWARD = [
    ("bfloat16", None, 4096, 4096, 4096, "gelu_tanh"),
    ("bfloat16", None, 8192, 1024, 1024, "gelu_tanh"),
    ("bfloat16", None, 16384, 4096, 1024, "relu"),
    ("bfloat16", None, 8192, 8192, 8192, "gelu_tanh"),
    ("float16", None, 8192, 16384, 4096, "gelu_tanh"),
    ("float32", "tf32", 4096, 4096, 4096, "gelu_tanh"),
    ("float32", "tf32x3", 4096, 4096, 4096, "gelu_tanh"),
    ("float32", "ieee", 4096, 4096, 4096, "relu"),
    ("float32", "ieee", 512, 512, 512, "gelu"),
]
#: (dtype, precision, M, N, K, act): the backward rows (a Linear layer: dA, dB, dBias from Z).
BACKWARD = [
    ("bfloat16", None, 4096, 4096, 1024, "gelu_tanh"),
    ("bfloat16", None, 4096, 1024, 4096, "gelu_tanh"),
    ("bfloat16", None, 16384, 4096, 1024, "gelu_tanh"),
    ("float32", "tf32x3", 4096, 1024, 4096, "gelu_tanh"),
    ("float32", "ieee", 4096, 1024, 1024, "gelu_tanh"),
]


def import_base(base_dir: Path):
    """The package ``base_dir/ge2jit`` as module ``ge2jit_base``."""
    init = base_dir / "ge2jit" / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"BASE_DIR: expected {init} (git archive REF ge2jit kernel_templates)")
    spec = importlib.util.spec_from_file_location(
        "ge2jit_base", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["ge2jit_base"] = module
    spec.loader.exec_module(module)
    return module


def _inputs(m, n, k, dtype, seed):
    dt = np_dtype(dtype)
    rng = cp.random.default_rng(seed)

    def rand(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=cp.float32) * np.float32(scale)).astype(dt)

    return rand(m, k), rand(k, n, scale=1 / np.sqrt(k)), rand(n), rand(m, n)


def forward_row(libs, dtype, precision, m, n, k, act) -> dict:
    sets = [_inputs(m, n, k, dtype, s)[:3] for s in range(2)]
    cases = []
    for lib in libs.values():
        def run(a, b, bias, lib=lib):
            lib.gemm_bias_act(a, b, bias, act=act, precision=precision)
        cases.append((run, sets))
    return dict(zip(libs, interleaved_ms(cases)))


def backward_row(libs, dtype, precision, m, n, k, act) -> dict:
    sets = []
    for s in range(2):
        a, b, bias, gy = _inputs(m, n, k, dtype, s)
        _, z = ge2jit.gemm_bias_act(a, b, bias, act=act, save_preact=True, precision=precision)
        sets.append((a, b, bias, gy, z))
    cases = []
    for lib in libs.values():
        def run(a, b, bias, gy, z, lib=lib):
            lib.gemm_bias_act_backward(gy, a, b, bias, act=act, z=z, precision=precision)
        cases.append((run, sets))
    return dict(zip(libs, interleaved_ms(cases)))


def parse_args(argv=None) -> argparse.Namespace:
    """The options; ``rows`` as a list of "forward" and "backward"."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_dir", type=Path, nargs="?",
                    help="the other version (required, except with --quick)")
    ap.add_argument("--rows", default="forward,backward")
    ap.add_argument("--json", help="write the rows here")
    add_quick(ap, "the first forward and backward rows; without BASE_DIR this checkout "
                  "against itself (a run of the script, not a comparison)")
    args = ap.parse_args(argv)
    if args.base_dir is None:
        if not args.quick:
            ap.error("BASE_DIR: required (git archive REF ge2jit kernel_templates | tar -x -C "
                     "BASE_DIR)")
        args.base_dir = ROOT
    args.rows = args.rows.split(",")
    for what in args.rows:
        if what not in ("forward", "backward"):
            ap.error(f"--rows: expected forward and/or backward, got {what!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    libs = {"this": ge2jit, "base": import_base(args.base_dir)}
    tables = {"forward": (FORWARD, forward_row), "backward": (BACKWARD, backward_row)}
    rows = []
    for what in args.rows:
        shapes, fn = tables[what]
        shapes = shapes[:1] if args.quick else shapes
        print(f"\n{what}\n| dtype | precision | M×N×K | act | this ms | base ms | base/this |\n"
              "|---|---|---|---|---|---|---|", flush=True)
        for dtype, precision, m, n, k, act in shapes:
            t = fn(libs, dtype, precision, m, n, k, act)
            rows.append({"what": what, "dtype": dtype, "precision": precision, "m": m, "n": n,
                         "k": k, "act": act, **t})
            print(f"| {dtype} | {precision or ''} | {m}×{n}×{k} | {act} | {t['this']:.4f} | "
                  f"{t['base']:.4f} | {t['base'] / t['this']:.3f} |", flush=True)
    if args.json:
        doc = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
               "date": time.strftime("%Y-%m-%d"), "commit": commit(),
               "base": str(args.base_dir), "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
