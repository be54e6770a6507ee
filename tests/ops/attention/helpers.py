"""What the attention GPU tests share: fresh inputs seeded by a case's arguments, and the check
of an output and its lse against the float64 reference with the kernel's error bounds (see
test_attention_kernel_gpu.py's docstring for the tolerances), failures naming where the bad
rows are."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from ge2jit.ops.attention.reference import allowed_mask, attention_ref

from ...gpu_arrays import DT

#: unit roundoff and (mantissa bits, smallest normal exponent) of the 16-bit types
UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
FORMAT = {"float16": (10, -14), "bfloat16": (7, -126)}
TANH_APPROX = 2.0 ** -11          # tanh.approx.f32's relative error
LSE_RTOL = 1e-4


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by the case's arguments (each case reproducible by itself)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def randn(rng, shape, dtype: str, sigma: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * sigma).astype(np.float32).astype(DT[dtype])


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """One unit in the last place of |x| in ``dtype`` (the subnormals' spacing below)."""
    mant, emin = FORMAT[dtype]
    _, e = np.frexp(np.abs(x))                    # |x| = f 2^e, f in [0.5, 1)
    return np.exp2(np.where(x == 0, emin, np.maximum(e - 1, emin)) - mant)


def rows_at(bad_rows: np.ndarray, cu_q, block_m: int) -> str:
    """Where the bad rows are: (b, s, h) (varlen: (seq, s, h)) of the first ones and the query
    blocks they fall in."""
    idx = np.argwhere(bad_rows)
    if cu_q is not None:     # (token, h) -> (seq, s, h)
        cu = np.asarray(cu_q)
        seq = np.searchsorted(cu, idx[:, 0], side="right") - 1
        idx = np.stack([seq, idx[:, 0] - cu[seq], idx[:, 1]], axis=1)
    blocks = sorted({(int(b), int(s) // block_m) for b, s, _ in idx})
    heads = sorted({int(x) for x in idx[:, 2]})
    return (f"{len(idx)} rows (b|seq, s, h), first {[tuple(map(int, r)) for r in idx[:8]]}; "
            f"(b|seq, query block) {blocks[:12]}; heads {heads[:16]}")


def check(dtype, q, k, v, o, lse, spec, *, causal=False, window=None, softcap=None,
          scale=None, cu_q=None, cu_k=None):
    """o and lse (None: not written) against the reference, with diagnostics on failure."""
    kw = dict(causal=causal, window=window, softcap=softcap or None, scale=scale,
              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    o_ref, lse_ref = attention_ref(q, k, v, **kw)
    pv_abs, _ = attention_ref(q, k, np.abs(v.astype(np.float64)), **kw)   # sum_j p_j |v_j|
    s_k = k.shape[0] if cu_k is not None else k.shape[1]
    delta = (softcap or 0.0) * TANH_APPROX
    tol = ulp(o_ref, dtype) + (2 * UNIT[dtype] + 2 * delta) * pv_abs
    if dtype == "float16":
        tol += 2.0 ** -25 * s_k * float(np.abs(v.astype(np.float64)).max(initial=0.0))
    block_m = spec.config.block_m
    nan = np.isnan(o)
    assert not nan.any(), \
        f"o: NaN (read outside, or not written) in {rows_at(nan.any(-1), cu_q, block_m)}"
    empty = np.isneginf(lse_ref)                       # rows that see no key
    if cu_q is None:
        empty = empty.transpose(0, 2, 1)               # (B, S_q, H) as o's rows
    else:
        empty = empty.T
    nonzero = empty & (o != 0).any(-1)
    assert not nonzero.any(), \
        f"o: rows that see no key are not 0: {rows_at(nonzero, cu_q, block_m)}"
    within("o", o, o_ref, tol, lambda bad: rows_at(bad.any(-1), cu_q, block_m),
            f"; max |o_ref| {np.abs(o_ref).max():.3g}")
    if lse is None:
        return o_ref, lse_ref
    lse_rows = (lambda m: m.transpose(0, 2, 1)) if cu_q is None else (lambda m: m.T)
    assert not np.isnan(lse).any(), \
        f"lse: NaN (not written) in {rows_at(lse_rows(np.isnan(lse)), cu_q, block_m)}"
    inf_bad = np.isneginf(lse) != np.isneginf(lse_ref)
    assert not inf_bad.any(), \
        f"lse: -inf mismatch in {rows_at(lse_rows(inf_bad), cu_q, block_m)}"
    fin = np.isfinite(lse_ref)
    assert np.isfinite(lse[fin]).all(), "lse: +inf where the reference is finite"
    finite_ref = np.where(fin, lse_ref, 0.0)
    within("lse", np.where(fin, lse, 0.0), finite_ref,
            LSE_RTOL * np.maximum(1.0, np.abs(finite_ref)) + delta,
            lambda bad: rows_at(lse_rows(bad), cu_q, block_m))
    return o_ref, lse_ref


def within(name: str, got, ref, tol, where, more: str = "") -> None:
    """Fails naming the worst element and where the bad rows are (``where(bad)``) unless
    ``|got - ref| <= tol`` everywhere."""
    err = np.abs(got - ref)
    bad = err > tol
    if bad.any():
        w = np.unravel_index(np.argmax(err - tol), err.shape)
        pytest.fail(f"{name}: {int(bad.sum())} of {bad.size} elements beyond the tolerance; "
                    f"worst at {tuple(map(int, w))}: {got[w]!r} vs {ref[w]!r} (tol "
                    f"{tol[w]:.3g}{more}); {where(bad)}")


def inputs(rng, dtype: str, b: int, s_q: int, s_k: int, h: int, h_kv: int, d: int,
           seqlens=None, sigma: float = 1.0):
    """Fresh host q, k (N(0, sigma^2)) and v (N(0, 1)): (B, S, H, D), or packed (T, H, D)
    with ``seqlens`` = (lengths of q, lengths of k); and cu_seqlens_q, cu_seqlens_k (int32;
    None dense)."""
    cu_q = cu_k = None
    if seqlens is None:
        shapes = ((b, s_q, h, d), (b, s_k, h_kv, d))
    else:
        cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in seqlens)
        shapes = ((int(cu_q[-1]), h, d), (int(cu_k[-1]), h_kv, d))
    return (randn(rng, shapes[0], dtype, sigma), randn(rng, shapes[1], dtype, sigma),
            randn(rng, shapes[1], dtype), cu_q, cu_k)


def _abs_terms(q, k, v, do, o, lse, scale, causal, window, softcap):
    """For one sequence (q, do, o: (S_q, H, D); k, v: (S_k, H_kv, D); lse (H, S_q)), float64:
    the sums the rounding bounds scale, (dq's, dk's, dv's), of q's, k's and v's shapes, and
    the bounds of dp - delta's float32 rounding through dq and dk."""
    s_q, h, _ = q.shape
    s_k, h_kv, _ = k.shape
    group = h // h_kv
    allowed = allowed_mask(s_q, s_k, causal, window)
    tq, tk, tv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    cq, ck = np.zeros(q.shape), np.zeros(k.shape)
    gamma = q.shape[-1] * 2.0 ** -24
    for hq in range(h):
        hk = hq // group
        s = scale * q[:, hq] @ k[:, hk].T
        th = np.tanh(s / softcap) if softcap else None
        s = softcap * th if softcap else s
        with np.errstate(invalid="ignore", over="ignore"):
            p = np.where(allowed & np.isfinite(lse[hq])[:, None],
                         np.exp(s - lse[hq][:, None]), 0.0)
        dp = do[:, hq] @ v[:, hk].T
        ds = np.abs(p * (dp - (do[:, hq] * o[:, hq]).sum(-1)[:, None]))
        if softcap:
            ds *= 1 - th * th
        tq[:, hq] = scale * ds @ np.abs(k[:, hk])
        tk[:, hk] += scale * ds.T @ np.abs(q[:, hq])
        tv[:, hk] += p.T @ np.abs(do[:, hq])
        a_do = np.abs(do[:, hq])
        canc = gamma * p * (a_do @ np.abs(v[:, hk]).T + (a_do * np.abs(o[:, hq])).sum(-1)[:, None])
        cq[:, hq] = scale * canc @ np.abs(k[:, hk])
        ck[:, hk] += scale * canc.T @ np.abs(q[:, hq])
    return tq, tk, tv, cq, ck


def _sequences(x, cu):
    """The rows of each sequence of a packed (T, ...) array, or the batch of a dense one."""
    if cu is None:
        return list(x)
    return [x[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]


def check_grads(dtype, q, k, v, do, o, lse, grads, *, causal=False, window=None, softcap=None,
                scale=None, cu_q=None, cu_k=None) -> None:
    """dq, dk, dv (``grads``, host float64, q's, k's and v's shapes) against the float64
    backward of the inputs as stored (o and lse: the forward's, host float64), each element
    within the bound of test_attention_backward_gpu.py's docstring."""
    import math

    from ge2jit.ops.attention.reference import attention_backward_ref

    refs = attention_backward_ref(do, q, k, v, o, lse, causal=causal, window=window,
                                  softcap=softcap, scale=scale, cu_seqlens_q=cu_q,
                                  cu_seqlens_k=cu_k)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    f64 = [x.astype(np.float64) for x in (q, k, v, do)]
    lse_seqs = (_sequences(lse, None) if cu_q is None
                else [lse[:, cu_q[i]:cu_q[i + 1]] for i in range(len(cu_q) - 1)])
    terms = [np.zeros(x.shape) for x in (q, k, v, q, k)]
    for i, (qs, ks, vs, dos, os_, ls) in enumerate(zip(
            _sequences(f64[0], cu_q), _sequences(f64[1], cu_k), _sequences(f64[2], cu_k),
            _sequences(f64[3], cu_q), _sequences(o, cu_q), lse_seqs)):
        t = _abs_terms(qs, ks, vs, dos, os_, ls, sc, causal, window, softcap)
        for whole, part, cu in zip(terms, t, (cu_q, cu_k, cu_k, cu_q, cu_k)):
            if cu is None:
                whole[i] = part
            else:
                whole[cu[i]:cu[i + 1]] = part
    u = UNIT[dtype] + 4 * (softcap or 0) * TANH_APPROX + 2.0 ** -12
    cancel = (terms[3], terms[4], 0.0)
    for name, got, ref, term, canc in zip(("dq", "dk", "dv"), grads, refs, terms, cancel):
        assert not np.isnan(got).any(), f"{name}: NaN (not written, or read outside)"
        within(name, got, ref, ulp(ref, dtype) + 2 * u * term + 2 * canc + 2.0 ** -24,
               lambda bad: f"rows (b|token, s|h, ..) {np.argwhere(bad)[:8].tolist()}",
               f"; max |ref| {np.abs(ref).max():.3g}")


#: the tensor maps' element types by name
MAP_TYPES = {"float16": "f16", "bfloat16": "bf16"}


def tensor_map_of(dtype: str, x, rows: int, varlen: bool) -> bytes:
    """The tensor map a Hopper attention kernel takes of a CuPy (B, S, H, D) array (varlen:
    (T, H, D)), by its strides: boxes of 64 columns x ``rows`` rows of one head."""
    from ge2jit.jit.tma import tensor_map

    if varlen:
        t, h, d = x.shape
        return tensor_map(MAP_TYPES[dtype], x.data.ptr, (d, t, h), (x.strides[0], x.strides[1]),
                          (64, rows, 1))
    b, s, h, d = x.shape
    return tensor_map(MAP_TYPES[dtype], x.data.ptr, (d, s, h, b),
                      (x.strides[1], x.strides[2], x.strides[0]), (64, rows, 1, 1))
