"""What the bench scripts share: timing in turns, inputs, a run's metadata and the ``--quick``
option every benchmark takes.

Importing this module, and so any bench script, needs no GPU and loads neither PyTorch nor
matplotlib (the scripts import those where they use them): tests/test_bench_scripts.py
imports every script on a CPU machine and runs its argument parsing, so that an API change
that breaks one is seen before a GPU run. CuPy is imported here where it is installed
(``cp``; None without it, so that the scripts still import).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# `python bench/x.py` puts bench/ on the path, not the checkout: the checkout's ge2jit is the
# one benchmarked, installed or not
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

try:
    import cupy as cp
except ImportError:   # a CPU environment without CuPy: the scripts still import and parse
    cp = None


def add_quick(parser, what: str) -> None:
    """The ``--quick`` option of a benchmark: ``what`` it runs then, the smallest sizes and
    fewest rounds that still time every implementation it compares (bench/run_quick.sh runs
    every script so, on a GPU, in well under a minute each)."""
    parser.add_argument("--quick", action="store_true", help=f"a short run: {what}")


def int_list(text: str) -> list[int]:
    """A comma-separated list of positive integers (an option's value)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, "
                                         f"got {text!r}")
    return values


def quick_defaults(args, **defaults) -> None:
    """Each option ``name=(full, quick)`` not given (None) takes its default: ``quick`` with
    ``--quick``, else ``full``."""
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)


def plot_options(doc: str, name: str) -> argparse.ArgumentParser:
    """The options of a plot of one results file, both positional: JSON (default
    bench/results_NAME.json) and OUT, the image (default bench/results_NAME.png)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("json", nargs="?", type=Path, default=ROOT / "bench" / f"results_{name}.json")
    ap.add_argument("out", nargs="?", type=Path, default=ROOT / "bench" / f"results_{name}.png")
    return ap


def plot_main(parse_args, plot, argv=None) -> int:
    """A plot script's main: ``plot(its results, the image's path)`` as its options name them
    (``json`` and ``out``)."""
    args = parse_args(argv)
    plot(json.loads(Path(args.json).read_text()), Path(args.out))
    return 0


def pyplot():
    """matplotlib's pyplot, drawing to files (no display), imported where a plot is made."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def import_torch():
    """PyTorch when it is importable and sees a GPU, else None (its baselines are skipped)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def commit() -> str | None:
    """The benchmarked commit: $GE2JIT_COMMIT (a checkout without git history), else git's."""
    if os.environ.get("GE2JIT_COMMIT"):
        return os.environ["GE2JIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip() or None
    except OSError:   # no git
        return None


def device_meta() -> dict:
    """What a results file records of the run: the device's name, the date, the commit."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    return {"device": props["name"].decode(), "date": datetime.date.today().isoformat(),
            "commit": commit()}


def np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def parse_shapes(parser, text: str) -> list[tuple[int, int, int]]:
    """'MxNxK,...' -> [(M, N, K), ...]; a malformed list is the parser's error."""
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in text.split(",")]
        assert all(len(s) == 3 for s in shapes)
    except (ValueError, AssertionError):
        parser.error(f"--shapes: expected MxNxK,... got {text!r}")
    return shapes


def parse_with_shapes(parser, argv, full: str, quick: str) -> argparse.Namespace:
    """``parser``'s arguments and two more: ``--shapes`` (MxNxK,..., default ``full``) and
    ``--quick`` (shapes ``quick``); ``shapes`` comes parsed, as a list of (M, N, K)."""
    parser.add_argument("--shapes", default=None, help=f"MxNxK,... (default {full})")
    add_quick(parser, f"shapes {quick}")
    args = parser.parse_args(argv)
    args.shapes = parse_shapes(parser, args.shapes or (quick if args.quick else full))
    return args


def interleaved_ms(cases, *, rounds=15, batch_ms=1.0) -> list[float]:
    """Median per-call times of several ``(fn, sets)`` cases timed in turns (a batch of
    back-to-back calls of each per round, rotating through its input sets), so that clock and
    temperature drift falls on all of them alike; every other round in the reverse order, so
    that no case is always the first after the host's wait (an H200 timed the same kernel up to
    3% slower there)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    batches = []
    for fn, sets in cases:
        for s in sets[:2]:
            fn(*s)
        start.record()
        fn(*sets[0])
        end.record()
        end.synchronize()
        batches.append(max(1, min(50, int(batch_ms / max(cp.cuda.get_elapsed_time(start, end),
                                                         1e-3)))))
    times = [[] for _ in cases]
    i = 0
    for r in range(rounds):
        order = range(len(cases)) if r % 2 == 0 else range(len(cases) - 1, -1, -1)
        for j in order:
            fn, sets = cases[j]
            start.record()
            for _ in range(batches[j]):
                fn(*sets[i % len(sets)])
                i += 1
            end.record()
            end.synchronize()
            times[j].append(cp.cuda.get_elapsed_time(start, end) / batches[j])
    return [statistics.median(t) for t in times]


def timed_row(shape, cases: dict, sets, work: float, unit: str = "tflops") -> dict:
    """A benchmark row: ``cases`` (name -> fn) timed in turns on ``sets``; per name the
    milliseconds and ``work`` per second in ``unit`` ("tflops": FLOPs / 1e12, "gbs": bytes /
    1e9)."""
    names = list(cases)
    ms = interleaved_ms([(cases[name], sets) for name in names])
    scale = {"tflops": 1e9, "gbs": 1e6}[unit]
    return {"shape": list(shape), "ms": dict(zip(names, ms)),
            unit: {name: work / t / scale for name, t in zip(names, ms)}}


def print_us_table(rows) -> None:
    """A markdown table of rows' ``us`` timings (one column per implementation) by shape."""
    names = list(rows[0]["us"])
    print("| M×N×K | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for r in rows:
        print(f"| {'×'.join(map(str, r['shape']))} | "
              + " | ".join(f"{r['us'][n]:.1f}" for n in names) + " |")


def enqueue_us(fn, calls: int = 200, rounds: int = 50) -> float:
    """Host time per call: the wall time of ``calls`` calls queued right after a
    synchronization (a queue that short never fills, so the GPU's time to run them is not in
    it), median of ``rounds``."""
    for _ in range(calls):
        fn()
    times = []
    for _ in range(rounds):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    cp.cuda.Device().synchronize()
    return statistics.median(times)


def per_call_us(fn, calls: int = 20000) -> float:
    """Wall time per call of ``fn`` called back to back (best of 5 rounds), in microseconds."""
    for _ in range(200):
        fn()
    cp.cuda.Device().synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        cp.cuda.Device().synchronize()
        best.append((time.perf_counter() - t0) / (calls // 5) * 1e6)
    return min(best)
