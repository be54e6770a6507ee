"""Benchmark of ge2jit's softmax against torch.softmax and a plain copy, in turns in one run.

    python bench/bench_softmax.py [--json bench/results_softmax.json] [--quick]
                                  [--dtypes float32,bfloat16] [--lengths 128,1024,...]
                                  [--mib 512] [--rounds 30]

For each dtype and row length n (128 to 128k elements), an input of about ``--mib`` MiB
(rows = size / (n * itemsize), random normal values) is normalized along its last axis by:
``ge2jit`` (``ge2jit.ops.softmax.softmax`` into a preallocated output), ``torch``
(``torch.softmax(t, -1)`` on the same memory through ``torch.from_dlpack``) and ``copy``, the
bandwidth reference (PyTorch's ``copy_`` into a preallocated tensor; CuPy's elementwise copy
without PyTorch). CuPy and PyTorch both launch on the legacy default stream. Each is timed
with CUDA events, after warm-up, in batches of back-to-back calls of about 1 ms; the
implementations take turns (a batch of each per round), so that clock and temperature drift
falls on all alike; the median over the rounds is reported.
Bandwidth counts the bytes read and written once (2 x the input's size for the same dtype in
and out): a kernel that reads its input twice (the ``loop_*`` variants, rows above 32768)
cannot reach more than 2/3 of the copy's bandwidth by this measure.

Writes JSON (``meta``: device, SMs, date, commit from $GE2JIT_COMMIT or git, versions;
``rows``: one per dtype and length) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from common import add_quick, commit, cp, import_torch, interleaved_ms, np_dtype, quick_defaults

import ge2jit
from ge2jit.jit.device import gpu_count
from ge2jit.ops.softmax import choose, softmax

LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
QUICK_LENGTHS = [128, 1024, 4096, 32768, 131072]


def bench_row(dtype: str, n: int, mib: int, rounds: int, torch, sms: int) -> dict:
    dt = np_dtype(dtype)
    rows = max(1, (mib << 20) // (n * dt.itemsize))
    x = cp.random.standard_normal((rows, n), dtype=cp.float32)
    x = x.astype(dt) if dt != np.float32 else x
    y = cp.empty_like(x)
    nbytes = x.nbytes
    cases = {"ge2jit": lambda: softmax(x, out=y)}
    if torch is not None:
        tx, ty = torch.from_dlpack(x), torch.empty(x.shape, dtype=getattr(torch, dtype),
                                                   device="cuda")
        cases["torch"] = lambda: torch.softmax(tx, -1)
        cases["copy"] = lambda: ty.copy_(tx)
        copy_kind = "torch copy_"
    else:
        yc = cp.empty_like(x)

        def cupy_copy():
            yc[...] = x

        cases["copy"] = cupy_copy
        copy_kind = "cupy elementwise copy"
    # CuPy and PyTorch both launch on the legacy default stream here, where the events are
    # recorded
    times = interleaved_ms([(fn, [()]) for fn in cases.values()], rounds=rounds)
    ms = dict(zip(cases, times))
    gbps = {k: 2 * nbytes / (t * 1e-3) / 1e9 for k, t in ms.items()}
    row = {"dtype": dtype, "n": n, "rows": rows, "bytes_per_array": nbytes,
           "config": choose(rows, n, dtype, sms).config.name, "copy_kind": copy_kind,
           "ms": ms, "gbps": gbps,
           "pct_of_copy": {k: 100 * ms["copy"] / t for k, t in ms.items()}}
    if "torch" in ms:
        row["speedup_vs_torch"] = ms["torch"] / ms["ge2jit"]
        softmax(x, out=y)
        ref = torch.softmax(tx[:64].float(), -1)
        got = torch.from_dlpack(y[:64].astype(cp.float32))
        row["max_abs_diff_vs_torch_f32"] = float((got - ref).abs().max())
    return row


def table(rows: list[dict]) -> str:
    head = ("| dtype | n | rows | config | ge2jit GB/s | % of copy | torch GB/s | % of copy | "
            "copy GB/s | ge2jit vs torch |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        g, p = r["gbps"], r["pct_of_copy"]
        torch_cells = (f"{g['torch']:.0f} | {p['torch']:.1f}% | " if "torch" in g
                       else "- | - | ")
        speed = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        lines.append(f"| {r['dtype']} | {r['n']} | {r['rows']} | {r['config']} | "
                     f"{g['ge2jit']:.0f} | {p['ge2jit']:.1f}% | {torch_cells}"
                     f"{g['copy']:.0f} | {speed} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked: ``lengths`` and ``dtypes`` as lists, ``mib`` and ``rounds``
    numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=str(Path(__file__).parent / "results_softmax.json"),
                        help="where to write the results (JSON)")
    add_quick(parser, f"lengths {QUICK_LENGTHS}, 256 MiB inputs, 8 rounds")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--lengths", default=None, help="row lengths, comma-separated")
    parser.add_argument("--mib", type=int, default=None, help="input size (default 512 MiB)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 30)")
    args = parser.parse_args(argv)
    try:
        args.lengths = ([int(v) for v in args.lengths.split(",")] if args.lengths
                        else QUICK_LENGTHS if args.quick else LENGTHS)
    except ValueError:
        parser.error(f"--lengths: expected integers separated by commas, got {args.lengths!r}")
    args.dtypes = args.dtypes.split(",")
    for d in args.dtypes:
        if d not in ("float32", "bfloat16", "float16"):
            parser.error(f"--dtypes: expected float32, bfloat16 or float16, got {d!r}")
    quick_defaults(args, mib=(512, 256), rounds=(30, 8))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    lengths, dtypes, mib, rounds = args.lengths, args.dtypes, args.mib, args.rounds
    if gpu_count() == 0:
        print("bench_softmax.py needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    torch = import_torch()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = dev.attributes["MultiProcessorCount"]
    meta = {"device": props["name"].decode(), "sms": sms, "date": time.strftime("%Y-%m-%d"),
            "commit": commit(), "ge2jit": ge2jit.__version__, "cupy": cp.__version__,
            "torch": getattr(torch, "__version__", None), "mib": mib, "rounds": rounds}
    rows = []
    for dtype in dtypes:
        for n in lengths:
            row = bench_row(dtype, n, mib, rounds, torch, sms)
            cp.get_default_memory_pool().free_all_blocks()      # the row's arrays are gone
            if torch is not None:
                torch.cuda.empty_cache()
            rows.append(row)
            print(f"{dtype:8s} n={n:6d} rows={row['rows']:8d} {row['config']:14s} "
                  + ", ".join(f"{k} {row['ms'][k]:.4f} ms {row['gbps'][k]:.0f} GB/s"
                              for k in row["ms"]), flush=True)
            Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print()
    print(f"{meta['device']}, {mib} MiB per input, median of {rounds} rounds, commit "
          f"{meta['commit']}")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
