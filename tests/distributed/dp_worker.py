"""One rank of the data-parallel test (run by test_data_parallel_gpu.py, one process a GPU,
the launcher's variables in the environment): a 2-layer MLP's step on this rank's shard of a
global batch, its gradients all-reduced by ge2jit.distributed.GradientAllReduce, eagerly and
replayed from a captured graph, against the gradients of the whole batch on this GPU alone.
Writes ``{"rank", "device", "eager_err", "graph_err", "graph_equal"}`` to argv[1]."""

from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np

import ge2jit
import ge2jit.distributed as dist
import ge2jit.graph


def main(path: str) -> None:
    group = dist.init()
    rank, world = group.rank, group.world_size
    rng = np.random.default_rng(0)   # every rank draws the same weights and global batch
    rows, d, hidden, out = 96, 64, 192, 48
    w1, b1 = rng.standard_normal((d, hidden)) / 8, rng.standard_normal(hidden)
    w2, b2 = rng.standard_normal((hidden, out)) / 8, rng.standard_normal(out)
    x_all = rng.standard_normal((rows * world, d))
    t_all = rng.standard_normal((rows * world, out))
    params = [cp.asarray(p, dtype=cp.float32) for p in (w1, b1, w2, b2)]
    if rank:   # the broadcast must make them rank 0's
        for p in params:
            p += 1.0
    group.broadcast(params)

    def grads(x, t, reducer, n_total):
        w1, b1, w2, b2 = params
        h, z1 = ge2jit.gemm_bias_act(x, w1, b1, act="gelu_tanh", save_preact=True)
        y = ge2jit.gemm_bias_act(h, w2, b2)
        dy = (y - t) * (2.0 / (n_total * out))   # d mean squared error, this shard's rows
        g2 = ge2jit.gemm_bias_act_backward(dy, h, w2, b2, needs=("a", "b", "bias"),
                                           a_act="gelu_tanh", a_z=z1, a_bias=b1)
        got = [None, g2.a_bias, g2.b, g2.bias]
        if reducer is not None:   # the last layer's first, as the backward makes them
            reducer.ready(3, g2.bias)
            reducer.ready(2, g2.b)
            reducer.ready(1, g2.a_bias)
        g1 = ge2jit.gemm_bias_act_backward(g2.a, x, w1, None, needs=("b",))
        got[0] = g1.b
        if reducer is not None:
            reducer.ready(0, g1.b)
            reducer.wait()
        return got

    # the whole batch on this GPU: the reference
    whole = [g.get() for g in grads(cp.asarray(x_all, cp.float32),
                                    cp.asarray(t_all, cp.float32), None, rows * world)]
    # this rank's shard, averaged over the ranks (each shard's mean is over its rows)
    reducer = dist.GradientAllReduce(group, [p.nbytes for p in params], bucket_bytes=40_000)
    x = cp.asarray(x_all[rank * rows:(rank + 1) * rows], cp.float32)
    t = cp.asarray(t_all[rank * rows:(rank + 1) * rows], cp.float32)
    eager = [g.get() for g in grads(x, t, reducer, rows)]
    err = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(eager, whole))
    step = ge2jit.graph.capture(lambda x, t: grads(x, t, reducer, rows), x, t)
    replayed = [g.get() for g in step(x, t)]
    graph_err = max(float(np.abs(a - b).max() / np.abs(b).max())
                    for a, b in zip(replayed, whole))
    equal = all(np.array_equal(a, b) for a, b in zip(replayed, eager))
    # 16-bit gradients travel as such: each rank's bfloat16 and float16 values averaged by
    # NCCL, against the float64 mean of what the ranks sent (every rank draws all of them)
    import ml_dtypes

    sent = {w: rng.standard_normal(1000 + 3) for w in range(world)}
    mean = sum(sent.values()) / world
    halves = {}
    for name, dtype in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
        mine = cp.asarray(sent[rank].astype(dtype))
        want = sum(sent[w].astype(dtype).astype(np.float64) for w in range(world)) / world
        group.all_reduce([mine], op="avg")
        halves[name] = float(np.abs(mine.get().astype(np.float64) - want).max()
                             / np.abs(want).max())
    # ZeRO-1's collectives: a reduce-scatter gives this rank its part of the mean, and an
    # all-gather (in place) puts every rank's part back together
    whole = cp.asarray(sent[rank].astype(np.float32)[:1000])
    part = cp.empty(1000 // world, cp.float32)
    group.reduce_scatter([(whole, part)])
    n = part.size
    scatter_err = float(np.abs(part.get() - mean[:1000][rank * n:(rank + 1) * n]).max())
    gathered = cp.zeros(1000, cp.float32)
    gathered[rank * n:(rank + 1) * n] = part
    group.all_gather([(gathered[rank * n:(rank + 1) * n], gathered)])
    gather_err = float(np.abs(gathered.get() - mean[:1000]).max())
    with open(path, "w") as f:
        json.dump({"rank": rank, "device": group.device_id, "eager_err": err,
                   "graph_err": graph_err, "graph_equal": equal,
                   "buckets": reducer.buckets, "half_errs": halves,
                   "scatter_err": scatter_err, "gather_err": gather_err}, f)


if __name__ == "__main__":
    main(sys.argv[1])
