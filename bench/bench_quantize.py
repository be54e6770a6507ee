"""FP8 quantization (``ge2jit.quantize_fp8``) against PyTorch's own recipe.

    python bench/bench_quantize.py [--shapes 8192x4096,...] [--json F]

bfloat16 activations (tokens x features) to float8_e4m3fn with a dynamic scale, per tensor
(amax of the whole tensor, then the cast: x is read twice) and per row (one read where a
warp or block holds a row), and with a given scale (one read). PyTorch's recipe is
``s = x.abs().amax(...) / 448; (x * (1 / s)).clamp(-448, 448).to(float8_e4m3fn)``, eager and
under ``torch.compile`` (default mode). Every implementation of a row timed in turns in one
process (medians of batches); GB/s counts x read once and q written once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemm import commit, device_meta, import_torch, interleaved_ms  # noqa: E402

import ge2jit  # noqa: E402

SHAPES = "8192x4096,16384x8192,4096x14336,65536x1024"


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
    names = list(cases)
    ms = interleaved_ms([(cases[name], sets) for name in names])
    moved = m * n * 3
    return {"shape": [m, n], "ms": dict(zip(names, ms)),
            "gbs": {name: moved / t / 1e6 for name, t in zip(names, ms)}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch = import_torch()
    if torch is None:
        print("needs PyTorch (its recipe is the baseline)")
        return 1
    rows = []
    for text in args.shapes.split(","):
        m, n = (int(v) for v in text.split("x"))
        r = row(m, n, torch)
        rows.append(r)
        print(f"\n{m} x {n}")
        for name, t in r["ms"].items():
            print(f"  {name:28s} {t * 1e3:9.1f} us  {r['gbs'][name]:7.0f} GB/s")
    out = {"device": device_meta(), "commit": commit(), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
