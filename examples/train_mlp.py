"""Train a 3-layer MLP on ge2jit alone: two interleaved spirals, classified. Needs a CUDA GPU.

    python examples/train_mlp.py [--dtype float32|bfloat16] [--optimizer adam|sgd]
                                 [--steps 400] [--seed 0] [--act gelu_tanh] [--graph]

Without a GPU it says so in one line, with what works without one (compiling and inspecting
kernels), and exits with status 2: nothing was trained.

The network is Linear -> act -> Linear -> act -> Linear (two logits). Each Linear's forward is
``ge2jit.gemm_bias_act`` (saving Z), its backward ``ge2jit.gemm_bias_act_backward`` (dX, dW
and db in one call; the first layer skips dX). The gradient flows between layers as dL/dZ:
each layer's dX GEMM applies the previous layer's act' in its epilogue (``a_act``, ``a_z``)
and sums the columns of what it stores for that layer's db (``a_bias``), so no elementwise
pass forms dZ or db below the last layer. Every parameter is updated by one fused
kernel (``ge2jit.adam_update`` or ``ge2jit.sgd_update``). The softmax cross-entropy loss and
its gradient are a few CuPy array expressions. In bfloat16 the optimizer keeps float32 master
weights and writes the bfloat16 copies that the next forward reads; biases stay float32.
Adam's step count is a device counter that the step advances (``adam_update(step=t)``).

``--graph`` captures the training step once as a CUDA graph (``ge2jit.graph.capture``: its
warm-up is the first step) and replays it for every other step: the batch is copied into the
graph's input buffers, the parameters and optimizer state (closed over by the step) are
updated in place by each replay, Adam's counter advances in the graph. The losses are the
eager run's, bit for bit; the per-step times of both are printed at the end.

``numpy_losses`` trains the same network, from the same initial weights and data, in float64
NumPy: the GPU test compares the first steps' losses with it.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

ACTS = ("gelu_tanh", "gelu", "relu", "silu", "tanh")


def make_spirals(points: int, seed: int, noise: float = 0.15):
    """``points`` per class on two interleaved spirals; features (x, y, x², y², xy, sin x,
    sin y, 1) as float64 (2 * points, 8), labels 0 / 1."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.uniform(0.0, 1.0, points)) * 3.0 * math.pi
    xs, labels = [], []
    for cls in (0, 1):
        angle = t + cls * math.pi
        r = t / (3.0 * math.pi) * 2.0
        pts = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1)
        xs.append(pts + rng.normal(0.0, noise * 0.2, pts.shape))
        labels.append(np.full(points, cls))
    p = np.concatenate(xs)
    x, y = p[:, 0], p[:, 1]
    feats = np.stack([x, y, x * x, y * y, x * y, np.sin(2 * x), np.sin(2 * y),
                      np.ones_like(x)], axis=1)
    return feats, np.concatenate(labels)


def init_params(sizes, seed: int):
    """(W, b) per layer in float64: W of (fan_in, fan_out), scaled for unit-variance outputs."""
    rng = np.random.default_rng(seed + 1)
    return [(rng.standard_normal((i, o)) / math.sqrt(i), np.zeros(o) + 0.01)
            for i, o in zip(sizes[:-1], sizes[1:])]


def _loss_and_grad(xp, logits, labels):
    """Mean softmax cross-entropy over the batch, its gradient, and the accuracy."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = xp.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    picked = prob[xp.arange(n), labels]
    loss = -xp.log(xp.maximum(picked, 1e-30)).mean()
    grad = prob.copy()
    grad[xp.arange(n), labels] -= 1.0
    acc = (prob.argmax(axis=1) == labels).mean()
    return loss, grad / n, acc


def train(steps: int = 400, *, dtype: str = "float32", optimizer: str = "adam", seed: int = 0,
          act: str = "gelu_tanh", hidden: int = 256, points: int = 1024, lr: float | None = None,
          progress: bool = True, graph: bool = False, timings: dict | None = None):
    """Trains on the GPU; returns (losses per step, final accuracy). ``graph``: the step
    captured once and replayed (see the module's docstring). ``timings``, a dict, receives
    the seconds per step after the first (``per_step_s``) and how many were timed."""
    import time

    import cupy as cp

    import ge2jit

    if dtype == "bfloat16":
        import ml_dtypes

        compute = np.dtype(ml_dtypes.bfloat16)
    elif dtype == "float32":
        compute = np.dtype(np.float32)
    else:
        raise ValueError(f"dtype: expected float32 or bfloat16, got {dtype!r}")
    lr = lr if lr is not None else (3e-3 if optimizer == "adam" else 0.1)
    feats, labels = make_spirals(points, seed)
    x = cp.asarray(feats.astype(np.float32)).astype(compute)
    y_true = cp.asarray(labels)
    sizes = [feats.shape[1], hidden, hidden, 2]
    layers = []
    for w64, b64 in init_params(sizes, seed):
        w = cp.asarray(w64.astype(np.float32))
        b = cp.asarray(b64.astype(np.float32))
        layers.append({
            "w": w, "b": b,
            # the weights the forward reads: the master weights themselves in float32
            "w_c": w if compute == np.float32 else w.astype(compute),
            "state": [cp.zeros_like(w), cp.zeros_like(w), cp.zeros_like(b), cp.zeros_like(b)],
        })
    acts = [act, act, "none"]
    counter = {"t": cp.zeros((), cp.int32)}   # Adam's step count, advanced by the step

    def train_step(x, y_true):
        """One training step, all of it queued on the GPU (nothing synchronizes): returns the
        loss and the accuracy as 0-d arrays."""
        # forward: keep each layer's input and pre-activation
        h, saved = x, []
        for layer, a in zip(layers, acts):
            out, z = ge2jit.gemm_bias_act(h, layer["w_c"], layer["b"], act=a, save_preact=True)
            saved.append((h, z))
            h = out
        loss, grad, acc = _loss_and_grad(cp, h.astype(np.float32), y_true)
        g = grad.astype(compute)   # dL/dZ of the last layer, whose act is "none"
        # backward, last layer first. g is dL/dZ of layer i (so act="none"); its dX comes back
        # as dL/dZ of layer i - 1, that layer's act' applied in the GEMM's epilogue, and with
        # it layer i - 1's bias gradient (the column sums of that dZ, a_bias). The first
        # layer needs no gradient of its input.
        grad_bias = None   # layer i's bias gradient, when layer i + 1's backward made it
        if optimizer == "adam":
            counter["t"] += 1   # in place: a captured step advances it on every replay
        for i in reversed(range(len(layers))):
            layer, h_in = layers[i], saved[i][0]
            needs = ("b",) if grad_bias is not None else ("b", "bias")
            if i:
                grads = ge2jit.gemm_bias_act_backward(
                    g, h_in, layer["w_c"], layer["b"], needs=("a", *needs),
                    a_act=acts[i - 1], a_z=saved[i - 1][1], a_bias=layers[i - 1]["b"])
            else:
                grads = ge2jit.gemm_bias_act_backward(g, h_in, layer["w_c"], layer["b"],
                                                      needs=needs)
            db = grads.bias if grad_bias is None else grad_bias
            g, grad_bias = grads.a, grads.a_bias
            copy = None if compute == np.float32 else layer["w_c"]
            s = layer["state"]
            if optimizer == "adam":
                ge2jit.adam_update(layer["w"], grads.b, s[0], s[1], step=counter["t"], lr=lr,
                                   param_copy=copy)
                ge2jit.adam_update(layer["b"], db, s[2], s[3], step=counter["t"], lr=lr)
            else:
                ge2jit.sgd_update(layer["w"], grads.b, s[0], lr=lr, momentum=0.9,
                                  param_copy=copy)
                ge2jit.sgd_update(layer["b"], db, s[2], lr=lr, momentum=0.9)
        return loss, acc

    if not steps:
        return [], 0.0
    run = train_step
    if graph:
        run = ge2jit.graph.capture(train_step, x, y_true)   # its warm-up: step 1, eagerly
        loss, acc = run.warmup_outputs
    else:
        loss, acc = train_step(x, y_true)
    log = cp.zeros(steps, loss.dtype)   # the losses, kept on the GPU until the end
    rt = cp.cuda.runtime

    def record(i: int, loss) -> None:   # log[i] = loss, queued (one small copy)
        rt.memcpyAsync(log.data.ptr + i * log.itemsize, loss.data.ptr, log.itemsize,
                       rt.memcpyDeviceToDevice, cp.cuda.get_current_stream().ptr)

    record(0, loss)
    bar = range(2, steps + 1)
    if progress:
        from tqdm import tqdm

        bar = tqdm(bar, desc=f"spirals ({dtype}, {optimizer}{', graph' if graph else ''})",
                   unit="step", initial=1, total=steps)
    cp.cuda.get_current_stream().synchronize()
    start = time.perf_counter()
    for step in bar:
        loss, acc = run(x, y_true)   # a graph: the batch copied in, one replay
        record(step - 1, loss)
        if progress and step % 10 == 0:
            bar.set_postfix(loss=f"{float(loss):.4f}", acc=f"{float(acc):.3f}")
    cp.cuda.get_current_stream().synchronize()
    if timings is not None:
        timings["steps_timed"] = max(steps - 1, 0)
        timings["per_step_s"] = (time.perf_counter() - start) / max(steps - 1, 1)
    return log.get().astype(float).tolist(), float(acc)


def numpy_losses(steps: int, *, seed: int = 0, act: str = "gelu_tanh", hidden: int = 256,
                 points: int = 1024, lr: float = 3e-3, optimizer: str = "adam"):
    """The same training in float64 NumPy (Adam or SGD with momentum 0.9): losses per step."""
    from ge2jit.ops.gemm.reference import activation, activation_grad

    feats, labels = make_spirals(points, seed)
    params = [[w.copy(), b.copy()] for w, b in init_params([feats.shape[1], hidden, hidden, 2],
                                                           seed)]
    state = [[np.zeros_like(w), np.zeros_like(w), np.zeros_like(b), np.zeros_like(b)]
             for w, b in params]
    acts = [act, act, "none"]
    losses = []
    b1, b2, eps = 0.9, 0.999, 1e-8
    for step in range(1, steps + 1):
        h, saved = feats, []
        for (w, b), a in zip(params, acts):
            z = h @ w + b
            saved.append((h, z))
            h = activation(a, z)
        loss, g, _ = _loss_and_grad(np, h, labels)
        losses.append(float(loss))
        for i in reversed(range(3)):
            h_in, z = saved[i]
            dz = g * activation_grad(acts[i], z)
            g = dz @ params[i][0].T
            for j, grad in enumerate((h_in.T @ dz, dz.sum(axis=0))):
                p, s1 = params[i][j], state[i][2 * j]
                if optimizer == "adam":
                    s2 = state[i][2 * j + 1]
                    s1[:] = b1 * s1 + (1 - b1) * grad
                    s2[:] = b2 * s2 + (1 - b2) * grad * grad
                    p -= lr * (s1 / (1 - b1**step)) / (np.sqrt(s2 / (1 - b2**step)) + eps)
                else:
                    s1[:] = 0.9 * s1 + grad
                    p -= lr * s1
    return losses


NO_GPU = ("train_mlp.py: no CUDA GPU found; training needs one. Without a GPU, ge2jit still "
          "compiles and inspects kernels: python -m ge2jit.demo --arch sm_90 compiles the "
          'demo\'s, ge2jit.inspect("128x128x16_w32x64_s3", arch="sm_90") shows one.')


def gpu_available() -> bool:
    """Whether CuPy sees a CUDA GPU (False without CuPy, a driver or a device)."""
    try:
        import cupy
    except ImportError:
        return False
    return bool(cupy.cuda.is_available())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--act", default="gelu_tanh", choices=ACTS)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--graph", action="store_true",
                        help="capture the training step as a CUDA graph and replay it")
    args = parser.parse_args(argv)
    if not gpu_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    options = dict(dtype=args.dtype, optimizer=args.optimizer, seed=args.seed, act=args.act,
                   lr=args.lr)
    timed: dict = {}
    losses, acc = train(args.steps, graph=args.graph, timings=timed, **options)
    print(f"final loss {losses[-1]:.4f} (first {losses[0]:.4f}), accuracy {acc:.3f} on the "
          f"{2 * 1024} training points")
    if args.graph:   # the same steps eagerly, for the comparison
        eager: dict = {}
        train(min(args.steps, 200), timings=eager, progress=False, **options)
        print(f"per step: {timed['per_step_s'] * 1e6:.0f} µs as a CUDA graph, "
              f"{eager['per_step_s'] * 1e6:.0f} µs eagerly "
              f"({eager['per_step_s'] / timed['per_step_s']:.2f}x; "
              f"{timed['steps_timed']} and {eager['steps_timed']} steps timed)")
    else:
        print(f"per step: {timed['per_step_s'] * 1e6:.0f} µs eagerly (--graph: as a CUDA "
              "graph)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
