"""Train a small LLaMA-style decoder on ge2jit.torch layers to copy sequences, or time one
LLaMA-7B-sized block's training step against PyTorch's. Needs a CUDA GPU.

    python examples/train_llama_block.py [--impl ge2jit|torch]
                                         [--compile [--compile-mode reduce-overhead] | --graph]
                                         [--dtype float32|bfloat16] [--steps 300] [--batch 32]
                                         [--seq 64] [--vocab 64] [--d 256] [--heads 4]
                                         [--hidden H] [--layers 2] [--lr 1e-3] [--seed 0]
                                         [--log-every 10] [--json PATH]
    python examples/train_llama_block.py --bench [--batch 4] [--seq 1024] [--d 4096]
                                         [--heads 32] [--hidden 11008] [--dtype bfloat16]
                                         [--rounds 10] [--round-steps 5] [--warmup 3]
                                         [--json PATH]

Without a GPU (or without PyTorch) it says so in one line and exits with status 2.

The model: a token embedding, ``--layers`` LLaMA blocks, a final RMSNorm and a head (no
bias). A block is ``x -> RMSNorm -> attention -> residual add -> RMSNorm -> SwiGLU MLP ->
residual add``: the attention's q, k, v and o projections are ``ge2jit.torch.Linear(d, d,
bias=False)``, q and k get rotary position embeddings (plain PyTorch; there is no other
position information), the attention itself is ``scaled_dot_product_attention(is_causal=
True)``; the MLP is ``ge2jit.torch.GatedMLP(d, hidden, act="silu", bias=False)``,
``down(silu(x @ W_gate.T) * (x @ W_up.T))``; the norms are ``ge2jit.torch.RMSNorm(d,
eps=1e-6)``. Every residual add is fused into the RMSNorm that follows it (``norm(x,
residual)`` returns ``(rms_norm(x + residual), x + residual)``): the block's second norm
takes the attention's output and the residual stream, and a block hands its MLP's output and
the stream to the next block's first norm (the final norm after the last block). The loss
is ``ge2jit.torch.cross_entropy``, the head a ``ge2jit.torch.Linear``. ``--hidden``
defaults to LLaMA's width, 8d/3 rounded up to a multiple of 256 (11008 at d = 4096).

``--impl torch`` builds the same model on PyTorch's layers (``nn.Linear``, ``nn.RMSNorm``
with the residual add written out, ``F.silu`` between ``nn.Linear`` layers,
``F.cross_entropy``). The parameters are the layers' own initialization drawn after
``torch.manual_seed(seed)`` (the two implementations' MLPs hold their weights differently,
so their initial weights differ there).

The task is ``train_gpt_block.py``'s: ``seq / 2`` random tokens, a separator and the same
tokens again; the loss and the accuracy (the argmax's, on a held-out batch) count the copied
half only.

Training: AdamW. ``--dtype bfloat16`` keeps the parameters in float32 and runs the forward
under ``torch.autocast("cuda", torch.bfloat16)``. Modes:

- eager (default);
- ``--compile``: the model is ``torch.compile(model, fullgraph=True)`` (``--compile-mode
  reduce-overhead``: PyTorch's CUDA graphs of the compiled forward and backward), the loss
  and AdamW eager;
- ``--graph``: the whole step (zero_grad, forward, loss, backward, AdamW's step) captured
  once as a CUDA graph with ``ge2jit.graph.capture(..., backend="torch")`` and replayed for
  every later step, as in ``train_gpt_block.py`` (its warm-up is the first step; AdamW is
  ``capturable=True``; the loss is read back every ``--log-every`` steps, outside the step).

It prints a progress bar, the final loss and the copy accuracy, and the median step time over
the last half of the steps (CUDA events around each step); ``--json PATH`` writes them.

``--bench`` times one block's training step at LLaMA-7B's sizes (by default 4 x 1024 tokens,
d = 4096, 32 heads, hidden 11008, bfloat16 autocast over float32 parameters): the block's
forward from the previous block's MLP output and the residual stream (its first norm fusing
that add) to its own MLP output and stream, the backward from fixed upstream gradients of
both (dX of the inputs included), and AdamW's step (``fused=True``) on its parameters. Seven
variants, each with its own block and optimizer: ge2jit eager, ge2jit with the step captured
as a CUDA graph (replayed), the ge2jit block under ``torch.compile`` (default mode and
"reduce-overhead"; its ops trace as custom ops, and Inductor fuses the PyTorch code around
them: the rotary embedding, the casts), PyTorch eager, ``torch.compile`` (default mode) and
``torch.compile(mode="reduce-overhead")`` of the PyTorch block. After ``--warmup`` steps of
each (compilation, capture), they are timed in turns: ``--rounds`` rounds, in each of which
every variant (in an order rotated from round to round) runs ``--round-steps`` steps between
two CUDA events after the GPU has gone idle; a variant's time is the median over the rounds
of its time per step. Its peak memory is the most memory allocated from its construction
through its warm-up (parameters, gradients, AdamW's state, activations, graph pools), beyond
what was allocated before (the shared inputs). It prints a table and the ratios of ge2jit's
times to PyTorch's; ``--json PATH`` writes them with the device's name, the date and the
commit (``$GE2JIT_COMMIT``, else ``git rev-parse --short HEAD``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

from ge2jit._deps import script_errors

SCRIPT = "train_llama_block.py"

with script_errors(SCRIPT, "PyTorch, ge2jit.torch and a CUDA GPU",
                   as_script=__name__ == "__main__"):
    import torch
    import torch.nn.functional as F
    from torch import nn

    import ge2jit.torch as gt

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # examples/_common.py
    import _common as common

IMPLS = ("ge2jit", "torch")
MODES = ("eager", "compile", "reduce-overhead", "graph")
EPS = 1e-6

NO_GPU = common.no_gpu_message(SCRIPT)

#: the sizes of the training run and of ``--bench`` (LLaMA-7B's block, 4096 tokens)
TRAIN_SIZES = dict(batch=32, seq=64, d=256, heads=4)
BENCH_SIZES = dict(batch=4, seq=1024, d=4096, heads=32)


def llama_hidden(d: int, multiple_of: int = 256) -> int:
    """LLaMA's SwiGLU width: ``8 d / 3`` rounded up to a multiple of ``multiple_of``."""
    return multiple_of * -(-int(8 * d / 3) // multiple_of)


# --- the model -----------------------------------------------------------------------------

def linear(n_in: int, n_out: int, impl: str, device) -> nn.Module:
    """A Linear layer without bias: ge2jit's or PyTorch's."""
    return (nn.Linear if impl == "torch" else gt.Linear)(n_in, n_out, bias=False, device=device)


class TorchRMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` with ``ge2jit.torch.RMSNorm``'s ``forward(x, residual=None)``: y, or
    ``(y, h)`` with ``h = x + residual`` normalized."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return super().forward(x)
        h = x + residual
        return super().forward(h), h


def rms_norm(d: int, impl: str, device) -> nn.Module:
    return (TorchRMSNorm if impl == "torch" else gt.RMSNorm)(d, eps=EPS, device=device)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` on PyTorch's layers (``ge2jit.torch.GatedMLP``'s
    function)."""

    def __init__(self, d: int, hidden: int, device):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False, device=device)
        self.up = nn.Linear(d, hidden, bias=False, device=device)
        self.down = nn.Linear(hidden, d, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def swiglu(d: int, hidden: int, impl: str, device) -> nn.Module:
    if impl == "torch":
        return SwiGLU(d, hidden, device)
    return gt.GatedMLP(d, hidden, act="silu", bias=False, device=device)


def rope_tables(seq: int, head_dim: int, device, base: float = 10000.0):
    """cos and sin of the rotary embedding's angles, ``position * base**(-2i / head_dim)``:
    (seq, head_dim / 2) each, float32."""
    i = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32),
                         base ** (-i / head_dim))
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of x (batch, heads, t, head_dim): element i of the first half and
    element i of the second rotated together by position's angle i (LLaMA's layout)."""
    t = x.shape[-2]
    c, s = cos[:t].to(x.dtype), sin[:t].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, impl: str, device):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (linear(d, d, impl, device) for _ in range(4))
        cos, sin = rope_tables(seq, d // heads, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def split(proj):   # (b, t, d) -> (b, heads, t, d / heads)
            return proj(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q = rotate(split(self.q), self.cos, self.sin)
        k = rotate(split(self.k), self.cos, self.sin)
        y = F.scaled_dot_product_attention(q, k, split(self.v), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """``x -> RMSNorm -> attention -> residual add -> RMSNorm -> SwiGLU MLP -> residual add``
    with the adds fused into the norms. ``forward(x, residual)`` takes the previous block's
    MLP output and the residual stream (``residual`` None: x is the stream, for the first
    block) and returns its own ``(MLP output, residual stream)``: the add that ends the block
    is the next norm's."""

    def __init__(self, d: int, heads: int, hidden: int, seq: int, impl: str, device):
        super().__init__()
        self.attn_norm = rms_norm(d, impl, device)
        self.attn = Attention(d, heads, seq, impl, device)
        self.mlp_norm = rms_norm(d, impl, device)
        self.mlp = swiglu(d, hidden, impl, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            y, h = self.attn_norm(x), x
        else:
            y, h = self.attn_norm(x, residual)   # h = x + residual
        y, h = self.mlp_norm(self.attn(y), h)    # h = h + attention
        return self.mlp(y), h


class Llama(nn.Module):
    """A token embedding, ``layers`` blocks, a final RMSNorm (fusing the last block's add)
    and a head over the ``vocab`` tokens (the separator, token ``vocab``, is only read)."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, hidden: int, layers: int, *,
                 impl: str = "ge2jit", device=None):
        super().__init__()
        self.tok = nn.Embedding(vocab + 1, d, device=device)
        self.blocks = nn.ModuleList(Block(d, heads, hidden, seq, impl, device)
                                    for _ in range(layers))
        self.norm = rms_norm(d, impl, device)
        self.head = linear(d, vocab, impl, device)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x, residual = self.tok(idx), None
        for block in self.blocks:
            x, residual = block(x, residual)
        return self.head(self.norm(x, residual)[0])


def seeded(make, seed: int, device):
    """``make()`` with PyTorch's generators (the CPU's and ``device``'s) seeded, restored
    after: the layers' own initialization, reproducible."""
    with torch.random.fork_rng(devices=[device.index]):
        torch.manual_seed(seed)
        return make()


def cross_entropy_of(impl: str):
    """The loss: ge2jit's (no target check: the copy task's targets are in range, and the
    check's synchronization has no place in a captured step) or PyTorch's."""
    if impl == "torch":
        return F.cross_entropy
    return functools.partial(gt.cross_entropy, check_targets=False)


# --- training ------------------------------------------------------------------------------

@dataclass(kw_only=True)
class Result(common.TrainResult):
    impl: str


def check_llama_sizes(*, d: int, heads: int, hidden: int, layers: int) -> None:
    """Raises ValueError, naming the option, for sizes a LLaMA block cannot take (beyond
    ``check_sizes``)."""
    if heads >= 1 and d % heads == 0 and (d // heads) % 2:
        raise ValueError(f"d: d / heads ({d // heads}) must be even (rotary embeddings)")
    if hidden < 1 or layers < 1:
        raise ValueError(f"hidden, layers: expected at least 1, got {hidden}, {layers}")


# zero_grad(set_to_none=True), PyTorch's default, in every mode: each step's backward makes
# the gradients anew and they become the parameters' .grad, with no accumulation pass (and
# ge2jit's float32 weight gradients, written by the GEMMs, with no cast either). In a captured
# step they are made in the graph's memory pool, at the same addresses in every replay, as in
# PyTorch's whole-network capture; under reduce-overhead they live in the backward's graph
# pool, which the next step's replay overwrites.


def compiled(module: nn.Module, mode: str) -> nn.Module:
    """``module`` as the mode runs it: compiled (fullgraph) in "compile" and
    "reduce-overhead", as it is otherwise."""
    if mode not in ("compile", "reduce-overhead"):
        return module
    return torch.compile(module, fullgraph=True,
                         mode="reduce-overhead" if mode == "reduce-overhead" else None)


def train(*, steps: int = 300, batch: int = 32, seq: int = 64, vocab: int = 64, d: int = 256,
          heads: int = 4, hidden: int | None = None, layers: int = 2, lr: float = 1e-3,
          weight_decay: float = 0.01, dtype: str = "float32", mode: str = "eager",
          impl: str = "ge2jit", seed: int = 0, log_every: int = 10, eval_batch: int = 512,
          progress: bool = True) -> Result:
    """Train on the copy task (see the module's docstring) on the current CUDA device."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype: expected float32 or bfloat16, got {dtype!r}")
    hidden = llama_hidden(d) if hidden is None else hidden
    common.check_sizes(seq=seq, d=d, heads=heads, steps=steps, log_every=log_every)
    check_llama_sizes(d=d, heads=heads, hidden=hidden, layers=layers)
    config = dict(batch=batch, seq=seq, vocab=vocab, d=d, heads=heads, hidden=hidden,
                  layers=layers, lr=lr, weight_decay=weight_decay, seed=seed)
    device = torch.device("cuda", torch.cuda.current_device())
    amp = dtype == "bfloat16"
    model = seeded(lambda: Llama(vocab, seq, d, heads, hidden, layers, impl=impl,
                                 device=device), seed, device)
    forward = compiled(model, mode)
    cross_entropy = cross_entropy_of(impl)
    # capturable: AdamW keeps its step count on the GPU and reads it there (a graph replays
    # no Python, so no host-side count could advance)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay,
                            capturable=mode == "graph")

    def train_step(x, targets):
        """One step, all of it queued on the GPU (nothing here reads a value back): the
        gradients are made anew (see the note above ``compiled``), and the loss comes back as
        a tensor."""
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()   # the last step's outputs are done
        opt.zero_grad(set_to_none=True)   # see the note above compiled()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = common.copy_loss(forward(x), targets, cross_entropy)
        loss.backward()
        opt.step()
        return loss.detach()

    data = torch.Generator(device=device).manual_seed(seed)
    held_out = torch.Generator(device=device).manual_seed(seed + 2**31)
    losses, times = common.run_steps(
        train_step, lambda: common.copy_batch(data, batch, seq, vocab, device), steps=steps,
        graph=mode == "graph", log_every=log_every, desc=f"copy ({impl}, {mode}, {dtype})",
        progress=progress, device=device)
    eval_loss, accuracy = common.evaluate(
        model, *common.copy_batch(held_out, eval_batch, seq, vocab, device), amp, cross_entropy)
    return Result(mode=mode, dtype=dtype, impl=impl, steps=steps, final_loss=losses[-1],
                  accuracy=accuracy, eval_loss=eval_loss,
                  step_ms=common.median_of_last_half(times),
                  losses=losses, step_times_ms=times, config=config)


# --- the benchmark -------------------------------------------------------------------------

#: name -> (implementation, mode) of ``--bench``'s variants
VARIANTS = {
    "ge2jit eager": ("ge2jit", "eager"),
    "ge2jit graph": ("ge2jit", "graph"),
    "ge2jit compile": ("ge2jit", "compile"),
    "ge2jit compile reduce-overhead": ("ge2jit", "reduce-overhead"),
    "torch eager": ("torch", "eager"),
    "torch.compile": ("torch", "compile"),
    "torch.compile reduce-overhead": ("torch", "reduce-overhead"),
}
#: (numerator, denominator) of the ratios ``--bench`` prints
RATIOS = [("ge2jit graph", "torch eager"), ("ge2jit graph", "torch.compile"),
          ("ge2jit graph", "torch.compile reduce-overhead"), ("ge2jit eager", "torch eager"),
          ("ge2jit eager", "torch.compile"), ("ge2jit compile", "torch.compile"),
          ("ge2jit compile reduce-overhead", "torch.compile reduce-overhead"),
          ("ge2jit compile reduce-overhead", "torch.compile")]


def block_step(impl: str, mode: str, inputs: tuple, *, d: int, heads: int, hidden: int,
               seq: int, amp: bool, lr: float, warmup: int, seed: int, device):
    """A callable running one training step of a fresh block (``mode``: "eager", "graph",
    "compile" or "reduce-overhead"; its own AdamW, fused), warmed up ``warmup`` times (a
    graph: its capture's warm-up, then replays). ``inputs``: the previous block's MLP output,
    the residual stream and the upstream gradients of the block's two outputs."""
    block = seeded(lambda: Block(d, heads, hidden, seq, impl, device), seed, device)
    forward = compiled(block, mode)
    opt = torch.optim.AdamW(block.parameters(), lr=lr, fused=True, capturable=mode == "graph")

    def step(x, residual, dx, dresidual):
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)   # see the note above compiled()
        x, residual = x.detach().requires_grad_(), residual.detach().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = forward(x, residual)
        torch.autograd.backward(out, (dx, dresidual))   # the inputs' gradients made too
        opt.step()

    if mode == "graph":
        run = common.capture_step(step, *inputs, inputs=()).replay   # every array by reference
        warmup -= 1   # the capture's warm-up was one
    else:
        run = functools.partial(step, *inputs)
    for _ in range(warmup):
        run()
    return run


def time_in_turns(runs: dict, rounds: int, steps: int) -> dict:
    """name -> the time per step (ms) of ``runs[name]()`` in each round: every round runs
    each callable ``steps`` times between two CUDA events, from an idle GPU, in an order
    rotated by one from round to round."""
    names = list(runs)
    times = {name: [] for name in names}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            torch.cuda.synchronize()
            start.record()
            for _ in range(steps):
                runs[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / steps)
    return times


def commit() -> str | None:
    """``$GE2JIT_COMMIT``, else this checkout's ``git rev-parse --short HEAD``, else None."""
    if os.environ.get("GE2JIT_COMMIT"):
        return os.environ["GE2JIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=30, cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def bench(*, batch: int = 4, seq: int = 1024, d: int = 4096, heads: int = 32,
          hidden: int | None = None, dtype: str = "bfloat16", rounds: int = 10,
          round_steps: int = 5, warmup: int = 3, lr: float = 1e-3, seed: int = 0,
          variants=tuple(VARIANTS)) -> dict:
    """Time one block's training step, every variant in turns (see the module's docstring);
    returns what ``--json`` writes."""
    hidden = llama_hidden(d) if hidden is None else hidden
    common.check_sizes(seq=seq, d=d, heads=heads, steps=1, log_every=1)
    check_llama_sizes(d=d, heads=heads, hidden=hidden, layers=1)
    if rounds < 1 or round_steps < 1 or warmup < 1:
        raise ValueError(f"rounds, round_steps, warmup: expected at least 1, got {rounds}, "
                         f"{round_steps}, {warmup}")
    device = torch.device("cuda", torch.cuda.current_device())
    amp = dtype == "bfloat16"
    g = torch.Generator(device=device).manual_seed(seed)
    act = torch.bfloat16 if amp else torch.float32   # the MLP output's type: the Linears'

    def randn(dt, scale=1.0):
        return torch.randn((batch, seq, d), generator=g, device=device, dtype=dt) * scale

    # the previous block's MLP output, the residual stream (float32, as the embedding's) and
    # the upstream gradients of this block's outputs
    inputs = (randn(act), randn(torch.float32), randn(act, 1e-3), randn(torch.float32, 1e-3))
    runs, peaks = {}, {}
    for name in variants:
        impl, mode = VARIANTS[name]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        runs[name] = block_step(impl, mode, inputs, d=d, heads=heads, hidden=hidden, seq=seq,
                                amp=amp, lr=lr, warmup=warmup, seed=seed, device=device)
        torch.cuda.synchronize()
        peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = time_in_turns(runs, rounds, round_steps)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "device": torch.cuda.get_device_name(device),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "torch": torch.__version__,
        "config": dict(batch=batch, seq=seq, tokens=batch * seq, d=d, heads=heads,
                       hidden=hidden, dtype=dtype, rounds=rounds, round_steps=round_steps,
                       warmup=warmup, lr=lr, seed=seed),
        "variants": {name: {"median_ms": medians[name], "min_ms": min(times[name]),
                            "peak_mib": peaks[name], "times_ms": times[name]}
                     for name in variants},
        "ratios": {f"{a} / {b}": medians[a] / medians[b] for a, b in RATIOS
                   if a in medians and b in medians},
    }


def print_bench(result: dict) -> None:
    c = result["config"]
    print(f"one LLaMA block's training step (forward, backward, AdamW), {c['dtype']}"
          f"{' autocast' if c['dtype'] == 'bfloat16' else ''}, {c['batch']} x {c['seq']} "
          f"tokens, d {c['d']}, {c['heads']} heads, hidden {c['hidden']}; "
          f"{result['device']}")
    print(f"{'variant':<32}{'median ms':>11}{'min ms':>10}{'peak MiB':>11}")
    for name, v in result["variants"].items():
        print(f"{name:<32}{v['median_ms']:>11.3f}{v['min_ms']:>10.3f}{v['peak_mib']:>11.0f}")
    for name, ratio in result["ratios"].items():
        print(f"{name + ':':<55}{ratio:>6.3f}")


# --- the command line ----------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_training_arguments(parser, dtype=None, **dict.fromkeys(TRAIN_SIZES))
    parser.add_argument("--impl", choices=IMPLS,
                        help="ge2jit's layers (default) or the same model on PyTorch's")
    parser.add_argument("--compile-mode", choices=["default", "reduce-overhead"],
                        help="with --compile: torch.compile's mode (default: default)")
    parser.add_argument("--hidden", type=int,
                        help="the MLP's width (default: 8d/3 rounded up to a multiple of 256)")
    bench_args = parser.add_argument_group("--bench", "time one block's training step")
    bench_args.add_argument("--bench", action="store_true",
                            help="time ge2jit eager and graph-captured, PyTorch eager and "
                                 "compiled, in turns (sizes default to LLaMA-7B's block)")
    bench_args.add_argument("--rounds", type=int, default=10)
    bench_args.add_argument("--round-steps", type=int, default=5,
                            help="steps of a variant between two CUDA events")
    bench_args.add_argument("--warmup", type=int, default=3, help="steps before the timing")
    args = parser.parse_args(argv)
    if args.bench and (args.compile or args.graph or args.impl or args.compile_mode):
        parser.error("--bench times every implementation and mode itself: leave out --impl, "
                     "--compile, --compile-mode and --graph")
    if args.compile_mode and not args.compile:
        parser.error("--compile-mode goes with --compile")
    for name, value in (BENCH_SIZES if args.bench else TRAIN_SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.dtype = args.dtype or ("bfloat16" if args.bench else "float32")
    args.hidden = llama_hidden(args.d) if args.hidden is None else args.hidden
    try:
        common.check_sizes(seq=args.seq, d=args.d, heads=args.heads, steps=args.steps,
                    log_every=args.log_every)
        check_llama_sizes(d=args.d, heads=args.heads, hidden=args.hidden, layers=args.layers)
        if min(args.rounds, args.round_steps, args.warmup) < 1:
            raise ValueError("rounds, round-steps, warmup: expected at least 1")
    except ValueError as e:
        parser.error(str(e))
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    if args.bench:
        result = bench(batch=args.batch, seq=args.seq, d=args.d, heads=args.heads,
                       hidden=args.hidden, dtype=args.dtype, rounds=args.rounds,
                       round_steps=args.round_steps, warmup=args.warmup, lr=args.lr,
                       seed=args.seed)
        print_bench(result)
        if args.json:
            common.write_json(args.json, result)
        return 0
    mode = ("graph" if args.graph else "eager" if not args.compile
            else "reduce-overhead" if args.compile_mode == "reduce-overhead" else "compile")
    result = train(steps=args.steps, batch=args.batch, seq=args.seq, vocab=args.vocab,
                   d=args.d, heads=args.heads, hidden=args.hidden, layers=args.layers,
                   lr=args.lr, dtype=args.dtype, mode=mode, impl=args.impl or "ge2jit",
                   seed=args.seed, log_every=args.log_every)
    common.report(result, args.json)
    return 0


if __name__ == "__main__":
    with script_errors(SCRIPT):   # setup problems met later (a GE2JIT_* variable): one line
        raise SystemExit(main())
