"""FP8 quantization (``ge2jit.quantize_fp8``) against PyTorch's own recipe.

    python bench/bench_quantize.py [--shapes 8192x4096,...] [--linears MxNxK,...] [--json F]
                                   [--quick]

bfloat16 activations (tokens x features) to float8_e4m3fn with a dynamic scale, per tensor
(amax of the whole tensor, then the cast: x is read twice) and per row (one read where a
warp or block holds a row), and with a given scale (one read). PyTorch's recipe is
``s = x.abs().amax(...) / 448; (x * (1 / s)).clamp(-448, 448).to(float8_e4m3fn)``, eager and
under ``torch.compile`` (default mode). GB/s counts x read once and q written once.

Then an inference Linear's forward with bias + GELU (``linear_row``): ge2jit's ``Linear`` in
bfloat16 and in FP8 (``fp8="e4m3"``), PyTorch's, and the FP8 recipe on cuBLASLt. Every
implementation of a row timed in turns in one process (medians of batches).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import add_quick, commit, device_meta, import_torch, parse_shapes, timed_row

import ge2jit

SHAPES = "8192x4096,16384x8192,4096x14336,65536x1024"
#: --quick: one quantized shape, one Linear
QUICK_SHAPES, QUICK_LINEARS = "8192x4096", "8192x4096x4096"


def torch_recipe(torch, per_row: bool):
    fp8 = torch.float8_e4m3fn

    def quantize(x):
        a = x.float().abs().amax(dim=-1, keepdim=True) if per_row else x.float().abs().amax()
        s = torch.where(a == 0, torch.ones_like(a), a / 448.0)
        return (x.float() * (1.0 / s)).clamp(-448.0, 448.0).to(fp8), s
    return quantize


def row(m, n, torch) -> dict:
    sets = [(torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3,) for _ in range(2)]
    eager_t, eager_r = torch_recipe(torch, False), torch_recipe(torch, True)
    comp_t, comp_r = torch.compile(eager_t), torch.compile(eager_r)
    cases = {
        "ge2jit per-tensor": lambda x: ge2jit.quantize_fp8(x),
        "ge2jit per-row": lambda x: ge2jit.quantize_fp8(x, per_row=True),
        "ge2jit given scale": lambda x: ge2jit.quantize_fp8(x, scale=0.05),
        "torch per-tensor": eager_t,
        "torch per-row": eager_r,
        "torch.compile per-tensor": comp_t,
        "torch.compile per-row": comp_r,
    }
    return timed_row((m, n), cases, sets, m * n * 3, "gbs")


LINEARS = "8192x4096x4096,16384x8192x8192,8192x14336x4096"


def linear_row(m, n, k, torch) -> dict:
    """An inference Linear's forward (tokens m, in k, out n, bias + GELU, bfloat16 in and
    out): ge2jit's in bfloat16 and FP8 (per-token activations, the weight quantized once and
    kept), PyTorch's (nn.Linear + GELU) and the FP8 recipe on cuBLASLt (the activations
    quantized by torch.compile, ``torch._scaled_mm`` with row-wise scales, then GELU)."""
    import ge2jit.torch as gt

    F = torch.nn.functional
    with torch.no_grad():
        ours = gt.Linear(k, n, act="gelu", device="cuda", dtype=torch.bfloat16)
        ours8 = gt.Linear(k, n, act="gelu", fp8="e4m3", device="cuda", dtype=torch.bfloat16)
        ours8.load_state_dict(ours.state_dict())
        ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        ref.load_state_dict(ours.state_dict())
        qw, sw = gt.quantize_fp8(ours.weight, "e4m3", per_row=True)
        quant = torch.compile(torch_recipe(torch, True))

        def scaled(x):
            qx, sx = quant(x)
            return F.gelu(torch._scaled_mm(qx, qw.t(), sx, sw[None, :], bias=ours.bias,
                                           out_dtype=torch.bfloat16))

        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),) for _ in range(2)]
        try:
            scaled(sets[0][0])
        except RuntimeError:      # no bias with row-wise scales in this PyTorch: added after

            def scaled(x):
                qx, sx = quant(x)
                return F.gelu(torch._scaled_mm(qx, qw.t(), sx, sw[None, :],
                                               out_dtype=torch.bfloat16) + ours.bias)
        cases = {"ge2jit Linear bf16": ours, "ge2jit Linear fp8": ours8,
                 "torch nn.Linear + gelu": lambda x: F.gelu(ref(x)),
                 "torch.compile quantize + _scaled_mm + gelu": scaled}
        return timed_row((m, n, k), cases, sets, 2.0 * m * n * k)


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked: ``shapes`` as a list of (M, N), ``linears`` of (M, N, K)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help=f"MxN,... (default {SHAPES})")
    parser.add_argument("--linears", default=None,
                        help=f"tokens x out x in of the Linear rows ('' for none; default "
                             f"{LINEARS})")
    parser.add_argument("--json", default=None)
    add_quick(parser, f"shapes {QUICK_SHAPES}, linears {QUICK_LINEARS}")
    args = parser.parse_args(argv)
    text = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    try:
        args.shapes = [tuple(int(v) for v in s.split("x")) for s in text.split(",")]
        assert all(len(s) == 2 for s in args.shapes)
    except (ValueError, AssertionError):
        parser.error(f"--shapes: expected MxN,... got {text!r}")
    if args.linears is None:
        args.linears = QUICK_LINEARS if args.quick else LINEARS
    args.linears = parse_shapes(parser, args.linears) if args.linears else []
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = import_torch()
    if torch is None:
        print("needs PyTorch (its recipe is the baseline)")
        return 1
    rows = []
    for m, n in args.shapes:
        r = row(m, n, torch)
        rows.append(r)
        print(f"\n{m} x {n}")
        for name, t in r["ms"].items():
            print(f"  {name:28s} {t * 1e3:9.1f} us  {r['gbs'][name]:7.0f} GB/s")
    linears = []
    for m, n, k in args.linears:
        r = linear_row(m, n, k, torch)
        linears.append(r)
        print(f"\nLinear: {m} tokens, {k} -> {n}, bias + gelu")
        for name, t in r["ms"].items():
            print(f"  {name:44s} {t * 1e3:9.1f} us  {r['tflops'][name]:7.0f} TFLOP/s")
    out = {"device": device_meta(), "commit": commit(), "rows": rows, "linears": linears}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
