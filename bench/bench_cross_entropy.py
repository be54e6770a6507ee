"""Benchmark of ge2jit's cross-entropy step and softmax backward against PyTorch's.

One training step's loss and gradient against PyTorch eager and torch.compile, and the softmax
backward against PyTorch's, the implementations timed in turns in one run:

    python bench/bench_cross_entropy.py [--json bench/results_cross_entropy.json] [--quick]
                                        [--dtypes bfloat16,float32] [--classes 32000,...]
                                        [--rows 4096,8192,16384] [--rounds 20] [--no-compile]
                                        [--softmax-lengths 128,...]

For each logits dtype, class count V and row count, one training step's loss and gradient
(random normal logits, random classes, every 16th row ignored, mean reduction) by:

``ge2jit``          ``ge2jit.cross_entropy(x, t, grad=True, out=g)``: loss and gradient in one
                    call into a preallocated gradient (CuPy arrays);
``ge2jit_inplace``  the same with ``inplace=True`` (the gradient over the logits);
``ge2jit_torch``    ``ge2jit.torch.cross_entropy(x, t)`` then ``loss.backward()`` (the
                    forward keeps the gradient its kernel writes; the backward scales it in
                    place, a no-op for an upstream gradient of 1);
``torch``           ``F.cross_entropy(x, t)`` then ``loss.backward()``, eager;
``torch_compile``   the same step under ``torch.compile`` (``--no-compile`` leaves it out);
``copy``            the bandwidth reference: ``copy_`` of the logits into another tensor.

The classes are checked without synchronizing (``check_targets=False``) in the timed calls.
Each is timed with CUDA events in batches of back-to-back calls of about 1 ms, the
implementations taking turns (a batch of each per round), the median over the rounds reported
(``bench_gemm.interleaved_ms``). Bandwidth: the least a step must move, the logits read once
and the gradient written once (2 x rows x V x itemsize bytes), over the time; ``% of copy`` is
the copy's time over the implementation's (a copy moves the same bytes). ge2jit's kernel reads
each row twice (the loss needs the row's max and sum before any gradient element is known), so
it moves 3 x rows x V x itemsize bytes. Peak memory: ``torch.cuda.max_memory_allocated`` over
one step beyond what was allocated before it (the inputs; ``ge2jit`` and ``ge2jit_inplace``
run on tensors for this, from PyTorch's allocator), in MiB. A case that runs out of memory is
recorded as such. The softmax backward rows: ``ge2jit.softmax_backward(dy, y, out=dx)``
against ``torch._softmax_backward_data`` and a copy, GB/s of 3 x the input's bytes (dy and y
read, dx written).

Writes JSON (``meta``: device, date, commit from $GE2JIT_COMMIT or git, versions; ``rows``;
``softmax_backward``) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import add_quick, commit, cp, import_torch, interleaved_ms, np_dtype, quick_defaults

import ge2jit
from ge2jit.jit.device import gpu_count
from ge2jit.ops.cross_entropy import heuristic

CLASSES = [32000, 50304, 128256, 262144]
ROW_COUNTS = [4096, 8192, 16384]
QUICK_CLASSES = [32000, 128256]
QUICK_ROWS = [4096]
SOFTMAX_LENGTHS = [128, 1024, 4096, 16384, 32768, 131072]
IGNORE_EVERY = 16


def _inputs(torch, rows: int, n: int, dtype: str):
    """(logits, targets) as torch tensors: normal logits of ``dtype``, random classes, every
    16th row ignored."""
    logits = torch.randn(rows, n, device="cuda").to(getattr(torch, dtype))
    targets = torch.randint(0, n, (rows,), device="cuda")
    targets[::IGNORE_EVERY] = -100
    return logits, targets


def _peak_mib(torch, step) -> float | str:
    """The memory one step allocates beyond what exists before it, in MiB; "oom" when it runs
    out, the error's first line when it fails otherwise (torch.compile, say)."""
    try:
        step()                                   # kernels loaded (compiled), caches warm
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    except torch.cuda.OutOfMemoryError:
        return "oom"
    except Exception as e:  # noqa: BLE001 - a baseline that fails is a result, not a crash
        return (str(e).splitlines() or [repr(e)])[0][:200]


def steps(torch, gt, logits, targets, scratch, compile_: bool) -> dict:
    """Each implementation's step on torch tensors, for the peak memory (``ge2jit`` makes a
    new gradient here; it is timed into a preallocated one); ``scratch``: a copy of the
    logits that the in-place gradient overwrites."""
    F = torch.nn.functional
    x = logits.detach().clone().requires_grad_(True)

    def ge2jit_torch():
        x.grad = None
        gt.cross_entropy(x, targets, check_targets=False).backward()

    def torch_eager():
        x.grad = None
        F.cross_entropy(x, targets).backward()

    out = {"ge2jit": lambda: ge2jit.cross_entropy(logits, targets, grad=True,
                                                  check_targets=False),
           "ge2jit_inplace": lambda: ge2jit.cross_entropy(scratch, targets, grad=True,
                                                          inplace=True, check_targets=False),
           "ge2jit_torch": ge2jit_torch, "torch": torch_eager}
    if compile_:
        compiled = torch.compile(lambda a, b: F.cross_entropy(a, b))

        def torch_compile():
            x.grad = None
            compiled(x, targets).backward()

        out["torch_compile"] = torch_compile
    return out


def bench_row(torch, gt, dtype: str, n: int, rows: int, rounds: int, compile_: bool) -> dict:
    itemsize = np_dtype(dtype).itemsize
    nbytes = rows * n * itemsize
    row = {"dtype": dtype, "classes": n, "rows": rows, "bytes": nbytes,
           "config": heuristic(n).name, "ms": {}, "gbps": {}, "pct_of_copy": {},
           "peak_mib": {}, "errors": {}}
    free, _ = torch.cuda.mem_get_info()
    if free < 5 * nbytes:      # logits, their autograd copy, scratch, copy target, a gradient
        row["errors"]["all"] = (f"needs about {5 * nbytes / 2**30:.1f} GiB, "
                                f"{free / 2**30:.1f} free")
        return row
    logits, targets = _inputs(torch, rows, n, dtype)
    copy_dst = torch.empty_like(logits)    # the copy's target, and ge2jit's timed gradient
    cases = steps(torch, gt, logits, targets, logits.clone(), compile_)
    for name, step in cases.items():
        row["peak_mib"][name] = _peak_mib(torch, step)
    timed = {k: v for k, v in cases.items() if isinstance(row["peak_mib"][k], float)}
    cu_logits, cu_targets = cp.from_dlpack(logits), cp.from_dlpack(targets)
    cu_grad = cp.from_dlpack(copy_dst)
    timed["ge2jit"] = lambda: ge2jit.cross_entropy(cu_logits, cu_targets, grad=True,
                                                   out=cu_grad, check_targets=False)
    timed["copy"] = lambda: copy_dst.copy_(logits)
    # CuPy and PyTorch both launch on the legacy default stream here, where the events are
    # recorded
    times = interleaved_ms([(fn, [()]) for fn in timed.values()], rounds=rounds)
    row["ms"] = dict(zip(timed, times))
    for k, t in row["ms"].items():
        row["gbps"][k] = 2 * nbytes / (t * 1e-3) / 1e9
        row["pct_of_copy"][k] = 100 * row["ms"]["copy"] / t
    for k in cases:
        if k not in row["ms"]:
            row["errors"][k] = row["peak_mib"].pop(k)
    if "torch" in row["ms"] and "ge2jit_torch" in row["ms"]:
        row["speedup_vs_torch"] = row["ms"]["torch"] / row["ms"]["ge2jit_torch"]
    loss, g = ge2jit.cross_entropy(logits, targets, grad=True)
    ref = torch.nn.functional.cross_entropy(logits.float(), targets)
    row["loss_abs_diff_vs_torch_f32"] = float((loss - ref).abs())
    return row   # the arrays go with this frame


def bench_softmax_backward(torch, dtype: str, n: int, rounds: int, mib: int = 512) -> dict:
    dt = np_dtype(dtype)
    rows = max(1, (mib << 20) // (n * dt.itemsize))
    y = ge2jit.softmax(cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt))
    dy = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt)
    dx = cp.empty_like(dy)
    cases = {"ge2jit": lambda: ge2jit.softmax_backward(dy, y, out=dx)}
    if torch is not None:
        ty, tdy = torch.from_dlpack(y), torch.from_dlpack(dy)
        tdt = getattr(torch, dtype)
        cases["torch"] = lambda: torch._softmax_backward_data(tdy, ty, -1, tdt)
        tc = torch.empty_like(ty)
        cases["copy"] = lambda: tc.copy_(ty)
    times = interleaved_ms([(fn, [()]) for fn in cases.values()], rounds=rounds)
    ms = dict(zip(cases, times))
    nbytes = y.nbytes
    return {"dtype": dtype, "n": n, "rows": rows,
            "config": ge2jit.explain(ge2jit.softmax_backward, dy, y).config, "ms": ms,
            "gbps": {k: 3 * nbytes / (t * 1e-3) / 1e9 for k, t in ms.items()},
            "copy_gbps": (2 * nbytes / (ms["copy"] * 1e-3) / 1e9) if "copy" in ms else None}


def table(rows: list[dict]) -> str:
    names = ["ge2jit", "ge2jit_inplace", "ge2jit_torch", "torch", "torch_compile"]
    head = "| dtype | V | rows | config | " + " | ".join(
        f"{n} ms (% copy, MiB)" for n in names) + " | vs torch |"
    lines = [head, "|" + "---|" * (len(names) + 5)]
    for r in rows:
        cells = []
        for n in names:
            if n in r["ms"]:
                peak = r["peak_mib"].get(n, "-")
                peak = f"{peak:.0f}" if isinstance(peak, float) else peak
                cells.append(f"{r['ms'][n]:.3f} ({r['pct_of_copy'][n]:.0f}%, {peak})")
            else:
                cells.append(r["errors"].get(n) or r["errors"].get("all") or "-")
        speed = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        lines.append(f"| {r['dtype']} | {r['classes']} | {r['rows']} | {r['config']} | "
                     + " | ".join(cells) + f" | {speed} |")
    return "\n".join(lines)


def softmax_table(rows: list[dict]) -> str:
    lines = ["| dtype | n | rows | config | ge2jit GB/s | torch GB/s | copy GB/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gbps"]
        torch_cell = f"{g['torch']:.0f}" if "torch" in g else "-"
        copy_cell = f"{r['copy_gbps']:.0f}" if r["copy_gbps"] else "-"
        lines.append(f"| {r['dtype']} | {r['n']} | {r['rows']} | {r['config']} | "
                     f"{g['ge2jit']:.0f} | {torch_cell} | {copy_cell} |")
    return "\n".join(lines)


def _ints(parser, name: str, text: str | None, default: list[int]) -> list[int]:
    if text is None:
        return default
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        parser.error(f"--{name}: expected integers separated by commas, got {text!r}")


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked: ``classes``, ``rows``, ``lengths`` and ``dtypes`` as lists,
    ``rounds`` a number."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=str(Path(__file__).parent /
                                              "results_cross_entropy.json"),
                        help="where to write the results (JSON)")
    add_quick(parser, f"classes {QUICK_CLASSES}, rows {QUICK_ROWS}, 8 rounds")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--classes", default=None, help="class counts, comma-separated")
    parser.add_argument("--rows", default=None, help="row counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 20)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--softmax-lengths", default=None,
                        help="softmax backward row lengths, comma-separated ('' for none)")
    args = parser.parse_args(argv)
    args.classes = _ints(parser, "classes", args.classes,
                         QUICK_CLASSES if args.quick else CLASSES)
    args.rows = _ints(parser, "rows", args.rows, QUICK_ROWS if args.quick else ROW_COUNTS)
    args.lengths = ([] if args.softmax_lengths == "" else
                    _ints(parser, "softmax-lengths", args.softmax_lengths, SOFTMAX_LENGTHS))
    args.dtypes = args.dtypes.split(",")
    for d in args.dtypes:
        if d not in ("float32", "bfloat16", "float16"):
            parser.error(f"--dtypes: expected float32, bfloat16 or float16, got {d!r}")
    quick_defaults(args, rounds=(20, 8))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    classes, row_counts, lengths = args.classes, args.rows, args.lengths
    dtypes, rounds = args.dtypes, args.rounds
    if gpu_count() == 0:
        print("bench_cross_entropy.py needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    torch = import_torch()
    if torch is None:
        print("bench_cross_entropy.py needs PyTorch with CUDA (its baselines and the peak "
              "memory come from it)", file=sys.stderr)
        return 2
    import ge2jit.torch as gt

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    meta = {"device": props["name"].decode(), "sms": dev.attributes["MultiProcessorCount"],
            "date": time.strftime("%Y-%m-%d"), "commit": commit(), "ge2jit": ge2jit.__version__,
            "cupy": cp.__version__, "torch": torch.__version__, "rounds": rounds,
            "ignored_rows": f"every {IGNORE_EVERY}th", "reduction": "mean"}
    result = {"meta": meta, "rows": [], "softmax_backward": []}
    for dtype in dtypes:
        for n in classes:
            for rows in row_counts:
                row = bench_row(torch, gt, dtype, n, rows, rounds, not args.no_compile)
                result["rows"].append(row)
                cp.get_default_memory_pool().free_all_blocks()
                torch.cuda.empty_cache()
                print(f"{dtype:8s} V={n:6d} rows={rows:5d} " + ", ".join(
                    f"{k} {t:.3f} ms" for k, t in row["ms"].items()) + (
                    f" {row['errors']}" if row["errors"] else ""), flush=True)
                Path(args.json).write_text(json.dumps(result, indent=1))
        for n in lengths:
            r = bench_softmax_backward(torch, dtype, n, rounds)
            result["softmax_backward"].append(r)
            cp.get_default_memory_pool().free_all_blocks()
            print(f"{dtype:8s} softmax_backward n={n:6d} " + ", ".join(
                f"{k} {g:.0f} GB/s" for k, g in r["gbps"].items()), flush=True)
            Path(args.json).write_text(json.dumps(result, indent=1))
    print()
    print(f"{meta['device']}, median of {rounds} rounds, commit {meta['commit']}")
    print()
    print(table(result["rows"]))
    if result["softmax_backward"]:
        print()
        print(softmax_table(result["softmax_backward"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
