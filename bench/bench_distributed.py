"""Data-parallel throughput of an MLP block's training step on CuPy, by world size.

    python bench/bench_distributed.py [--world 1,2,4,8] [--widths 1024,4096]
                                      [--tokens 16384] [--steps 20] [--warmup 3]
                                      [--profile-steps 5] [--bucket-mb MiB]
                                      [--grad-dtype bfloat16|float32] [--chunks 4]
                                      [--comm-sms 0] [--tile-grids] [--shard-optimizer]
                                      [--compute-only]
                                      [--timeline]
                                      [--eager]
                                      [--json bench/results_distributed.json] [--quick]

The step, on each GPU: ``--tokens`` tokens (rows) of width d through a 2-layer MLP block
d -> 4d -> d with tanh-GELU in bfloat16 (float32 master weights and biases): the forward
(``ge2jit.gemm_bias_act``, Z saved), a mean-squared-error gradient in CuPy, the backward
(``ge2jit.gemm_bias_act_backward``), and ``ge2jit.adam_update`` steps that also write the
bfloat16 weights. The weight gradients are ``--grad-dtype`` (bfloat16 by default, written by
the GEMMs from their float32 accumulators; the bias gradients float32), and travel in it.

With more than one GPU, ``ge2jit.distributed.GradientAllReduce`` averages the gradients over
the ranks in buckets (``--bucket-mb`` MiB; by default a chunk's, below, and a first bucket of
1 MiB) on a high-priority side stream, each bucket as soon as the backward has written it:

- the second layer's weight and bias gradients by their own GEMM, before the GEMM of the
  gradient that flows down (the first layer's act' and bias gradient in its epilogue), so
  their reduction runs under that GEMM and the first layer's;
- the first layer's weight gradient, the last one the backward makes, by ``--chunks`` GEMMs
  of its row blocks (``x[:, rows].T @ dZ``), each block reduced while the next is computed;
- each bucket's Adam step starts as soon as that bucket is reduced (``reducer.wait(b)``),
  under the reduction of the next.

``--comm-sms K`` sizes the kernels' grids for K SMs fewer than the GPU has
(``ge2jit.set_num_sms``) and caps NCCL at K blocks (``NCCL_MAX_CTAS``), on ranks of a world
above one: a persistent GEMM otherwise holds every SM while NCCL waits for one. The world of
one is the plain single-GPU step: one fused backward call for the second layer, one GEMM for
the first layer's weight gradient, the Adam steps after the backward, all SMs, no reducer.
The step is captured as a CUDA graph and replayed (``--eager``: run from Python).

Each world size (by default 1, 2, 4 and 8, those the GPUs present allow) runs as that many
processes on this host, one a GPU, started the way ``examples/train_mlp.py --gpus N`` starts
them (``ge2jit.distributed.launch_local``). Per width, after ``--warmup`` steps, ``--steps``
steps are timed with CUDA events (the slowest rank's time). It reports:

- tokens/s: world size x ``--tokens`` x steps / time;
- scaling: tokens/s against the world size 1 row's, and its share of linear (target: 1.9x at
  2 GPUs, 0.9 of linear at 4 and 8);
- the all-reduce's time alone: the step's buckets reduced back to back with nothing else on
  the GPUs (``--profile-steps`` times, the median, rank 0's);
- exposed: how much longer the step is than one GPU's (the communication's cost in the
  step, the ranks' waiting for each other included), and hidden = 1 - exposed / the
  all-reduce's time alone.

``--shard-optimizer`` shards the optimizer over the ranks (ZeRO-1: weight gradients
reduce-scattered, each rank's part of the float32 master weights and Adam's moments stepped,
the bfloat16 weights all-gathered on the side stream); the rows report each rank's optimizer
memory (master weights and moments). ``--tile-grids`` runs the GEMMs of ranks of a world
above one with a block per tile (``ge2jit.set_persistent(False)``) rather than one per SM, so
that NCCL's blocks get SMs as tiles finish.

``--compute-only`` runs the distributed step on every rank but sends nothing (the cost of its
chunks and waits without communication); ``--timeline`` prints, for rank 0, one eager step's
timeline: when each gradient is written and when each bucket's reduction starts and ends.

It writes ``--json`` (default ``bench/results_distributed.json``) with the device, the date,
the commit ($GE2JIT_COMMIT, else git's), the NCCL version and the rows.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, add_quick, commit, int_list, quick_defaults

ACT = "gelu_tanh"
WORLDS = (1, 2, 4, 8)
#: scaling targets: the share of linear scaling expected at a world size (2: 1.9x)
TARGET = {2: 0.95, 4: 0.9, 8: 0.9}
#: the share of the all-reduce expected hidden under the step
HIDDEN_TARGET = 0.8



# --- one rank ------------------------------------------------------------------------------

class Block:
    """The MLP block's parameters, Adam state and training step on this rank's GPU.

    The gradients the reducer is given, in the parameters' order (first layer first): the
    first layer's weight gradient as ``chunks`` row blocks, its bias', the second layer's
    weight and bias gradients. ``pieces[i]`` = (parameter, rows) of gradient ``i``."""

    def __init__(self, group, d: int, tokens: int, args, distributed: bool):
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
        self.db_dtype = None if args.grad_dtype == "bfloat16" else "float32"
        self.distributed = distributed
        chunks = args.chunks if distributed else 1
        if d % chunks or (d // chunks) % 8:
            raise SystemExit(f"bench_distributed.py: --chunks: expected a divisor of d = {d} "
                             f"leaving rows of a multiple of 8, got {chunks}")
        step = d // chunks
        self.rows = [slice(j * step, (j + 1) * step) for j in range(chunks)]
        self.pieces = [(0, r) for r in self.rows] + [(1, slice(None)), (2, slice(None)),
                                                      (3, slice(None))]
        grad_item = np.dtype(self.bf16 if self.db_dtype is None else np.float32).itemsize
        nbytes = [step * 4 * d * grad_item] * chunks + [4 * d * 4, 4 * d * d * grad_item, d * 4]
        bucket = nbytes[0] if args.bucket_mb is None else int(args.bucket_mb * 2**20)

        def new_reducer(timing: bool = False):
            return dist.GradientAllReduce(group, nbytes, bucket_bytes=max(bucket, 1),
                                          first_bucket_bytes=2**20, timing=timing)

        self.new_reducer, self.reducer = new_reducer, new_reducer()
        self.group, self.last = group, [None] * len(nbytes)
        self.marks = None   # (what, event) of a timeline step (``timeline``)

    def optimizer_bytes(self) -> int:
        """Bytes of this rank's float32 master weights and biases and Adam moments."""
        return sum(p.nbytes * 3 for p in self.params)

    def _give(self, i: int, grad) -> None:
        self.last[i] = grad
        if self.marks is not None:   # when the gradient is written, on the compute stream
            self.marks.append((f"grad {i} written", self.cp.cuda.Event()))
            self.marks[-1][1].record()
        self.reducer.ready(i, grad)

    def step(self, x, target) -> None:
        import ge2jit

        backward = ge2jit.gemm_bias_act_backward
        h, z1, gy = self._forward(x, target)
        if not self.distributed:   # the plain step: no reducer, the Adam steps after
            c1, c2, b1, b2 = self.copies[0], self.copies[2], self.params[1], self.params[3]
            g2 = backward(gy, h, c2, b2, needs=("a", "b", "bias"), a_act=ACT, a_z=z1,
                          a_bias=b1, db_dtype=self.db_dtype)
            g1 = backward(g2.a, x, c1, None, needs=("b",), db_dtype=self.db_dtype)
            self.t += 1
            for p, g, (m, v), c in zip(self.params, (g1.b, g2.a_bias, g2.b, g2.bias),
                                       self.state, self.copies):
                ge2jit.adam_update(p, g, m, v, step=self.t, lr=1e-4, param_copy=c)
            return
        self._distributed_backward(x, h, z1, gy)
        self.t += 1
        for b, members in enumerate(self.reducer.buckets):   # in the order they complete
            self.reducer.wait(b)
            for i in members:
                k, rows = self.pieces[i]
                m, v = self.state[k]
                copy = self.copies[k]
                ge2jit.adam_update(self.params[k][rows], self.last[i], m[rows], v[rows],
                                   step=self.t, lr=1e-4,
                                   param_copy=None if copy is None else copy[rows])
        self.reducer.wait()

    def _distributed_backward(self, x, h, z1, gy) -> None:
        """The backward of a rank of a world above one, each gradient given (``_give``) as
        soon as it is written: the second layer's weight and bias gradients by their own call,
        then the gradient flowing down (with the first layer's bias gradient), then the first
        layer's weight gradient by ``len(self.rows)`` row blocks."""
        import ge2jit

        backward = ge2jit.gemm_bias_act_backward
        b1, b2 = self.params[1], self.params[3]
        c1, c2 = self.copies[0], self.copies[2]
        n = len(self.rows)
        g2 = backward(gy, h, c2, b2, needs=("b", "bias"), db_dtype=self.db_dtype)
        self._give(n + 1, g2.b)
        self._give(n + 2, g2.bias)
        ga = backward(gy, h, c2, b2, needs=("a",), a_act=ACT, a_z=z1, a_bias=b1)
        self._give(n, ga.a_bias)
        for j, rows in enumerate(self.rows):
            self._give(j, backward(ga.a, x[:, rows], c1[rows], None, needs=("b",),
                                   db_dtype=self.db_dtype).b)

    def _forward(self, x, target):
        """(h, z1, gy): the forward and the loss's gradient, in bfloat16."""
        import ge2jit

        b1, b2 = self.params[1], self.params[3]
        c1, c2 = self.copies[0], self.copies[2]
        h, z1 = ge2jit.gemm_bias_act(x, c1, b1, act=ACT, save_preact=True)
        y = ge2jit.gemm_bias_act(h, c2, b2)
        return h, z1, ((y.astype(self.cp.float32) - target) * self.scale).astype(self.bf16)

    def timeline(self) -> list[tuple[str, float]]:
        """One eager step with timing events: when each gradient is written (compute stream),
        when each bucket's reduction starts and ends (side stream), when the step ends; ms from
        the step's start, in order."""
        cp = self.cp
        plain, self.reducer = self.reducer, self.new_reducer(timing=True)
        try:
            start, end = cp.cuda.Event(), cp.cuda.Event()
            cp.cuda.Device().synchronize()
            self.marks = []
            start.record()
            self.step(self.x, self.target)
            end.record()
            end.synchronize()
            out = [(what, cp.cuda.get_elapsed_time(start, e)) for what, e in self.marks]
            for b, (s, e) in enumerate(self.reducer.events):
                out.append((f"bucket {b} {self.reducer.buckets[b]} starts",
                            cp.cuda.get_elapsed_time(start, s)))
                out.append((f"bucket {b} ends", cp.cuda.get_elapsed_time(start, e)))
            out.append(("step ends", cp.cuda.get_elapsed_time(start, end)))
            return sorted(out, key=lambda x: x[1])
        finally:
            self.marks, self.reducer = None, plain

    def allreduce_alone(self, times: int) -> float:
        """The step's buckets reduced back to back with nothing else queued (the last step's
        gradients, reduced again): ms per step, the median of ``times``."""
        cp = self.cp
        cp.cuda.Device().synchronize()
        stream = self.reducer.stream
        start, end = cp.cuda.Event(), cp.cuda.Event()
        out = []
        for _ in range(times):
            start.record(stream)
            for members in self.reducer.buckets:
                self.group.all_reduce([self.last[i] for i in members], op="avg",
                                      stream=stream)
            end.record(stream)
            end.synchronize()
            out.append(cp.cuda.get_elapsed_time(start, end))
        return statistics.median(out)


class ShardedBlock(Block):
    """The block with its optimizer sharded over the ranks (ZeRO-1, ``--shard-optimizer``):
    each weight gradient is reduce-scattered as soon as it is written (rank ``r`` gets part
    ``r`` of it, averaged); each rank keeps the float32 master weights and Adam's moments of
    its parts only, steps them, and all-gathers the bfloat16 weights in place on the side
    stream while the next part is stepped; the step ends when the gathers have.
    The biases (replicated, tiny) are all-reduced and stepped whole."""

    def __init__(self, group, d: int, tokens: int, args, distributed: bool):
        import numpy as np

        super().__init__(group, d, tokens, args, distributed)
        cp = self.cp
        world, rank = group.world_size, group.rank
        grad_dtype = self.bf16 if self.db_dtype is None else np.dtype(np.float32)
        #: gradient index -> (flat bfloat16 weights, first element of this rank's part,
        #: elements in a part, float32 master part, m, v, gradient part)
        self.parts = {}
        for i, (k, rows) in enumerate(self.pieces):
            if k not in (0, 2):
                continue
            whole = self.copies[k][rows].reshape(-1)
            if whole.size % world:
                raise SystemExit(f"bench_distributed.py: --shard-optimizer: gradient {i} of "
                                 f"{whole.size} elements does not split over {world} ranks")
            n = whole.size // world
            master = self.params[k][rows].reshape(-1)[rank * n:(rank + 1) * n].copy()
            self.parts[i] = (whole, rank * n, n, master, cp.zeros(n, np.float32),
                             cp.zeros(n, np.float32), cp.empty(n, grad_dtype))
        for k in (0, 2):   # the whole float32 weights and their moments are not kept
            self.params[k] = None
            self.state[k] = None
        self.side = self.reducer.stream
        self.ready = [cp.cuda.Event(disable_timing=True) for _ in self.pieces]
        self.done = [cp.cuda.Event(disable_timing=True) for _ in self.pieces]
        self.stepped = [cp.cuda.Event(disable_timing=True) for _ in self.pieces]
        self.gathered = cp.cuda.Event(disable_timing=True)

    def optimizer_bytes(self) -> int:
        """Bytes of this rank's float32 master weights and Adam moments."""
        whole = sum(p.nbytes * 3 for p in self.params if p is not None)
        return whole + sum(part[3].nbytes * 3 for part in self.parts.values())

    def _give(self, i: int, grad) -> None:
        self.last[i] = grad
        self.ready[i].record()
        self.side.wait_event(self.ready[i])
        if i in self.parts:
            self.group.reduce_scatter([(grad, self.parts[i][6])], stream=self.side)
        else:
            self.group.all_reduce([grad], op="avg", stream=self.side)
        self.done[i].record(self.side)

    def step(self, x, target) -> None:
        import ge2jit

        current = self.cp.cuda.get_current_stream()
        h, z1, gy = self._forward(x, target)
        self._distributed_backward(x, h, z1, gy)
        n = len(self.rows)
        self.t += 1
        for i in (n + 1, n + 2, n, *range(n)):   # in the order they were reduced
            current.wait_event(self.done[i])
            if i not in self.parts:
                k = self.pieces[i][0]
                m, v = self.state[k]
                ge2jit.adam_update(self.params[k], self.last[i], m, v, step=self.t, lr=1e-4)
                continue
            whole, first, size, master, m, v, grad = self.parts[i]
            mine = whole[first:first + size]
            ge2jit.adam_update(master, grad, m, v, step=self.t, lr=1e-4, param_copy=mine)
            self.stepped[i].record()
            self.side.wait_event(self.stepped[i])
            self.group.all_gather([(mine, whole)], stream=self.side)
        self.gathered.record(self.side)
        current.wait_event(self.gathered)   # the step ends with every weight gathered

    def allreduce_alone(self, times: int) -> float:
        """The step's reduce-scatters, bias all-reduces and all-gathers back to back with
        nothing else queued: ms per step, the median of ``times``."""
        cp = self.cp
        cp.cuda.Device().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        out = []
        for _ in range(times):
            start.record(self.side)
            for i, grad in enumerate(self.last):
                if i in self.parts:
                    self.group.reduce_scatter([(grad, self.parts[i][6])], stream=self.side)
                else:
                    self.group.all_reduce([grad], op="avg", stream=self.side)
            for whole, first, size, *_ in self.parts.values():
                self.group.all_gather([(whole[first:first + size], whole)], stream=self.side)
            end.record(self.side)
            end.synchronize()
            out.append(cp.cuda.get_elapsed_time(start, end))
        return statistics.median(out)


def bench_width(group, d: int, args) -> dict:
    import cupy as cp
    import numpy as np

    import ge2jit

    distributed = group.world_size > 1
    sharded = args.shard_optimizer and distributed
    block = (ShardedBlock if sharded else Block)(group, d, args.tokens, args, distributed)
    mode, why = "eager", None

    def run():
        block.step(block.x, block.target)

    run()   # compiles or loads every kernel
    if not args.eager:
        try:
            graph = ge2jit.graph.capture(block.step, block.x, block.target)
            run, mode = graph.replay, "graph"   # the batch stays in the graph's input buffers
        except Exception as e:  # noqa: BLE001 - reported, and the step runs eagerly instead
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            block.reducer.reset()   # the failed capture left gradients given
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
    cp.cuda.Device().synchronize()
    step_ms = float(times.max()) / args.steps
    row = {"world": group.world_size, "d": d, "tokens_per_gpu": args.tokens, "mode": mode,
           "step_ms": step_ms, "host_step_ms": wall * 1e3 / args.steps,
           "tokens_per_s": group.world_size * args.tokens / (step_ms * 1e-3),
           "grad_dtype": args.grad_dtype, "chunks": len(block.rows),
           "comm_sms": args.comm_sms if distributed else 0,
           "tile_grids": bool(args.tile_grids and distributed),
           "grid_sms": ge2jit.get_num_sms(group.device_id),
           "buckets": len(block.reducer.buckets),
           "gradient_bytes": sum(block.reducer.nbytes),
           "shard_optimizer": sharded,
           "optimizer_mib": block.optimizer_bytes() / 2**20,
           "compute_only": bool(args.compute_only),
           "allreduce_ms": (block.allreduce_alone(args.profile_steps)
                            if distributed and not args.compute_only else None)}
    if why:
        row["graph_error"] = why
    if args.timeline and distributed:
        row["timeline"] = block.timeline()
        if group.rank == 0:
            print(f"d = {d}, world {group.world_size}, rank 0's eager step:")
            for what, ms in row["timeline"]:
                print(f"  {ms:8.3f} ms  {what}")
    return row


def worker(args) -> int:
    """One rank: every width; rank 0 writes the rows to ``args.worker``."""
    from ge2jit.distributed import process_info

    info = process_info()
    if info.world_size > 1 and args.comm_sms:
        os.environ["NCCL_MAX_CTAS"] = str(args.comm_sms)   # read when the communicator is made
    import cupy as cp

    import ge2jit
    import ge2jit.distributed as dist

    group = dist.init(info)
    if args.compute_only:   # the distributed step with nothing sent: its compute alone
        group.comm = None
    if group.world_size > 1 and args.tile_grids:
        ge2jit.set_persistent(False)
    if group.world_size > 1 and args.comm_sms:
        sms = ge2jit.get_num_sms(group.device_id)
        if args.comm_sms >= sms:
            raise SystemExit(f"bench_distributed.py: --comm-sms: expected fewer than the "
                             f"{sms} SMs of the GPU, got {args.comm_sms}")
        ge2jit.set_num_sms(sms - args.comm_sms)
    rows = []
    for d in args.widths:
        rows.append(bench_width(group, d, args))
        gc.collect()   # the width's arrays and graph, before the next one's
        cp.get_default_memory_pool().free_all_blocks()
    if group.rank == 0:
        props = cp.cuda.runtime.getDeviceProperties(group.device_id)
        nccl = None
        if group.world_size > 1:
            from cupy.cuda import nccl as _nccl

            nccl = _nccl.get_version()
        Path(args.worker).write_text(json.dumps({"device": props["name"].decode(),
                                                 "nccl": nccl, "rows": rows}))
    return 0


# --- the driver ----------------------------------------------------------------------------

def add_scaling(rows: list[dict]) -> None:
    """Each row's tokens/s against the world size 1 row of its width and against linear; the
    step's time beyond one GPU's (exposed) and the all-reduce's share hidden."""
    single = {r["d"]: r for r in rows if r["world"] == 1}
    for r in rows:
        base = single.get(r["d"])
        r["scaling"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
        r["efficiency"] = r["scaling"] / r["world"] if base else None
        target = TARGET.get(r["world"])
        r["target_efficiency"] = target
        r["meets_target"] = (r["efficiency"] >= target
                             if target is not None and base else None)
        r["exposed_ms"] = r["hidden_fraction"] = None
        if base and r["world"] > 1 and r["allreduce_ms"]:
            r["exposed_ms"] = max(0.0, r["step_ms"] - base["step_ms"])
            r["hidden_fraction"] = max(0.0, 1.0 - r["exposed_ms"] / r["allreduce_ms"])


def table(rows: list[dict]) -> str:
    def num(v, fmt, unit=""):
        return "" if v is None else format(v, fmt) + unit

    lines = ["| world | d | mode | grads | step ms | tokens/s | scaling | of linear | target | "
             "all-reduce alone ms | exposed ms | hidden |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        target, hidden = r["target_efficiency"], r["hidden_fraction"]
        verdict = "" if r["meets_target"] is None else ("met" if r["meets_target"] else "missed")
        grads = f"{r['grad_dtype']}"
        if r["world"] > 1:
            grads += f", {r['chunks']} chunk{'s' if r['chunks'] > 1 else ''}"
            grads += f", {r['grid_sms']} SMs" if r["comm_sms"] else ""
            grads += ", tile grids" if r.get("tile_grids") else ""
            grads += f", ZeRO-1 ({r['optimizer_mib']:.0f} MiB)" if r.get("shard_optimizer") else ""
        lines.append(
            f"| {r['world']} | {r['d']} | {r['mode']} | {grads} | {r['step_ms']:.3f} | "
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
    parser.add_argument("--world", type=int_list, default=None,
                        help="world sizes, comma-separated (default: 1,2,4,8 up to the GPUs)")
    parser.add_argument("--widths", type=int_list, default=None,
                        help="the block's widths d (default 1024,4096)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens (rows) per GPU (default 16384)")
    parser.add_argument("--steps", type=int, default=None, help="steps timed (default 20)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps run before the timing (default 3)")
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="times the all-reduces are timed alone (default 5)")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="all-reduce bucket size in MiB (default: a chunk's gradient, so "
                             "that each chunk is reduced as soon as it is written; the first "
                             "bucket 1 MiB)")
    parser.add_argument("--grad-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the weight gradients' type, in which they travel (default "
                             "bfloat16)")
    parser.add_argument("--chunks", type=int, default=4,
                        help="GEMMs (row blocks) of the first layer's weight gradient, each "
                             "reduced as soon as written (default 4)")
    parser.add_argument("--comm-sms", type=int, default=0,
                        help="SMs the kernels leave to NCCL on ranks of a world above one "
                             "(default 0)")
    parser.add_argument("--shard-optimizer", action="store_true",
                        help="ZeRO-1 on ranks of a world above one: weight gradients "
                             "reduce-scattered, each rank's part of the master weights and "
                             "Adam's moments stepped, the weights all-gathered")
    parser.add_argument("--tile-grids", action="store_true",
                        help="on ranks of a world above one, GEMM grids of one block per tile "
                             "(ge2jit.set_persistent(False)), so that NCCL gets SMs as tiles "
                             "finish")
    parser.add_argument("--timeline", action="store_true",
                        help="print rank 0's timeline of one eager step: gradients written, "
                             "buckets reduced")
    parser.add_argument("--compute-only", action="store_true",
                        help="ranks above one run the distributed step but send nothing: "
                             "the cost of its chunks, waits and SMs without communication")
    parser.add_argument("--eager", action="store_true", help="no CUDA graph: the step from "
                                                             "Python")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results_distributed.json"),
                        help="write the results here")
    add_quick(parser, ", ".join(f"{k.replace('_', '-')} {q}" for k, (_, q) in SIZES.items()))
    parser.add_argument("--worker", help=argparse.SUPPRESS)   # one rank's results file
    args = parser.parse_args(argv)
    quick_defaults(args, **SIZES)
    if args.bucket_mb is not None and args.bucket_mb <= 0:
        parser.error(f"--bucket-mb: expected a positive size, got {args.bucket_mb}")
    for name in ("tokens", "steps", "profile_steps", "chunks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, got "
                         f"{getattr(args, name)}")
    if args.timeline and args.shard_optimizer:
        parser.error("--timeline: times the buckets of the all-reduce; leave out "
                     "--shard-optimizer")
    for name in ("warmup", "comm_sms"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')}: expected at least 0, got "
                         f"{getattr(args, name)}")
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
    rows, device, nccl = [], None, None
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
            device, nccl = result["device"], result["nccl"] or nccl
            rows.extend(result["rows"])
    rows.sort(key=lambda r: (r["d"], r["world"]))
    add_scaling(rows)
    print(table(rows))
    doc = {"device": device, "gpus": gpus, "date": time.strftime("%Y-%m-%d"),
           "commit": commit(), "tokens_per_gpu": args.tokens, "steps": args.steps,
           "warmup": args.warmup, "profile_steps": args.profile_steps,
           "bucket_mb": args.bucket_mb, "graph": not args.eager,
           "grad_dtype": args.grad_dtype, "chunks": args.chunks, "comm_sms": args.comm_sms,
           "nccl": nccl, "rows": rows}
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
