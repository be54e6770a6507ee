"""A small training step eagerly and as a CUDA graph (ge2jit.graph), timed in turns in one run.

    python bench/bench_graph.py [--dtypes float32,bfloat16] [--rows 512] [--width 1024]
                                [--rounds 30] [--batch 16] [--json PATH] [--quick]

The step: a 2-layer MLP (Linear -> gelu_tanh -> Linear, ``--width`` features, ``--rows``
rows), a mean-squared-error loss in CuPy, the backward (``gemm_bias_act_backward``, the first
layer's act' in the second's dA epilogue) and four Adam updates with the step count on the
device: about 30 launches. Cases, each timed in batches of ``--batch`` back-to-back steps,
the cases in turns (one batch of each per round), medians over ``--rounds`` rounds:

- eager: the step's Python, every launch from the host;
- graph: ``step(x, target)`` of the captured step (the batch copied in, one replay);
- graph replay only: ``step.replay()``;
- kernels alone: the eager step queued behind a kernel that holds the GPU until every launch
  of the batch is queued, so the GPU runs the step's kernels back to back and no host time
  falls between them: the sum of the kernels' GPU times (and their launch gaps on the GPU).

Per case: "wall", the host's time per step (from the first launch until the batch has run),
and "GPU", CUDA events around the batch per step. Eagerly the GPU waits for the host; a
graph's replay should cost about what its kernels do alone.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from common import add_quick, commit, cp, np_dtype, quick_defaults

import ge2jit

ACT = "gelu_tanh"
#: --quick: timing rounds and steps per batch
QUICK_ROUNDS, QUICK_BATCH = 5, 4


@functools.cache
def _spin_kernel():
    """Made on first use: importing this script makes no CuPy object (it imports without a
    GPU)."""
    return cp.RawKernel(r'''
extern "C" __global__ void spin(long long ns) {
    long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}''', "spin")


def spin(seconds: float) -> None:
    """Hold the current stream for ``seconds`` (one thread spinning on the GPU's timer)."""
    _spin_kernel()((1,), (1,), (np.int64(seconds * 1e9),))


class Mlp:
    """Parameters and Adam state of the 2-layer MLP (float32 master weights; ``dtype`` the
    weights the GEMMs read), and its training step."""

    def __init__(self, width: int, dtype, seed: int = 0):
        rng = cp.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.w = [rng.standard_normal((width, width), dtype=np.float32) / float(np.sqrt(width))
                  for _ in range(2)]
        self.w_c = [w if self.dtype == np.float32 else w.astype(self.dtype) for w in self.w]
        self.b = [cp.zeros(width, np.float32) for _ in range(2)]
        self.state = [(cp.zeros_like(p), cp.zeros_like(p)) for p in self.w + self.b]
        self.t = cp.zeros((), cp.int32)

    def step(self, x, target):
        (w1, w2), (b1, b2) = self.w_c, self.b
        h, z1 = ge2jit.gemm_bias_act(x, w1, b1, act=ACT, save_preact=True)
        y = ge2jit.gemm_bias_act(h, w2, b2)
        diff = y.astype(np.float32) - target
        loss = (diff * diff).mean()
        gy = (diff * (2.0 / diff.size)).astype(self.dtype)
        g2 = ge2jit.gemm_bias_act_backward(gy, h, w2, b2, needs=("a", "b", "bias"), a_act=ACT,
                                           a_z=z1, a_bias=b1)
        g1 = ge2jit.gemm_bias_act_backward(g2.a, x, w1, b1, needs=("b",))
        self.t += 1
        grads = (g1.b, g2.b, g2.a_bias, g2.bias)
        copies = (*(None if c is w else c for c, w in zip(self.w_c, self.w)), None, None)
        for p, g, (m, v), c in zip(self.w + self.b, grads, self.state, copies):
            ge2jit.adam_update(p, g, m, v, step=self.t, lr=1e-4, param_copy=c)
        return loss


def measure(cases: dict, rounds: int, batch: int) -> dict:
    """Median wall and GPU milliseconds per step of each case, the cases in turns. A case is
    ``(fn, hold)``: ``hold`` seconds of spinning queued before each batch (0: none)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    stream = cp.cuda.get_current_stream()
    times = {name: ([], []) for name in cases}
    for _ in range(rounds):
        for name, (fn, hold) in cases.items():
            stream.synchronize()
            if hold:
                spin(hold)
            start.record()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            end.record()
            end.synchronize()
            wall = (time.perf_counter() - t0) / batch * 1e3
            times[name][0].append(wall)
            times[name][1].append(cp.cuda.get_elapsed_time(start, end) / batch)
    return {name: {"wall_ms": statistics.median(w), "gpu_ms": statistics.median(g)}
            for name, (w, g) in times.items()}


def bench(dtype: str, rows: int, width: int, rounds: int, batch: int) -> dict:
    dt = np_dtype(dtype)
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((rows, width), dtype=np.float32).astype(dt)
    target = rng.standard_normal((rows, width), dtype=np.float32)
    # the same steps eagerly and replayed give the same bits: check once
    a, b = Mlp(width, dt), Mlp(width, dt)
    for _ in range(3):
        a.step(x, target)
    step = ge2jit.graph.capture(b.step, x, target)
    for _ in range(2):
        step(x, target)
    identical = all(bool((p == q).all()) for p, q in zip(a.w + a.b, b.w + b.b))
    del a, b, step
    model = Mlp(width, dt)
    step = ge2jit.graph.capture(model.step, x, target)
    host = measure({"eager": (lambda: model.step(x, target), 0.0)}, 3, batch)["eager"]
    hold = host["wall_ms"] * 1e-3 * batch * 1.5 + 200e-6   # longer than queuing a batch takes
    cases = {
        "eager": (lambda: model.step(x, target), 0.0),
        "graph": (lambda: step(x, target), 0.0),
        "graph replay only": (step.replay, 0.0),
        "kernels alone": (lambda: model.step(x, target), hold),
    }
    result = measure(cases, rounds, batch)
    result["kernels alone"]["wall_ms"] = None   # it waits for the spin: not a step's time
    return {"dtype": dtype, "rows": rows, "width": width, "identical": identical,
            "graph_pool_bytes": step.pool.total_bytes(), "cases": result}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 30)")
    parser.add_argument("--batch", type=int, default=None,
                        help="steps per timed batch (default 16; keep steps x ~30 launches "
                             "under the launch queue's depth, about 1000)")
    parser.add_argument("--json", help="write the results here")
    add_quick(parser, f"{QUICK_ROUNDS} rounds of {QUICK_BATCH}-step batches")
    args = parser.parse_args(argv)
    quick_defaults(args, rounds=(30, QUICK_ROUNDS), batch=(16, QUICK_BATCH))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not cp.cuda.is_available():
        print("bench_graph.py: no CUDA GPU found", file=sys.stderr)
        return 2
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    results = []
    print("| dtype | case | wall µs/step | GPU µs/step | vs eager (wall) |\n|---|---|---|---|---|")
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        r = bench(dtype, args.rows, args.width, args.rounds, args.batch)
        results.append(r)
        eager = r["cases"]["eager"]["wall_ms"]
        for name, c in r["cases"].items():
            wall = c["wall_ms"]
            print(f"| {dtype} | {name} | {'' if wall is None else f'{wall * 1e3:.1f}'} | "
                  f"{c['gpu_ms'] * 1e3:.1f} | "
                  f"{'' if wall is None else f'{eager / wall:.2f}x'} |")
        print(f"({dtype}: graph and eager steps identical: {r['identical']}; the graph's pool "
              f"{r['graph_pool_bytes'] / 2**20:.1f} MiB)")
    if args.json:
        doc = {"device": props["name"].decode(), "date": time.strftime("%Y-%m-%d"),
               "commit": commit(), "rounds": args.rounds,
               "batch": args.batch, "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
