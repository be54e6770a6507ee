"""The element types ge2jit's kernels read and write, shared by every op."""

from __future__ import annotations

from enum import Enum

import numpy as np

from ..errors import ArgumentValueError


class DType(Enum):
    """Element type of an operand or output as it is stored in memory."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.F32 else 2

    @property
    def ctype(self) -> str:
        """The type the kernel templates use for it (``common/types.cuh``)."""
        return {"f32": "float", "f16": "f16_t", "bf16": "bf16_t"}[self.value]

    @property
    def numpy_name(self) -> str:
        return {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[self.value]


#: numpy dtype name -> DType (bfloat16 is ml_dtypes.bfloat16, which CuPy 14 uses)
SUPPORTED_DTYPES = {"float32": DType.F32, "float16": DType.F16, "bfloat16": DType.BF16}
SUPPORTED_TEXT = ", ".join(SUPPORTED_DTYPES)


def dtype_name(x) -> str | None:
    """'float32' for 'float32', numpy.float32, cupy.float32, numpy.dtype('float32'),
    ml_dtypes.bfloat16, ...; None when ``x`` names no dtype."""
    if isinstance(x, str):
        return x
    try:
        return np.dtype(x).name
    except TypeError:
        return None


def as_dtype(dtype, name: str = "dtype") -> DType:
    """A DType from a DType or a dtype name or object ('float32', numpy.float16,
    ml_dtypes.bfloat16, ...); one line naming ``name`` for anything else."""
    if isinstance(dtype, DType):
        return dtype
    dt = SUPPORTED_DTYPES.get(dtype if isinstance(dtype, str) else getattr(dtype, "name", ""))
    if dt is None:
        dt = SUPPORTED_DTYPES.get(dtype_name(dtype) or "")
    if dt is None:
        raise ArgumentValueError(f"{name}: expected one of {SUPPORTED_TEXT}, got {dtype!r}")
    return dt
