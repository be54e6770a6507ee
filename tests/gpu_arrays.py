"""What the GPU tests of the ops share: the element types by name (bfloat16 is ml_dtypes'),
outputs poisoned with NaN before a call, copies to the host, and bitwise comparison.
Importing it skips the importing module where CuPy or ml_dtypes is missing."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")

BF16 = np.dtype(ml_dtypes.bfloat16)
#: the supported element types by name
DT = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}
DTYPES = list(DT)


def poisoned(shape, dtype):
    """A new GPU array of NaN (so that an element a kernel fails to write shows)."""
    return cp.full(shape, np.nan, dtype=np.float32).astype(dtype)


def host(a) -> np.ndarray:
    """A GPU array copied to the host; a host array as it is."""
    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


def same_bits(a, b) -> bool:
    """Whether two arrays (on the host or the GPU) hold the same bits (NaN included)."""
    a, b = np.ascontiguousarray(host(a)), np.ascontiguousarray(host(b))
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8),
                                                                        b.view(np.uint8))
