"""The float64 NumPy reference of the rotary position embedding, for checking results (tests,
benchmarks, notebooks)."""

from __future__ import annotations

import numpy as np


def _rows(cos: np.ndarray, batch: int, seq: int, positions) -> tuple[np.ndarray, np.ndarray]:
    """(rows, valid): the table row of each token (b, s), (B, S) int64, and whether the table
    has it."""
    table_rows = cos.shape[-2]
    if positions is None:
        rows = np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq))
    else:
        rows = np.broadcast_to(np.asarray(positions).astype(np.int64), (batch, seq))
    valid = (rows >= 0) & (rows < table_rows)
    return rows, valid


def _angles(table: np.ndarray, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """table[row] (2-D, or 3-D of one batch) or table[b, row] (3-D) of each token as
    (B, S, half) float64; NaN where the row is not in the table."""
    t = np.asarray(table).astype(np.float64)
    if t.ndim == 3 and t.shape[0] == 1:
        t = t[0]
    safe = np.where(valid, rows, 0)
    if t.ndim == 2:
        out = t[safe]
    else:
        out = t[np.arange(rows.shape[0])[:, None], safe]
    out[~valid] = np.nan
    return out


def _rotate(x: np.ndarray, c: np.ndarray, s: np.ndarray, interleaved: bool) -> np.ndarray:
    half = c.shape[-1]
    out = x.copy()
    c, s = c[:, :, None, :], s[:, :, None, :]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = x1 * c - x2 * s
        out[..., 1:2 * half:2] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half:2 * half]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:2 * half] = x2 * c + x1 * s
    return out


def rope_reference(q, k, cos, sin, *, interleaved: bool = False, positions=None,
                   backward: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """(q_out, k_out) in float64: q (B, S, Hq, D) and k (B, S, Hk, D) (or None) rotated pair by
    pair, pair ``j < half`` being ``(x[j], x[j + half])`` (GPT-NeoX) or ``(x[2j], x[2j + 1])``
    (``interleaved``: GPT-J), by the angle of ``cos[row, j]`` and ``sin[row, j]`` (tables of
    ``half`` columns: (rows, half), (1, rows, half) or (B, rows, half)), ``row`` being
    ``positions[b, s]`` (positions (B, S), (1, S) or (S,)) or ``s`` without positions;
    ``backward``: by the opposite angle. Elements ``2 * half`` to D pass through. A row
    outside the table makes the token's rotated elements NaN."""
    q = np.asarray(q).astype(np.float64)
    batch, seq = q.shape[:2]
    rows, valid = _rows(np.asarray(cos), batch, seq, positions)
    c = _angles(cos, rows, valid)
    s = _angles(sin, rows, valid)
    if backward:
        s = -s
    q_out = _rotate(q, c, s, interleaved)
    k_out = None
    if k is not None:
        k_out = _rotate(np.asarray(k).astype(np.float64), c, s, interleaved)
    return q_out, k_out
