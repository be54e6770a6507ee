"""Float64 references of the composed functions, from the inputs' own values."""

from __future__ import annotations

import numpy as np

from ..ops.cross_entropy.reference import cross_entropy_grad_ref, cross_entropy_ref


def linear_cross_entropy_ref(x, weight, targets, ignore_index: int = -100,
                             reduction: str = "mean", label_smoothing: float = 0.0,
                             grad_scale: float = 1.0, row_scale=None):
    """``(loss, dx, d weight)`` of ``cross_entropy(x @ weight.T, targets)`` in float64 from the
    inputs' own values (``row_scale``: each row's gradient of the logits times it, the
    backward of reduction "none" for per-row upstream gradients)."""
    x64 = np.asarray(x).astype(np.float64)
    w64 = np.asarray(weight).astype(np.float64)
    logits = x64 @ w64.T
    loss = cross_entropy_ref(logits, targets, ignore_index, reduction, label_smoothing)
    g = cross_entropy_grad_ref(logits, targets, ignore_index, reduction, label_smoothing,
                               grad_scale)
    if row_scale is not None:
        g = g * np.asarray(row_scale, np.float64)[:, None]
    return loss, g @ w64, g.T @ x64
