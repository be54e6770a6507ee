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
    torchrun --nproc-per-node N examples/train_llama_block.py [--fsdp [--param-dtype bfloat16]]
                                         [--reduce-dtype float32|bfloat16] [--comm-sms K]
                                         [--compile] [...]
    torchrun --nproc-per-node N examples/train_llama_block.py --bench-dp ddp|fsdp
                                         [--reduce-dtype bfloat16|float32]
                                         [--param-dtype float32|bfloat16] [--comm-sms K]
                                         [--batch 4] [...]
    python examples/train_llama_block.py --bench-dp none [...]

Without a GPU (or without PyTorch) it says so in one line and exits with status 2.

The model: a token embedding, ``--layers`` LLaMA blocks, a final RMSNorm and a head (no bias).
A block is ``x -> RMSNorm -> attention -> residual add -> RMSNorm -> SwiGLU MLP -> residual
add``: the attention's q, k, v and o projections are ``ge2jit.torch.Linear(d, d, bias=False)``,
q and k get rotary position embeddings (plain PyTorch; there is no other position information),
the attention itself is ``ge2jit.torch.scaled_dot_product_attention(is_causal=True)`` on 16-bit
tensors (PyTorch's on float32 ones and with ``--impl torch``); the MLP is
``ge2jit.torch.GatedMLP(d, hidden, act="silu", bias=False)``, ``down(silu(x @ W_gate.T) * (x @
W_up.T))``; the norms are ``ge2jit.torch.RMSNorm(d, eps=1e-6)``. Every residual add is fused
into the RMSNorm that follows it (``norm(x, residual)`` returns ``(rms_norm(x + residual), x +
residual)``): the block's second norm takes the attention's output and the residual stream, and
a block hands its MLP's output and the stream to the next block's first norm (the final norm
after the last block). The loss is ``ge2jit.torch.cross_entropy``, the head a
``ge2jit.torch.Linear``. ``--hidden`` defaults to LLaMA's width, 8d/3 rounded up to a multiple
of 256 (11008 at d = 4096).

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
the last half of the steps (CUDA events around each step); ``--json PATH`` writes them, with
every step's training loss.

Data parallel: under ``torchrun --nproc-per-node N`` (``WORLD_SIZE`` > 1; or ``mpirun``,
``srun``: ``ge2jit.distributed.process_info()`` reads them all) each process takes the GPU of
its local rank, joins the NCCL process group and trains on its contiguous shard of each batch
(``--batch`` is the global batch: the world size must divide it; every rank draws the whole
batch from the same generator and keeps its rows), as ``train_gpt_block.py`` does. The loss
logged each step is the mean of the ranks' losses (an all-reduce): each shard's loss is a mean
over its rows, so it is the whole batch's, and the run follows one GPU's on the whole batch
within float rounding. The progress bar and the results are rank 0's; the process group is
destroyed at the end. The wrapper:

- DDP (default): ``DistributedDataParallel(device_ids=[local rank],
  gradient_as_bucket_view=True)`` (the gradients are views of its all-reduce buckets: no second
  copy of them), without the per-step broadcast of the buffers (the rotary tables, computed
  alike on every rank and synchronized once when DDP is built);
- ``--fsdp``: FSDP2, ``fully_shard`` on each block's attention and MLP, then on each block
  (its two norms), then on the whole model (the embedding, the last norm, the head): each
  rank keeps 1/N of every parameter, its gradient and AdamW's state, and a unit's parameters
  are all-gathered before its forward and its backward and its gradients reduce-scattered
  after its backward, on streams of their own, so that one unit's communication runs under
  another's compute. With one process ``--fsdp`` still shards, over a group of one (a free
  local port when no launcher gave a rendezvous): the same code path on one GPU.

The parameters stay float32 in both, and ``--dtype bfloat16`` runs the forward under autocast
as on one GPU: ge2jit's layers cast their float32 master weights themselves and make float32
weight gradients from their accumulators, so the losses compare with one GPU's. FSDP2's own
mixed precision, ``--param-dtype bfloat16`` (``MixedPrecisionPolicy(param_dtype=bfloat16)``,
``--fsdp`` and ``--dtype bfloat16`` only), gathers bfloat16 copies of the parameters instead
(half the all-gather's bytes) and casts each unit's floating inputs to bfloat16: the
embedding's output and so the residual stream become bfloat16, the norms' weights too, and
the weight gradients are rounded to bfloat16 before the reduction: another computation than
one GPU's, close to it, not equal. ``--reduce-dtype bfloat16`` (default float32) sends the gradients
across as bfloat16: DDP through ``bf16_compress_hook`` (each bucket cast to bfloat16,
all-reduced, divided, and copied back into the float32 bucket), FSDP2 through
``MixedPrecisionPolicy(reduce_dtype=bfloat16)`` (reduce-scattered in bfloat16, the shard
cast back to float32); half the bytes, each gradient rounded to bfloat16 once.

``--compile`` compiles the wrapped model without ``fullgraph``: under DDP Dynamo splits the
graph at DDP's buckets (its DDPOptimizer), on purpose; under FSDP2 the model is compiled after
``fully_shard`` and FSDP2's hooks (all-gathers, reduce-scatters) run eagerly between the
compiled regions (Dynamo breaks the graph at each unit's hooks, which are kept from it).
``--graph`` and ``--compile-mode reduce-overhead`` are refused with more than one process or
``--fsdp``: a CUDA graph (ours or torch.compile's) does not capture DDP's all-reduces, queued
from autograd hooks, nor FSDP2's collectives.

``--comm-sms K`` (with more than one process; default 0) sizes ge2jit's kernels' grids for K
SMs fewer than the GPU has (``ge2jit.set_num_sms``) and caps NCCL at K blocks
(``NCCL_MAX_CTAS``): a persistent GEMM (one block an SM for its whole run) otherwise holds
every SM, and the all-reduce or reduce-scatter queued under it on NCCL's stream waits for it.
``--tile-grids`` runs ge2jit's GEMMs with a block per tile instead (``ge2jit.set_persistent
(False)``), so that NCCL's blocks get SMs as tiles finish, and ``--nccl-high-priority`` puts
NCCL's streams at high priority (``ProcessGroupNCCL.Options(is_high_priority_stream=True)``),
so that its blocks go first.

``--bench`` times one block's training step at LLaMA-7B's sizes (by default 4 x 1024 tokens,
d = 4096, 32 heads, hidden 11008, bfloat16 autocast over float32 parameters): the block's
forward from the previous block's MLP output and the residual stream (its first norm fusing
that add) to its own MLP output and stream, the backward from fixed upstream gradients of
both (dX of the inputs included), and AdamW's step (``fused=True``) on its parameters. Eight
variants, each with its own block and optimizer: ge2jit eager, ge2jit with the step captured
as a CUDA graph (replayed), the ge2jit block under ``torch.compile`` (default mode and
"reduce-overhead"; its ops trace as custom ops, and Inductor fuses the PyTorch code around
them: the rotary embedding, the casts), PyTorch eager, ``torch.compile`` (default mode),
``torch.compile(mode="reduce-overhead")`` of the PyTorch block, and the PyTorch block's
eager step captured with ``torch.cuda.graph`` the same way as ge2jit's (the peer of a
captured step). After ``--warmup`` steps of
each (compilation, capture), they are timed in turns: ``--rounds`` rounds, in each of which
every variant (in an order rotated from round to round) runs ``--round-steps`` steps between
two CUDA events after the GPU has gone idle; a variant's time is the median over the rounds
of its time per step. Its peak memory is the most memory allocated from its construction
through its warm-up (parameters, gradients, AdamW's state, activations, graph pools), beyond
what was allocated before (the shared inputs). It prints a table and the ratios of ge2jit's
times to PyTorch's in the same mode; ``--json PATH`` writes them with the device's name, the
date and the commit (``$GE2JIT_COMMIT``, else ``git rev-parse --short HEAD``). It takes one
process.

``--bench-dp ddp|fsdp|none`` times one variant alone across the launcher's processes (at
LLaMA-7B's block sizes by default, ``--batch`` x ``--seq`` tokens per GPU): ge2jit's block
eager (``--impl torch``: PyTorch's), its step as above, wrapped in DDP (as in training;
``--reduce-dtype`` bfloat16 by default: the gradients cross as bfloat16) or FSDP2 (the
attention and the MLP, then the block; ``--reduce-dtype`` bfloat16 by default,
``--param-dtype`` float32 by default), or as it is (``none``: one process, the single-GPU
baseline). Each rank draws its own inputs. After ``--warmup`` steps it times ``--rounds``
rounds of ``--round-steps`` steps between two CUDA events, each round started by a barrier on
idle GPUs; a round's time is the slowest rank's (an all-reduce of the maximum), the step time
the median over the rounds. It reports the step time, tokens/s (world size x tokens per GPU /
step time) and the peak memory per GPU (the most allocated from the first step on, the
parameters, gradients and AdamW's state included, beyond the inputs; the largest over the
ranks); rank 0 writes ``--json`` with the device, the date, the commit, the configuration,
the world size and the mode. ``bench/bench_llama_distributed.py`` runs it at each world size.
One block has nothing before its forward nor after its backward to hide communication under:
FSDP2's first all-gather and the last gradients' reduction are exposed, as they would be once
per step, not once per block, in a whole model.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass

from ge2jit._deps import script_errors

SCRIPT = "train_llama_block.py"

with script_errors(SCRIPT, "PyTorch, ge2jit.torch and a CUDA GPU",
                   as_script=__name__ == "__main__"):
    import torch
    import torch.distributed
    import torch.nn.functional as F
    from torch import nn

    import ge2jit.torch as gt

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # examples/_common.py
    import _common as common

IMPLS = ("ge2jit", "torch")
MODES = ("eager", "compile", "reduce-overhead", "graph")
DTYPES = ("float32", "bfloat16")
#: the data-parallel wrappers of a training run, and ``--bench-dp``'s modes
WRAPPERS = ("ddp", "fsdp")
BENCH_DP_MODES = ("none", *WRAPPERS)
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
        self.heads, self.impl = heads, impl
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
        y = attend(self.impl, q, k, split(self.v))
        return self.o(y.transpose(1, 2).reshape(b, t, d))


def attend(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of (batch, heads, t, head_dim) tensors: ge2jit's kernels for 16-bit
    tensors (under autocast, say), PyTorch's for float32 and for ``--impl torch``."""
    if impl != "torch" and q.dtype in (torch.float16, torch.bfloat16):
        return gt.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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


def compiled(module: nn.Module, mode: str, fullgraph: bool = True) -> nn.Module:
    """``module`` as the mode runs it: compiled in "compile" and "reduce-overhead" (one graph
    with ``fullgraph``; a DDP or FSDP2 model takes none, see the module's docstring), as it is
    otherwise."""
    if mode not in ("compile", "reduce-overhead"):
        return module
    return torch.compile(module, fullgraph=fullgraph,
                         mode="reduce-overhead" if mode == "reduce-overhead" else None)


# --- data parallel -------------------------------------------------------------------------

def check_distributed(*, mode: str, batch: int, world_size: int, wrapper: str = "ddp") -> None:
    """Raises ValueError, naming the option, for what a data-parallel run cannot take
    (``wrapper`` "fsdp" is one even with one process)."""
    if wrapper not in WRAPPERS:
        raise ValueError(f"wrapper: expected one of {', '.join(WRAPPERS)}, got {wrapper!r}")
    if (world_size > 1 or wrapper == "fsdp") and mode in ("graph", "reduce-overhead"):
        where = f"{world_size} processes" if world_size > 1 else "FSDP2"
        raise ValueError(f"mode: expected eager or compile with {where} (a CUDA graph, ours "
                         "or torch.compile's, captures neither DDP's all-reduces nor "
                         f"FSDP2's collectives), got {mode!r}")
    if batch < 1 or batch % world_size:
        raise ValueError(f"batch: expected a positive multiple of the number of processes "
                         f"({world_size}), got {batch}")


def check_data_parallel(*, wrapper: str | None, dtype: str, reduce_dtype: str,
                        param_dtype: str) -> None:
    """Raises ValueError, naming the option, for types the wrapper cannot take: ``wrapper``
    "ddp", "fsdp", or None where no gradient is reduced (one process without FSDP2)."""
    for name, value in (("dtype", dtype), ("reduce_dtype", reduce_dtype),
                        ("param_dtype", param_dtype)):
        if value not in DTYPES:
            raise ValueError(f"{name}: expected float32 or bfloat16, got {value!r}")
    if wrapper is None and reduce_dtype != "float32":
        raise ValueError(f"reduce_dtype: expected float32 where no gradient is reduced (one "
                         f"process without FSDP2), got {reduce_dtype!r}")
    if param_dtype != "float32" and wrapper != "fsdp":
        raise ValueError(f"param_dtype: expected float32 without FSDP2 (only fully_shard "
                         f"gathers the parameters in another type), got {param_dtype!r}")
    if param_dtype != "float32" and dtype != "bfloat16":
        raise ValueError(f"param_dtype: expected float32 with dtype {dtype} (bfloat16 "
                         f"parameters go with bfloat16 autocast), got {param_dtype!r}")


def fsdp_units(module: nn.Module) -> list:
    """The submodules ``data_parallel`` shards as units of their own, children first (as
    ``fully_shard`` must be applied): each block's attention and MLP, then the block (its
    norms' weights), for a ``Llama`` or a ``Block``; the module itself comes last. A unit's
    parameters are gathered just before it runs and freed after, so the attention's and the
    MLP's gathering and reduction overlap the other's compute."""
    if isinstance(module, Block):
        return [module.attn, module.mlp]
    return [unit for block in module.blocks for unit in (block.attn, block.mlp, block)]


def data_parallel(module: nn.Module, wrapper: str, *, device, reduce_dtype: str = "float32",
                  param_dtype: str = "float32") -> nn.Module:
    """``module`` data-parallel over the default process group (initialized), on
    ``device``: "ddp" returns it wrapped in DistributedDataParallel; "fsdp" shards it in
    place with FSDP2's ``fully_shard`` (``fsdp_units``, then the module) and returns it. The
    types: see the module's docstring (``reduce_dtype`` "bfloat16": the gradients cross as
    bfloat16; ``param_dtype`` "bfloat16", FSDP2 only: the parameters gathered as bfloat16).
    Build the optimizer after: FSDP2 replaces the parameters by their shards."""
    if wrapper == "ddp":
        net = nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True)
        # the buffers are the rotary tables, computed alike on every rank (and synchronized
        # once when DDP is built): no broadcast of them before every forward
        net.broadcast_buffers = False
        if reduce_dtype == "bfloat16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            net.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return net
    if wrapper != "fsdp":
        raise ValueError(f"wrapper: expected one of {', '.join(WRAPPERS)}, got {wrapper!r}")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    # param_dtype None: the parameters gathered as they are (float32), autocast as on one GPU;
    # the reduction's type always named (None would follow param_dtype)
    policy = MixedPrecisionPolicy(
        param_dtype=None if param_dtype == "float32" else dtypes[param_dtype],
        reduce_dtype=dtypes[reduce_dtype])
    # FSDP2 warns when a unit returns a view (Linear and GatedMLP return their GEMM's output
    # reshaped): an in-place op on it would lose its pre-backward hook. Nothing here writes
    # in place on a unit's output.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view")
    for unit in fsdp_units(module):
        fully_shard(unit, mp_policy=policy)
    fully_shard(module, mp_policy=policy)
    return module


def join_process_group(info, device, high_priority: bool = False) -> None:
    """Joins the NCCL process group of ``info`` (``ge2jit.distributed.ProcessInfo``) on
    ``device``: the launcher's rendezvous (``MASTER_ADDR``, ``MASTER_PORT``: torchrun's, or
    the defaults of ``process_info`` where an MPI or Slurm launcher set none), or, for one
    process without a launcher, a free port of this host."""
    if info.launcher == "none":
        from ge2jit.distributed import free_port

        init_method = f"tcp://127.0.0.1:{free_port()}"
    else:
        os.environ.setdefault("MASTER_ADDR", info.master_addr)
        os.environ.setdefault("MASTER_PORT", str(info.master_port))
        init_method = None   # env://, torchrun's store included
    options = None
    if high_priority:   # NCCL's kernels then get SMs before the backward's as blocks free
        options = torch.distributed.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    torch.distributed.init_process_group("nccl", init_method=init_method, rank=info.rank,
                                         world_size=info.world_size, device_id=device,
                                         pg_options=options)


def train(*, steps: int = 300, batch: int = 32, seq: int = 64, vocab: int = 64, d: int = 256,
          heads: int = 4, hidden: int | None = None, layers: int = 2, lr: float = 1e-3,
          weight_decay: float = 0.01, dtype: str = "float32", mode: str = "eager",
          impl: str = "ge2jit", seed: int = 0, log_every: int = 10, eval_batch: int = 512,
          progress: bool = True, rank: int = 0, world_size: int = 1, wrapper: str = "ddp",
          reduce_dtype: str = "float32", param_dtype: str = "float32") -> Result:
    """Train on the copy task (see the module's docstring) on the current CUDA device. With
    ``world_size`` > 1, this is rank ``rank`` of a data-parallel run over its shard of each
    ``batch``, the losses the whole batch's: ``wrapper`` "ddp" or "fsdp" (FSDP2, which
    shards with one process too), with ``reduce_dtype`` and ``param_dtype`` as the module's
    docstring says. Either wrapper needs the NCCL process group initialized (``main`` joins
    it: ``join_process_group``)."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
    hidden = llama_hidden(d) if hidden is None else hidden
    common.check_sizes(seq=seq, d=d, heads=heads, steps=steps, log_every=log_every)
    check_llama_sizes(d=d, heads=heads, hidden=hidden, layers=layers)
    check_distributed(mode=mode, batch=batch, world_size=world_size, wrapper=wrapper)
    # the wrapper in use: none for one process without FSDP2
    wrapper = wrapper if wrapper == "fsdp" or world_size > 1 else None
    check_data_parallel(wrapper=wrapper, dtype=dtype, reduce_dtype=reduce_dtype,
                        param_dtype=param_dtype)
    config = dict(batch=batch, seq=seq, vocab=vocab, d=d, heads=heads, hidden=hidden,
                  layers=layers, lr=lr, weight_decay=weight_decay, seed=seed,
                  world_size=world_size, wrapper=wrapper, reduce_dtype=reduce_dtype,
                  param_dtype=param_dtype)
    device = torch.device("cuda", torch.cuda.current_device())
    amp = dtype == "bfloat16"
    # every rank the same initial weights (the same seed; DDP broadcasts rank 0's anyway,
    # FSDP2 keeps each rank's shard of its own)
    model = seeded(lambda: Llama(vocab, seq, d, heads, hidden, layers, impl=impl,
                                 device=device), seed, device)
    net = model
    if wrapper is not None:   # the device is this rank's (main set it from the local rank)
        net = data_parallel(model, wrapper, device=device, reduce_dtype=reduce_dtype,
                            param_dtype=param_dtype)
    forward = compiled(net, mode, fullgraph=wrapper is None)
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
        x, targets = common.copy_batch(data, batch, seq, vocab, device)
        return x[rows], targets[rows]

    what = f"{impl}, {mode}, {dtype}"
    if wrapper is not None:
        what += f", {world_size} GPU{'s' if world_size > 1 else ''}, {wrapper.upper()}"
    losses, times = common.run_steps(
        train_step, next_batch, steps=steps, graph=mode == "graph", log_every=log_every,
        desc=f"copy ({what})", progress=progress, device=device)
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
    "torch graph": ("torch", "graph"),
}
#: (numerator, denominator) of the ratios ``--bench`` prints: like with like (eager with
#: eager, compiled with compiled, a captured step with PyTorch's captured the same way)
RATIOS = [("ge2jit eager", "torch eager"), ("ge2jit compile", "torch.compile"),
          ("ge2jit compile reduce-overhead", "torch.compile reduce-overhead"),
          ("ge2jit graph", "torch graph"), ("ge2jit graph", "torch.compile reduce-overhead")]


def block_step(impl: str, mode: str, inputs: tuple, *, d: int, heads: int, hidden: int,
               seq: int, amp: bool, lr: float, warmup: int, seed: int, device, wrap=None):
    """A callable running one training step of a fresh block (``mode``: "eager", "graph",
    "compile" or "reduce-overhead"; its own AdamW, fused), warmed up ``warmup`` times (a
    graph: its capture's warm-up, then replays). ``inputs``: the previous block's MLP output,
    the residual stream and the upstream gradients of the block's two outputs. ``wrap``:
    None, or a function of the block that returns the module to run (a data-parallel
    wrapper), called before the optimizer is made."""
    block = seeded(lambda: Block(d, heads, hidden, seq, impl, device), seed, device)
    forward = compiled(block if wrap is None else wrap(block), mode)
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


def bench_data_parallel(*, mode: str = "ddp", impl: str = "ge2jit", batch: int = 4,
                        seq: int = 1024, d: int = 4096, heads: int = 32,
                        hidden: int | None = None, dtype: str = "bfloat16",
                        reduce_dtype: str | None = None, param_dtype: str = "float32",
                        rounds: int = 10, round_steps: int = 5, warmup: int = 3,
                        lr: float = 1e-3, seed: int = 0, rank: int = 0,
                        world_size: int = 1) -> dict:
    """Time one block's eager training step on this rank's GPU, ``batch`` x ``seq`` tokens
    per GPU, the block wrapped by DDP or FSDP2 (``mode`` "ddp", "fsdp"; the process group
    initialized) or as it is ("none", one process); every rank calls it, and each returns
    what ``--json`` writes (see the module's docstring). ``reduce_dtype``: default bfloat16
    where gradients are reduced, float32 otherwise."""
    if mode not in BENCH_DP_MODES:
        raise ValueError(f"mode: expected one of {', '.join(BENCH_DP_MODES)}, got {mode!r}")
    if mode == "none" and world_size > 1:
        raise ValueError(f"mode: expected ddp or fsdp with {world_size} processes, got 'none'")
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
    wrapper = None if mode == "none" else mode
    reduce_dtype = reduce_dtype or ("float32" if wrapper is None else "bfloat16")
    check_data_parallel(wrapper=wrapper, dtype=dtype, reduce_dtype=reduce_dtype,
                        param_dtype=param_dtype)
    hidden = llama_hidden(d) if hidden is None else hidden
    common.check_sizes(seq=seq, d=d, heads=heads, steps=1, log_every=1)
    check_llama_sizes(d=d, heads=heads, hidden=hidden, layers=1)
    if batch < 1 or rounds < 1 or round_steps < 1 or warmup < 1:
        raise ValueError(f"batch, rounds, round_steps, warmup: expected at least 1, got "
                         f"{batch}, {rounds}, {round_steps}, {warmup}")
    device = torch.device("cuda", torch.cuda.current_device())
    amp = dtype == "bfloat16"
    g = torch.Generator(device=device).manual_seed(seed + 1 + rank)   # each rank its batch
    act = torch.bfloat16 if amp else torch.float32

    def randn(dt, scale=1.0):
        return torch.randn((batch, seq, d), generator=g, device=device, dtype=dt) * scale

    # as in bench(): the previous block's MLP output, the residual stream, the upstream
    # gradients of this block's outputs
    inputs = (randn(act), randn(torch.float32), randn(act, 1e-3), randn(torch.float32, 1e-3))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()

    def wrap(block):
        return data_parallel(block, wrapper, device=device, reduce_dtype=reduce_dtype,
                             param_dtype=param_dtype)

    run = block_step(impl, "eager", inputs, d=d, heads=heads, hidden=hidden, seq=seq, amp=amp,
                     lr=lr, warmup=0, seed=seed, device=device,
                     wrap=None if wrapper is None else wrap)
    # the peak from here: FSDP2's shards, not the whole block it was built as
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        run()
    grouped = torch.distributed.is_initialized()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        if grouped:   # the ranks start the round together, from idle GPUs
            torch.distributed.barrier(device_ids=[device.index])
            torch.cuda.synchronize()
        start.record()
        for _ in range(round_steps):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / round_steps)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    peak = torch.tensor([(torch.cuda.max_memory_allocated() - base) / 2**20],
                        dtype=torch.float64, device=device)
    if grouped:   # a round takes as long as its slowest rank; the largest peak of any rank
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    times = slowest.tolist()
    step_ms = statistics.median(times)
    return {
        "device": torch.cuda.get_device_name(device),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "torch": torch.__version__,
        "world": world_size,
        "mode": mode,
        "impl": impl,
        "config": dict(batch=batch, seq=seq, tokens_per_gpu=batch * seq, d=d, heads=heads,
                       hidden=hidden, dtype=dtype, reduce_dtype=reduce_dtype,
                       param_dtype=param_dtype, rounds=rounds, round_steps=round_steps,
                       warmup=warmup, lr=lr, seed=seed),
        "step_ms": step_ms,
        "min_ms": min(times),
        "tokens_per_s": world_size * batch * seq / (step_ms * 1e-3),
        "peak_mib": float(peak[0]),
        "times_ms": times,
    }


def print_bench_data_parallel(result: dict) -> None:
    c = result["config"]
    how = {"none": "as it is", "ddp": "DDP", "fsdp": "FSDP2"}[result["mode"]]
    types = ""
    if result["mode"] != "none":
        types = f", gradients reduced in {c['reduce_dtype']}"
        if result["mode"] == "fsdp":
            types += f", parameters gathered in {c['param_dtype']}"
    print(f"one LLaMA block's training step ({result['impl']} eager, {how}{types}), "
          f"{c['dtype']}{' autocast' if c['dtype'] == 'bfloat16' else ''}, {c['batch']} x "
          f"{c['seq']} tokens per GPU, d {c['d']}, {c['heads']} heads, hidden {c['hidden']}; "
          f"{result['world']} x {result['device']}")
    print(f"step {result['step_ms']:.3f} ms (median; min {result['min_ms']:.3f}), "
          f"{result['tokens_per_s']:.0f} tokens/s, peak {result['peak_mib']:.0f} MiB per GPU")


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
    parser = argparse.ArgumentParser(prog=SCRIPT, description=__doc__.split("\n")[0])
    common.add_training_arguments(parser, dtype=None, **dict.fromkeys(TRAIN_SIZES))
    parser.add_argument("--impl", choices=IMPLS,
                        help="ge2jit's layers (default) or the same model on PyTorch's")
    parser.add_argument("--compile-mode", choices=["default", "reduce-overhead"],
                        help="with --compile: torch.compile's mode (default: default)")
    parser.add_argument("--hidden", type=int,
                        help="the MLP's width (default: 8d/3 rounded up to a multiple of 256)")
    dp_args = parser.add_argument_group(
        "data parallel", "under torchrun (or mpirun, srun): one process a GPU, DDP by default")
    dp_args.add_argument("--fsdp", action="store_true",
                         help="FSDP2 (fully_shard) instead of DDP; with one process too")
    dp_args.add_argument("--reduce-dtype", choices=DTYPES,
                         help="the gradients' type across the processes (default float32; "
                              "with --bench-dp ddp|fsdp bfloat16)")
    dp_args.add_argument("--param-dtype", choices=DTYPES,
                         help="FSDP2 with --dtype bfloat16: the type the parameters are "
                              "gathered in (default float32: autocast over them, as on one "
                              "GPU)")
    dp_args.add_argument("--comm-sms", type=int, default=0, metavar="K",
                         help="with more than one process: ge2jit's kernels sized for K SMs "
                              "fewer than the GPU has, NCCL capped at K blocks (default 0)")
    dp_args.add_argument("--tile-grids", action="store_true",
                         help="with more than one process: ge2jit's GEMMs run a block per "
                              "tile, not one per SM (ge2jit.set_persistent(False))")
    dp_args.add_argument("--nccl-high-priority", action="store_true",
                         help="with more than one process: NCCL's streams at high priority "
                              "(ProcessGroupNCCL's is_high_priority_stream)")
    bench_args = parser.add_argument_group("--bench", "time one block's training step")
    bench_args.add_argument("--bench", action="store_true",
                            help="time ge2jit eager and graph-captured, PyTorch eager and "
                                 "compiled, in turns (sizes default to LLaMA-7B's block)")
    bench_args.add_argument("--bench-dp", choices=BENCH_DP_MODES,
                            help="time the block's eager step alone, wrapped in DDP or FSDP2 "
                                 "across the launcher's processes (none: as it is, one "
                                 "process); --batch is per GPU")
    bench_args.add_argument("--rounds", type=int, default=10)
    bench_args.add_argument("--round-steps", type=int, default=5,
                            help="steps of a variant between two CUDA events")
    bench_args.add_argument("--warmup", type=int, default=3, help="steps before the timing")
    args = parser.parse_args(argv)
    benching = args.bench or args.bench_dp is not None
    if args.bench and args.bench_dp:
        parser.error("--bench-dp is a benchmark of its own: leave out --bench")
    if args.bench and (args.compile or args.graph or args.impl or args.compile_mode):
        parser.error("--bench times every implementation and mode itself: leave out --impl, "
                     "--compile, --compile-mode and --graph")
    if args.bench and (args.reduce_dtype or args.param_dtype):
        parser.error("--bench times one process: leave out --reduce-dtype and --param-dtype "
                     "(--bench-dp takes them)")
    if args.bench_dp and (args.compile or args.graph or args.compile_mode):
        parser.error("--bench-dp times the eager step: leave out --compile, --compile-mode "
                     "and --graph")
    if benching and args.fsdp:
        parser.error("--fsdp goes with training: --bench-dp fsdp times FSDP2")
    if args.compile_mode and not args.compile:
        parser.error("--compile-mode goes with --compile")
    for name, value in (BENCH_SIZES if benching else TRAIN_SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.dtype = args.dtype or ("bfloat16" if benching else "float32")
    args.hidden = llama_hidden(args.d) if args.hidden is None else args.hidden
    args.param_dtype = args.param_dtype or "float32"
    from ge2jit import ArgumentValueError
    from ge2jit.distributed import process_info

    try:
        info = process_info()   # the launcher's rank, world size, local rank (none: one)
    except ArgumentValueError as e:
        print(f"{SCRIPT}: {e}", file=sys.stderr)
        return 2
    world = info.world_size
    mode = ("graph" if args.graph else "eager" if not args.compile
            else "reduce-overhead" if args.compile_mode == "reduce-overhead" else "compile")
    wrapper = "fsdp" if args.fsdp else "ddp"
    used = None   # the wrapper in use: none for one process without FSDP2 (or for --bench)
    try:
        common.check_sizes(seq=args.seq, d=args.d, heads=args.heads, steps=args.steps,
                           log_every=args.log_every)
        check_llama_sizes(d=args.d, heads=args.heads, hidden=args.hidden, layers=args.layers)
        if min(args.rounds, args.round_steps, args.warmup) < 1:
            raise ValueError("rounds, round-steps, warmup: expected at least 1")
        if args.comm_sms < 0:
            raise ValueError(f"--comm-sms: expected at least 0, got {args.comm_sms}")
        if args.bench and world > 1:
            raise ValueError(f"--bench: expected one process (it times seven variants on one "
                             f"GPU), got {world} (--bench-dp ddp|fsdp times the data-parallel "
                             "step)")
        if args.bench_dp == "none" and world > 1:
            raise ValueError(f"--bench-dp: expected ddp or fsdp with {world} processes, got "
                             "none")
        if args.bench_dp:
            used = None if args.bench_dp == "none" else args.bench_dp
            args.reduce_dtype = args.reduce_dtype or ("float32" if used is None
                                                      else "bfloat16")
            if args.batch < 1:
                raise ValueError(f"batch: expected at least 1 (tokens per GPU: batch x seq), "
                                 f"got {args.batch}")
        elif not args.bench:
            check_distributed(mode=mode, batch=args.batch, world_size=world, wrapper=wrapper)
            used = wrapper if args.fsdp or world > 1 else None
            args.reduce_dtype = args.reduce_dtype or "float32"
        if not args.bench:
            check_data_parallel(wrapper=used, dtype=args.dtype, reduce_dtype=args.reduce_dtype,
                                param_dtype=args.param_dtype)
    except ValueError as e:
        parser.error(str(e))
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    if not common.use_launchers_gpu(info, SCRIPT):
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    grouped = not args.bench and used is not None
    comm_sms = args.comm_sms if grouped and world > 1 else 0
    if comm_sms:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if comm_sms >= sms:
            print(f"{SCRIPT}: --comm-sms: expected fewer than the {sms} SMs of the GPU, got "
                  f"{comm_sms}", file=sys.stderr)
            return 2
        os.environ["NCCL_MAX_CTAS"] = str(comm_sms)   # read when the communicator is made
    if grouped:
        join_process_group(info, device, high_priority=args.nccl_high_priority and world > 1)
    tile_grids = args.tile_grids and grouped and world > 1
    if comm_sms or tile_grids:
        # ge2jit's persistent GEMMs (one block an SM for their whole run) would otherwise
        # hold every SM while NCCL's kernels, on their own stream, wait for one
        import ge2jit

        if comm_sms:
            ge2jit.set_num_sms(sms - comm_sms)
        if tile_grids:
            ge2jit.set_persistent(False)
    try:
        if args.bench:
            result = bench(batch=args.batch, seq=args.seq, d=args.d, heads=args.heads,
                           hidden=args.hidden, dtype=args.dtype, rounds=args.rounds,
                           round_steps=args.round_steps, warmup=args.warmup, lr=args.lr,
                           seed=args.seed)
        elif args.bench_dp:
            result = bench_data_parallel(
                mode=args.bench_dp, impl=args.impl or "ge2jit", batch=args.batch,
                seq=args.seq, d=args.d, heads=args.heads, hidden=args.hidden,
                dtype=args.dtype, reduce_dtype=args.reduce_dtype, param_dtype=args.param_dtype,
                rounds=args.rounds, round_steps=args.round_steps, warmup=args.warmup,
                lr=args.lr, seed=args.seed, rank=info.rank, world_size=world)
        else:
            result = train(steps=args.steps, batch=args.batch, seq=args.seq, vocab=args.vocab,
                           d=args.d, heads=args.heads, hidden=args.hidden, layers=args.layers,
                           lr=args.lr, dtype=args.dtype, mode=mode, impl=args.impl or "ge2jit",
                           seed=args.seed, log_every=args.log_every, progress=info.rank == 0,
                           rank=info.rank, world_size=world, wrapper=wrapper,
                           reduce_dtype=args.reduce_dtype, param_dtype=args.param_dtype)
    finally:
        if comm_sms:
            ge2jit.set_num_sms(None)   # all SMs again (main called in a process that goes on)
        if tile_grids:
            ge2jit.set_persistent(True)
        if grouped:
            torch.distributed.destroy_process_group()
    if info.rank != 0:   # rank 0 reports
        return 0
    if args.bench:
        print_bench(result)
    elif args.bench_dp:
        result["config"]["comm_sms"] = comm_sms
        result["config"]["tile_grids"] = bool(tile_grids)
        result["config"]["nccl_high_priority"] = bool(args.nccl_high_priority and world > 1)
        print_bench_data_parallel(result)
    else:
        result.config["comm_sms"] = comm_sms
        common.report(result, None)
        result = {**result.summary(), "losses": result.losses}
    if args.json:
        common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    with script_errors(SCRIPT):   # setup problems met later (a GE2JIT_* variable): one line
        raise SystemExit(main())
