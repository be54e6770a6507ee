"""How much of a kernel on a side stream runs under ge2jit's GEMMs, on one GPU: the mechanics
of hiding a gradient all-reduce under a backward, without NCCL.

    python bench/bench_overlap.py [--size 4096] [--gemms 8] [--side-mb 256] [--side-blocks 16]
                                  [--rounds 10] [--json bench/results_overlap.json] [--quick]

The main stream runs ``--gemms`` bfloat16 GEMMs of ``--size``³ (``ge2jit.gemm_bias_act``), one
after another. After the first, a side stream of the highest priority runs a stand-in for
NCCL's all-reduce kernel: ``--side-blocks`` blocks (NCCL's CTAs) copying ``--side-mb`` MiB,
each block walking its share of the buffer. Each variant is timed alone and together:

- GEMM grids: persistent (one block per SM, ge2jit's default) or a block per tile
  (``ge2jit.set_persistent(False)``);
- how the work is queued: eagerly from Python, or replayed from a CUDA graph captured with
  ``ge2jit.graph.capture`` (which keeps the captured kernels' stream priorities).

It reports, per variant, in ms (medians over ``--rounds``): the GEMMs alone, the copy alone,
both together, when the copy ended (from the start), and the share of the copy hidden,
1 - (together - GEMMs alone) / copy alone. A copy that waits for the GEMMs to end is
hidden 0%; one that runs beside them, near 100%.

It writes ``--json`` (default ``bench/results_overlap.json``) with the device, the date and the
commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from common import ROOT, add_quick, cp, device_meta, np_dtype, quick_defaults

#: the copy kernel standing in for NCCL's: each block walks its share of the buffer in 16-byte
#: vectors, as NCCL's CTAs do
COPY = r"""
extern "C" __global__ void copy(const int4* __restrict__ src, int4* __restrict__ dst, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


class Work:
    """The GEMMs and the copy, and the events that time them."""

    def __init__(self, args):
        import ge2jit

        bf16 = np_dtype("bfloat16")
        rng = cp.random.default_rng(0)
        n = args.size
        self.a = rng.standard_normal((n, n), dtype=cp.float32).astype(bf16)
        self.b = (rng.standard_normal((n, n), dtype=cp.float32) / n ** 0.5).astype(bf16)
        self.outs = [cp.empty((n, n), bf16) for _ in range(args.gemms)]
        words = args.side_mb * 2**20 // 16
        self.src = rng.standard_normal(words * 4, dtype=cp.float32)
        self.dst = cp.empty_like(self.src)
        self.words, self.blocks = words, args.side_blocks
        self.kernel = cp.RawKernel(COPY, "copy")
        self.side = cp.cuda.Stream(non_blocking=True, priority=-1000)
        self.forked = cp.cuda.Event(disable_timing=True)
        self.joined = cp.cuda.Event(disable_timing=True)
        self.gemm = ge2jit.gemm_bias_act

    def gemms(self, copy: bool, copy_end=None) -> None:
        """The GEMMs on the current stream; with ``copy``, the copy on the side stream after
        the first (``copy_end``: a timing event recorded when it ends)."""
        main = cp.cuda.get_current_stream()
        for i, out in enumerate(self.outs):
            self.gemm(self.a, self.b, out=out)
            if i == 0 and copy:
                self.forked.record(main)
                self.side.wait_event(self.forked)
                self.copy_on(self.side)
                if copy_end is not None:
                    copy_end.record(self.side)
                self.joined.record(self.side)
        if copy:
            main.wait_event(self.joined)

    def copy_on(self, stream) -> None:
        self.kernel((self.blocks,), (512,), (self.src, self.dst, cp.int64(self.words)),
                    stream=stream)


def _median_ms(run, rounds: int, end=None):
    """Median ms of ``run()`` between two events on the current stream, and of ``end`` (an
    event ``run`` records) from the start."""
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    total, ends = [], []
    for _ in range(rounds):
        cp.cuda.Device().synchronize()
        start.record()
        run()
        stop.record()
        stop.synchronize()
        total.append(cp.cuda.get_elapsed_time(start, stop))
        if end is not None:
            ends.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(total), (statistics.median(ends) if ends else None)


def variant(work: Work, persistent: bool, graph: bool, rounds: int) -> dict:
    import ge2jit

    ge2jit.set_persistent(persistent)
    try:
        copy_end = cp.cuda.Event()
        alone = lambda: work.gemms(False)   # noqa: E731 - three one-line steps
        both = lambda: work.gemms(True, None if graph else copy_end)   # noqa: E731
        copy = lambda: work.copy_on(cp.cuda.get_current_stream())   # noqa: E731
        alone(), both()   # loads every kernel
        if graph:
            alone = ge2jit.graph.capture(alone).replay
            both = ge2jit.graph.capture(both).replay
        gemms_ms, _ = _median_ms(alone, rounds)
        copy_ms, _ = _median_ms(copy, rounds)
        together_ms, end_ms = _median_ms(both, rounds, None if graph else copy_end)
    finally:
        ge2jit.set_persistent(True)
    return {"grids": "persistent" if persistent else "a block per tile",
            "queued": "graph replay" if graph else "eager", "gemms_ms": gemms_ms,
            "copy_ms": copy_ms, "together_ms": together_ms, "copy_end_ms": end_ms,
            "hidden": max(0.0, 1.0 - (together_ms - gemms_ms) / copy_ms)}


def table(rows: list[dict]) -> str:
    lines = ["| GEMM grids | queued | GEMMs alone ms | copy alone ms | together ms | "
             "copy ends at ms | copy hidden |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        end = "" if r["copy_end_ms"] is None else f"{r['copy_end_ms']:.3f}"
        lines.append(f"| {r['grids']} | {r['queued']} | {r['gemms_ms']:.3f} | "
                     f"{r['copy_ms']:.3f} | {r['together_ms']:.3f} | {end} | "
                     f"{100 * r['hidden']:.0f}% |")
    return "\n".join(lines)


#: option -> (default, --quick's)
SIZES = {"size": (4096, 2048), "gemms": (8, 4), "side_mb": (256, 64), "rounds": (10, 3)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--size", type=int, default=None, help="the GEMMs' M = N = K (4096)")
    parser.add_argument("--gemms", type=int, default=None, help="GEMMs in a row (8)")
    parser.add_argument("--side-mb", type=int, default=None, help="MiB the copy moves (256)")
    parser.add_argument("--side-blocks", type=int, default=16,
                        help="the copy's blocks, as NCCL's CTAs (16)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (10)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results_overlap.json"),
                        help="write the results here")
    add_quick(parser, ", ".join(f"{k.replace('_', '-')} {q}" for k, (_, q) in SIZES.items()))
    args = parser.parse_args(argv)
    quick_defaults(args, **SIZES)
    for name in ("size", "gemms", "side_mb", "side_blocks", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, got "
                         f"{getattr(args, name)}")
    if args.size % 8:
        parser.error(f"--size: expected a multiple of 8 (16-byte rows), got {args.size}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if cp is None:
        print("bench_overlap.py: needs CuPy and a CUDA GPU", file=sys.stderr)
        return 2
    from ge2jit.jit.device import gpu_count

    if not gpu_count():
        print("bench_overlap.py: no CUDA GPU found", file=sys.stderr)
        return 2
    work = Work(args)
    rows = [variant(work, persistent, graph, args.rounds)
            for graph in (False, True) for persistent in (True, False)]
    print(table(rows))
    doc = {**device_meta(), "size": args.size, "gemms": args.gemms, "side_mb": args.side_mb,
           "side_blocks": args.side_blocks, "rounds": args.rounds, "rows": rows}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
