"""Optional dependencies: one clear error naming the pip extra when one is missing."""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import ModuleType

from .errors import ArgumentTypeError, ArgumentValueError, MissingDependencyError, NvrtcError

CUPY_MISSING = ('cupy is not installed; install ge2jit with a CUDA extra: pip install '
                '"ge2jit[cuda13]" (CUDA 13 drivers) or "ge2jit[cuda12]" (CUDA 12 drivers)')


def require_cupy(module: str = "cupy") -> ModuleType:
    """``import module`` (``cupy`` or one of CuPy's modules, e.g.
    ``cupy_backends.cuda.libs.nvrtc``).

    Raises:
        MissingDependencyError: CuPy is not installed (the message names the extras).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        # Only CuPy itself missing; an installed CuPy that fails to import says why itself.
        if (e.name or "").split(".")[0] in ("cupy", "cupy_backends"):
            raise MissingDependencyError(CUPY_MISSING) from None
        raise


@contextlib.contextmanager
def script_errors(prog: str, needs: str = "", *, as_script: bool = True):
    """For command-line scripts (``python -m ge2jit.demo``, the examples): a setup problem
    raised inside is one line on stderr, ``prog: ...``, and exit status 2, not a traceback.
    Setup problems: a package that cannot be imported (``needs``: what the script needs, for
    the message; ge2jit's MissingDependencyError names its pip extra itself), NVRTC missing,
    and ge2jit's errors for what was given (an option, a ``GE2JIT_*`` variable).

    ``as_script`` False (the script imported as a module, by a test): the errors go on.
    """
    try:
        yield
    except (ImportError, ArgumentValueError, ArgumentTypeError, NvrtcError) as e:
        if not as_script:
            raise
        message = str(e)
        if isinstance(e, ImportError) and not isinstance(e, MissingDependencyError):
            message = f"cannot import {e.name or e} ({e})" + (f"; it needs {needs}" if needs
                                                               else "")
        print(f"{prog}: {message}", file=sys.stderr)
        raise SystemExit(2) from None
