"""Benchmark of ge2jit's rms_norm and layer_norm against PyTorch eager, torch.compile and a copy.

Forward and backward, with and without the fused residual add, in turns in one run:

    python bench/bench_norm.py [--json bench/results_norm.json] [--quick]
                               [--kinds rms,layer] [--dtypes bfloat16,float32]
                               [--hidden 1024,2048,4096,8192,16384] [--mib 128] [--rounds 20]
                               [--no-compile]

For each kind, dtype and hidden size n, x is about ``--mib`` MiB (rows = size / (n *
itemsize), random normal values), the weight (and bias) n values of x's type. Cases, each
timed for:

``forward``
    ``ge2jit`` (into a preallocated y), ``torch`` (``F.rms_norm`` / ``F.layer_norm``),
    ``compile`` (the same under ``torch.compile``); reads x, writes y.
``forward+residual``
    ``ge2jit`` (``residual=``, y and h preallocated: one pass), ``torch`` (``h = x + r`` then
    the norm: two passes), ``compile`` (the same compiled: Inductor fuses it); reads x and r,
    writes h and y.
``backward`` (with ``--backward``, the default)
    ``ge2jit`` (``*_norm_backward`` with the saved statistics: dx, and dweight/dbias through
    the fixed-order partial sums), ``torch`` (``torch.autograd.grad`` of the eager forward's
    graph: dx, dweight, dbias), ``compile`` (the compiled forward's backward graph); reads dy
    and h, writes dx. ``backward+dh`` adds the gradient arriving at h (ge2jit's ``dh=``,
    added in the same pass; torch: ``dx + dh``).

``copy`` is the bandwidth reference: PyTorch's ``copy_`` of x into a preallocated tensor
(CuPy's elementwise copy without PyTorch). Every case is timed with CUDA events, after
warm-up, in batches of back-to-back calls of about 1 ms; the implementations of one row take
turns (a batch of each per round) so that clock and temperature drift falls on all alike;
the median over the rounds is reported. GB/s counts each array read or written once (the
weight and statistics are ignored); "% of copy" is that rate over the copy's.

Writes JSON (``meta``: device, SMs, date, commit from $GE2JIT_COMMIT or git, versions;
``rows``: one per kind, dtype, n and case) and prints a markdown table.
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

HIDDEN = [1024, 2048, 4096, 8192, 16384]
QUICK_HIDDEN = [4096]
CASES = ("forward", "forward+residual", "backward", "backward+dh")


def _arrays(kind: str, dtype: str, n: int, mib: int) -> dict:
    dt = np_dtype(dtype)
    rows = max(1, (mib << 20) // (n * dt.itemsize))
    rng = cp.random.default_rng(0)

    def rand(shape):
        return rng.standard_normal(shape, dtype=cp.float32).astype(dt)

    a = {"x": rand((rows, n)), "r": rand((rows, n)), "dy": rand((rows, n)),
         "dh": rand((rows, n)), "w": rand(n), "b": rand(n) if kind == "layer" else None}
    a["y"], a["h"] = cp.empty_like(a["x"]), cp.empty_like(a["x"])
    a["rows"] = rows
    return a


def _ge2jit_cases(kind: str, a: dict) -> dict:
    """case -> a call of ge2jit on these arrays."""
    fn = ge2jit.rms_norm if kind == "rms" else ge2jit.layer_norm
    aff = (a["w"],) if kind == "rms" else (a["w"], a["b"])
    stats = fn(a["x"], *aff, save_stats=True)
    if kind == "rms":
        def back(dh):
            return ge2jit.rms_norm_backward(a["dy"], a["x"], a["w"], stats.rstd, dh=dh)
    else:
        def back(dh):
            return ge2jit.layer_norm_backward(a["dy"], a["x"], a["w"], stats.mean, stats.rstd,
                                              bias=a["b"], dh=dh)
    return {"forward": lambda: fn(a["x"], *aff, out=a["y"]),
            "forward+residual": lambda: fn(a["x"], *aff, residual=a["r"], out=a["y"],
                                           residual_out=a["h"]),
            "backward": lambda: back(None), "backward+dh": lambda: back(a["dh"])}


def _torch_cases(torch, kind: str, a: dict, compiled: bool) -> dict:
    """case -> the same work by PyTorch (eager, or under torch.compile)."""
    F = torch.nn.functional
    t = {k: None if a[k] is None else torch.from_dlpack(a[k]) for k in
         ("x", "r", "dy", "dh", "w", "b")}
    n = (t["x"].shape[-1],)

    def norm(x, w, b):
        return F.rms_norm(x, n, w, eps=1e-6) if kind == "rms" else F.layer_norm(x, n, w, b)

    def norm_residual(x, r, w, b):
        h = x + r
        return norm(h, w, b), h

    if compiled:
        # The backward is timed alone, on a graph kept for every call (retain_graph=True);
        # a compiled backward that donates its saved buffers refuses to run twice
        # (PyTorch 2.5 and later), so the compiled graph donates none
        import torch._functorch.config as functorch_config

        if hasattr(functorch_config, "donated_buffer"):
            functorch_config.donated_buffer = False
        norm, norm_residual = torch.compile(norm), torch.compile(norm_residual)
    leaves = [t["x"].detach().requires_grad_(), t["w"].detach().requires_grad_()]
    if t["b"] is not None:
        leaves.append(t["b"].detach().requires_grad_())
    y = norm(leaves[0], leaves[1], leaves[2] if len(leaves) > 2 else None)

    def back():
        return torch.autograd.grad(y, leaves, t["dy"], retain_graph=True)

    def back_dh():
        g = back()
        return g[0] + t["dh"], *g[1:]

    return {"forward": lambda: norm(t["x"], t["w"], t["b"]),
            "forward+residual": lambda: norm_residual(t["x"], t["r"], t["w"], t["b"]),
            "backward": back, "backward+dh": back_dh}


def _config(kind: str, case: str, a: dict) -> str:
    """The config ge2jit's call of a case takes."""
    fn = ge2jit.rms_norm if kind == "rms" else ge2jit.layer_norm
    if case.startswith("forward"):
        return ge2jit.explain(fn, a["x"], a["w"]).config
    stats = fn(a["x"], a["w"], save_stats=True)
    if kind == "rms":
        return ge2jit.explain(ge2jit.rms_norm_backward, a["dy"], a["x"], a["w"],
                              stats.rstd).config
    return ge2jit.explain(ge2jit.layer_norm_backward, a["dy"], a["x"], a["w"], stats.mean,
                          stats.rstd).config


def _copy(torch, a: dict):
    if torch is None:
        def cupy_copy():
            a["y"][...] = a["x"]
        return cupy_copy, "cupy elementwise copy"
    tx, ty = torch.from_dlpack(a["x"]), torch.from_dlpack(a["y"])
    return (lambda: ty.copy_(tx)), "torch copy_"


#: arrays of x's size each case reads and writes once
TRAFFIC = {"forward": 2, "forward+residual": 4, "backward": 3, "backward+dh": 4}


def bench(kind: str, dtype: str, n: int, mib: int, rounds: int, torch, use_compile: bool,
          cases) -> list[dict]:
    a = _arrays(kind, dtype, n, mib)
    impls = {"ge2jit": _ge2jit_cases(kind, a)}
    if torch is not None:
        impls["torch"] = _torch_cases(torch, kind, a, False)
        if use_compile:
            impls["compile"] = _torch_cases(torch, kind, a, True)
    copy, copy_kind = _copy(torch, a)
    nbytes = a["x"].nbytes
    out = []
    for case in cases:
        fns = {}
        for name, impl in impls.items():
            try:
                impl[case]()
            except Exception as e:  # noqa: BLE001 - a baseline that cannot run is a note
                print(f"  {name} {case}: left out ({type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0][:120]})", flush=True)
                continue
            fns[name] = impl[case]
        fns["copy"] = copy
        # CuPy and PyTorch both launch on the legacy default stream here, where the events
        # are recorded
        times = interleaved_ms([(fn, [()]) for fn in fns.values()], rounds=rounds)
        ms = dict(zip(fns, times))
        gbps = {k: (TRAFFIC[case] if k != "copy" else 2) * nbytes / (v * 1e-3) / 1e9
                for k, v in ms.items()}
        row = {"kind": kind, "dtype": dtype, "n": n, "rows": a["rows"], "case": case,
               "bytes_per_array": nbytes, "copy_kind": copy_kind, "ms": ms, "gbps": gbps,
               "pct_of_copy": {k: 100 * v / gbps["copy"] for k, v in gbps.items()}}
        if "torch" in ms:
            row["speedup_vs_torch"] = ms["torch"] / ms["ge2jit"]
        if "compile" in ms:
            row["speedup_vs_compile"] = ms["compile"] / ms["ge2jit"]
        row["config"] = _config(kind, case, a)
        out.append(row)
        print(f"{kind:5s} {dtype:8s} n={n:6d} rows={a['rows']:8d} {case:17s} "
              + ", ".join(f"{k} {ms[k]:.4f} ms {gbps[k]:.0f} GB/s" for k in ms), flush=True)
    return out


def table(rows: list[dict]) -> str:
    names = [k for k in ("ge2jit", "torch", "compile") if any(k in r["ms"] for r in rows)]
    head = ("| kind | dtype | n | rows | case | " + " | ".join(
        f"{k} GB/s | % of copy" for k in names) + " | vs torch | vs compile |")
    lines = [head, "|" + "---|" * (5 + 2 * len(names) + 2)]
    for r in rows:
        cells = " | ".join(f"{r['gbps'][k]:.0f} | {r['pct_of_copy'][k]:.1f}%" if k in r["gbps"]
                           else "- | -" for k in names)
        vs_t = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else "-"
        vs_c = f"{r['speedup_vs_compile']:.2f}x" if "speedup_vs_compile" in r else "-"
        lines.append(f"| {r['kind']} | {r['dtype']} | {r['n']} | {r['rows']} | {r['case']} | "
                     f"{cells} | {vs_t} | {vs_c} |")
    return "\n".join(lines)


def _list(parser, text: str, what: str, allowed=None, cast=str) -> list:
    try:
        values = [cast(v) for v in text.split(",")]
    except ValueError:
        parser.error(f"--{what}: expected values separated by commas, got {text!r}")
    for v in values:
        if allowed is not None and v not in allowed:
            parser.error(f"--{what}: expected some of {', '.join(allowed)}, got {v!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked: ``kinds``, ``dtypes``, ``cases`` and ``hidden`` as lists,
    ``mib`` and ``rounds`` numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=str(Path(__file__).parent / "results_norm.json"),
                        help="where to write the results (JSON)")
    add_quick(parser, f"hidden sizes {QUICK_HIDDEN}, 64 MiB inputs, 8 rounds")
    parser.add_argument("--kinds", default="rms,layer", help="rms, layer (comma-separated)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--hidden", default=None, help="hidden sizes n, comma-separated")
    parser.add_argument("--cases", default=",".join(CASES), help=", ".join(CASES))
    parser.add_argument("--mib", type=int, default=None, help="x's size (default 128 MiB)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 20)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    args = parser.parse_args(argv)
    args.kinds = _list(parser, args.kinds, "kinds", ("rms", "layer"))
    args.dtypes = _list(parser, args.dtypes, "dtypes", ("float32", "bfloat16", "float16"))
    args.cases = _list(parser, args.cases, "cases", CASES)
    args.hidden = (_list(parser, args.hidden, "hidden", cast=int) if args.hidden
                   else QUICK_HIDDEN if args.quick else HIDDEN)
    quick_defaults(args, mib=(128, 64), rounds=(20, 8))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    kinds, dtypes, cases, hidden = args.kinds, args.dtypes, args.cases, args.hidden
    mib, rounds = args.mib, args.rounds
    if gpu_count() == 0:
        print("bench_norm.py needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    torch = import_torch()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    meta = {"device": props["name"].decode(), "sms": dev.attributes["MultiProcessorCount"],
            "date": time.strftime("%Y-%m-%d"), "commit": commit(), "ge2jit": ge2jit.__version__,
            "cupy": cp.__version__, "torch": getattr(torch, "__version__", None), "mib": mib,
            "rounds": rounds}
    rows = []
    for kind in kinds:
        for dtype in dtypes:
            for n in hidden:
                rows += bench(kind, dtype, n, mib, rounds, torch, not args.no_compile, cases)
                cp.get_default_memory_pool().free_all_blocks()     # the arrays are gone
                if torch is not None:
                    torch.cuda.empty_cache()
                Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    summary = (f"{meta['device']}, x of {mib} MiB, median of {rounds} rounds, commit "
               f"{meta['commit']}")
    print(f"\n{summary}\n\n{table(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
