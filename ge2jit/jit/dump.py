"""``GE2JIT_DUMP_DIR``: every kernel a process uses, written once as files a kernel engineer
reads, whether it was compiled now or found in the cache:

- ``<kernel>.<arch>.cu``: the rendered source NVRTC compiled;
- ``<kernel>.<arch>.ptx``: its PTX (compiled again for the virtual architecture, with the
  same options);
- ``<kernel>.<arch>.cubin``: the machine code that runs;
- ``<kernel>.<arch>.sass``: its disassembly (``cuobjdump``; where none is installed, the file
  says how to get one);
- ``<kernel>.<arch>.log``: NVRTC's options, its log (ptxas' registers, shared memory and
  spills) and the cache key.

Dumping costs a second compile (to PTX) per kernel and process: a debugging switch.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..errors import Ge2jitError

logger = logging.getLogger(__name__)

_done: set = set()
_lock = threading.Lock()


def dump_kernel(directory: Path, spec, arch: str, entry) -> Path | None:
    """Write ``spec``'s kernel for ``arch`` (its cache ``entry``) into ``directory``, once per
    process; the path of its source file, or None where it was written before. A failure to
    write is logged, not raised: the kernel still runs."""
    from . import nvrtc
    from .loader import key_for

    name = f"{spec.kernel_name}.{arch}"
    with _lock:
        if (directory, name) in _done:
            return None
        _done.add((directory, name))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _, source, options = key_for(spec, arch)
        def path(suffix: str) -> Path:
            return directory / f"{name}{suffix}"

        path(".cu").write_text(source)
        path(".cubin").write_bytes(entry.cubin)
        try:
            ptx = nvrtc.compile_to_ptx(source, spec.kernel_name, arch, spec.compile_options())
        except Ge2jitError as e:
            ptx = f"// no PTX: {e}\n"
        path(".ptx").write_text(ptx)
        path(".sass").write_text(_sass(entry.cubin))
        path(".log").write_text(
            f"kernel: {spec.kernel_name}\narch: {arch}\nspec: {spec!r}\n"
            f"options: {' '.join(options)}\ncache key: {entry.key}\n"
            f"registers: {entry.registers}, shared bytes: {entry.shared_bytes}, "
            f"spill stores: {entry.spill_stores}, spill loads: {entry.spill_loads}\n\n"
            f"{entry.log or ''}")
    except OSError as e:
        logger.warning("ge2jit: GE2JIT_DUMP_DIR: could not write %s into %s (%s)", name,
                       directory, e)
        return None
    return directory / f"{name}.cu"


def _sass(cubin: bytes) -> str:
    from .sass import dump_sass

    try:
        return dump_sass(cubin)
    except Ge2jitError as e:
        return f"// no SASS: {e}\n"
