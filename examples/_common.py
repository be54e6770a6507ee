"""What the training examples share (``train_gpt_block.py``, ``train_llama_block.py``): the
copy task, the size checks, the training loop (eager, or the whole step captured as a CUDA
graph) and the command line's common options. Not an example of its own; the scripts import
it from their folder."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import ge2jit.graph


def no_gpu_message(script: str) -> str:
    """The one line a script prints, before it exits with status 2, where there is no GPU."""
    return (f"{script}: no CUDA GPU found (torch.cuda.is_available() is False); "
            "training needs one.")


# --- the task ------------------------------------------------------------------------------

def copy_batch(gen: torch.Generator, batch: int, seq: int, vocab: int, device):
    """``(x, targets)``: x (batch, seq) holds ``seq / 2`` random tokens, the separator
    (token ``vocab``) and the first ``seq / 2 - 1`` tokens again; targets (batch, seq / 2)
    are the random tokens, which the logits at positions ``seq / 2 ..`` must predict."""
    half = seq // 2
    tokens = torch.randint(0, vocab, (batch, half), generator=gen, device=device)
    sep = torch.full((batch, 1), vocab, dtype=tokens.dtype, device=device)
    x = torch.cat([tokens, sep, tokens[:, :-1]], dim=1)
    return x, tokens


def copy_loss(logits: torch.Tensor, targets: torch.Tensor,
              cross_entropy=F.cross_entropy) -> torch.Tensor:
    """Cross-entropy (``cross_entropy``'s) of the copied half (the last ``targets.shape[1]``
    positions)."""
    half = targets.shape[1]
    copied = logits[:, -half:]
    return cross_entropy(copied.reshape(-1, copied.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, amp: bool,
             cross_entropy=F.cross_entropy):
    """(loss, accuracy of the argmax) on the copied half of a batch, as Python floats."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        logits = model(x)
        loss = copy_loss(logits, targets, cross_entropy)
    predicted = logits[:, -targets.shape[1]:].argmax(dim=-1)
    return float(loss), float((predicted == targets).float().mean())


def check_sizes(*, seq: int, d: int, heads: int, steps: int, log_every: int) -> None:
    """Raises ValueError, naming the option, for sizes the model or the loop cannot take."""
    if seq < 2 or seq % 2:
        raise ValueError(f"seq: expected an even number >= 2, got {seq}")
    if heads < 1 or d % heads:
        raise ValueError(f"d: {d} is not divisible by heads ({heads})")
    if steps < 1 or log_every < 1:
        raise ValueError(f"steps, log_every: expected at least 1, got {steps}, {log_every}")


# --- training ------------------------------------------------------------------------------

def capture_step(train_step, *args, **kwargs):
    """``ge2jit.graph.capture(train_step, *args, warmup=1, backend="torch")``: one warm-up run
    (a real training step on these arguments) creates the gradients and the optimizer's
    state and loads every kernel; then the step is captured (the capture runs nothing). With
    one warm-up a graph run trains on the same batches as an eager run. A capturable AdamW
    warns that it runs uncaptured: that is the warm-up, meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This instance was constructed with "
                                "capturable=True")
        return ge2jit.graph.capture(train_step, *args, warmup=1, backend="torch", **kwargs)


def run_steps(train_step, next_batch, *, steps: int, graph: bool, log_every: int, desc: str,
              progress: bool, device):
    """Train ``steps`` steps: ``train_step(*next_batch())`` (which queues a step on the GPU
    and returns its loss as a tensor) eagerly or, with ``graph``, captured once (its warm-up
    is the first step) and replayed with each batch copied in. The losses stay on the GPU,
    read back every ``log_every`` steps for the progress bar, outside the step. Returns
    ``(losses, times)``: every step's loss and its time in ms (CUDA events around it)."""
    log = torch.zeros(steps, device=device)   # the losses, kept on the GPU until the end
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    bar = tqdm(range(steps), desc=desc, unit="step", disable=not progress)
    step = None
    for i in bar:
        batch = next_batch()
        starts[i].record()
        if not graph:
            loss = train_step(*batch)
        elif step is None:
            step = capture_step(train_step, *batch)
            loss = step.warmup_outputs
        else:
            loss = step(*batch)   # the batch copied in, one replay
        ends[i].record()
        log[i].copy_(loss)
        if (i + 1) % log_every == 0 or i + 1 == steps:
            bar.set_postfix(loss=f"{float(loss):.4f}")   # a read-back, outside the step
    torch.cuda.synchronize()
    return log.tolist(), [s.elapsed_time(e) for s, e in zip(starts, ends)]


def use_launchers_gpu(info, script: str) -> bool:
    """Under a launcher (``info``: ``ge2jit.distributed.process_info()``), make the local
    rank's GPU current; False, after one line on stderr naming the launcher's variable, when
    this host has no such GPU. Without a launcher, True (the current GPU stays)."""
    from ge2jit.distributed.environment import LAUNCHERS

    if info.launcher == "none":
        return True
    if info.local_rank >= torch.cuda.device_count():
        variable = next(v[3] for v in LAUNCHERS if v[0] == info.launcher)
        print(f"{script}: {variable}: expected a GPU in [0, {torch.cuda.device_count()}) on "
              f"this host, got {info.local_rank}", file=sys.stderr)
        return False
    torch.cuda.set_device(info.local_rank)
    return True


def median_of_last_half(times: list) -> float:
    return statistics.median(times[len(times) // 2:])


@dataclass(kw_only=True)
class TrainResult:
    """A training run's results; each script's ``Result`` adds its model's options."""
    mode: str
    dtype: str
    steps: int
    final_loss: float          # the training loss of the last step
    accuracy: float            # the copy's accuracy on the held-out batch
    eval_loss: float           # the loss on the held-out batch
    step_ms: float             # median time of a step over the last half of the steps
    losses: list = field(default_factory=list)         # the training loss of every step
    step_times_ms: list = field(default_factory=list)  # every step's time (CUDA events)
    config: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """What ``--json`` writes: everything but the per-step lists."""
        out = asdict(self)
        del out["losses"], out["step_times_ms"]
        return out


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def report(result, json_path: str | None) -> None:
    """Print the final loss, the copy accuracy and the step time; write ``--json``."""
    print(f"final loss {result.final_loss:.4f}, copy accuracy {100 * result.accuracy:.1f}%")
    print(f"step time: {result.step_ms:.3f} ms (median of the last half of the steps)")
    if json_path:
        write_json(json_path, result.summary())


# --- the command line ----------------------------------------------------------------------

def add_training_arguments(parser: argparse.ArgumentParser, **defaults) -> None:
    """The modes (``--compile`` | ``--graph``), ``--dtype``, the sizes and the training
    options, and ``--json``; ``defaults`` overrides the defaults by option (``d=None``)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--compile", action="store_true",
                       help="torch.compile the model (fullgraph=True)")
    group.add_argument("--graph", action="store_true",
                       help="capture the whole training step as a CUDA graph and replay it")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="bfloat16: float32 parameters, the forward under autocast")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64, help="tokens the model reads (even)")
    parser.add_argument("--vocab", type=int, default=64)
    # (--d-model under torchrun, whose own parser takes "--d" for an ambiguous prefix of its
    # options)
    parser.add_argument("--d-model", "--d", dest="d", type=int, default=256,
                        help="model width (--d for short, except under torchrun)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10,
                        help="read the loss back for the progress bar every N steps")
    parser.add_argument("--json", metavar="PATH", help="write the results there")
    parser.set_defaults(**defaults)
