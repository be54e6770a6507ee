"""Train a small GPT-style decoder on ge2jit.torch layers to copy sequences. Needs a CUDA GPU.

    python examples/train_gpt_block.py [--compile | --graph] [--baseline]
                                       [--dtype float32|bfloat16] [--steps 300] [--batch 32]
                                       [--seq 64] [--vocab 64] [--d 256] [--heads 4]
                                       [--layers 2] [--lr 1e-3] [--seed 0]
                                       [--log-every 10] [--json PATH]
    torchrun --nproc-per-node N examples/train_gpt_block.py [--compile] [...]

Without a GPU (or without PyTorch) it says so in one line and exits with status 2: nothing
was trained.

The model: token embedding plus a learned positional embedding, ``--layers`` pre-LayerNorm
blocks, a final LayerNorm and a head (no bias). A block is ``x + attn(ln1(x))`` then
``x + mlp(ln2(x))``: the attention's qkv and output projections are ``ge2jit.torch.Linear``
(the attention itself ``ge2jit.torch.scaled_dot_product_attention(is_causal=True)`` on
16-bit tensors, PyTorch's on float32 ones and in the baseline), the MLP is
``ge2jit.torch.MLP([d, 4 * d, d], act="gelu_tanh")`` (one custom op whose backward is
chained), the head a ``ge2jit.torch.Linear``. ``--baseline`` builds the same model on
PyTorch's layers (``nn.Linear``; ``nn.Sequential(Linear, GELU("tanh"), Linear)``), with the
same initial weights, so the two can be compared with one script.

The task: a sequence of ``seq / 2`` random tokens (from ``vocab``), a separator, and the same
tokens again; the model reads the first ``seq`` of those ``seq + 1`` tokens and predicts each
next one, and the loss (cross-entropy) and the accuracy count the copied half only. Batches
are drawn on the GPU from a seeded ``torch.Generator``; the accuracy printed at the end is
the argmax's on a held-out batch (another generator's).

Training: AdamW. ``--dtype bfloat16`` keeps the parameters in float32 and runs the forward
under ``torch.autocast("cuda", torch.bfloat16)``. Modes:

- eager (default);
- ``--compile``: the model is ``torch.compile(model, fullgraph=True)`` (the ge2jit layers are
  custom ops: no graph break), its backward compiled with it; the loss and AdamW stay eager;
- ``--graph``: the whole step (zero_grad, forward, loss, backward, AdamW's step) is captured
  once as a CUDA graph with ``ge2jit.graph.capture(..., backend="torch")`` and replayed for
  every later step, each batch copied into the graph's input buffers. The first step is the
  capture's warm-up (an eager step, which also creates the gradients and AdamW's state);
  AdamW is ``capturable=True`` (its step count lives on the GPU). The step returns the loss
  tensor, which the next replay overwrites; it is read (``float(loss)``) every
  ``--log-every`` steps, outside the step.

Data parallel: under ``torchrun --nproc-per-node N`` (``WORLD_SIZE`` > 1 in the environment)
each process takes the GPU of its ``LOCAL_RANK`` (``torch.cuda.set_device``), joins the NCCL
process group, and trains the model wrapped in ``DistributedDataParallel(device_ids=[local
rank])`` on its contiguous shard of each batch (``--batch`` is the global batch: the world
size must divide it; every rank draws the whole batch from the same generator and keeps its
rows). DDP averages the gradients over the ranks, and the loss logged each step is the mean
of the ranks' losses (an all-reduce): each shard's loss is a mean over its rows, so both are
the whole batch's, and the losses follow one GPU's on the whole batch within float rounding.
The progress bar and the results are rank 0's; the process group is destroyed at the end.
``--compile`` compiles the DDP-wrapped model without ``fullgraph`` (Dynamo splits it at DDP's
buckets, on purpose); ``--graph`` is refused there (DDP's all-reduces are not captured).

It prints a progress bar (the loss every ``--log-every`` steps), the final loss and the copy
accuracy, and the median time of a step over the last half of the steps (CUDA events around
each step); ``--json PATH`` writes them, with every step's training loss.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

from ge2jit._deps import script_errors

SCRIPT = "train_gpt_block.py"

with script_errors(SCRIPT, "PyTorch, ge2jit.torch and a CUDA GPU",
                   as_script=__name__ == "__main__"):
    import torch
    import torch.distributed
    import torch.nn.functional as F
    from torch import nn

    import ge2jit.torch as gt

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # examples/_common.py
    from _common import (
        TrainResult,
        add_training_arguments,
        check_sizes,
        copy_batch,
        copy_loss,
        evaluate,
        median_of_last_half,
        no_gpu_message,
        report,
        run_steps,
        use_launchers_gpu,
        write_json,
    )

MODES = ("eager", "compile", "graph")

NO_GPU = no_gpu_message(SCRIPT)


# --- the model -----------------------------------------------------------------------------

def linear(n_in: int, n_out: int, baseline: bool, device, bias: bool = True) -> nn.Module:
    """A Linear layer: ge2jit's or, for the baseline, PyTorch's."""
    return (nn.Linear if baseline else gt.Linear)(n_in, n_out, bias=bias, device=device)


def make_mlp(d: int, baseline: bool, device) -> nn.Module:
    """The block's MLP, d -> 4d (GELU, tanh approximation) -> d."""
    if baseline:
        return nn.Sequential(nn.Linear(d, 4 * d, device=device), nn.GELU(approximate="tanh"),
                             nn.Linear(4 * d, d, device=device))
    return gt.MLP([d, 4 * d, d], act="gelu_tanh", device=device)


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, baseline: bool, device):
        super().__init__()
        self.heads, self.baseline = heads, baseline
        self.qkv = linear(d, 3 * d, baseline, device)
        self.proj = linear(d, d, baseline, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)   # each (b, heads, t, d / heads)
        if not self.baseline and q.dtype in (torch.float16, torch.bfloat16):
            y = gt.scaled_dot_product_attention(q, k, v, is_causal=True)   # ge2jit's kernels
        else:   # float32, and the baseline: PyTorch's
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d: int, heads: int, baseline: bool, device):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, device=device)
        self.attn = CausalSelfAttention(d, heads, baseline, device)
        self.ln2 = nn.LayerNorm(d, device=device)
        self.mlp = make_mlp(d, baseline, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and learned positional embeddings, ``layers`` blocks, a final LayerNorm and a
    head over the ``vocab`` tokens (the separator, token ``vocab``, is only read)."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int, *,
                 baseline: bool = False, device=None):
        super().__init__()
        self.tok = nn.Embedding(vocab + 1, d, device=device)
        self.pos = nn.Parameter(torch.zeros(seq, d, device=device))
        self.blocks = nn.ModuleList(Block(d, heads, baseline, device) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, device=device)
        self.head = linear(d, vocab, baseline, device, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


LINEARS = (nn.Linear, gt.Linear)


def init_weights(model: GPT, seed: int) -> None:
    """GPT-2's initialization: linear weights and embeddings normal(0, 0.02), the residual
    projections (attention output, the MLP's last layer) 0.02 / sqrt(2 * layers), biases 0,
    LayerNorms 1 and 0. Drawn on the CPU from ``seed`` in module order, so the ge2jit and
    the baseline model start from the same weights."""
    g = torch.Generator().manual_seed(seed)
    std = 0.02
    residual_std = std / math.sqrt(2 * len(model.blocks))
    residual = set()
    for block in model.blocks:
        residual.add(id(block.attn.proj))
        residual.add(id([m for m in block.mlp.modules() if isinstance(m, LINEARS)][-1]))

    def normal_(p: torch.Tensor, s: float) -> None:
        p.copy_(torch.randn(p.shape, generator=g) * s)

    with torch.no_grad():
        normal_(model.tok.weight, std)
        normal_(model.pos, std)
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, LINEARS):
                normal_(m.weight, residual_std if id(m) in residual else std)
                if m.bias is not None:
                    m.bias.zero_()


# --- training ------------------------------------------------------------------------------

@dataclass(kw_only=True)
class Result(TrainResult):
    baseline: bool


def check_distributed(*, mode: str, batch: int, world_size: int) -> None:
    """Raises ValueError, naming the option, for what a data-parallel run cannot take."""
    if world_size > 1 and mode == "graph":
        raise ValueError(f"mode: expected eager or compile with {world_size} processes "
                         "(DistributedDataParallel's all-reduces are not captured), got 'graph'")
    if batch < 1 or batch % world_size:
        raise ValueError(f"batch: expected a positive multiple of the number of processes "
                         f"({world_size}), got {batch}")


def train(*, steps: int = 300, batch: int = 32, seq: int = 64, vocab: int = 64, d: int = 256,
          heads: int = 4, layers: int = 2, lr: float = 1e-3, weight_decay: float = 0.01,
          dtype: str = "float32", mode: str = "eager", baseline: bool = False, seed: int = 0,
          log_every: int = 10, eval_batch: int = 512, progress: bool = True, rank: int = 0,
          world_size: int = 1) -> Result:
    """Train on the copy task (see the module's docstring) on the current CUDA device. With
    ``world_size`` > 1 (the NCCL process group initialized), this is rank ``rank`` of a
    data-parallel run: DDP over its shard of each ``batch``, the losses the whole batch's."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype: expected float32 or bfloat16, got {dtype!r}")
    check_sizes(seq=seq, d=d, heads=heads, steps=steps, log_every=log_every)
    check_distributed(mode=mode, batch=batch, world_size=world_size)
    config = dict(batch=batch, seq=seq, vocab=vocab, d=d, heads=heads, layers=layers, lr=lr,
                  weight_decay=weight_decay, seed=seed, world_size=world_size)
    device = torch.device("cuda", torch.cuda.current_device())
    amp = dtype == "bfloat16"
    model = GPT(vocab, seq, d, heads, layers, baseline=baseline, device=device)
    init_weights(model, seed)
    net = model
    if world_size > 1:   # the device is this rank's (main set it from LOCAL_RANK)
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    # under DDP, Dynamo splits the compiled graph at DDP's buckets (its DDPOptimizer), on
    # purpose: no fullgraph there
    forward = torch.compile(net, fullgraph=world_size == 1) if mode == "compile" else net
    # capturable: AdamW keeps its step count on the GPU and reads it there (a graph replays
    # no Python, so no host-side count could advance)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                            capturable=mode == "graph")

    def train_step(x, targets):
        """One step, all of it queued on the GPU (nothing here reads a value back): the
        gradients are zeroed in place (a graph replays their addresses), and the loss comes
        back as a tensor."""
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = copy_loss(forward(x), targets)
        loss.backward()
        opt.step()
        loss = loss.detach()
        if world_size > 1:   # the whole batch's: the mean of the shards' means
            loss = loss.clone()
            torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG)
        return loss

    data = torch.Generator(device=device).manual_seed(seed)
    held_out = torch.Generator(device=device).manual_seed(seed + 2**31)
    rows = slice(rank * batch // world_size, (rank + 1) * batch // world_size)

    def next_batch():
        """This rank's rows of the next batch (all of them with one process): every rank draws
        the whole batch from the same generator, so the shards make up one GPU's batch."""
        x, targets = copy_batch(data, batch, seq, vocab, device)
        return x[rows], targets[rows]

    what = f"{mode}, {dtype}{', baseline' if baseline else ''}"
    if world_size > 1:
        what += f", {world_size} GPUs"
    losses, times = run_steps(train_step, next_batch,
                              steps=steps, graph=mode == "graph", log_every=log_every,
                              desc=f"copy ({what})", progress=progress, device=device)
    eval_loss, accuracy = evaluate(model, *copy_batch(held_out, eval_batch, seq, vocab, device),
                                   amp)
    return Result(mode=mode, dtype=dtype, baseline=baseline, steps=steps,
                  final_loss=losses[-1], accuracy=accuracy, eval_loss=eval_loss,
                  step_ms=median_of_last_half(times), losses=losses,
                  step_times_ms=times, config=config)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_training_arguments(parser)
    parser.add_argument("--baseline", action="store_true",
                        help="PyTorch's nn.Linear and MLP instead of ge2jit's layers")
    args = parser.parse_args(argv)
    mode = "compile" if args.compile else "graph" if args.graph else "eager"
    from ge2jit import ArgumentValueError
    from ge2jit.distributed import process_info

    try:
        info = process_info()   # torchrun's RANK, WORLD_SIZE, LOCAL_RANK (one process: none)
    except ArgumentValueError as e:
        print(f"{SCRIPT}: {e}", file=sys.stderr)
        return 2
    try:
        check_sizes(seq=args.seq, d=args.d, heads=args.heads, steps=args.steps,
                    log_every=args.log_every)
        check_distributed(mode=mode, batch=args.batch, world_size=info.world_size)
    except ValueError as e:
        parser.error(str(e))
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    distributed = info.world_size > 1
    if not use_launchers_gpu(info, SCRIPT):
        return 2
    if distributed:   # MASTER_ADDR and MASTER_PORT from the environment (torchrun's)
        torch.distributed.init_process_group(
            "nccl", rank=info.rank, world_size=info.world_size,
            device_id=torch.device("cuda", info.local_rank))
    try:
        result = train(steps=args.steps, batch=args.batch, seq=args.seq, vocab=args.vocab,
                       d=args.d, heads=args.heads, layers=args.layers, lr=args.lr,
                       dtype=args.dtype, mode=mode, baseline=args.baseline, seed=args.seed,
                       log_every=args.log_every, progress=info.rank == 0, rank=info.rank,
                       world_size=info.world_size)
    finally:
        if distributed:
            torch.distributed.destroy_process_group()
    if info.rank == 0:
        report(result, None)
        if args.json:
            write_json(args.json, {**result.summary(), "losses": result.losses})
    return 0


if __name__ == "__main__":
    with script_errors(SCRIPT):   # setup problems met later (a GE2JIT_* variable): one line
        raise SystemExit(main())
