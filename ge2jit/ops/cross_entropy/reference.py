"""The float64 NumPy reference of cross_entropy: the loss with PyTorch's semantics
(``torch.nn.functional.cross_entropy`` with class indices, ``ignore_index``, ``reduction`` and
``label_smoothing``) and its gradient with respect to the logits, for checking results
(tests, benchmarks, notebooks)."""

from __future__ import annotations

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(x, axis=1, keepdims=True)
        return x - m - np.log(np.sum(np.exp(x - m), axis=1, keepdims=True))


def row_losses(logits, targets, ignore_index: int = -100, label_smoothing: float = 0.0
               ) -> np.ndarray:
    """The loss of each row, float64: ``(1 - e) * -log_softmax(x)[t] + e * mean_j
    -log_softmax(x)[j]`` (``e`` the label smoothing), 0 where ``t`` is ``ignore_index``, NaN
    where ``t`` is outside [0, V) otherwise (PyTorch raises there)."""
    x = np.asarray(logits).astype(np.float64)
    t = np.asarray(targets).astype(np.int64)
    rows, classes = x.shape
    ls = _log_softmax(x)
    ignored = t == ignore_index
    valid = ~ignored & (t >= 0) & (t < classes)
    out = np.full(rows, np.nan)
    picked = ls[np.arange(rows), np.where(valid, t, 0)]
    with np.errstate(invalid="ignore", over="ignore"):
        loss = -(1.0 - label_smoothing) * picked
        if label_smoothing:
            loss = loss - label_smoothing * np.sum(ls, axis=1) / classes
    out[valid] = loss[valid]
    out[ignored] = 0.0
    return out


def count(targets, ignore_index: int = -100) -> int:
    """The rows whose class is not ``ignore_index``: the mean's denominator."""
    return int(np.sum(np.asarray(targets) != ignore_index))


def cross_entropy_ref(logits, targets, ignore_index: int = -100, reduction: str = "mean",
                      label_smoothing: float = 0.0):
    """The loss, float64: per row (``none``), their sum, or their sum over the rows that are
    not ignored (``mean``; NaN when every row is, as PyTorch)."""
    losses = row_losses(logits, targets, ignore_index, label_smoothing)
    if reduction == "none":
        return losses
    total = float(np.sum(losses))
    if reduction == "sum":
        return total
    n = count(targets, ignore_index)
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.float64(total) / n)


def cross_entropy_grad_ref(logits, targets, ignore_index: int = -100,
                           reduction: str = "mean", label_smoothing: float = 0.0,
                           grad_scale: float = 1.0) -> np.ndarray:
    """d (grad_scale * loss) / d logits, float64: ``softmax(x) - (1 - e) onehot(t) - e / V``
    for each row not ignored (zero for the ignored ones, NaN for classes outside [0, V)),
    divided by the rows not ignored for ``mean`` (``reduction="none"``: the gradient of the
    rows' losses' sum)."""
    x = np.asarray(logits).astype(np.float64)
    t = np.asarray(targets).astype(np.int64)
    rows, classes = x.shape
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        p = np.exp(_log_softmax(x))
        g = p - label_smoothing / classes
        ignored = t == ignore_index
        valid = ~ignored & (t >= 0) & (t < classes)
        idx = np.nonzero(valid)[0]
        g[idx, t[idx]] -= 1.0 - label_smoothing
        g[~valid & ~ignored] = np.nan
        g[ignored] = 0.0
        scale = grad_scale
        if reduction == "mean":
            n = count(targets, ignore_index)
            scale = grad_scale / n if n else np.inf
        g[~ignored] *= scale
    return g
