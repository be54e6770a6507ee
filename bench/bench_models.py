"""Whole Hugging Face models' training steps (forward, loss, backward) with ge2jit put in by one
line, against the same models untouched, every mode timed in turns in one process:

- ``hf eager``, ``hf compile`` (``torch.compile``), ``hf max-autotune`` (with
  ``--max-autotune``: ``torch.compile(mode="max-autotune-no-cudagraphs")``);
- ``ge2jit patch``: ``ge2jit.torch.patch(model)``, eager (``ge2jit patch layer_norms``, when
  ``--variants`` names it: ``patch(model, layer_norms=True)``, its LayerNorms ge2jit's too);
- ``ge2jit compile``: ``ge2jit.torch.compile(model)`` (the ``"ge2jit"`` backend, and the
  head and loss as ``patch`` makes them);
- ``ge2jit patch+compile``: both;
- with ``--graphs``: ``hf reduce-overhead`` and ``ge2jit reduce-overhead``, the compiled steps
  captured as CUDA graphs by Inductor (``mode="reduce-overhead"``).

    python bench/bench_models.py [--models llama,gpt2] [--dtypes bf16,amp] [--max-autotune]
                                 [--graphs] [--batch B]
                                 [--inputs plain|nocache|padded|packed]
                                 [--rounds 10] [--json PATH] [--quick]

``--inputs padded``: a batch with padding (transformers masks it); ``packed``: rows of packed
sequences (position ids that start again, ``use_cache=False``: transformers masks each
sequence apart); ``nocache``: the plain batch with ``use_cache=False`` (while tracing,
transformers then masks for packed sequences, which it cannot rule out). ge2jit's attention
reads the padded and packed masks as variable-length sequences in eager mode; while
compiling, the packed (and nocache) masks run the kernels with each token's sequence bounds
made in the graph, and the padded mask goes to PyTorch's SDPA.

Models (random init, random tokens): ``llama``: ``LlamaForCausalLM``, 4 layers, d 2048, 16
heads, 4 KV heads, hidden 5632, vocabulary 32000, 4 x 1024 tokens; ``llama128k``: the same with
a 128256-token vocabulary (the memory of the head and loss); ``mistral``:
``MistralForCausalLM``, LLaMA's layers with a sliding window of 1024 keys, 2 x 4096 tokens
(transformers makes a mask for the window); ``gpt2``: ``GPT2LMHeadModel``, 8
layers, d 1024, 16 heads, 8 x 512 tokens; ``convnet``: four convolutions with batch norms,
ReLUs and pooling and a Linear head over 1000 classes, 64 images of 64 x 64 (nothing for
ge2jit to fuse: its compile should take torch.compile's time). ``bf16``: bfloat16 weights;
``amp``: float32 weights inside ``torch.autocast(bfloat16)``. A step is
``model(input_ids=ids, labels=ids).loss.backward()`` (images and classes for the network)
with the gradients set to None before it. Peak memory is the model's parameters plus the
most a step allocates above what was allocated before it (every variant's model stays
resident, so each is counted alone; a step captured as a CUDA graph allocates nothing then,
so its figure is the parameters alone). Each variant's first loss is printed beside the
untouched model's. Beside the step's time, its CUDA kernel time (``kernel ms``: the kernels'
durations summed by ``torch.profiler`` over ``--steps`` steps, per step): at these sizes a
compiled step can be bound by the host (the launches), whose speed varies from run to run;
the kernel time says what the GPU does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types

from common import add_quick, commit, device_meta

MODELS = {
    "llama": dict(kind="llama", vocab=32000, d=2048, layers=4, heads=16, kv_heads=4,
                  hidden=5632, batch=4, seq=1024),
    "llama128k": dict(kind="llama", vocab=128256, d=2048, layers=4, heads=16, kv_heads=4,
                      hidden=5632, batch=4, seq=1024),
    "gpt2": dict(kind="gpt2", vocab=50257, d=1024, layers=8, heads=16, batch=8, seq=512),
    # a sliding window shorter than the sequence (transformers masks it)
    "mistral": dict(kind="mistral", vocab=32000, d=2048, layers=4, heads=16, kv_heads=4,
                    hidden=5632, batch=2, seq=4096, window=1024),
    # nothing for ge2jit to fuse: its compile should match torch.compile's step
    "convnet": dict(kind="convnet", vocab=1000, d=256, layers=4, batch=64, seq=64),
}
QUICK = dict(layers=1, batch=2, seq=256)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama,gpt2",
                    help=f"comma-separated, of {', '.join(MODELS)} (default llama,gpt2)")
    ap.add_argument("--dtypes", default="bf16", help="comma-separated, of bf16, amp")
    ap.add_argument("--variants", default=None,
                    help="comma-separated variant names (default: all)")
    ap.add_argument("--max-autotune", action="store_true",
                    help="add torch.compile(mode='max-autotune-no-cudagraphs')")
    ap.add_argument("--graphs", action="store_true",
                    help="add both compiled steps captured as CUDA graphs "
                         "(mode='reduce-overhead'), like with like")
    ap.add_argument("--batch", type=int, default=None, help="sequences (default the model's)")
    ap.add_argument("--inputs", default="plain",
                    choices=("plain", "nocache", "padded", "packed"),
                    help="the token models' batch: every token kept (default); 'nocache': the "
                         "same with use_cache=False (as training with gradient checkpointing "
                         "calls it); 'padded': each row's last 0 to half of its tokens "
                         "padding (attention_mask, the padding's labels ignored); 'packed': "
                         "each row several sequences of 1/8 to 1/2 of it (position_ids that "
                         "start again, use_cache=False)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3, help="steps per round")
    ap.add_argument("--json", default=None, help="write the results there")
    add_quick(ap, "one layer, 2 x 256 tokens, 3 rounds")
    args = ap.parse_args(argv)
    bad = [m for m in args.models.split(",") if m not in MODELS]
    bad += [d for d in args.dtypes.split(",") if d not in ("bf16", "amp")]
    if bad:
        ap.error(f"unknown models or dtypes: {', '.join(bad)}")
    if args.quick:
        args.rounds = min(args.rounds, 3)
    return args


def build(spec: dict, dtype, seed: int = 0):
    """The untouched model of ``spec`` on the GPU, of ``dtype``."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    if spec["kind"] == "convnet":
        return _ConvNet(spec).to(device="cuda", dtype=dtype).train()
    if spec["kind"] in ("llama", "mistral"):
        common = dict(vocab_size=spec["vocab"], hidden_size=spec["d"],
                      intermediate_size=spec["hidden"], num_hidden_layers=spec["layers"],
                      num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
                      max_position_embeddings=max(2048, spec["seq"]))
        if spec["kind"] == "mistral":
            model = tf.MistralForCausalLM(tf.MistralConfig(sliding_window=spec["window"],
                                                           **common))
        else:
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    else:
        config = tf.GPT2Config(vocab_size=spec["vocab"], n_embd=spec["d"],
                               n_layer=spec["layers"], n_head=spec["heads"],
                               n_positions=max(1024, spec["seq"]), resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0)
        model = tf.GPT2LMHeadModel(config)
    return model.to(device="cuda", dtype=dtype).train()


def _conv_net_class():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ConvNet(nn.Module):
        """A small convolutional classifier (convolutions, batch norms, ReLUs, pooling, a
        Linear head with a bias): ``forward(images, labels)`` returns an object with the
        cross-entropy ``.loss``, as the language models do."""

        def __init__(self, spec):
            super().__init__()
            chans = [3] + [spec["d"] // 2 ** (spec["layers"] - 1 - i)
                           for i in range(spec["layers"])]
            self.body = nn.Sequential(*[m for a, b in zip(chans, chans[1:]) for m in (
                nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(),
                nn.MaxPool2d(2))])
            self.head = nn.Linear(chans[-1], spec["vocab"])

        def forward(self, input_ids, labels):
            h = self.body(input_ids).mean(dim=(2, 3))
            return types.SimpleNamespace(loss=F.cross_entropy(self.head(h).float(), labels))

    del torch
    return ConvNet


def _ConvNet(spec):
    return _conv_net_class()(spec)


def inputs(spec: dict, dtype, batch: str = "plain"):
    """``(input_ids, labels, keywords)`` of a step: random tokens (their own labels; ``batch``
    'padded' and 'packed': the keywords of a padded batch or of packed sequences, ``--inputs``),
    or for the convolutional network random images and classes."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1)
    if spec["kind"] == "convnet":
        images = torch.randn(spec["batch"], 3, spec["seq"], spec["seq"], device="cuda",
                             generator=gen).to(dtype)
        return images, torch.randint(0, spec["vocab"], (spec["batch"],), device="cuda",
                                     generator=gen), {}
    b, s = spec["batch"], spec["seq"]
    ids = torch.randint(0, spec["vocab"], (b, s), device="cuda", generator=gen)
    cpu = torch.Generator().manual_seed(2)
    if batch == "padded":
        kept = torch.randint(s // 2, s + 1, (b,), generator=cpu)
        mask = (torch.arange(s)[None] < kept[:, None]).long().cuda()
        return ids, ids.masked_fill(mask == 0, -100), {"attention_mask": mask}
    if batch == "packed":
        rows = []
        for _ in range(b):
            lengths = []
            while sum(lengths) < s:
                lengths.append(int(torch.randint(s // 8, s // 2 + 1, (), generator=cpu)))
            lengths[-1] -= sum(lengths) - s
            rows.append(torch.cat([torch.arange(n) for n in lengths]))
        return ids, ids, {"position_ids": torch.stack(rows).cuda(), "use_cache": False}
    return ids, ids, {"use_cache": False} if batch == "nocache" else {}


def variants(names, max_autotune: bool, graphs: bool = False) -> dict:
    """name -> ``make(model) -> callable model`` (the model changed in place where ge2jit's
    ``patch`` is one of the steps)."""
    import torch

    import ge2jit.torch as gt

    def patched(model, **kinds):
        gt.patch(model, **kinds)
        return model

    out = {
        "hf eager": lambda m: m,
        "hf compile": lambda m: torch.compile(m),
        "ge2jit patch": patched,
        "ge2jit compile": lambda m: gt.compile(m),
        "ge2jit patch+compile": lambda m: gt.compile(patched(m)),
    }
    if max_autotune:
        out["hf max-autotune"] = lambda m: torch.compile(m, mode="max-autotune-no-cudagraphs")
    if graphs:
        out["hf reduce-overhead"] = lambda m: torch.compile(m, mode="reduce-overhead")
        out["ge2jit reduce-overhead"] = lambda m: gt.compile(m, mode="reduce-overhead")
    if names is not None and "ge2jit patch layer_norms" in names:   # named only: an A/B
        out["ge2jit patch layer_norms"] = lambda m: patched(m, layer_norms=True)
    return {k: v for k, v in out.items() if names is None or k in names}


def run_model(name: str, spec: dict, amp: bool, args) -> dict:
    import torch

    dtype = torch.float32 if amp else torch.bfloat16
    ids, labels, extra = inputs(spec, dtype, getattr(args, "inputs", "plain"))
    chosen = variants(args.variants.split(",") if args.variants else None, args.max_autotune,
                      args.graphs)
    models, steps, result = {}, {}, {}
    for vname, make in chosen.items():
        model = build(spec, dtype)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        runnable = make(model)

        def step(runnable=runnable, model=model, graphed="reduce-overhead" in vname):
            if graphed:
                torch.compiler.cudagraph_mark_step_begin()
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                loss = runnable(input_ids=ids, labels=labels, **extra).loss
            loss.backward()
            return loss

        t0 = time.perf_counter()
        try:
            first = float(step().detach())
            step()
        except Exception as e:   # a variant that fails is reported, the others still run
            print(f"  {vname}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            result[vname] = {"error": f"{type(e).__name__}: {e}"[:500]}
            del model, runnable
            torch.cuda.empty_cache()
            continue
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = params + torch.cuda.max_memory_allocated() - before
        models[vname], steps[vname] = model, step
        result[vname] = {"first_loss": first, "peak_gib": peak / 2**30, "warm_s": warm_s}
        print(f"  {vname}: first loss {first:.5f}, warm-up {warm_s:.1f} s, peak "
              f"{peak / 2**30:.2f} GiB", flush=True)
    times = {k: [] for k in steps}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for vname, step in steps.items():
            start.record()
            for _ in range(args.steps):
                step()
            end.record()
            end.synchronize()
            times[vname].append(start.elapsed_time(end) / args.steps)
    for vname, t in times.items():
        result[vname]["median_ms"] = statistics.median(t)
        result[vname]["min_ms"] = min(t)
        result[vname]["kernel_ms"] = kernel_ms(steps[vname], args.steps)
    return result


def kernel_ms(step, n: int) -> float:
    """The CUDA kernels' time of one ``step()`` (ms), summed by torch.profiler over ``n``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages()) / n / 1e3


def summary(result: dict) -> dict:
    """The best ge2jit variant against the best untouched one (step time, and kernel time),
    and peak memory of each kind's compiled variants."""
    ok = {k: v for k, v in result.items() if "median_ms" in v}
    hf = {k: v["median_ms"] for k, v in ok.items() if k.startswith("hf")}
    ours = {k: v["median_ms"] for k, v in ok.items() if k.startswith("ge2jit")}
    out = {}
    if hf and ours:
        best_hf, best_ours = min(hf, key=hf.get), min(ours, key=ours.get)
        out["best hf"], out["best ge2jit"] = best_hf, best_ours
        out["speedup"] = hf[best_hf] / ours[best_ours]
        kernels = {k: v["kernel_ms"] for k, v in ok.items() if "kernel_ms" in v}
        k_hf = [t for k, t in kernels.items() if k.startswith("hf")]
        k_ours = [t for k, t in kernels.items() if k.startswith("ge2jit")]
        if k_hf and k_ours:   # the GPU's work alone: the least kernel time of each kind
            out["kernel-time speedup"] = min(k_hf) / min(k_ours)
    if "hf eager" in ok and "ge2jit patch" in ok:
        out["patch / hf eager speedup"] = ok["hf eager"]["median_ms"] / ok["ge2jit patch"][
            "median_ms"]
    if "hf compile" in ok and "ge2jit compile" in ok:
        out["peak ge2jit compile / hf compile"] = ok["ge2jit compile"]["peak_gib"] / ok[
            "hf compile"]["peak_gib"]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    meta = device_meta()
    meta.update(commit=commit(), torch=torch.__version__)
    print(f"{meta['device']}, {meta['date']}, commit {meta['commit']}, torch {torch.__version__}")
    results = {"meta": meta, "runs": []}
    for name in args.models.split(","):
        spec = dict(MODELS[name])
        if args.quick:
            spec.update(QUICK)
        if args.batch:
            spec["batch"] = args.batch
        for dt in args.dtypes.split(","):
            print(f"{name} {dt} ({args.inputs} batch): {spec}", flush=True)
            res = run_model(name, spec, dt == "amp", args)
            run = {"model": name, "dtype": dt, "spec": spec, "inputs": args.inputs,
                   "variants": res,
                   "summary": summary(res)}
            results["runs"].append(run)
            print(f"{'variant':<24}{'median ms':>11}{'min ms':>9}{'kernel ms':>11}"
                  f"{'peak GiB':>10}{'loss':>10}")
            for vname, v in res.items():
                if "median_ms" in v:
                    print(f"{vname:<24}{v['median_ms']:>11.3f}{v['min_ms']:>9.3f}"
                          f"{v['kernel_ms']:>11.3f}{v['peak_gib']:>10.2f}{v['first_loss']:>10.5f}")
                else:
                    print(f"{vname:<24} {v['error'][:80]}")
            for k, v in run["summary"].items():
                print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
