"""The machine code (SASS) of a compiled kernel, through ``cuobjdump``; no GPU needed.

``cuobjdump`` (and the ``nvdisasm`` it runs) come from a CUDA toolkit or the
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (ge2jit's ``tools`` extra; the
``test`` extra has them too); ``cuda.pathfinder`` finds either.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import Ge2jitError, MissingDependencyError

#: where the disassemblers come from, for the error when one is missing
_INSTALL = ('pip install "ge2jit[tools]" (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm '
            'wheels) or install a CUDA toolkit')


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
    """The SASS listing of a cubin (``cuobjdump --dump-sass``).

    Raises:
        MissingDependencyError: cuobjdump or nvdisasm is not installed (the message says how
            to install them).
    """
    tool = tool or find_cuobjdump()
    if tool is None:
        raise MissingDependencyError(f"cuobjdump not found: {_INSTALL}")
    # cuobjdump runs nvdisasm for --dump-sass, looking on PATH; a toolkit has it alongside
    nvdisasm = _find("nvdisasm")
    beside = os.path.join(os.path.dirname(tool), "nvdisasm")
    if nvdisasm is None and os.path.isfile(beside):
        nvdisasm = beside
    if nvdisasm is None:
        raise MissingDependencyError(f"nvdisasm not found (cuobjdump needs it to print SASS): "
                                     f"{_INSTALL}")
    env = dict(os.environ)
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
