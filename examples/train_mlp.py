"""Train a 3-layer MLP on ge2jit alone: two interleaved spirals, classified. Needs a CUDA GPU.

    python examples/train_mlp.py [--dtype float32|bfloat16] [--optimizer adam|sgd]
                                 [--steps 400] [--seed 0] [--act gelu_tanh] [--graph]
                                 [--gpus N] [--json PATH]
    torchrun --nproc-per-node N examples/train_mlp.py [...]     (or mpirun -n N, srun -n N)

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

Data parallel (``--gpus N``, or started by a launcher): one process a GPU, through
``ge2jit.distributed``. Without a launcher's variables in the environment, ``--gpus N`` starts
N copies of the script on this host (local ranks 0 to N - 1, MASTER_ADDR 127.0.0.1, a free
MASTER_PORT: ``ge2jit.distributed.launch_local``), waits for them and exits with the status of
the first rank that fails, its output printed (the others are stopped); under ``torchrun``,
``mpirun`` or ``srun`` each process joins the job directly. Every rank starts from rank 0's
parameters (a broadcast) and trains on its own contiguous shard of the 2 * 1024 points (the
world size must divide them). The backward hands each layer's dW and db to a
``GradientAllReduce`` as soon as it makes them, the last layer's first: a bucket's all-reduce
(a mean over the ranks) starts on a side stream once its last gradient is made, under the
rest of the backward (this network's 0.3 MB of gradients fill one bucket of the default
25 MiB, reduced once the first layer's dW is made); the optimizer steps wait for them. Each
shard's loss and accuracy are means over its rows, so their mean over the ranks (one small
all-reduce a step) is the whole batch's: the losses printed and recorded are those of one GPU
training on the whole batch, within float rounding. In bfloat16 the weight gradients come out
of the backward in float32 (``db_dtype``: NCCL through CuPy reduces no bfloat16). The
progress bar and the printed results are rank 0's; with ``--graph`` each rank's captured step
holds its all-reduces.

At the end it prints, per rank, how many kernels the process found in ge2jit's kernel cache
and how many it compiled (``ge2jit.cache_info()``'s ``process_hits`` and
``process_misses``: every miss is compiled), which tells whether a warmed, shared cache
covered the job. ``--json PATH`` writes the losses, the accuracy, the first step's and the
later steps' times and these counts (rank 0).

``numpy_losses`` trains the same network, from the same initial weights and data, in float64
NumPy: the GPU test compares the first steps' losses with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

ACTS = ("gelu_tanh", "gelu", "relu", "silu", "tanh")
POINTS = 1024   # per class: the training set has 2 * POINTS points


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
          act: str = "gelu_tanh", hidden: int = 256, points: int = POINTS,
          lr: float | None = None, progress: bool = True, graph: bool = False,
          timings: dict | None = None, group=None):
    """Trains on the GPU; returns (losses per step, final accuracy). ``graph``: the step
    captured once and replayed (see the module's docstring). ``timings``, a dict, receives
    the seconds of the first step (``first_step_s``: it compiles or loads the kernels and,
    with ``graph``, captures the step), per step after the first (``per_step_s``) and how
    many were timed. ``group``: a ``ge2jit.distributed.Group`` (None: one process): this
    rank trains on its shard of the 2 * ``points`` rows, the gradients averaged over the
    ranks, and the losses and accuracy returned are the whole batch's."""
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
    rows = slice(None)
    if group is not None:
        from ge2jit.distributed import GradientAllReduce, shard

        rows = shard(len(feats), group.rank, group.world_size, what="training points")
        progress = progress and group.rank == 0
    x = cp.asarray(feats[rows].astype(np.float32)).astype(compute)
    y_true = cp.asarray(labels[rows])
    sizes = [feats.shape[1], hidden, hidden, 2]
    params = [(cp.asarray(w64.astype(np.float32)), cp.asarray(b64.astype(np.float32)))
              for w64, b64 in init_params(sizes, seed)]
    if group is not None:
        group.broadcast([p for pair in params for p in pair])   # every rank starts from rank 0's
    layers = []
    for w, b in params:
        layers.append({
            "w": w, "b": b,
            # the weights the forward reads: the master weights themselves in float32
            "w_c": w if compute == np.float32 else w.astype(compute),
            "state": [cp.zeros_like(w), cp.zeros_like(w), cp.zeros_like(b), cp.zeros_like(b)],
        })
    acts = [act, act, "none"]
    counter = {"t": cp.zeros((), cp.int32)}   # Adam's step count, advanced by the step
    reducer, backward_options = None, {}
    if group is not None:
        # dW of layer i is gradient 2 * i, db 2 * i + 1; all float32 (NCCL through CuPy
        # reduces no bfloat16: the bfloat16 backward writes dW in float32, db is float32)
        reducer = GradientAllReduce(group, [p.nbytes for pair in params for p in pair])
        if compute != np.float32:
            backward_options["db_dtype"] = "float32"

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
        if group is not None:   # the whole batch's: the mean of the shards' means
            stats = cp.stack([loss, acc.astype(np.float32)])
            group.all_reduce([stats])
            if group.world_size > 1:
                stats *= np.float32(1.0 / group.world_size)
            loss, acc = stats[0], stats[1]
        g = grad.astype(compute)   # dL/dZ of the last layer, whose act is "none"
        # backward, last layer first. g is dL/dZ of layer i (so act="none"); its dX comes back
        # as dL/dZ of layer i - 1, that layer's act' applied in the GEMM's epilogue, and with
        # it layer i - 1's bias gradient (the column sums of that dZ, a_bias). The first
        # layer needs no gradient of its input. Each gradient goes to the all-reduce as soon
        # as it is made.
        dw, db = [None] * len(layers), [None] * len(layers)
        for i in reversed(range(len(layers))):
            layer, h_in = layers[i], saved[i][0]
            needs = ("b",) if db[i] is not None else ("b", "bias")
            if i:
                grads = ge2jit.gemm_bias_act_backward(
                    g, h_in, layer["w_c"], layer["b"], needs=("a", *needs),
                    a_act=acts[i - 1], a_z=saved[i - 1][1], a_bias=layers[i - 1]["b"],
                    **backward_options)
            else:
                grads = ge2jit.gemm_bias_act_backward(g, h_in, layer["w_c"], layer["b"],
                                                      needs=needs, **backward_options)
            dw[i] = grads.b
            made = [(2 * i, dw[i])]
            if db[i] is None:   # the last layer: its own bias gradient
                db[i] = grads.bias
                made.append((2 * i + 1, db[i]))
            if i:   # the layer below's bias gradient, made by this dX GEMM
                db[i - 1] = grads.a_bias
                made.append((2 * i - 1, db[i - 1]))
            g = grads.a
            if reducer is not None:
                for index, array in made:
                    reducer.ready(index, array)
        if reducer is not None:
            reducer.wait()   # the optimizer reads the averaged gradients
        if optimizer == "adam":
            counter["t"] += 1   # in place: a captured step advances it on every replay
        for i in reversed(range(len(layers))):
            layer, s = layers[i], layers[i]["state"]
            copy = None if compute == np.float32 else layer["w_c"]
            if optimizer == "adam":
                ge2jit.adam_update(layer["w"], dw[i], s[0], s[1], step=counter["t"], lr=lr,
                                   param_copy=copy)
                ge2jit.adam_update(layer["b"], db[i], s[2], s[3], step=counter["t"], lr=lr)
            else:
                ge2jit.sgd_update(layer["w"], dw[i], s[0], lr=lr, momentum=0.9,
                                  param_copy=copy)
                ge2jit.sgd_update(layer["b"], db[i], s[2], lr=lr, momentum=0.9)
        return loss, acc

    if not steps:
        return [], 0.0
    stream = cp.cuda.get_current_stream()
    stream.synchronize()
    first = time.perf_counter()
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
    stream.synchronize()
    start = time.perf_counter()
    for step in bar:
        loss, acc = run(x, y_true)   # a graph: the batch copied in, one replay
        record(step - 1, loss)
        if progress and step % 10 == 0:
            bar.set_postfix(loss=f"{float(loss):.4f}", acc=f"{float(acc):.3f}")
    stream.synchronize()
    if timings is not None:
        timings["first_step_s"] = start - first
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


def visible_gpus() -> int:
    """How many GPUs CuPy sees (0 without CuPy, a driver or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean none
        return 0


def world_size(info, gpus: int | None) -> int:
    """How many processes train: the launcher's (``info``, a
    ``ge2jit.distributed.ProcessInfo``; ``--gpus``, when given, must say the same) or, without
    a launcher, ``gpus`` (default 1).

    Raises:
        ArgumentValueError: ``--gpus`` against the launcher's number, or a number that does
            not divide the training points into equal shards; the message names the option
            or the launcher's variable.
    """
    from ge2jit import ArgumentValueError
    from ge2jit.distributed.environment import LAUNCHERS

    if info.launcher == "none":
        world, source = gpus or 1, "--gpus"
    else:
        source = next(names[2] for names in LAUNCHERS if names[0] == info.launcher)
        if gpus is not None and gpus != info.world_size:
            raise ArgumentValueError(f"--gpus: expected the launcher's number of processes "
                                     f"({source}={info.world_size}), got {gpus}")
        world = info.world_size
    if (2 * POINTS) % world:
        raise ArgumentValueError(f"{source}: expected a number of processes that divides the "
                                 f"{2 * POINTS} training points into equal shards, got {world}")
    return world


def kernel_counts(group=None) -> list[dict]:
    """Per rank, the kernels the process has found in ge2jit's kernel cache (``loaded``) and
    compiled (``compiled``): ``ge2jit.cache_info()``'s ``process_hits`` and
    ``process_misses`` (every miss is compiled), gathered from the ranks of ``group`` (one
    all-reduce: every rank calls it)."""
    import cupy as cp

    import ge2jit

    info = ge2jit.cache_info()
    mine = [info["process_hits"], info["process_misses"]]
    if group is None:
        table = [mine]
    else:   # each rank writes its row of zeros; the sum over the ranks is the table
        counts = cp.zeros((group.world_size, 2), cp.float64)
        counts[group.rank] = cp.asarray(mine, cp.float64)
        group.all_reduce([counts])
        table = counts.get().round().astype(int).tolist()
    return [{"rank": r, "loaded": int(loaded), "compiled": int(compiled)}
            for r, (loaded, compiled) in enumerate(table)]


def describe_kernels(kernels: list[dict]) -> str:
    """The line that tells where the kernels came from, per rank."""
    if len(kernels) == 1:
        k = kernels[0]
        return f"kernel cache: {k['loaded']} kernels loaded, {k['compiled']} compiled"
    return "kernel cache: " + "; ".join(f"rank {k['rank']}: {k['loaded']} kernels loaded, "
                                        f"{k['compiled']} compiled" for k in kernels)


def launch(argv: list, world: int) -> int:
    """The script started as ``world`` processes on this host (``--gpus``, no launcher): their
    exit status, with the first failing rank's output on stderr."""
    import ge2jit.distributed as dist

    visible = visible_gpus()
    if visible < world:
        print(f"train_mlp.py: --gpus: expected at most the {visible} GPU"
              f"{'' if visible == 1 else 's'} visible here, got {world}", file=sys.stderr)
        return 2
    run = dist.launch_local([sys.executable, os.path.abspath(__file__), *argv], world)
    text = run.report("train_mlp.py")
    if text:
        print(text, file=sys.stderr)
    return run.returncode


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="train_mlp.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--act", default="gelu_tanh", choices=ACTS)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--graph", action="store_true",
                        help="capture the training step as a CUDA graph and replay it")
    parser.add_argument("--gpus", type=int, default=None, metavar="N",
                        help="train data-parallel on N GPUs of this host, one process each "
                             "(under torchrun, mpirun or srun: the launcher's processes)")
    parser.add_argument("--json", metavar="PATH",
                        help="write the losses, the times and the kernel counts there")
    args = parser.parse_args(argv)
    if args.gpus is not None and args.gpus < 1:
        parser.error(f"--gpus: expected at least 1, got {args.gpus}")
    import ge2jit.distributed as dist
    from ge2jit import ArgumentValueError
    from ge2jit._deps import require_cupy

    require_cupy()   # not installed: the extras to install (one line), rather than "no GPU"
    try:
        info = dist.process_info()
        world = world_size(info, args.gpus)
    except ArgumentValueError as e:
        print(f"train_mlp.py: {e}", file=sys.stderr)
        return 2
    if not gpu_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    if info.launcher == "none" and world > 1:
        return launch(argv, world)
    group = None
    if info.launcher != "none":   # one rank of a job
        try:
            group = dist.init(info)
        except ArgumentValueError as e:
            print(f"train_mlp.py: {e}", file=sys.stderr)
            return 2
    lead = group is None or group.rank == 0
    options = dict(dtype=args.dtype, optimizer=args.optimizer, seed=args.seed, act=args.act,
                   lr=args.lr)
    timed: dict = {}
    losses, acc = train(args.steps, graph=args.graph, timings=timed, group=group, **options)
    shards = f" ({world} GPUs, {2 * POINTS // world} points each)" if world > 1 else ""
    if lead:
        print(f"final loss {losses[-1]:.4f} (first {losses[0]:.4f}), accuracy {acc:.3f} on the "
              f"{2 * POINTS} training points{shards}")
    eager: dict = {}
    if args.graph:   # the same steps eagerly, for the comparison
        train(min(args.steps, 200), timings=eager, progress=False, group=group, **options)
    kernels = kernel_counts(group)
    if not lead:
        return 0
    if args.graph:
        print(f"per step: {timed['per_step_s'] * 1e6:.0f} µs as a CUDA graph, "
              f"{eager['per_step_s'] * 1e6:.0f} µs eagerly "
              f"({eager['per_step_s'] / timed['per_step_s']:.2f}x; "
              f"{timed['steps_timed']} and {eager['steps_timed']} steps timed)")
    else:
        print(f"per step: {timed['per_step_s'] * 1e6:.0f} µs eagerly (--graph: as a CUDA "
              "graph)")
    print(describe_kernels(kernels))
    if args.json:
        result = {"world_size": world, "dtype": args.dtype, "optimizer": args.optimizer,
                  "graph": args.graph, "steps": args.steps, "losses": losses, "accuracy": acc,
                  "first_step_s": timed["first_step_s"], "per_step_s": timed["per_step_s"],
                  "steps_timed": timed["steps_timed"],
                  "eager_per_step_s": eager.get("per_step_s"), "kernels": kernels}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    from ge2jit._deps import script_errors

    with script_errors("train_mlp.py"):   # setup problems (CuPy missing, ...): one line
        raise SystemExit(main())
