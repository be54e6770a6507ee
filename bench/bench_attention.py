"""Attention's speed: ge2jit against each of PyTorch's SDPA backends (flash, cuDNN, efficient),
forward and forward + backward, in turns in one run, in TFLOP/s.

    python bench/bench_attention.py [--json bench/results_attention.json] [--plot PNG]
                                    [--shapes B,H,H_kv,S,D,causal;...] [--backward] [--quick]

The default shapes are a LLaMA-like grouped-query layer at 4 x 4096 tokens, a 16k-token causal
sequence, 4 x 4096 tokens not causal, 8 x 2048 with head_dim 64, and the grouped-query layer
at 16 x 1024 and 2 x 8192 tokens (bfloat16, (B, H, S, D) tensors as PyTorch's SDPA takes
them). Implementations:

- ``ge2jit``: ``ge2jit.torch.scaled_dot_product_attention`` (the custom op, GQA read natively);
  in the forward, also ``ge2jit <config>``: ``ge2jit.attention`` pinned to each candidate
  config of the GPU, the default's among them (the Hopper kernel's variants and the sm_80
  kernel's on sm_90): every config on the same direct path, without the custom op's host time;
- ``torch flash`` / ``torch cudnn`` / ``torch efficient``: ``F.scaled_dot_product_attention``
  pinned to that backend with ``torch.nn.attention.sdpa_kernel`` (a backend that refuses the
  shape is left out of its row); grouped-query heads with ``enable_gqa=True``.

With ``--backward``, a second table times the backward alone from a stored forward:
``ge2jit.attention_backward`` with its default kernels and, on sm_90, its deterministic form
(``deterministic=True``: no atomics) and the sm_80 kernels (``config="sm80"``), against
``torch.autograd.grad`` of each backend's output.

TFLOP/s counts FlashAttention's 4 B H S^2 D for the forward, halved when causal, and 3.5 times
that for forward + backward (the backward: 2.5 times the forward). Forward + backward is the
forward on inputs that need gradients, then ``torch.autograd.grad`` of q, k and v. Times are
medians of CUDA-event batches of about 5 ms taken in turns (``common.interleaved_ms``). Writes
JSON (device, date, commit, rows), prints a markdown table and, with ``--plot``, a bar chart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common import add_quick, commit, device_meta, import_torch, interleaved_ms, quick_defaults

SHAPES = ("4,32,8,4096,128,1;1,32,32,16384,128,1;4,32,32,4096,128,0;8,16,16,2048,64,0;"
          "16,32,8,1024,128,1;2,32,8,8192,128,1")
QUICK_SHAPES = "1,4,2,256,64,1"
BACKENDS = ("flash", "cudnn", "efficient")
BATCH_MS = 5.0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a bar chart (PNG) here")
    ap.add_argument("--shapes", default=None,
                    help=f"B,H,H_kv,S,D,causal;... (default {SHAPES})")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--backward", action="store_true",
                    help="also time the backward alone (a second table)")
    ap.add_argument("--replot", metavar="JSON",
                    help="draw --plot from a JSON this script wrote, timing nothing")
    add_quick(ap, f"shapes {QUICK_SHAPES}, 3 rounds")
    args = ap.parse_args(argv)
    quick_defaults(args, shapes=(SHAPES, QUICK_SHAPES), rounds=(9, 3))
    try:
        args.shape_list = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    except ValueError:
        ap.error(f"--shapes: expected B,H,H_kv,S,D,causal;..., got {args.shapes!r}")
    if any(len(s) != 6 for s in args.shape_list):
        ap.error(f"--shapes: expected six integers a shape, got {args.shapes!r}")
    return args


def flops(b, h, s, d, causal, mode) -> float:
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * {"fwd": 1.0, "fwd+bwd": 3.5, "bwd": 2.5}[mode]


def implementations(q, k, v, causal):
    """Name -> fn() of the forward, for the backends that take these inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import ge2jit.torch as gt

    gqa = q.shape[1] != k.shape[1]
    F = torch.nn.functional
    cases = {"ge2jit": lambda: gt.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=gqa)}
    if not q.requires_grad:   # the forward's candidate configs on this GPU, each pinned
        import ge2jit
        from ge2jit.ops.attention.spec import candidates_for

        arch = 90 if torch.cuda.get_device_capability() == (9, 0) else 80
        for config in candidates_for(q.shape[-1], arch):
            cases[f"ge2jit {config.name}"] = lambda config=config: ge2jit.attention(
                q, k, v, causal=causal, layout="bhsd", config=config)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for name in BACKENDS:
        def run(backend=backends[name]):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                      enable_gqa=gqa)
        try:
            run()
            torch.cuda.synchronize()
        except RuntimeError:   # the backend does not take this shape or type
            continue
        cases[f"torch {name}"] = run
    return cases


def with_backward(cases, q, k, v):
    grad = None

    def step(fn):
        def run():
            nonlocal grad
            out = fn()
            if grad is None:
                grad = torch.randn_like(out)
            torch.autograd.grad(out, (q, k, v), grad)
        return run

    return {name: step(fn) for name, fn in cases.items()}


def backward_only(q, k, v, causal):
    """Name -> fn() of the backward alone, from a forward run once: ge2jit's default kernels
    (and on sm_90 its deterministic form, the sm_80 kernels and, at head_dim 64 and 128, the
    one-kernel backward's narrow step pinned, and with its dq products deferred), each torch
    backend's autograd backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import ge2jit

    gqa = q.shape[1] != k.shape[1]
    qs, ks, vs = (x.detach() for x in (q, k, v))
    grad = torch.randn_like(qs)
    kw = dict(causal=causal, layout="bhsd")
    o, lse = ge2jit.attention(qs, ks, vs, return_lse=True, **kw)
    cases = {"ge2jit": lambda: ge2jit.attention_backward(grad, qs, ks, vs, o, lse, **kw)}
    if torch.cuda.get_device_capability() == (9, 0):
        cases["ge2jit deterministic"] = lambda: ge2jit.attention_backward(
            grad, qs, ks, vs, o, lse, deterministic=True, **kw)
        cases["ge2jit sm80"] = lambda: ge2jit.attention_backward(
            grad, qs, ks, vs, o, lse, config="sm80", **kw)
        if qs.shape[-1] in (64, 128):   # the one-kernel backward's narrow step pinned, and
            cases["ge2jit sm90n"] = lambda: ge2jit.attention_backward(   # with its dq
                grad, qs, ks, vs, o, lse, config="sm90n", **kw)          # products deferred
            cases["ge2jit sm90d"] = lambda: ge2jit.attention_backward(
                grad, qs, ks, vs, o, lse, config="sm90d", **kw)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for name in BACKENDS:
        try:
            with sdpa_kernel(backends[name]):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=gqa)
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            torch.cuda.synchronize()
        except RuntimeError:   # the backend does not take this shape or type
            continue
        cases[f"torch {name}"] = lambda out=out: torch.autograd.grad(out, (q, k, v), grad,
                                                                     retain_graph=True)
    return cases


def print_table(title: str, pairs: list, names: list) -> None:
    """A markdown table of rows (or pairs of rows, cells "a / b") by implementation."""
    print(f"\nTFLOP/s, bfloat16 ({title}; - where a backend refuses the shape)")
    print("| B, H, H_kv, S, D, causal | " + " | ".join(names)
          + " | best ge2jit / best torch |")
    print("|---" * (len(names) + 2) + "|")
    for group in pairs:
        cells = [" / ".join(f"{r['tflops'][n]:.0f}" if n in r["tflops"] else "-"
                            for r in group) for n in names]
        ratio = " / ".join(
            f"{max(t for m, t in r['tflops'].items() if m.startswith('ge2jit')) / best:.2f}"
            if (best := max((t for m, t in r["tflops"].items() if m.startswith("torch")),
                            default=0)) else "-" for r in group)
        r = group[0]
        print(f"| {r['batch']}, {r['heads']}, {r['kv_heads']}, {r['seq']}, "
              f"{r['head_dim']}, {'yes' if r['causal'] else 'no'} | " + " | ".join(cells)
              + f" | {ratio} |")


def main(argv=None) -> int:
    global torch
    args = parse_args(argv)
    if args.replot:
        if not args.plot:
            print("bench_attention: --replot needs --plot (the PNG to write)", file=sys.stderr)
            return 2
        with open(args.replot) as f:
            plot(json.load(f), args.plot)
        return 0
    torch = import_torch()
    if torch is None or not torch.cuda.is_available():
        print("bench_attention: needs PyTorch with a CUDA GPU", file=sys.stderr)
        return 1
    rows = []
    for b, h, h_kv, s, d, causal in args.shape_list:
        g = torch.Generator(device="cuda").manual_seed(0)
        make = [(b, h, s, d), (b, h_kv, s, d), (b, h_kv, s, d)]
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
                   .requires_grad_() for shape in make)
        for mode in ("fwd", "fwd+bwd", "bwd") if args.backward else ("fwd", "fwd+bwd"):
            if mode == "fwd":   # without autograd: the forward alone, and each config of it
                cases = implementations(q.detach(), k.detach(), v.detach(), bool(causal))
            elif mode == "bwd":
                cases = backward_only(q, k, v, bool(causal))
            else:
                cases = with_backward(implementations(q, k, v, bool(causal)), q, k, v)
            ms = interleaved_ms([(fn, [()]) for fn in cases.values()], rounds=args.rounds,
                                batch_ms=BATCH_MS)
            f = flops(b, h, s, d, causal, mode)
            rows.append({"batch": b, "heads": h, "kv_heads": h_kv, "seq": s, "head_dim": d,
                         "causal": bool(causal), "mode": mode, "ms": dict(zip(cases, ms)),
                         "tflops": {n: f / t / 1e9 for n, t in zip(cases, ms)}})
    main_rows = [r for r in rows if r["mode"] != "bwd"]
    names = list(dict.fromkeys(n for r in main_rows for n in r["tflops"]
                               if n.startswith("ge2jit")))
    names += [f"torch {n}" for n in BACKENDS]
    print_table("fwd / fwd+bwd", list(zip(main_rows[::2], main_rows[1::2])), names)
    if args.backward:
        bwd = [r for r in rows if r["mode"] == "bwd"]
        bwd_names = list(dict.fromkeys(n for r in bwd for n in r["tflops"]
                                       if n.startswith("ge2jit")))
        print_table("the backward alone", [(r,) for r in bwd],
                    bwd_names + [f"torch {n}" for n in BACKENDS])
    meta = {**device_meta(), "date": time.strftime("%Y-%m-%d"), "commit": commit(),
            "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)
    if args.plot:
        plot(meta, args.plot)
    return 0


def plot(meta: dict, path: str) -> None:
    """A bar chart of ``meta`` (the JSON this script writes), a panel per mode: ge2jit's
    default, the fastest of its forward configs (pinned), each SDPA backend."""
    from common import pyplot

    plt = pyplot()
    modes = list(dict.fromkeys(r["mode"] for r in meta["rows"]))
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.2), sharey=True,
                             squeeze=False)
    bars = ("ge2jit", "ge2jit, fastest config pinned", *(f"torch {n}" for n in BACKENDS))
    colors = dict(zip(bars, ("tab:blue", "tab:cyan", "tab:red", "tab:purple", "tab:gray")))
    for ax, mode in zip(axes[0], modes):
        sel = [r for r in meta["rows"] if r["mode"] == mode]

        def value(r, name):
            t = r["tflops"]
            if name == bars[1]:
                pinned = [v for n, v in t.items() if n.startswith("ge2jit ")
                          and n != "ge2jit deterministic"]
                return max(pinned, default=0.0)
            return t.get(name, 0.0)

        shown = [n for n in bars if any(value(r, n) for r in sel)]
        width = 0.8 / len(shown)
        for i, name in enumerate(shown):
            ax.bar([j + i * width for j in range(len(sel))], [value(r, name) for r in sel],
                   width, label=name, color=colors[name])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sel))])
        ax.set_xticklabels([f"{r['batch']}x{r['seq']}\nH{r['heads']}/{r['kv_heads']} "
                            f"D{r['head_dim']}{' c' if r['causal'] else ''}"
                            for r in sel], fontsize=7)
        ax.set_title(f"{mode} (bfloat16)")
        ax.set_ylabel("TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(f"attention, {meta.get('device', '')} {meta['date']} {meta['commit'] or ''}"
                 " (c: causal)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)


torch = None

if __name__ == "__main__":
    sys.exit(main())
