"""Train a Hugging Face causal LM (random init) to copy sequences, with ge2jit added in one line.
Needs a CUDA GPU, PyTorch and transformers.

    python examples/train_hf_lm.py [--model llama|gpt2] [--ge2jit compile|patch|none]
                                   [--dtype bfloat16|amp] [--steps 300] [--batch 32]
                                   [--seq 64] [--vocab 64] [--d 256] [--layers 2] [--heads 4]
                                   [--lr 1e-3] [--seed 0] [--json PATH]

Without a GPU, PyTorch or transformers it says so in one line and exits with status 2:
nothing was trained.

The model is transformers' own ``LlamaForCausalLM`` (``--model llama``: RMSNorm, rotary
embeddings, grouped-query attention with half as many kv heads, a SwiGLU MLP) or
``GPT2LMHeadModel`` (``--model gpt2``), made from a config of the given sizes with random
weights. The one line that brings in ge2jit is

    model = ge2jit.torch.compile(model)       # --ge2jit compile (the default)
    ge2jit.torch.patch(model)                 # --ge2jit patch: eager, modules replaced

``compile`` is ``torch.compile`` with ge2jit's backend: ge2jit's attention, the head and loss
fused without logits (``linear_cross_entropy``), and what else its patterns match in the
traced graphs, the rest left to Inductor. ``patch`` replaces modules in place (attention,
norms, Linear + activation, the head and loss) and runs eagerly. ``none`` trains the untouched
model, eagerly, for comparison.

The task: ``seq / 2`` random tokens (from ``vocab``), a separator (token ``vocab``) and the
same tokens again; ``labels`` are the input with the first half and the separator set to
-100, so the model's own loss counts the copied half only. AdamW; ``--dtype bfloat16`` makes
the model bfloat16, ``amp`` keeps it float32 under ``torch.autocast``. A progress bar shows
the loss; at the end the script prints the final loss (the mean of the last ten steps') and
the copy accuracy of a held-out batch (the argmax of logits from a call without labels, which
runs the model's own forward).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ge2jit import ArgumentValueError
from ge2jit._deps import script_errors

SCRIPT = "train_hf_lm.py"

with script_errors(SCRIPT, "PyTorch, transformers, ge2jit.torch and a CUDA GPU",
                   as_script=__name__ == "__main__"):
    import torch
    import transformers
    from tqdm import tqdm

    import ge2jit.torch as gt

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # examples/_common.py
    import _common as common

NO_GPU = common.no_gpu_message(SCRIPT)
MODELS = ("llama", "gpt2")
MODES = ("compile", "patch", "none")


def build(model: str, *, vocab: int, d: int, layers: int, heads: int, seq: int, seed: int,
          dtype: str, device="cuda"):
    """The untouched Hugging Face model on ``device`` (``vocab + 1`` tokens: the
    separator)."""
    torch.manual_seed(seed)
    if model == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab + 1, hidden_size=d, intermediate_size=llama_hidden(d),
            num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2), max_position_embeddings=max(128, seq + 1))
        net = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=vocab + 1, n_embd=d, n_layer=layers, n_head=heads,
            n_positions=max(128, seq + 1), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=vocab, eos_token_id=vocab)
        net = transformers.GPT2LMHeadModel(config)
    weights = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    return net.to(device=device, dtype=weights).train()


def llama_hidden(d: int) -> int:
    """LLaMA's MLP width for ``d``: 8 d / 3 rounded up to a multiple of 64."""
    return -(-8 * d // 3 // 64) * 64


def batch(gen, size: int, seq: int, vocab: int):
    """``(input_ids, labels, targets)`` of the copy task on ``gen``'s device: the copy (``seq
    + 1`` tokens), its labels (-100 but on the copied half) and the copied tokens."""
    x, tokens = common.copy_batch(gen, size, seq, vocab, gen.device)
    ids = torch.cat([x, tokens[:, -1:]], dim=1)       # the whole copy: seq + 1 tokens
    labels = ids.clone()
    labels[:, :seq // 2 + 1] = -100
    return ids, labels, tokens


def train(*, model="llama", mode="compile", dtype="bfloat16", steps=300, batch_size=32, seq=64,
          vocab=64, d=256, layers=2, heads=4, lr=1e-3, seed=0, progress=True,
          device="cuda") -> dict:
    """Train and evaluate; returns the losses, the final loss, the copy accuracy and the
    median step time of the last half of the steps. (``device`` "cpu" runs the untouched
    model, ``mode`` "none", on the CPU: the loop without a GPU.)"""
    if seq < 4 or seq % 2:
        raise ArgumentValueError(f"seq: expected an even number of at least 4, got {seq}")
    if mode not in MODES:
        raise ArgumentValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    net = build(model, vocab=vocab, d=d, layers=layers, heads=heads, seq=seq, seed=seed,
                dtype=dtype, device=device)
    runnable = net
    if mode == "compile":
        runnable = gt.compile(net)                    # the one line
    elif mode == "patch":
        gt.patch(net)                                 # the one line (eager)
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    gen = torch.Generator(device=device).manual_seed(seed)
    amp, kind = dtype == "amp", torch.device(device).type
    losses, times = [], []
    bar = tqdm(range(steps), desc=f"{model} ({mode})", disable=not progress)
    for _ in bar:
        ids, labels, _ = batch(gen, batch_size, seq, vocab)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, torch.bfloat16, enabled=amp):
            loss = runnable(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))           # (synchronizes: the step's time)
        times.append((time.perf_counter() - start) * 1e3)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    net.eval()
    held_out = torch.Generator(device=device).manual_seed(seed + 12345)
    ids, _, tokens = batch(held_out, batch_size, seq, vocab)
    with torch.no_grad(), torch.autocast(kind, torch.bfloat16, enabled=amp):
        logits = net(input_ids=ids).logits            # the model's own forward, no labels
    predicted = logits[:, seq // 2:seq].argmax(dim=-1)
    accuracy = float((predicted == tokens).float().mean())
    last = losses[-10:]
    tail = sorted(times[len(times) // 2:])
    return {"model": model, "mode": mode, "dtype": dtype, "losses": losses,
            "final_loss": sum(last) / len(last), "accuracy": accuracy,
            "step_ms": tail[len(tail) // 2]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="llama")
    p.add_argument("--ge2jit", choices=MODES, default="compile",
                   help="how ge2jit comes in: compile (default), patch, or none (untouched)")
    p.add_argument("--dtype", choices=("bfloat16", "amp"), default="bfloat16")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the losses and results here")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "vocab", "d", "layers", "heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected a positive number, got {getattr(args, name)}")
    if args.seq < 4 or args.seq % 2:
        p.error(f"--seq: expected an even number of at least 4, got {args.seq}")
    if args.d % args.heads or args.heads % 2 and args.model == "llama" and args.heads > 1:
        p.error(f"--heads: expected a divisor of --d ({args.d}) (llama: even, for its half "
                f"as many kv heads), got {args.heads}")
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    r = train(model=args.model, mode=args.ge2jit, dtype=args.dtype, steps=args.steps,
              batch_size=args.batch, seq=args.seq, vocab=args.vocab, d=args.d,
              layers=args.layers, heads=args.heads, lr=args.lr, seed=args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    print(f"final loss {r['final_loss']:.4f}, copy accuracy {100 * r['accuracy']:.1f}%")
    print(f"step time: {r['step_ms']:.3f} ms (median of the last half of the steps)")
    return 0


if __name__ == "__main__":
    with script_errors(SCRIPT):   # setup problems met later (a GE2JIT_* variable): one line
        sys.exit(main())
