"""rope's float64 reference (host NumPy)."""

from __future__ import annotations

import numpy as np


def _one(x, cos, sin, interleaved, positions, backward):
    x = np.asarray(x, np.float64)
    b, s, _, d = x.shape
    half = cos.shape[-1]
    cos = np.asarray(cos, np.float64)
    sin = np.asarray(sin, np.float64)
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    rows = cos.shape[1]
    pos = (np.broadcast_to(np.arange(s), (b, s)) if positions is None
           else np.broadcast_to(np.asarray(positions).reshape(-1, s), (b, s)))
    bad = (pos < 0) | (pos >= rows)
    safe = np.where(bad, 0, pos)
    bi = np.broadcast_to(np.arange(b)[:, None] if cos.shape[0] > 1 else 0, (b, s))
    c = cos[bi, safe][:, :, None, :]
    sn = sin[bi, safe][:, :, None, :] * (-1.0 if backward else 1.0)
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = x1 * c - x2 * sn
        out[..., 1:2 * half:2] = x2 * c + x1 * sn
        idx = np.arange(2 * half)
    else:
        x1, x2 = x[..., :half], x[..., half:2 * half]
        out[..., :half] = x1 * c - x2 * sn
        out[..., half:2 * half] = x2 * c + x1 * sn
        idx = np.arange(2 * half)
    rot = out[..., idx]
    rot[bad] = np.nan
    out[..., idx] = rot
    return out


def rope_reference(q, k, cos, sin, *, interleaved=False, positions=None, backward=False):
    """(q_out, k_out) in float64 (k_out None without k)."""
    qo = _one(q, cos, sin, interleaved, positions, backward)
    ko = None if k is None else _one(k, cos, sin, interleaved, positions, backward)
    return qo, ko
