"""Instruction mix of compiled kernels, from their SASS (cuobjdump --dump-sass; no GPU needed).

    python bench/sass_check.py [--arch sm_90a]

Compiles one kernel of each tensor-core family and counts the instructions that tell which
path it is on: HGMMA (Hopper warpgroup MMA), HMMA (mma.sync), UTMALDG (TMA loads), LDSM
(ldmatrix), FFMA, FADD (the rounded adds of 3xTF32), and local-memory traffic (LDL/STL).
Needs cuobjdump and nvdisasm (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels of the
test extra, or a CUDA toolkit).
"""

from __future__ import annotations

import argparse
import sys

from common import ROOT  # noqa: F401 - the checkout's ge2jit on the path

from ge2jit.jit.loader import build
from ge2jit.jit.sass import dump_sass, find_cuobjdump, instruction_mix
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    MMA_X3_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_X3_CONFIGS,
    DType,
    MmaGemmSpec,
    WgmmaGemmSpec,
)

#: no GPU work here (it compiles, on the CPU): no --quick (tests/test_bench_scripts.py)
RUNS_ON_GPU = False

OPS = ("HGMMA", "HMMA", "UTMALDG", "LDSM", "FFMA", "FADD", "LDL", "STL", "BAR", "SYNCS")


def _epilogue(dtype: DType, act: Act) -> Epilogue:
    """Y and a bias per column in the inputs' type."""
    return Epilogue(out_dtype=dtype, act=act, bias=BiasKind.COL, bias_dtype=dtype)


SPECS = [
    WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL, _epilogue(DType.BF16, Act.GELU_TANH),
                  WGMMA_CONFIGS[0]),
    WgmmaGemmSpec(DType.F16, Layout.COL, Layout.ROW, _epilogue(DType.F16, Act.SILU),
                  WGMMA_CONFIGS[1]),
    WgmmaGemmSpec(DType.F32, Layout.ROW, Layout.COL, _epilogue(DType.F32, Act.GELU),
                  WGMMA_CONFIGS[1]),
    WgmmaGemmSpec(DType.F32, Layout.ROW, Layout.COL, _epilogue(DType.F32, Act.GELU),
                  WGMMA_X3_CONFIGS[0], promote=True),
    MmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL, _epilogue(DType.BF16, Act.GELU_TANH),
                MMA_16BIT_CONFIGS[0]),
    MmaGemmSpec(DType.F32, Layout.ROW, Layout.COL, _epilogue(DType.F32, Act.GELU),
                MMA_X3_CONFIGS[0], promote=True),
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="sm_90a")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    tool = find_cuobjdump()
    if tool is None:
        print("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
        return 1
    for spec in SPECS:
        arch = args.arch if isinstance(spec, WgmmaGemmSpec) else args.arch.rstrip("a")
        entry, _ = build(spec, arch)
        counts = instruction_mix(dump_sass(entry.cubin, tool))
        print(f"{spec.kernel_name} ({arch}, {entry.registers} registers): "
              + ", ".join(f"{k} {counts[k]}" for k in OPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
