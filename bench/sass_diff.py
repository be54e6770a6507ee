"""Machine code of kernel variants, a git revision against the working tree (no GPU needed):
a change to the templates that should not change what runs is checked by comparing SASS.

    python bench/sass_diff.py [--base HEAD] [--family REGEX] [--step N] [--jobs N]

The variants are the compile tests' covering sets (``tests/ops/gemm/test_compile.py``), the
families whose name matches ``--family`` (default: every family), every ``--step``-th. Each
variant is rendered by the revision's code (a checkout of ``--base`` in a temporary
directory) and by the working tree's, both are compiled with the working tree's NVRTC and
options, and their SASS (``cuobjdump``) is compared, with registers and spills. Exit status:
0 the same everywhere, 1 a variant differs (each is listed), 2 a mistake in the arguments or
no disassembler.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import ROOT

_OPCODE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")

#: no GPU work here (it compiles, on the CPU): no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False

#: rendered in a checkout (its own ge2jit and tests on the path): the covering sets' variants
#: of the matching families, every STEP-th, as DIR/<index>.cu and DIR/meta.json
_RENDER = r"""
import json, re, sys
from pathlib import Path
from tests.ops.gemm import test_compile as tc
from ge2jit.jit.render import render
family, step, out = re.compile(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
meta = []
for name, rows in tc.COVERING.items():
    if not family.search(name):
        continue
    make = tc.FAMILIES[name][1]
    for p in rows[::step]:
        spec = make(p)
        arch = spec.target_arch(p["arch"])
        i = len(meta)
        (out / f"{i}.cu").write_text(render(spec))
        meta.append([name, spec.kernel_name, arch, list(spec.compile_options())])
(out / "meta.json").write_text(json.dumps(meta))
"""


def _render(tree: Path, family: str, step: int, out: Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", _RENDER, family, str(step), str(out)], cwd=tree,
                   env=env, check=True)
    return json.loads((out / "meta.json").read_text())


def _checkout(rev: str, where: Path) -> None:
    """The files of ``rev`` in ``where`` (``git archive``: no worktree to clean up)."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)


def _sass(args) -> tuple:
    path, name, arch, options = args
    from ge2jit.jit import nvrtc
    from ge2jit.jit.sass import dump_sass

    result = nvrtc.compile_to_cubin(Path(path).read_text(), name, arch, tuple(options))
    r = result.resources
    return dump_sass(result.cubin), r.registers, r.spill_stores + r.spill_loads


def _mix(sass: str) -> Counter:
    """How many of each opcode (predicates and modifiers dropped: ``@P0 LDG.E.128`` is LDG)."""
    ops = (_OPCODE.match(line) for line in sass.splitlines())
    return Counter(m.group(1).split(".")[0] for m in ops if m)


def _mix_change(old: str, new: str) -> str:
    """The opcodes whose counts differ, as ``FFMA 812 -> 810``, or '' for the same mix."""
    a, b = _mix(old), _mix(new)
    return ", ".join(f"{op} {a[op]} -> {b[op]}" for op in sorted(a.keys() | b.keys())
                     if a[op] != b[op])


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the revision to compare with")
    ap.add_argument("--family", default="", help="a regular expression of the families")
    ap.add_argument("--step", type=int, default=1, help="every N-th variant of a family")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    try:
        re.compile(args.family)
    except re.error as e:
        ap.error(f"--family: expected a regular expression, got {args.family!r} ({e})")
    if args.step < 1 or args.jobs < 1:
        ap.error(f"--step, --jobs: expected positive integers, got {args.step}, {args.jobs}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from ge2jit.jit.sass import find_cuobjdump

    if find_cuobjdump() is None:
        print("sass_diff: cuobjdump not found: pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ge2jit-sass-diff-") as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        _checkout(args.base, tmp / "base")
        base = _render(tmp / "base", args.family, args.step, tmp / "base-src")
        here = _render(ROOT, args.family, args.step, tmp / "here-src")
        if [m[1:3] for m in base] != [m[1:3] for m in here]:
            print("sass_diff: the variants differ between the trees (the covering sets "
                  "changed); compare with a --family whose set did not", file=sys.stderr)
            return 2
        jobs = [(str(tmp / side / f"{i}.cu"), name, arch, options)
                for i, (_, name, arch, options) in enumerate(here)
                for side in ("base-src", "here-src")]
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_sass, jobs))
        differ = unstable = same_mix = 0
        for i, (family, name, arch, options) in enumerate(here):
            old, new = results[2 * i], results[2 * i + 1]
            if old == new:
                continue
            # NVRTC has been seen to allocate registers differently for the same source from
            # one compile to the next in a process: a difference counts if it holds again
            again = [_sass((str(tmp / side / f"{i}.cu"), name, arch, options))
                     for side in ("base-src", "here-src")]
            if again[0] == again[1]:
                unstable += 1
                print(f"unstable: {family} {name} ({arch}): the same when compiled again")
                continue
            differ += 1
            mix = _mix_change(again[0][0], again[1][0])
            same_mix += not mix
            print(f"differs: {family} {name} ({arch}): registers {again[0][1]} -> "
                  f"{again[1][1]}, spilled bytes {again[0][2]} -> {again[1][2]}, "
                  f"instructions {mix or 'the same mix (scheduling and register names only)'}")
    print(f"{len(here)} variants compared with {args.base}: {len(here) - differ} the same"
          f"{f' ({unstable} only when compiled again)' if unstable else ''}, "
          f"{differ} different" + (f" ({same_mix} of them with the same instruction mix)"
                                   if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
