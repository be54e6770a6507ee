"""Optional dependencies: one clear error naming the pip extra when one is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

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
