"""The float64 NumPy reference of rms_norm and layer_norm, forward and backward, for checking
results (tests, notebooks). Host arrays in, float64 results out, except h, which is rounded
as the kernels round it."""

from __future__ import annotations

import numpy as np


def residual_sum(x, residual=None, h_dtype=None) -> np.ndarray:
    """h as the kernels make it: x, or ``x + residual`` added in float32 and rounded to
    ``h_dtype`` (default the residual's type)."""
    if residual is None:
        return np.asarray(x)
    dtype = np.dtype(h_dtype) if h_dtype is not None else np.asarray(residual).dtype
    s = np.asarray(x).astype(np.float32) + np.asarray(residual).astype(np.float32)
    return s.astype(dtype)


def _stats(h64: np.ndarray, eps: float, layer: bool):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        n = h64.shape[-1]
        if layer:
            mean = h64.sum(axis=-1, keepdims=True) / n
            var = ((h64 - mean) ** 2).sum(axis=-1, keepdims=True) / n
        else:
            mean = np.zeros(h64.shape[:-1] + (1,))
            var = (h64 * h64).sum(axis=-1, keepdims=True) / n
        return mean, 1.0 / np.sqrt(var + eps)


def _affine(u, weight, bias):
    if weight is not None:
        u = u * np.asarray(weight, np.float64)
    if bias is not None:
        u = u + np.asarray(bias, np.float64)
    return u


def rms_norm_ref(x, weight=None, *, eps: float = 1e-6, residual=None, h_dtype=None):
    """(y, h, rstd): y in float64, h as stored, rstd per row (float64, x's leading shape)."""
    h = residual_sum(x, residual, h_dtype)
    h64 = np.asarray(h, np.float64)
    _, rstd = _stats(h64, eps, False)
    with np.errstate(invalid="ignore", over="ignore"):
        y = _affine(h64 * rstd, weight, None)
    return y, h, rstd[..., 0]


def layer_norm_ref(x, weight=None, bias=None, *, eps: float = 1e-5, residual=None,
                   h_dtype=None):
    """(y, h, mean, rstd), as ``rms_norm_ref`` with the per-row mean."""
    h = residual_sum(x, residual, h_dtype)
    h64 = np.asarray(h, np.float64)
    mean, rstd = _stats(h64, eps, True)
    with np.errstate(invalid="ignore", over="ignore"):
        y = _affine((h64 - mean) * rstd, weight, bias)
    return y, h, mean[..., 0], rstd[..., 0]


def _backward(dy, h, weight, eps, dh, layer: bool):
    h64, dy64 = np.asarray(h, np.float64), np.asarray(dy, np.float64)
    mean, rstd = _stats(h64, eps, layer)
    with np.errstate(invalid="ignore", over="ignore"):
        xhat = (h64 - mean) * rstd
        g = dy64 * np.asarray(weight, np.float64) if weight is not None else dy64
        c1 = (g * xhat).mean(axis=-1, keepdims=True)
        c2 = g.mean(axis=-1, keepdims=True) if layer else 0.0
        dx = rstd * (g - c2 - xhat * c1)
        if dh is not None:
            dx = dx + np.asarray(dh, np.float64)
        rows = tuple(range(dy64.ndim - 1))
        dweight = (dy64 * xhat).sum(axis=rows) if weight is not None else None
        dbias = dy64.sum(axis=rows)
    return dx, dweight, dbias


def rms_norm_backward_ref(dy, h, weight=None, *, eps: float = 1e-6, dh=None):
    """(dx, dweight) in float64: the gradients of ``sum(dy * rms_norm(h)) + sum(dh * h)`` with
    respect to h and the weight (None without one)."""
    dx, dweight, _ = _backward(dy, h, weight, eps, dh, False)
    return dx, dweight


def layer_norm_backward_ref(dy, h, weight=None, *, eps: float = 1e-5, dh=None):
    """(dx, dweight, dbias) in float64, as ``rms_norm_backward_ref`` (dbias: the sum of dy over
    the rows)."""
    return _backward(dy, h, weight, eps, dh, True)
