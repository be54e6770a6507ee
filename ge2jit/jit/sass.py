"""The machine code (SASS) of a compiled kernel, through ``cuobjdump``; no GPU needed.

``cuobjdump`` (and the ``nvdisasm`` it runs) come from a CUDA toolkit or the
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (in ge2jit's ``test`` extra);
``cuda.pathfinder`` finds either.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import Ge2jitError


def _find(utility: str) -> str | None:
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_binary_utility(utility)
        if found:
            return str(found)
    except Exception:  # noqa: BLE001 - pathfinder missing or too old: look on PATH
        pass
    for cand in (shutil.which(utility), f"/usr/local/cuda/bin/{utility}"):
        if cand and Path(cand).is_file():
            return cand
    return None


def find_cuobjdump() -> str | None:
    """The path of ``cuobjdump``, or None."""
    return _find("cuobjdump")


def dump_sass(cubin: bytes, tool: str | None = None) -> str:
    """The SASS listing of a cubin (``cuobjdump --dump-sass``)."""
    tool = tool or find_cuobjdump()
    if tool is None:
        raise Ge2jitError("cuobjdump not found: install nvidia-cuda-cuobjdump (pip) or a CUDA "
                          "toolkit")
    env = dict(os.environ)
    nvdisasm = _find("nvdisasm")   # cuobjdump runs it for --dump-sass, looking on PATH
    if nvdisasm:
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True,
                             env=env)
    if out.returncode != 0 or "Function" not in out.stdout:
        raise Ge2jitError(f"cuobjdump could not read the cubin: {out.stderr.strip()}")
    return out.stdout


def instruction_mix(sass: str) -> collections.Counter:
    """Count of each opcode (``HGMMA``, ``LDL``, ...; modifiers dropped) in a SASS listing."""
    return collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)",
                                          sass))
