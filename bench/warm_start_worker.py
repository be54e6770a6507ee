"""One rank of a job started on a warmed kernel cache (run by bench_warm_start.py and
tests/distributed/test_warm_start_gpu.py, one process a GPU, the launcher's variables in the
environment, ``GE2JIT_CACHE_DIR`` set per rank): an MLP block's
data-parallel training step (bfloat16, d -> 4d -> d, the gradients averaged over the ranks in
bfloat16 under the backward, Adam). The job starts as a data-parallel job does: rank 0's
initial parameters broadcast to every rank, which also lines the ranks up, so that a rank's
first step is its own cost, not its wait for a peer still starting. The first step is timed
from there to its end on the GPU, then later steps. Writes ``{"rank", "first_s", "later_s",
"hits", "misses", "first_step_profile", "phases"}`` to argv[1]; argv[2] and argv[3] are d and
the tokens per GPU; with argv[4] "profile", the first step runs under cProfile and its 25
costliest calls by cumulative time are reported, and then ``phases`` holds, for the first step
and for a later one, each part's time with the GPU synchronized after it (else both empty)."""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import cupy as cp
import ml_dtypes
import numpy as np

import ge2jit
import ge2jit.distributed as dist

BF16 = np.dtype(ml_dtypes.bfloat16)


def _marker(phases: dict | None):
    """``mark(name)``: with ``phases`` (a dict), the GPU synchronized and the time since the
    last mark stored under ``name``; without, nothing."""
    if phases is None:
        return lambda name: None
    last = [time.perf_counter()]

    def mark(name: str) -> None:
        cp.cuda.Device().synchronize()
        now = time.perf_counter()
        phases[name] = now - last[0]
        last[0] = now

    return mark


def main(path: str, d: int, tokens: int, profiled: bool = False) -> None:
    group = dist.init()
    rng = cp.random.default_rng(0)
    params = [rng.standard_normal((d, 4 * d), dtype=np.float32) / np.float32(d ** 0.5),
              cp.zeros(4 * d, np.float32),
              rng.standard_normal((4 * d, d), dtype=np.float32) / np.float32(2 * d ** 0.5),
              cp.zeros(d, np.float32)]
    copies = [params[0].astype(BF16), None, params[2].astype(BF16), None]
    state = [(cp.zeros_like(p), cp.zeros_like(p)) for p in params]
    t = cp.zeros((), cp.int32)
    x = rng.standard_normal((tokens, d), dtype=np.float32).astype(BF16)
    target = rng.standard_normal((tokens, d), dtype=np.float32)
    nbytes = [d * 4 * d * 2, 4 * d * 4, 4 * d * d * 2, d * 4]
    reducer = dist.GradientAllReduce(group, nbytes)

    def step(phases: dict | None = None):
        nonlocal t
        mark = _marker(phases)
        h, z = ge2jit.gemm_bias_act(x, copies[0], params[1], act="gelu_tanh",
                                    save_preact=True)
        y = ge2jit.gemm_bias_act(h, copies[2], params[3])
        mark("forward")
        gy = ((y.astype(np.float32) - target) * np.float32(2 / y.size)).astype(BF16)
        mark("loss gradient (CuPy)")
        g2 = ge2jit.gemm_bias_act_backward(gy, h, copies[2], params[3],
                                           needs=("a", "b", "bias"), a_act="gelu_tanh",
                                           a_z=z, a_bias=params[1])
        mark("backward, layer 2")
        reducer.ready(3, g2.bias)
        reducer.ready(2, g2.b)
        reducer.ready(1, g2.a_bias)
        g1 = ge2jit.gemm_bias_act_backward(g2.a, x, copies[0], None, needs=("b",))
        mark("backward, layer 1")
        reducer.ready(0, g1.b)
        reducer.wait()
        mark("all-reduce")
        t += 1
        for p, g, (m, v), c in zip(params, (g1.b, g2.a_bias, g2.b, g2.bias), state, copies):
            ge2jit.adam_update(p, g, m, v, step=t, lr=1e-4, param_copy=c)
        mark("adam")

    group.broadcast(params + [c for c in copies if c is not None])
    cp.cuda.Device().synchronize()
    profile = cProfile.Profile() if profiled else None
    start = time.perf_counter()
    first_phases: dict = {}
    if profile:
        profile.enable()
    step(first_phases if profiled else None)
    cp.cuda.Device().synchronize()
    if profile:
        profile.disable()
    first = time.perf_counter() - start
    later = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        cp.cuda.Device().synchronize()
        later.append(time.perf_counter() - start)
    info = ge2jit.cache_info()
    phases = {}
    if profiled:   # once more, each part timed: a later step's, beside the first's
        phases["later"] = {}
        step(phases["later"])
        phases["first"] = first_phases
    top = []
    if profile:   # (file, line, name) -> (calls, .., tottime, cumtime, ..)
        stats = pstats.Stats(profile).stats
        top = sorted(((v[3], f"{k[2]} ({Path(k[0]).name}:{k[1]})") for k, v in stats.items()),
                     reverse=True)[:25]
    with open(path, "w") as f:
        json.dump({"rank": group.rank, "first_s": first, "later_s": statistics.median(later),
                   "hits": info["process_hits"], "misses": info["process_misses"],
                   "first_step_profile": top, "phases": phases}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["profile"])
