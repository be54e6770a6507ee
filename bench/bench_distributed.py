"""Data-parallel throughput of an MLP block's training step on CuPy, by world size.

    python bench/bench_distributed.py [--world 1,2,4,8] [--widths 1024,4096]
                                      [--tokens 16384] [--steps 20] [--warmup 3]
                                      [--profile-steps 5] [--bucket-mb 25] [--eager]
                                      [--json bench/results_distributed.json] [--quick]

The step, on each GPU: ``--tokens`` tokens (rows) of width d through a 2-layer MLP block
d -> 4d -> d with tanh-GELU in bfloat16 (float32 master weights and biases): the forward
(``ge2jit.gemm_bias_act``, Z saved), a mean-squared-error gradient in CuPy, the fused
backward (``ge2jit.gemm_bias_act_backward``, the first layer's act' and bias gradient in the
second's dA epilogue), the gradients all-reduced by ``ge2jit.distributed.GradientAllReduce``
in buckets of ``--bucket-mb`` MiB on a side stream as the backward makes them (dW in float32:
NCCL through CuPy reduces no bfloat16), and four ``ge2jit.adam_update`` steps that also write
the bfloat16 weights. The step is captured as a CUDA graph and replayed (``--eager``: run
from Python).

Each world size (by default 1, 2, 4 and 8, those the GPUs present allow) runs as that many
processes on this host, one a GPU, started the way ``examples/train_mlp.py --gpus N`` starts
them (``ge2jit.distributed.launch_local``); with one the reducer does nothing (no NCCL), so a
single GPU runs it. Per width, after ``--warmup`` steps, ``--steps`` steps are timed with CUDA
events (the slowest rank's time). It reports:

- tokens/s: world size x ``--tokens`` x steps / time;
- scaling: tokens/s against the world size 1 row's, and its share of linear (target: 1.9x at
  2 GPUs, 0.9 of linear at 4 and 8);
- the all-reduce time hidden under the backward, from ``--profile-steps`` eager steps with
  timing events (``GradientAllReduce(timing=True)``) around each bucket's all-reduce on the
  side stream and one on the compute stream where the backward ends (before ``wait()``):
  exposed = max(0, end of the last all-reduce - end of the backward), hidden = 1 - exposed /
  (the sum of the buckets' all-reduce times); medians over the steps, rank 0's. Events in a
  captured graph are no timings, hence eager steps; at these sizes the host queues a step
  far faster than the GPU runs it, so an eager step overlaps as a replayed one does.

It writes ``--json`` (default ``bench/results_distributed.json``) with the device, the date,
the commit ($GE2JIT_COMMIT, else git's) and the rows.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, add_quick, commit, quick_defaults

ACT = "gelu_tanh"
WORLDS = (1, 2, 4, 8)
#: scaling targets: the share of linear scaling expected at a world size (2: 1.9x)
TARGET = {2: 0.95, 4: 0.9, 8: 0.9}


def _ints(text: str) -> list[int]:
    """A comma-separated list of positive integers (an option's value)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, "
                                         f"got {text!r}")
    return values


# --- one rank ------------------------------------------------------------------------------

class Block:
    """The MLP block's parameters, Adam state and training step on this rank's GPU."""

    def __init__(self, group, d: int, tokens: int, bucket_bytes: int):
        import cupy as cp
        import ml_dtypes
        import numpy as np

        import ge2jit.distributed as dist

        self.cp, self.bf16 = cp, np.dtype(ml_dtypes.bfloat16)
        rng = cp.random.default_rng(0)   # the same weights everywhere; rank 0's broadcast
        w1 = rng.standard_normal((d, 4 * d), dtype=np.float32) / np.float32(math.sqrt(d))
        w2 = rng.standard_normal((4 * d, d), dtype=np.float32) / np.float32(math.sqrt(4 * d))
        self.params = [w1, cp.zeros(4 * d, np.float32), w2, cp.zeros(d, np.float32)]
        group.broadcast(self.params)
        self.copies = [w1.astype(self.bf16), None, w2.astype(self.bf16), None]
        self.state = [(cp.zeros_like(p), cp.zeros_like(p)) for p in self.params]
        self.t = cp.zeros((), cp.int32)
        data = cp.random.default_rng(1 + group.rank)   # each rank its own batch
        self.x = data.standard_normal((tokens, d), dtype=np.float32).astype(self.bf16)
        self.target = data.standard_normal((tokens, d), dtype=np.float32)
        self.scale = np.float32(2.0 / (tokens * d))
        nbytes = [p.nbytes for p in self.params]   # float32 gradients

        def new_reducer(timing: bool = False):
            return dist.GradientAllReduce(group, nbytes, bucket_bytes=bucket_bytes,
                                          timing=timing)

        self.new_reducer = new_reducer
        self.reducer, self.timed = new_reducer(), new_reducer(timing=True)
        self.backward_end = cp.cuda.Event()

    def step(self, x, target, reducer) -> None:
        import ge2jit

        _, b1, _, b2 = self.params
        c1, _, c2, _ = self.copies   # the bfloat16 weights the GEMMs read
        h, z1 = ge2jit.gemm_bias_act(x, c1, b1, act=ACT, save_preact=True)
        y = ge2jit.gemm_bias_act(h, c2, b2)
        gy = ((y.astype(self.cp.float32) - target) * self.scale).astype(self.bf16)
        g2 = ge2jit.gemm_bias_act_backward(gy, h, c2, b2, needs=("a", "b", "bias"), a_act=ACT,
                                           a_z=z1, a_bias=b1, db_dtype="float32")
        reducer.ready(3, g2.bias)
        reducer.ready(2, g2.b)
        reducer.ready(1, g2.a_bias)
        g1 = ge2jit.gemm_bias_act_backward(g2.a, x, c1, None, needs=("b",), db_dtype="float32")
        reducer.ready(0, g1.b)
        if reducer.events is not None:
            self.backward_end.record()
        reducer.wait()
        self.t += 1
        grads = (g1.b, g2.a_bias, g2.b, g2.bias)
        for p, g, (m, v), c in zip(self.params, grads, self.state, self.copies):
            ge2jit.adam_update(p, g, m, v, step=self.t, lr=1e-4, param_copy=c)

    def overlap(self) -> dict:
        """One eager step with timing events: the buckets' all-reduce time, the part of it
        after the backward's end (exposed), in ms."""
        cp = self.cp
        self.step(self.x, self.target, self.timed)
        cp.cuda.get_current_stream().synchronize()
        durations = [cp.cuda.get_elapsed_time(s, e) for s, e in self.timed.events]
        last = max(cp.cuda.get_elapsed_time(self.backward_end, e) for _, e in self.timed.events)
        return {"allreduce_ms": sum(durations), "exposed_ms": max(0.0, last)}


def bench_width(group, d: int, args) -> dict:
    import cupy as cp
    import numpy as np

    import ge2jit

    block = Block(group, d, args.tokens, args.bucket_mb * 2**20)
    mode, why = "eager", None

    def run():
        block.step(block.x, block.target, block.reducer)

    run()   # compiles or loads every kernel
    if not args.eager:
        try:
            graph = ge2jit.graph.capture(lambda x, t: block.step(x, t, block.reducer),
                                         block.x, block.target)
            run, mode = graph.replay, "graph"   # the batch stays in the graph's input buffers
        except Exception as e:  # noqa: BLE001 - reported, and the step runs eagerly instead
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            block.reducer = block.new_reducer()   # the failed step left gradients given
    for _ in range(args.warmup):
        run()
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    stream.synchronize()
    start.record()
    wall = time.perf_counter()
    for _ in range(args.steps):
        run()
    end.record()
    end.synchronize()
    wall = time.perf_counter() - wall
    # the slowest rank's time (they wait for each other in every all-reduce)
    times = cp.zeros(group.world_size, np.float64)
    times[group.rank] = cp.cuda.get_elapsed_time(start, end)
    group.all_reduce([times])
    step_ms = float(times.max()) / args.steps
    profiles = [block.overlap() for _ in range(args.profile_steps)]
    total = statistics.median(p["allreduce_ms"] for p in profiles)
    exposed = statistics.median(p["exposed_ms"] for p in profiles)
    hidden = [1.0 - p["exposed_ms"] / p["allreduce_ms"] for p in profiles
              if p["allreduce_ms"] > 0]
    row = {"world": group.world_size, "d": d, "tokens_per_gpu": args.tokens, "mode": mode,
           "step_ms": step_ms, "host_step_ms": wall * 1e3 / args.steps,
           "tokens_per_s": group.world_size * args.tokens / (step_ms * 1e-3),
           "buckets": len(block.reducer.buckets),
           "gradient_bytes": sum(p.nbytes for p in block.params),
           "allreduce_ms": total if group.world_size > 1 else None,
           "exposed_ms": exposed if group.world_size > 1 else None,
           "hidden_fraction": (statistics.median(hidden)
                               if group.world_size > 1 and hidden else None)}
    if why:
        row["graph_error"] = why
    return row


def worker(args) -> int:
    """One rank: every width; rank 0 writes the rows to ``args.worker``."""
    import cupy as cp

    import ge2jit.distributed as dist

    group = dist.init()
    rows = []
    for d in args.widths:
        rows.append(bench_width(group, d, args))
        gc.collect()   # the width's arrays and graph, before the next one's
        cp.get_default_memory_pool().free_all_blocks()
    if group.rank == 0:
        props = cp.cuda.runtime.getDeviceProperties(group.device_id)
        Path(args.worker).write_text(json.dumps({"device": props["name"].decode(),
                                                 "rows": rows}))
    return 0


# --- the driver ----------------------------------------------------------------------------

def add_scaling(rows: list[dict]) -> None:
    """Each row's tokens/s against the world size 1 row of its width, and against linear."""
    single = {r["d"]: r["tokens_per_s"] for r in rows if r["world"] == 1}
    for r in rows:
        base = single.get(r["d"])
        r["scaling"] = r["tokens_per_s"] / base if base else None
        r["efficiency"] = r["scaling"] / r["world"] if base else None
        target = TARGET.get(r["world"])
        r["target_efficiency"] = target
        r["meets_target"] = (r["efficiency"] >= target
                             if target is not None and base else None)


def table(rows: list[dict]) -> str:
    def num(v, fmt, unit=""):
        return "" if v is None else format(v, fmt) + unit

    lines = ["| world | d | mode | step ms | tokens/s | scaling | of linear | target | "
             "all-reduce ms | exposed ms | hidden |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        target, hidden = r["target_efficiency"], r["hidden_fraction"]
        verdict = "" if r["meets_target"] is None else ("met" if r["meets_target"] else "missed")
        lines.append(
            f"| {r['world']} | {r['d']} | {r['mode']} | {r['step_ms']:.3f} | "
            f"{r['tokens_per_s'] / 1e6:.2f}M | {num(r['scaling'], '.2f', 'x')} | "
            f"{num(r['efficiency'], '.2f')} | "
            f"{'' if target is None else f'{target:.2f} {verdict}'} | "
            f"{num(r['allreduce_ms'], '.3f')} | {num(r['exposed_ms'], '.3f')} | "
            f"{'' if hidden is None else f'{100 * hidden:.0f}%'} |")
    return "\n".join(lines)


#: option -> (default, --quick's): the sizes and step counts a quick run takes
SIZES = {"widths": ([1024, 4096], [1024]), "tokens": (16384, 4096), "steps": (20, 5),
         "warmup": (3, 1), "profile_steps": (5, 2)}


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked, with the defaults of ``SIZES`` (``--quick``: its smaller ones)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--world", type=_ints, default=None,
                        help="world sizes, comma-separated (default: 1,2,4,8 up to the GPUs)")
    parser.add_argument("--widths", type=_ints, default=None,
                        help="the block's widths d (default 1024,4096)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens (rows) per GPU (default 16384)")
    parser.add_argument("--steps", type=int, default=None, help="steps timed (default 20)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps run before the timing (default 3)")
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="eager steps with timing events around the all-reduces "
                             "(default 5)")
    parser.add_argument("--bucket-mb", type=int, default=25, help="all-reduce bucket size")
    parser.add_argument("--eager", action="store_true", help="no CUDA graph: the step from "
                                                             "Python")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results_distributed.json"),
                        help="write the results here")
    add_quick(parser, ", ".join(f"{k.replace('_', '-')} {q}" for k, (_, q) in SIZES.items()))
    parser.add_argument("--worker", help=argparse.SUPPRESS)   # one rank's results file
    args = parser.parse_args(argv)
    quick_defaults(args, **SIZES)
    for name in ("tokens", "steps", "profile_steps", "bucket_mb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, got "
                         f"{getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup: expected at least 0, got {args.warmup}")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)

    import ge2jit.distributed as dist
    from ge2jit.jit.device import gpu_count

    gpus = gpu_count()
    if not gpus:
        print("bench_distributed.py: no CUDA GPU found", file=sys.stderr)
        return 2
    worlds = args.world or [w for w in WORLDS if w <= gpus]
    if max(worlds) > gpus:
        print(f"bench_distributed.py: --world: expected world sizes up to the {gpus} GPU"
              f"{'' if gpus == 1 else 's'} visible here, got {max(worlds)}", file=sys.stderr)
        return 2
    # the ranks get the same options, less --world and --json, and their results file
    passed = _without(argv, ("--world", "--json"))
    rows, device = [], None
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp:
        for world in worlds:
            out = Path(tmp, f"world{world}.json")
            print(f"world size {world} ...", flush=True)
            run = dist.launch_local([sys.executable, str(Path(__file__).resolve()), *passed,
                                     "--worker", str(out)], world)
            text = run.report("bench_distributed.py")
            if text:
                print(text, file=sys.stderr)
            if run.returncode:
                return run.returncode
            result = json.loads(out.read_text())
            device = result["device"]
            rows.extend(result["rows"])
    rows.sort(key=lambda r: (r["d"], r["world"]))
    add_scaling(rows)
    print(table(rows))
    doc = {"device": device, "gpus": gpus, "date": time.strftime("%Y-%m-%d"),
           "commit": commit(), "tokens_per_gpu": args.tokens, "steps": args.steps,
           "warmup": args.warmup, "profile_steps": args.profile_steps,
           "bucket_bytes": args.bucket_mb * 2**20, "graph": not args.eager, "rows": rows}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` without ``options`` and their values (``--opt v`` or ``--opt=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
