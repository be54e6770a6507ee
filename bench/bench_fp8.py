"""8-bit GEMMs with fused epilogues against cuBLASLt (``torch._scaled_mm``).

    python bench/bench_fp8.py [--shapes 4096x4096x4096,...] [--json F] [--quick]

float8_e4m3fn inputs, A row-major (M, K), the weight as PyTorch lays it out ((N, K), read as
``w.T``: K-major, as both kernels want), bfloat16 bias. Per shape, every implementation timed
in turns in one process (medians of batches):

- ge2jit ``gemm_bias_act`` with bias + GELU (erf) and per-tensor scales (device scalars):
  float32 sums every 128 of K (the default, as ``torch._scaled_mm`` without fast
  accumulation) and ``precision="fast_accum"``; per-row and per-column scales; the ReLU,
  SiLU, sigmoid and tanh epilogues; an 8-bit output with its scale and the amax;
- ``torch._scaled_mm`` with its bias (both accumulation modes), then followed by PyTorch's
  GELU (the pass the fused epilogue saves), and with row-wise scales;
- the bfloat16 GEMM with the same epilogue by ge2jit, for the factor 8 bits buy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import commit, device_meta, import_torch, parse_with_shapes, timed_row

import ge2jit

SHAPES = "4096x4096x4096,8192x8192x8192,8192x16384x4096"
QUICK_SHAPES = "4096x4096x4096"


def row(m, n, k, torch) -> dict:
    F = torch.nn.functional
    sets = []
    for _ in range(2):
        a = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        sa = torch.tensor(0.7, device="cuda")
        sb = torch.tensor(1.3, device="cuda")
        ra = torch.rand(m, 1, device="cuda") + 0.5
        rb = torch.rand(1, n, device="cuda") + 0.5
        a16, w16 = a.to(torch.bfloat16), w.to(torch.bfloat16)
        amax = torch.zeros(1, device="cuda")
        sets.append((a, w, bias, sa, sb, ra, rb, a16, w16, amax))
    cases = {
        "ge2jit bias+gelu": lambda a, w, bias, sa, sb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="gelu", scale_a=sa, scale_b=sb),
        "ge2jit bias+gelu fast_accum": lambda a, w, bias, sa, sb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="gelu", scale_a=sa, scale_b=sb, precision="fast_accum"),
        "ge2jit bias+gelu row-wise": lambda a, w, bias, sa, sb, ra, rb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="gelu", scale_a=ra, scale_b=rb),
        "ge2jit bias+relu": lambda a, w, bias, sa, sb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="relu", scale_a=sa, scale_b=sb),
        "ge2jit bias+silu": lambda a, w, bias, sa, sb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="silu", scale_a=sa, scale_b=sb),
        "ge2jit bias+sigmoid": lambda a, w, bias, sa, sb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="sigmoid", scale_a=sa, scale_b=sb),
        "ge2jit bias+tanh": lambda a, w, bias, sa, sb, *_: ge2jit.gemm_bias_act(
            a, w.t(), bias, act="tanh", scale_a=sa, scale_b=sb),
        "ge2jit bias+gelu e4m3 out + amax": lambda a, w, bias, sa, sb, ra, rb, a16, w16, amax:
            ge2jit.gemm_bias_act(a, w.t(), bias, act="gelu", scale_a=sa, scale_b=sb,
                                 out_dtype="float8_e4m3fn", scale_y=sb, amax_out=amax),
        "torch._scaled_mm bias": lambda a, w, bias, sa, sb, *_: torch._scaled_mm(
            a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16),
        "torch._scaled_mm bias fast_accum": lambda a, w, bias, sa, sb, *_: torch._scaled_mm(
            a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=True),
        "torch._scaled_mm bias, then gelu": lambda a, w, bias, sa, sb, *_: F.gelu(
            torch._scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16)),
        "torch._scaled_mm row-wise": lambda a, w, bias, sa, sb, ra, rb, *_: torch._scaled_mm(
            a, w.t(), ra, rb, out_dtype=torch.bfloat16),
        "ge2jit bf16 bias+gelu": lambda a, w, bias, sa, sb, ra, rb, a16, w16, amax:
            ge2jit.gemm_bias_act(a16, w16.t(), bias, act="gelu"),
    }
    return timed_row((m, n, k), cases, sets, 2.0 * m * n * k)


def parse_args(argv=None) -> argparse.Namespace:
    """The options; ``shapes`` as a list of (M, N, K)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    return parse_with_shapes(parser, argv, SHAPES, QUICK_SHAPES)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = import_torch()
    if torch is None:
        print("needs PyTorch (torch._scaled_mm is the baseline)")
        return 1
    rows = []
    for m, n, k in args.shapes:
        r = row(m, n, k, torch)
        rows.append(r)
        print(f"\n{m} x {n} x {k}")
        for name, t in r["ms"].items():
            print(f"  {name:38s} {t * 1e3:9.1f} us  {r['tflops'][name]:7.0f} TFLOP/s")
    out = {"device": device_meta(), "commit": commit(), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
