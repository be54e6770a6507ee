"""The float64 NumPy reference of fused (FlashAttention-style) attention, forward and backward,
for checking results (tests, benchmarks, notebooks).

The conventions are FlashAttention 2/3's. Dense inputs are q (B, S_q, H, D) and k, v
(B, S_k, H_kv, D) (``layout="bshd"``) or q (B, H, S_q, D) and k, v (B, H_kv, S_k, D)
(``layout="bhsd"``); packed (varlen) inputs are q (total_q, H, D) and k, v (total_k, H_kv, D)
with ``cu_seqlens_q`` and ``cu_seqlens_k``, integer arrays of length B + 1 whose sequence b is
the rows ``cu[b]:cu[b + 1]`` (a length may be 0). v's head dimension may differ from q's and
k's; the output then has v's. H must be a multiple of H_kv: query head h reads key/value head
``h // (H // H_kv)`` (grouped-query attention; multi-query when H_kv = 1).

For each sequence (lengths S_q, S_k) and query head, the score of query i and key j is
``s = scale * q_i . k_j`` (``scale`` 1 / sqrt(D) by default), soft-capped to
``softcap * tanh(s / softcap)`` when ``softcap`` > 0. Query i may attend to key j as
:func:`allowed_mask` says (causal and sliding-window masks aligned to the bottom-right corner).
The output row is the softmax of the allowed scores applied to v, and ``lse`` is the natural
log of the sum of the exponentials of the allowed scores, of shape (B, H, S_q) (dense) or
(H, total_q) (varlen). A query row with no allowed key (fully masked, or S_k = 0) has output 0,
lse -inf and zero gradients, without a NaN anywhere.

Several sequences a row of a dense batch (S_q == S_k) take ``seq_bounds``, integers (B, S, 2):
query i of row b then sees only keys j with ``seq_bounds[b, i, 0] <= j < seq_bounds[b, i, 1]``
(its sequence), within the masks above.

Inputs of any floating dtype (float16, bfloat16, float32, float64) are upcast to float64; the
results are float64 arrays.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

LAYOUTS = ("bshd", "bhsd")


def _window(window, causal: bool) -> tuple[int, int]:
    """(left, right) of ``window``, -1 for an unbounded side; ``causal`` makes right 0."""
    if window is None:
        left, right = -1, -1
    else:
        if not isinstance(window, tuple) or len(window) != 2:
            raise ValueError(f"window must be None or a (left, right) tuple, not {window!r}")
        for side in window:
            if isinstance(side, bool) or not isinstance(side, Integral) or side < -1:
                raise ValueError(f"window sides must be ints >= -1 (-1: unbounded), not "
                                 f"{window!r}")
        left, right = int(window[0]), int(window[1])
    if causal:
        right = 0
    return left, right


def allowed_mask(s_q: int, s_k: int, causal: bool = False, window=None) -> np.ndarray:
    """The (s_q, s_k) bool array of which keys each query may attend to, for one sequence of
    s_q queries and s_k keys.

    Masks are aligned to the bottom-right corner: query i sits at key position
    ``p = i + s_k - s_q``. ``causal``: key j is allowed iff ``j <= p``. ``window`` is None or a
    tuple ``(left, right)`` of ints, each >= 0 or -1 (that side unbounded): key j is allowed
    iff ``p - left <= j <= p + right``. ``causal`` with a window replaces the window's right
    side by 0 (as FlashAttention does), so ``window=(-1, 0)`` is the same as ``causal``.
    Neither: every key is allowed.
    """
    for name, n in (("s_q", s_q), ("s_k", s_k)):
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 0:
            raise ValueError(f"{name} must be an int >= 0, not {n!r}")
    left, right = _window(window, causal)
    p = np.arange(s_q, dtype=np.int64)[:, None] + (int(s_k) - int(s_q))
    j = np.arange(s_k, dtype=np.int64)[None, :]
    mask = np.ones((s_q, s_k), dtype=bool)
    if left >= 0:
        mask &= j >= p - left
    if right >= 0:
        mask &= j <= p + right
    return mask


def _float64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _cu_seqlens(name: str, cu, total: int) -> np.ndarray:
    cu = np.asarray(cu)
    if cu.ndim != 1 or cu.shape[0] < 1 or cu.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array of length B + 1")
    cu = cu.astype(np.int64)
    if cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != total:
        raise ValueError(f"{name} must start at 0, not decrease and end at {total} (the "
                         f"number of packed rows), not {cu.tolist()}")
    return cu


class _Problem:
    """The arguments checked: q, k, v float64 in token-major order ((B, S, H, D) dense,
    (total, H, D) varlen), and each sequence's rows in them."""

    def __init__(self, q, k, v, causal, scale, window, softcap, cu_seqlens_q, cu_seqlens_k,
                 layout, seq_bounds=None):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        q, k, v = _float64(q), _float64(k), _float64(v)
        self.varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        self.bhsd = layout == "bhsd"
        if self.varlen:
            if cu_seqlens_q is None or cu_seqlens_k is None:
                raise ValueError("varlen needs both cu_seqlens_q and cu_seqlens_k")
            if self.bhsd:
                raise ValueError("varlen (packed) inputs take layout='bshd' only")
            if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
                raise ValueError("varlen q, k, v must be 3-D: (total, heads, head_dim)")
            cu_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
            cu_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
            if cu_q.shape != cu_k.shape:
                raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length")
            self.seqs = [(slice(a, b), slice(c, d))
                         for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])]
        else:
            if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
                raise ValueError(f"dense q, k, v must be 4-D ({layout})")
            if self.bhsd:
                q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
            if not q.shape[0] == k.shape[0] == v.shape[0]:
                raise ValueError("q, k, v must have the same batch size")
            self.seqs = [(b, b) for b in range(q.shape[0])]
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"k and v must agree but in the head dimension: {k.shape} vs "
                             f"{v.shape} (token-major)")
        heads, kv_heads = q.shape[-2], k.shape[-2]
        if kv_heads == 0 or heads % kv_heads != 0:
            raise ValueError(f"q's heads ({heads}) must be a multiple of k's and v's "
                             f"({kv_heads})")
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"q and k must have the same head dimension: {q.shape[-1]} vs "
                             f"{k.shape[-1]}")
        if scale is None:
            if q.shape[-1] == 0:
                raise ValueError("the default scale 1 / sqrt(D) needs D > 0")
            scale = 1.0 / math.sqrt(q.shape[-1])
        if softcap is not None and (not isinstance(softcap, Real) or softcap < 0):
            raise ValueError(f"softcap must be None or a number >= 0, not {softcap!r}")
        self.bounds = None
        if seq_bounds is not None:
            bounds = np.asarray(seq_bounds)
            if self.varlen or q.shape[1] != k.shape[1]:
                raise ValueError("seq_bounds takes dense q, k, v of one length")
            if bounds.shape != (q.shape[0], q.shape[1], 2) or bounds.dtype.kind not in "iu":
                raise ValueError(f"seq_bounds must be integers of shape "
                                 f"{(q.shape[0], q.shape[1], 2)}, not {bounds.shape}")
            self.bounds = bounds.astype(np.int64)
        self.q, self.k, self.v = q, k, v
        self.causal, self.window = bool(causal), window
        _window(window, causal)  # checks it
        self.scale = float(scale)
        self.softcap = float(softcap) if softcap else 0.0

    def out_shape(self) -> tuple[int, ...]:
        """o's (and do's) shape in the caller's layout."""
        shape = self.q.shape[:-1] + self.v.shape[-1:]
        return (shape[0], shape[2], shape[1], shape[3]) if self.bhsd else shape

    def lse_shape(self) -> tuple[int, ...]:
        if self.varlen:
            return (self.q.shape[1], self.q.shape[0])
        return (self.q.shape[0], self.q.shape[2], self.q.shape[1])

    def to_caller(self, x: np.ndarray) -> np.ndarray:
        """A token-major dense array (B, S, H, D) in the caller's layout."""
        return x.transpose(0, 2, 1, 3) if self.bhsd else x

    def from_caller(self, name: str, x, shape: tuple[int, ...]) -> np.ndarray:
        x = _float64(x)
        if x.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, not {x.shape}")
        return x.transpose(0, 2, 1, 3) if self.bhsd else x

    def lse_to_caller(self, lse_tm: np.ndarray) -> np.ndarray:
        """Token-major lse ((B, S_q, H) or (total_q, H)) in FlashAttention's layout."""
        return lse_tm.T if self.varlen else lse_tm.transpose(0, 2, 1)

    def lse_from_caller(self, lse) -> np.ndarray:
        lse = _float64(lse)
        if lse.shape != self.lse_shape():
            raise ValueError(f"lse must have shape {self.lse_shape()}, not {lse.shape}")
        return lse.T if self.varlen else lse.transpose(0, 2, 1)

    def mask(self, s_q: int, s_k: int, row=None) -> np.ndarray:
        """The allowed keys of a sequence, within row ``row``'s bounds (with seq_bounds)."""
        mask = allowed_mask(s_q, s_k, self.causal, self.window)
        if self.bounds is not None and row is not None:
            j = np.arange(s_k)[None, :]
            bounds = self.bounds[row]
            mask &= (j >= bounds[:, :1]) & (j < bounds[:, 1:])
        return mask


def _scores(p: _Problem, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(s, t) of one sequence: q (S_q, H, D) and k (S_k, H, D) (one kv head per query head)
    give the scores s (H, S_q, S_k), soft-capped, and ``t = tanh(scale * q.k / softcap)``
    (None without soft-capping)."""
    x = np.einsum("qhd,khd->hqk", q, k) * p.scale
    if p.softcap > 0:
        t = np.tanh(x / p.softcap)
        return p.softcap * t, t
    return x, None


def _forward_one(p: _Problem, q, k, v, row=None) -> tuple[np.ndarray, np.ndarray]:
    """(o (S_q, H, Dv), lse (H, S_q)) of one sequence (``row`` of a dense batch); k and v
    have H_kv heads."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s, _ = _scores(p, q, k)
    s = np.where(p.mask(q.shape[0], k.shape[0], row), s, -np.inf)
    m = np.max(s, axis=-1, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m[..., None])
    total = e.sum(axis=-1)
    live = total > 0
    total = np.where(live, total, 1.0)
    lse = np.where(live, m + np.log(total), -np.inf)
    o = np.einsum("hqk,khd->qhd", e / total[..., None], v)
    return o, lse


def _backward_one(p: _Problem, do, q, k, v, o, lse, row=None) -> tuple[np.ndarray, ...]:
    """(dq, dk, dv) of one sequence, dk and dv summed over each query-head group; lse is
    (H, S_q), a row whose lse is not finite contributing nothing."""
    s_k, kv_heads, dim = k.shape
    group = q.shape[1] // kv_heads
    ke, ve = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s, t = _scores(p, q, ke)
    finite = np.isfinite(lse)
    live = p.mask(q.shape[0], s_k, row) & finite[..., None]
    with np.errstate(over="ignore"):
        prob = np.where(live, np.exp(np.where(live, s, 0.0)
                                     - np.where(finite, lse, 0.0)[..., None]), 0.0)
    dv = np.einsum("hqk,qhd->khd", prob, do)
    dp = np.einsum("qhd,khd->hqk", do, ve)
    delta = np.einsum("qhd,qhd->hq", do, o)
    ds = prob * (dp - delta[..., None])
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = np.einsum("hqk,khd->qhd", ds, ke) * p.scale
    dk = np.einsum("hqk,qhd->khd", ds, q) * p.scale
    dk = dk.reshape(s_k, kv_heads, group, dim).sum(axis=2)
    dv = dv.reshape(s_k, kv_heads, group, v.shape[-1]).sum(axis=2)
    return dq, dk, dv


def attention_ref(q, k, v, *, causal: bool = False, scale=None, window=None, softcap=None,
                  cu_seqlens_q=None, cu_seqlens_k=None, layout: str = "bshd",
                  seq_bounds=None) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse) in float64: attention of q over k and v as the module describes.

    ``o`` has q's shape with v's head dimension (q's shape when they agree); ``lse`` is
    (B, H, S_q) (dense) or (H, total_q) (varlen), -inf where a row has no allowed key (whose
    output is then 0). ``scale``: the scores' factor (None: 1 / sqrt(D)); ``softcap``: None or
    0 for none, else > 0; ``causal`` and ``window``: as :func:`allowed_mask`;
    ``cu_seqlens_q`` and ``cu_seqlens_k``: both for packed inputs (then ``layout`` must be
    "bshd"), neither for dense ones; ``layout``: "bshd" or "bhsd" of dense q, k, v and o;
    ``seq_bounds``: several sequences a row (module docstring).
    """
    p = _Problem(q, k, v, causal, scale, window, softcap, cu_seqlens_q, cu_seqlens_k, layout,
                 seq_bounds)
    o = np.zeros(p.q.shape[:-1] + p.v.shape[-1:])
    lse = np.full(p.q.shape[:-1], -np.inf)
    for rows_q, rows_k in p.seqs:
        o[rows_q], lse_b = _forward_one(p, p.q[rows_q], p.k[rows_k], p.v[rows_k],
                                        None if p.varlen else rows_q)
        lse[rows_q] = lse_b.T
    return (o if p.varlen else p.to_caller(o)), p.lse_to_caller(lse)


def attention_backward_ref(do, q, k, v, o, lse, *, causal: bool = False, scale=None,
                           window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_k=None,
                           layout: str = "bshd", seq_bounds=None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) in float64, of q's, k's and v's shapes: the gradients of attention's
    inputs given ``do``, the gradient of its output ``o`` (shapes of :func:`attention_ref`'s
    o), and the forward's ``o`` and ``lse``, with the forward's keywords.

    As FlashAttention's backward, it recomputes the probabilities from ``lse``,
    ``P = exp(s - lse)`` over the allowed keys, and uses the given ``o``:
    ``dV = P^T dO``, ``dP = dO V^T``, ``D_i = sum(dO_i * O_i)``, ``dS = P * (dP - D_i)``;
    with soft-capping ``dS`` is multiplied by ``1 - tanh^2(scale * q.k / softcap)``;
    ``dQ = scale * dS K``, ``dK = scale * dS^T Q``. dK and dV sum over the query heads that
    share a key/value head. A row whose lse is -inf (or +inf, FlashAttention 2's value for
    an empty row) contributes nothing.
    """
    p = _Problem(q, k, v, causal, scale, window, softcap, cu_seqlens_q, cu_seqlens_k, layout,
                 seq_bounds)
    do = p.from_caller("do", do, p.out_shape())
    o = p.from_caller("o", o, p.out_shape())
    lse = p.lse_from_caller(lse)
    dq, dk, dv = np.zeros_like(p.q), np.zeros_like(p.k), np.zeros_like(p.v)
    for rows_q, rows_k in p.seqs:
        dq[rows_q], dk[rows_k], dv[rows_k] = _backward_one(
            p, do[rows_q], p.q[rows_q], p.k[rows_k], p.v[rows_k], o[rows_q], lse[rows_q].T,
            None if p.varlen else rows_q)
    if p.varlen:
        return dq, dk, dv
    return p.to_caller(dq), p.to_caller(dk), p.to_caller(dv)
