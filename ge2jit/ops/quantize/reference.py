"""The float32 host reference of ``quantize_fp8`` (NumPy and ml_dtypes): what the kernels
compute, bit for bit."""

from __future__ import annotations

import numpy as np

from ...runtime.dtypes import as_fp8


def amax(x: np.ndarray, axis=None) -> np.ndarray:
    """max |x| in float32 (NaN where x holds one)."""
    a = np.abs(np.asarray(x, dtype=np.float32))
    if a.size == 0:
        return np.zeros(() if axis is None else a.shape[:-1], np.float32)
    return np.max(a, axis=axis).astype(np.float32)


def dynamic_scale(a: np.ndarray, fmt) -> np.ndarray:
    """amax / the format's largest value, in float32 (1 where amax is 0)."""
    largest = np.float32(as_fp8(fmt).largest)
    a = np.asarray(a, np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(a == 0, np.float32(1), a / largest).astype(np.float32)


def quantize(x: np.ndarray, scale, fmt) -> np.ndarray:
    """x * (1 / scale) in float32 (``scale`` broadcast over the rows' last axis; a host
    number's reciprocal is taken in float64, then rounded), rounded to the format with
    saturation (NaN stays NaN), as the format's ml_dtypes type."""
    dt = as_fp8(fmt)
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if isinstance(scale, (int, float)):
            inv = np.float32(1.0 / scale)
        else:
            inv = np.float32(1) / np.asarray(scale, dtype=np.float32)
            if inv.ndim:
                inv = inv[..., None]
        v = x32 * inv
    v = np.where(np.isnan(v), v, np.clip(v, -dt.largest, dt.largest)).astype(np.float32)
    return v.astype(dt.numpy_dtype)


def quantize_fp8(x: np.ndarray, fmt="e4m3", scale=None, per_row: bool = False):
    """(q, scale) as ``ge2jit.quantize_fp8`` returns them, on the host."""
    if scale is None:
        scale = dynamic_scale(amax(x, -1 if per_row else None), fmt)
    return quantize(x, scale, fmt), scale
