"""The float64 NumPy references of softmax and its backward, for checking results (tests,
benchmarks, notebooks)."""

from __future__ import annotations

import numpy as np


def softmax_ref(x, axis: int = -1) -> np.ndarray:
    """``e / sum(e)`` with ``e = exp(x - max(x))`` along ``axis``, in float64 (a vector holding
    +inf or NaN, or only -inf, is NaN)."""
    x = np.asarray(x).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def softmax_backward_ref(dy, y, axis: int = -1) -> np.ndarray:
    """``y * (dy - sum(dy * y))`` along ``axis``, in float64: the gradient with respect to the
    softmax's input, ``y`` being its output and ``dy`` the gradient with respect to ``y``."""
    dy = np.asarray(dy).astype(np.float64)
    y = np.asarray(y).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))
