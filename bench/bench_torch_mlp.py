"""A GPT-style MLP block (Linear d -> 4d, GELU-tanh, Linear 4d -> d), forward + backward, in
PyTorch: ge2jit.torch.MLP against PyTorch eager, torch.compile and torch.compile
reduce-overhead, every implementation timed in turns (CUDA events around batches, medians).

    python bench/bench_torch_mlp.py [--d 1024] [--tokens 512,4096,16384] [--dtype bfloat16]
                                    [--json PATH]

float32 runs at ``torch.get_float32_matmul_precision()`` ``--precision`` (default "highest"
for PyTorch and "high" for ge2jit, i.e. 3xTF32 against exact float32, the issue's comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import ge2jit.torch as gt


def _timed(cases, rounds=15, batch=10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for fn in cases.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            start.record()
            for _ in range(batch):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / batch)
    return {k: statistics.median(v) for k, v in times.items()}


def row(tokens, d, dtype, ge2jit_precision):
    torch.manual_seed(0)
    ours = gt.MLP([d, 4 * d, d], act="gelu_tanh", device="cuda", dtype=dtype,
                  precision=ge2jit_precision)
    ref = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(4 * d, d)).to("cuda", dtype)
    x = torch.randn(tokens, d, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(tokens, d, device="cuda", dtype=dtype)
    compiled = torch.compile(ref)
    graphs = torch.compile(ref, mode="reduce-overhead")

    def step(model):
        def run():
            model(x).backward(gy)
        return run

    cases = {"ge2jit.torch.MLP": step(ours), "torch eager": step(ref),
             "torch.compile": step(compiled), "torch.compile reduce-overhead": step(graphs)}
    return _timed(cases)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--tokens", default="512,4096,16384")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--precision", default="highest", help="PyTorch's float32 matmul precision")
    ap.add_argument("--ge2jit-precision", default=None,
                    help="ge2jit's float32 precision (default: tf32x3)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.set_float32_matmul_precision(args.precision)
    ours_precision = args.ge2jit_precision or ("tf32x3" if dtype == torch.float32 else None)
    rows = []
    print(f"| tokens | {' | '.join(['ge2jit.torch.MLP', 'eager', 'compile', 'reduce-overhead'])}"
          " | vs best |\n|---|---|---|---|---|---|")
    for tokens in (int(t) for t in args.tokens.split(",")):
        t = row(tokens, args.d, dtype, ours_precision)
        best = min(v for k, v in t.items() if not k.startswith("ge2jit"))
        ours = t["ge2jit.torch.MLP"]
        rows.append({"tokens": tokens, **t})
        print(f"| {tokens} | " + " | ".join(f"{v:.3f}" for v in t.values())
              + f" | {best / ours:.2f}x |", flush=True)
    if args.json:
        doc = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
               "commit": os.environ.get("GE2JIT_COMMIT", ""), "d": args.d,
               "dtype": args.dtype, "torch": torch.__version__, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
