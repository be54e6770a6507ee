"""Benchmark of ge2jit's rotary embedding against PyTorch eager, ``torch.compile`` and a copy of
the same bytes, in turns in one run.

    python bench/bench_rope.py [--json bench/results_rope.json] [--quick]
                               [--shapes 1x512,4x1024,8x2048] [--kv-heads 32,8]

LLaMA-7B's attention (32 query heads of 128, bfloat16) at batch x sequence tokens, with 32 or
8 key/value heads: q (batch, heads, seq, head_dim) and k as Hugging Face's attention holds
them, cos and sin (batch, seq, head_dim) as its rotary embedding module makes them. Forward:
``ge2jit`` is ``ge2jit.torch.apply_rotary_pos_emb`` (the drop-in: new outputs, the autograd
check), ``ge2jit out=`` the core op into preallocated outputs (``ge2jit.rope`` on the
transposed views), ``torch eager`` Hugging Face's formula (``q * cos + rotate_half(q) *
sin``, written out here), ``torch.compile`` and ``torch.compile max-autotune`` the same
function compiled, ``copy`` PyTorch's ``copy_`` of q and k into preallocated tensors (the
bandwidth reference: the same bytes read and written). Forward and backward
(``fwd+bwd``): the forward on inputs that need gradients, then
``torch.autograd.grad`` of both outputs. Times are medians of CUDA-event batches of about
5 ms taken in turns (``common.interleaved_ms``); bandwidth counts q and k read and
written once, and cos and sin read once. Writes JSON (device, date, commit, rows) and prints
a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common import add_quick, commit, device_meta, import_torch, interleaved_ms, quick_defaults

SHAPES = "1x512,4x1024,8x2048"
#: the length of a timed batch of back-to-back calls: each batch starts on an idle GPU, so its
#: first call's host time is in it; 5 ms batches make that a small part of a call's time (at
#: 1 ms it added up to 15 µs a call to the implementations with the most host time)
BATCH_MS = 5.0
QUICK_SHAPES = "1x128"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--shapes", default=None, help=f"batch x seq list (default {SHAPES})")
    ap.add_argument("--kv-heads", default="32,8", help="key/value head counts")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=None)
    add_quick(ap, f"shapes {QUICK_SHAPES}, 3 rounds")
    args = ap.parse_args(argv)
    quick_defaults(args, shapes=(SHAPES, QUICK_SHAPES), rounds=(15, 3))
    return args


def rotate_half(x):
    """The half-split rotation's partner: (-x2, x1)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rope(q, k, cos, sin):
    """Hugging Face's formula: cos and sin broadcast over the heads (dimension 1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def inputs(batch, seq, heads, kv_heads, d, grad=False):
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(batch, heads, seq, d, device=dev, dtype=dt, requires_grad=grad)
    k = torch.randn(batch, kv_heads, seq, d, device=dev, dtype=dt, requires_grad=grad)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=dev).float() / d))
    freqs = torch.arange(seq, device=dev).float()[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), dim=-1)[None].expand(batch, -1, -1)
    return q, k, emb.cos().to(dt).contiguous(), emb.sin().to(dt).contiguous()


def forward_cases(q, k, cos, sin, compiled):
    import ge2jit
    import ge2jit.torch as gt

    half = q.shape[-1] // 2
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    views = (q.transpose(1, 2), k.transpose(1, 2), cos[..., :half], sin[..., :half],
             (qo.transpose(1, 2), ko.transpose(1, 2)))

    def copy():
        qo.copy_(q)
        ko.copy_(k)

    cases = {"ge2jit": lambda: gt.apply_rotary_pos_emb(q, k, cos, sin),
             "ge2jit out=": lambda: ge2jit.rope(*views[:4], out=views[4]),
             "torch eager": lambda: hf_rope(q, k, cos, sin)}
    for name, fn in compiled.items():
        cases[name] = lambda fn=fn: fn(q, k, cos, sin)
    cases["copy"] = copy
    return cases


def backward_cases(q, k, cos, sin, compiled):
    import ge2jit.torch as gt

    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def step(fn):
        def run():
            qo, ko = fn(q, k, cos, sin)
            torch.autograd.grad((qo, ko), (q, k), (gq, gk))
        return run

    cases = {"ge2jit": step(gt.apply_rotary_pos_emb), "torch eager": step(hf_rope)}
    for name, fn in compiled.items():
        cases[name] = step(fn)
    return cases


def main(argv=None) -> int:
    global torch
    args = parse_args(argv)
    torch = import_torch()
    if torch is None or not torch.cuda.is_available():
        print("bench_rope: needs PyTorch with a CUDA GPU", file=sys.stderr)
        return 1
    # every shape and mode is a recompilation of the same function: let it have them all
    torch._dynamo.config.recompile_limit = 256
    compiled = {"torch.compile": torch.compile(hf_rope),
                "torch.compile max-autotune": torch.compile(
                    hf_rope, mode="max-autotune-no-cudagraphs")}
    rows = []
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for batch, seq in shapes:
        for kv in (int(v) for v in args.kv_heads.split(",")):
            q, k, cos, sin = inputs(batch, seq, args.heads, kv, args.head_dim)
            nbytes = 2 * (q.nbytes + k.nbytes) + cos.nbytes + sin.nbytes
            for mode, make, grad in (("fwd", forward_cases, False),
                                     ("fwd+bwd", backward_cases, True)):
                if grad:
                    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
                cases = make(q, k, cos, sin, compiled)
                ms = interleaved_ms([(fn, [()]) for fn in cases.values()],
                                    rounds=args.rounds, batch_ms=BATCH_MS)
                row = {"batch": batch, "seq": seq, "heads": args.heads, "kv_heads": kv,
                       "head_dim": args.head_dim, "mode": mode,
                       "ms": dict(zip(cases, ms))}
                if mode == "fwd":
                    row["gbs"] = {n: nbytes / t / 1e6 for n, t in row["ms"].items()}
                    row["of_copy"] = row["ms"]["copy"] / row["ms"]["ge2jit out="]
                rows.append(row)
    for mode in ("fwd", "fwd+bwd"):
        names = [n for n in rows[0 if mode == "fwd" else 1]["ms"]]
        print(f"\n{mode}, µs (bfloat16, {args.heads} query heads of {args.head_dim})")
        print("| tokens | kv heads | " + " | ".join(names)
              + (" | ge2jit out= GB/s | of copy |" if mode == "fwd" else " |"))
        print("|---" * (len(names) + (4 if mode == "fwd" else 2)) + "|")
        for r in rows:
            if r["mode"] != mode:
                continue
            cells = [f"{r['ms'][n] * 1e3:.1f}" for n in names]
            extra = (f" | {r['gbs']['ge2jit out=']:.0f} | {r['of_copy']:.2f}"
                     if mode == "fwd" else "")
            print(f"| {r['batch']}x{r['seq']} | {r['kv_heads']} | " + " | ".join(cells)
                  + extra + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**device_meta(), "date": time.strftime("%Y-%m-%d"), "commit": commit(),
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


torch = None

if __name__ == "__main__":
    sys.exit(main())
