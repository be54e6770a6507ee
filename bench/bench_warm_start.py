"""A data-parallel job started on a warmed, read-only kernel cache: each rank's first step
against a later one, by world size.

    python bench/bench_warm_start.py [--world 2,4] [--d 4096] [--tokens 16384]
                                     [--no-profile] [--json bench/results_warm_start.json]
                                     [--quick]

A cluster job starts on a shared cache that a warm-up filled, each rank with a fresh directory
of its own in front of it (``GE2JIT_CACHE_DIR="fresh/rank<r>:warmed"``). Here one process
first warms the cache by running the job's step once (its kernels compiled into an empty
directory), the directory is made read-only, then a job of each ``--world`` size (one process
a GPU, rank 0's parameters broadcast to every rank as a data-parallel job starts) runs
``warm_start_worker.py``'s step: an MLP block (d -> 4d -> d, ``--tokens`` a GPU, bfloat16,
the gradients averaged in bfloat16 under the backward, Adam). Each rank reports its first
step (from the broadcast to the step's end on the GPU), the median of 5 later steps, and the
kernels it loaded and compiled; the fresh directories' files are counted after.

The target is a first step within 2x a later one on every rank. A world whose slowest rank
misses it is run once more with the first step under cProfile (unless ``--no-profile``), and
that rank's first step is broken down by part (the GPU synchronized after each) and by its
costliest calls. Writes JSON (device, date, commit, rows).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, add_quick, commit, cp, device_meta, int_list, quick_defaults

WORKER = Path(__file__).with_name("warm_start_worker.py")
TARGET = 2.0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--world", type=int_list, default=None,
                    help="world sizes, comma-separated (default 2,4: those the GPUs allow)")
    ap.add_argument("--d", type=int, default=None, help="the block's width (default 4096)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens (rows) a GPU (default 16384)")
    ap.add_argument("--no-profile", action="store_true",
                    help="no profiled rerun of a world that misses the target")
    ap.add_argument("--json", help="write the results here")
    add_quick(ap, "d 1024, 4096 tokens, world 2")
    args = ap.parse_args(argv)
    quick_defaults(args, world=([2, 4], [2]), d=(4096, 1024), tokens=(16384, 4096))
    return args


def job(world: int, caches: list[str], tmp: Path, name: str, d: int, tokens: int,
        profile: bool = False) -> list[dict]:
    """``world`` worker processes (rank r on GPU r, ``GE2JIT_CACHE_DIR`` ``caches[r]``); their
    reports, by rank. Raises RuntimeError naming the rank that failed, with its output's end."""
    from ge2jit.distributed.launch import free_port, local_environments

    procs = []
    for rank, env in enumerate(local_environments(world, master_port=free_port())):
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        env["GE2JIT_CACHE_DIR"] = caches[rank]
        argv = [sys.executable, str(WORKER), str(tmp / f"{name}{rank}.json"), str(d),
                str(tokens), *["profile"] * profile]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise RuntimeError(f"{name}: rank {rank} failed (exit {p.returncode}):\n"
                               f"{out[-3000:]}")
    return [json.loads((tmp / f"{name}{r}.json").read_text()) for r in range(world)]


def set_writable(root: Path, on: bool) -> None:
    """``root`` and everything under it writable by its owner (``on``) or by nobody."""
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if on
                   else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def warm(tmp: Path, d: int, tokens: int) -> tuple[Path, dict]:
    """A kernel cache warmed by the job's step run once in one process (every rank runs the
    same kernels): its directory and that run's report."""
    root = tmp / "warmed"
    root.mkdir(mode=0o700)
    (warming,) = job(1, [str(root)], tmp, "warming", d, tokens)
    return root, warming


def start(world: int, warmed: Path, tmp: Path, d: int, tokens: int,
          profile: bool = False) -> tuple[list[dict], list[Path]]:
    """A job of ``world`` ranks on the read-only ``warmed`` cache behind a fresh directory per
    rank: (the ranks' reports, the fresh directories)."""
    fresh = [tmp / f"fresh{world}{'p' if profile else ''}" / f"rank{r}" for r in range(world)]
    for f in fresh:
        f.mkdir(parents=True, mode=0o700)
    set_writable(warmed, False)
    try:
        reports = job(world, [f"{fresh[r]}{os.pathsep}{warmed}" for r in range(world)], tmp,
                      f"w{world}{'p' if profile else ''}", d, tokens, profile)
    finally:
        set_writable(warmed, True)
    return reports, fresh


def files_in(directories: list[Path]) -> int:
    return sum(1 for f in directories for p in f.rglob("*") if p.is_file())


def profile_report(report: dict) -> str:
    """A profiled rank's first step: its parts against a later step's, its costliest calls."""
    parts = "\n".join(f"{name:>22}: first {first * 1e3:8.1f} ms, later "
                      f"{report['phases']['later'].get(name, 0) * 1e3:8.1f} ms"
                      for name, first in report["phases"]["first"].items())
    calls = "\n".join(f"{t * 1e3:9.1f} ms  {name}" for t, name in report["first_step_profile"])
    return (f"rank {report['rank']}'s first step under cProfile "
            f"({report['first_s'] * 1e3:.1f} ms), its parts (the GPU synchronized after "
            f"each):\n{parts}\nits costliest calls:\n{calls}")


def main(argv=None) -> int:
    args = parse_args(argv)
    gpus = cp.cuda.runtime.getDeviceCount()
    worlds = [w for w in args.world if w <= gpus]
    if not worlds:
        print(f"bench_warm_start: --world {args.world} needs more GPUs than the {gpus} here",
              file=sys.stderr)
        return 1
    rows, profiles = [], {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        warmed, warming = warm(tmp, args.d, args.tokens)
        for world in worlds:
            reports, fresh = start(world, warmed, tmp, args.d, args.tokens)
            written = files_in(fresh)
            for r in reports:
                rows.append({"world": world, "rank": r["rank"], "first_ms": r["first_s"] * 1e3,
                             "later_ms": r["later_s"] * 1e3,
                             "ratio": r["first_s"] / r["later_s"], "loaded": r["hits"],
                             "compiled": r["misses"], "fresh_files": written})
            worst = max(reports, key=lambda r: r["first_s"] / r["later_s"])
            if worst["first_s"] > TARGET * worst["later_s"] and not args.no_profile:
                again, _ = start(world, warmed, tmp, args.d, args.tokens, profile=True)
                profiles[world] = profile_report(again[worst["rank"]])
    print(f"\nfirst step on a warmed read-only cache (d {args.d}, {args.tokens} tokens a GPU; "
          f"warming it took {warming['first_s'] * 1e3:.1f} ms, {warming['misses']} kernels "
          f"compiled)")
    print("| world | rank | first ms | later ms | first / later | target 2x | kernels loaded "
          "| compiled | files in the fresh directories |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world']} | {r['rank']} | {r['first_ms']:.1f} | {r['later_ms']:.1f} | "
              f"{r['ratio']:.2f} | {'met' if r['ratio'] <= TARGET else 'missed'} | "
              f"{r['loaded']} | {r['compiled']} | {r['fresh_files']} |")
    for world, text in profiles.items():
        print(f"\nworld {world}, the slowest rank again: {text}")
    if args.json:
        meta = {**device_meta(), "date": time.strftime("%Y-%m-%d"), "commit": commit(),
                "d": args.d, "tokens": args.tokens, "warming_ms": warming["first_s"] * 1e3,
                "rows": rows, "profiles": {str(w): t for w, t in profiles.items()}}
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
