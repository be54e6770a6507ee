"""Building ge2jit's C launch path (``_fastlaunch.c``) with the machine's C compiler: the
wheel's build hook and, where an install has no prebuilt module, ``ge2jit.jit.fastlaunch`` at
first use. Imports nothing of ge2jit (the build hook runs this file by its path)."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sysconfig
from pathlib import Path

#: the C source of the module ``ge2jit.jit._fastlaunch``
SOURCE = Path(__file__).with_name("_fastlaunch.c")


def source_hash() -> str:
    """16 hex digits of the source and the interpreter it is built for."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    return h.hexdigest()[:16]


def compiler_command(output: Path) -> list[str]:
    """The command that builds the module into ``output``: the compiler Python was built
    with (``CC``, else ``cc``), Python's headers, no CUDA (the driver is opened at run
    time)."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    return [*cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{include}",
            str(SOURCE), "-o", str(output), "-ldl"]


def build(output: Path, timeout: float = 180) -> None:
    """Build the module into ``output`` (written beside it, then renamed into place: a reader
    never sees half a file).

    Raises:
        RuntimeError: one line saying why (no compiler, no Python headers, the compiler's
            last error line).
    """
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise RuntimeError(f"Python's headers are not installed (no {include / 'Python.h'}; "
                           "on Debian/Ubuntu: the python3-dev package)")
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    command = compiler_command(partial)
    try:
        r = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise RuntimeError(f"no C compiler: {command[0]!r} was not found (set CC)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the C compiler ran past {timeout:.0f} s") from None
    if r.returncode != 0:
        partial.unlink(missing_ok=True)
        errors = [line for line in r.stderr.splitlines() if "error" in line] or \
            r.stderr.strip().splitlines()[-1:] or [f"exit status {r.returncode}"]
        raise RuntimeError(f"the C compiler failed: {errors[0].strip()}")
    os.replace(partial, output)
