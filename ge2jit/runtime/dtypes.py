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
    #: 8-bit floats (``FP8_DTYPES``: the ops that read them say so)
    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @property
    def itemsize(self) -> int:
        return {"f32": 4, "f16": 2, "bf16": 2}.get(self.value, 1)

    @property
    def is_fp8(self) -> bool:
        return self.itemsize == 1

    @property
    def ctype(self) -> str:
        """The type the kernel templates use for it (``common/types.cuh``)."""
        return {"f32": "float", "f16": "f16_t", "bf16": "bf16_t", "e4m3": "e4m3_t",
                "e5m2": "e5m2_t"}[self.value]

    @property
    def numpy_name(self) -> str:
        """Its NumPy name (``ml_dtypes`` registers bfloat16 and the 8-bit formats)."""
        return {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
                "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[self.value]

    @property
    def numpy_dtype(self) -> np.dtype:
        if self.value in ("f32", "f16"):
            return np.dtype(self.numpy_name)
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self.numpy_name))

    @property
    def largest(self) -> float:
        """The largest finite value."""
        return {"f32": 3.4028234663852886e38, "f16": 65504.0, "bf16": 3.3895313892515355e38,
                "e4m3": 448.0, "e5m2": 57344.0}[self.value]


#: numpy dtype name -> DType (bfloat16 is ml_dtypes.bfloat16, which CuPy 14 uses)
SUPPORTED_DTYPES = {"float32": DType.F32, "float16": DType.F16, "bfloat16": DType.BF16}
SUPPORTED_TEXT = ", ".join(SUPPORTED_DTYPES)
#: the 32- and 16-bit types, which every op reads
FLOAT_DTYPES = tuple(SUPPORTED_DTYPES.values())
#: numpy dtype name -> the 8-bit float formats (ml_dtypes' names, PyTorch's without "torch.")
FP8_DTYPES = {"float8_e4m3fn": DType.E4M3, "float8_e5m2": DType.E5M2}
FP8_TEXT = " or ".join(FP8_DTYPES)


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


#: the short names of the 8-bit formats
FP8_SHORT = {"e4m3": DType.E4M3, "e5m2": DType.E5M2}


def as_fp8(fmt, name: str = "fmt") -> DType:
    """An 8-bit format from 'e4m3' or 'e5m2', its NumPy or PyTorch name or dtype
    ('float8_e4m3fn', ml_dtypes.float8_e5m2, torch.float8_e4m3fn, ...) or a DType; one line
    naming ``name`` for anything else."""
    if isinstance(fmt, DType) and fmt.is_fp8:
        return fmt
    text = fmt if isinstance(fmt, str) else dtype_name(fmt) or str(fmt)
    text = text.removeprefix("torch.")
    dt = FP8_SHORT.get(text) or FP8_DTYPES.get(text)
    if dt is None:
        raise ArgumentValueError(f"{name}: expected 'e4m3' or 'e5m2' (or {FP8_TEXT}), got "
                                 f"{fmt!r}")
    return dt
