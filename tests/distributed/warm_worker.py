"""One rank of the warm-start test (run by test_warm_start_gpu.py, one process a GPU, the
launcher's variables in the environment, ``GE2JIT_CACHE_DIR`` set per rank): an MLP block's
data-parallel training step (bfloat16, d -> 4d -> d, the gradients averaged over the ranks in
bfloat16 under the backward, Adam), the first step timed from the process's first kernel to
its end on the GPU, then later steps. Writes ``{"rank", "first_s", "later_s", "hits",
"misses", "first_step_profile"}`` to argv[1]; argv[2] and argv[3] are d and the tokens per
GPU; with argv[4] "profile", the first step runs under cProfile and its 25 costliest calls
by cumulative time are reported (else the list is empty)."""

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

    def step():
        nonlocal t
        h, z = ge2jit.gemm_bias_act(x, copies[0], params[1], act="gelu_tanh",
                                    save_preact=True)
        y = ge2jit.gemm_bias_act(h, copies[2], params[3])
        gy = ((y.astype(np.float32) - target) * np.float32(2 / y.size)).astype(BF16)
        g2 = ge2jit.gemm_bias_act_backward(gy, h, copies[2], params[3],
                                           needs=("a", "b", "bias"), a_act="gelu_tanh",
                                           a_z=z, a_bias=params[1])
        reducer.ready(3, g2.bias)
        reducer.ready(2, g2.b)
        reducer.ready(1, g2.a_bias)
        g1 = ge2jit.gemm_bias_act_backward(g2.a, x, copies[0], None, needs=("b",))
        reducer.ready(0, g1.b)
        reducer.wait()
        t += 1
        for p, g, (m, v), c in zip(params, (g1.b, g2.a_bias, g2.b, g2.bias), state, copies):
            ge2jit.adam_update(p, g, m, v, step=t, lr=1e-4, param_copy=c)

    cp.cuda.Device().synchronize()
    profile = cProfile.Profile() if profiled else None
    start = time.perf_counter()
    if profile:
        profile.enable()
    step()
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
    top = []
    if profile:   # (file, line, name) -> (calls, .., tottime, cumtime, ..)
        stats = pstats.Stats(profile).stats
        top = sorted(((v[3], f"{k[2]} ({Path(k[0]).name}:{k[1]})") for k, v in stats.items()),
                     reverse=True)[:25]
    with open(path, "w") as f:
        json.dump({"rank": group.rank, "first_s": first, "later_s": statistics.median(later),
                   "hits": info["process_hits"], "misses": info["process_misses"],
                   "first_step_profile": top}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["profile"])
