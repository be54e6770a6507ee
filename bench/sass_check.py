"""Instruction mix of compiled kernels, from their SASS (cuobjdump --dump-sass).

    python bench/sass_check.py [--arch sm_90a]

Compiles one kernel of each tensor-core family and counts the instructions that tell which
path it is on: HGMMA (Hopper warpgroup MMA), HMMA (mma.sync), UTMALDG (TMA loads), FFMA, and
local-memory traffic (LDL/STL). Needs cuobjdump: on PATH, in a CUDA toolkit, or from the
nvidia-cuda-cuobjdump wheel.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ge2jit.jit.loader import build  # noqa: E402
from ge2jit.ops.gemm.spec import (  # noqa: E402
    MMA_16BIT_CONFIGS,
    WGMMA_CONFIGS,
    Act,
    BiasKind,
    DType,
    Layout,
    MmaGemmSpec,
    WgmmaGemmSpec,
)

OPS = ("HGMMA", "HMMA", "UTMALDG", "LDSM", "FFMA", "LDL", "STL", "BAR", "SYNCS")


def cuobjdump() -> str | None:
    for cand in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if cand and Path(cand).exists():
            return cand
    try:
        from cuda import pathfinder

        return pathfinder.find_nvidia_binary_utility("cuobjdump")
    except Exception:  # noqa: BLE001 - not installed
        return None


def mix(cubin: bytes, tool: str) -> tuple[collections.Counter, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True)
    ops = collections.Counter(m.split(".")[0] for m in re.findall(r"\b([A-Z][A-Z0-9]+)[.\s]",
                                                                    out.stdout))
    return collections.Counter({k: ops[k] for k in OPS}), out.stderr.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="sm_90a")
    args = parser.parse_args()
    tool = cuobjdump()
    if tool is None:
        print("cuobjdump not found")
        return 1
    specs = [
        WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL, None, Act.GELU_TANH, BiasKind.COL,
                      False, WGMMA_CONFIGS[0]),
        WgmmaGemmSpec(DType.F16, Layout.COL, Layout.ROW, None, Act.SILU, BiasKind.COL, False,
                      WGMMA_CONFIGS[1]),
        MmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL, None, Act.GELU_TANH, BiasKind.COL,
                    False, MMA_16BIT_CONFIGS[0]),
    ]
    for spec in specs:
        arch = args.arch if isinstance(spec, WgmmaGemmSpec) else args.arch.rstrip("a")
        entry, _ = build(spec, arch)
        counts, err = mix(entry.cubin, tool)
        print(f"{spec.kernel_name} ({arch}, {entry.registers} registers): "
              + ", ".join(f"{k} {v}" for k, v in counts.items()) + (f"  [{err}]" if err else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
