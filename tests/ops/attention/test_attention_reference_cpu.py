"""The float64 attention reference without a GPU: ``allowed_mask`` against the masking rule
written out; ``attention_ref`` and ``attention_backward_ref`` against a per-element loop
implementation on tiny shapes (every mask, soft-capping, GQA and MQA, S_q != S_k both ways,
S_q = 1, varlen with empty and one-token sequences); the gradients against central finite
differences; the bhsd layout against the transposed bshd one; varlen against each sequence
run densely; fully masked rows (0 output, lse -inf, zero gradients, no NaN); lse against the
logsumexp of the masked scores; softmax rows summing to 1; low-precision inputs upcast; and
the refusals of bad arguments."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ge2jit.ops.attention.reference import (
    allowed_mask,
    attention_backward_ref,
    attention_ref,
)

# --- the per-element loop implementation -------------------------------------------------


def naive_allowed(i, j, s_q, s_k, causal, window):
    """Whether query i may see key j: the spec's rule, written out once more."""
    shift = s_k - s_q
    if causal and j > i + shift:
        return False
    if window is not None:
        left, right = window
        if left != -1 and j < i + shift - left:
            return False
        if right != -1 and not causal and j > i + shift + right:
            return False
    return True


def naive_score(qi, kj, scale, softcap):
    """(s, ds/dx): the score of one query and key and its derivative in x = scale * q.k."""
    x = scale * sum(a * b for a, b in zip(qi, kj))
    if softcap:
        t = math.tanh(x / softcap)
        return softcap * t, 1.0 - t * t
    return x, 1.0


def naive_sequences(q, k, v, cu_q, cu_k):
    """[(q_b, k_b, v_b)]: each sequence's (S, H, D) float64 arrays of bshd or packed inputs."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if cu_q is None:
        return [(q[b], k[b], v[b]) for b in range(q.shape[0])]
    return [(q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]])
            for b in range(len(cu_q) - 1)]


def naive_forward_seq(q, k, v, causal, scale, window, softcap):
    """(o (S_q, H, Dv), lse (H, S_q)) of one sequence by loops."""
    s_q, heads, dim = q.shape
    s_k, kv_heads, dim_v = v.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    o = np.zeros((s_q, heads, dim_v))
    lse = np.zeros((heads, s_q))
    for h in range(heads):
        hk = h // (heads // kv_heads)
        for i in range(s_q):
            seen = [j for j in range(s_k) if naive_allowed(i, j, s_q, s_k, causal, window)]
            if not seen:
                lse[h, i] = -math.inf
                continue
            scores = {j: naive_score(q[i, h], k[j, hk], scale, softcap)[0] for j in seen}
            top = max(scores.values())
            total = math.fsum(math.exp(scores[j] - top) for j in seen)
            lse[h, i] = top + math.log(total)
            for d in range(dim_v):
                o[i, h, d] = math.fsum(math.exp(scores[j] - lse[h, i]) * v[j, hk, d]
                                       for j in seen)
    return o, lse


def naive_backward_seq(do, q, k, v, o, lse, causal, scale, window, softcap):
    """(dq, dk, dv) of one sequence by loops."""
    s_q, heads, dim = q.shape
    s_k, kv_heads, dim_v = v.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for h in range(heads):
        hk = h // (heads // kv_heads)
        for i in range(s_q):
            if not math.isfinite(lse[h, i]):
                continue
            delta = math.fsum(do[i, h, d] * o[i, h, d] for d in range(dim_v))
            for j in range(s_k):
                if not naive_allowed(i, j, s_q, s_k, causal, window):
                    continue
                s, dsdx = naive_score(q[i, h], k[j, hk], scale, softcap)
                p = math.exp(s - lse[h, i])
                dp = math.fsum(do[i, h, d] * v[j, hk, d] for d in range(dim_v))
                dx = p * (dp - delta) * dsdx
                for d in range(dim_v):
                    dv[j, hk, d] += p * do[i, h, d]
                for d in range(dim):
                    dq[i, h, d] += dx * k[j, hk, d] * scale
                    dk[j, hk, d] += dx * q[i, h, d] * scale
    return dq, dk, dv


def naive_forward(q, k, v, cu_q, cu_k, **opts):
    """(o, lse) of bshd or packed inputs, lse in FlashAttention's layout."""
    outs = [naive_forward_seq(*seq, **opts) for seq in naive_sequences(q, k, v, cu_q, cu_k)]
    if cu_q is None:
        return np.stack([o for o, _ in outs]), np.stack([lse for _, lse in outs])
    return np.concatenate([o for o, _ in outs]), np.concatenate([lse for _, lse in outs], 1)


def naive_backward(do, q, k, v, o, lse, cu_q, cu_k, **opts):
    seqs = naive_sequences(q, k, v, cu_q, cu_k)
    if cu_q is None:
        rows = [(do[b], o[b], lse[b]) for b in range(len(seqs))]
    else:
        rows = [(do[a:b], o[a:b], lse[:, a:b]) for a, b in zip(cu_q[:-1], cu_q[1:])]
    grads = [naive_backward_seq(d, qb, kb, vb, ob, lb, **opts)
             for (qb, kb, vb), (d, ob, lb) in zip(seqs, rows)]
    join = np.stack if cu_q is None else np.concatenate
    return tuple(join([g[n] for g in grads]) for n in range(3))


# --- the cases -----------------------------------------------------------------------------


def opts(causal=False, scale=None, window=None, softcap=None):
    return {"causal": causal, "scale": scale, "window": window, "softcap": softcap}


#: dense cases: (B, S_q, S_k, H, H_kv, D, D_v, options)
DENSE = {
    "plain": (2, 3, 4, 2, 2, 4, 4, opts()),
    "causal_sq<sk_mqa": (1, 3, 5, 2, 1, 3, 3, opts(causal=True)),
    "causal_sq>sk_gqa": (1, 5, 3, 4, 2, 4, 4, opts(causal=True)),
    "window(-1,0)": (2, 4, 6, 2, 2, 3, 3, opts(window=(-1, 0))),
    "window(3,-1)": (1, 4, 7, 2, 1, 3, 3, opts(window=(3, -1))),
    "window(2,1)_gqa": (1, 6, 6, 4, 2, 3, 3, opts(window=(2, 1))),
    "window(2,1)_sq>sk": (1, 7, 4, 2, 2, 3, 3, opts(window=(2, 1))),
    "window(2,1)+causal": (1, 5, 7, 2, 2, 3, 3, opts(causal=True, window=(2, 1))),
    "window(0,0)+causal_sq>sk": (1, 5, 2, 2, 1, 3, 3, opts(causal=True, window=(0, 0))),
    "softcap": (1, 4, 5, 2, 2, 4, 4, opts(softcap=1.5, scale=0.9)),
    "softcap+causal_gqa": (2, 4, 4, 4, 2, 3, 3, opts(causal=True, softcap=2.0)),
    "softcap+window_mqa": (1, 5, 6, 3, 1, 3, 3, opts(window=(1, 2), softcap=1.0)),
    "sq=1_causal_window": (2, 1, 6, 2, 1, 3, 3, opts(causal=True, window=(2, -1))),
    "sq=1": (1, 1, 4, 2, 2, 3, 3, opts()),
    "sk=1": (1, 5, 1, 2, 2, 3, 3, opts(causal=True)),
    "dv!=d": (1, 3, 4, 2, 1, 4, 2, opts(causal=True, scale=0.5)),
}

LENS_Q = [0, 1, 5, 3]
#: varlen cases: (key lengths, H, H_kv, D, options), query lengths LENS_Q
VARLEN = {
    "plain": ([2, 3, 4, 0], 2, 2, 3, opts()),
    "causal": ([1, 4, 6, 2], 2, 1, 3, opts(causal=True)),
    "causal_sq>sk": ([2, 0, 3, 3], 2, 2, 3, opts(causal=True)),
    "window(2,1)_gqa": ([1, 4, 6, 2], 4, 2, 3, opts(window=(2, 1))),
    "window(3,-1)+causal": ([3, 2, 7, 1], 2, 2, 3, opts(causal=True, window=(3, -1))),
    "softcap_mqa": ([1, 4, 6, 2], 3, 1, 3, opts(softcap=1.2, scale=0.8)),
}


def seed_of(name: str) -> int:
    return sum(ord(c) * (n + 1) for n, c in enumerate(name))


def dense_inputs(name):
    b, s_q, s_k, h, h_kv, d, d_v, options = DENSE[name]
    rng = np.random.default_rng(seed_of("dense" + name))
    q = rng.standard_normal((b, s_q, h, d))
    k = rng.standard_normal((b, s_k, h_kv, d))
    v = rng.standard_normal((b, s_k, h_kv, d_v))
    do = rng.standard_normal((b, s_q, h, d_v))
    return (q, k, v, do), {**options, "cu_seqlens_q": None, "cu_seqlens_k": None}


def cu_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def varlen_inputs(name):
    lens_k, h, h_kv, d, options = VARLEN[name]
    rng = np.random.default_rng(seed_of("varlen" + name))
    cu_q, cu_k = cu_of(LENS_Q), cu_of(lens_k)
    q = rng.standard_normal((cu_q[-1], h, d))
    k = rng.standard_normal((cu_k[-1], h_kv, d))
    v = rng.standard_normal((cu_k[-1], h_kv, d))
    do = rng.standard_normal((cu_q[-1], h, d))
    return (q, k, v, do), {**options, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}


CASES = [("dense", n) for n in DENSE] + [("varlen", n) for n in VARLEN]
CASE_IDS = [f"{kind}-{name}" for kind, name in CASES]


def inputs(kind, name):
    return dense_inputs(name) if kind == "dense" else varlen_inputs(name)


def split(kw):
    """(options, cu_q, cu_k) of the keywords."""
    kw = dict(kw)
    return kw, kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k")


def assert_close(got, want, tol):
    assert got.shape == want.shape
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=tol)


# --- the tests -----------------------------------------------------------------------------


def test_allowed_mask_examples():
    causal = allowed_mask(2, 4, True)
    assert causal.tolist() == [[True, True, True, False], [True, True, True, True]]
    # more queries than keys: the first S_q - S_k rows see nothing
    assert allowed_mask(4, 2, True).astype(int).tolist() == [[0, 0], [0, 0], [1, 0], [1, 1]]
    assert allowed_mask(3, 5, False, (1, 0)).astype(int).tolist() == [
        [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert allowed_mask(3, 3, False, (0, 1)).astype(int).tolist() == [
        [1, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert allowed_mask(3, 3).all() and allowed_mask(3, 3, False, (-1, -1)).all()
    assert allowed_mask(0, 3).shape == (0, 3) and allowed_mask(3, 0, True).shape == (3, 0)


@pytest.mark.parametrize("causal", [False, True])
def test_allowed_mask_is_the_rule(causal):
    windows = [None, (-1, -1), (-1, 0), (0, 0), (0, -1), (3, -1), (2, 1), (1, 3), (5, 5)]
    for s_q in range(0, 6):
        for s_k in range(0, 6):
            for window in windows:
                want = [[naive_allowed(i, j, s_q, s_k, causal, window) for j in range(s_k)]
                        for i in range(s_q)]
                got = allowed_mask(s_q, s_k, causal, window)
                assert got.shape == (s_q, s_k)
                assert got.tolist() == want, (s_q, s_k, window)
    # causal is the window (-1, 0); with a window, causal makes its right side 0
    assert np.array_equal(allowed_mask(4, 6, True), allowed_mask(4, 6, False, (-1, 0)))
    assert np.array_equal(allowed_mask(4, 6, True, (2, 3)), allowed_mask(4, 6, False, (2, 0)))


@pytest.mark.parametrize("kind,name", CASES, ids=CASE_IDS)
def test_forward_matches_loops(kind, name):
    (q, k, v, _), kw = inputs(kind, name)
    options, cu_q, cu_k = split(kw)
    o, lse = attention_ref(q, k, v, **kw)
    o_n, lse_n = naive_forward(q, k, v, cu_q, cu_k, **options)
    assert o.dtype == lse.dtype == np.float64
    assert o.shape == q.shape[:-1] + v.shape[-1:]
    heads = q.shape[-2]
    assert lse.shape == ((heads, q.shape[0]) if cu_q is not None
                         else (q.shape[0], heads, q.shape[1]))
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert_close(o, o_n, 1e-12)
    assert_close(lse, lse_n, 1e-12)


@pytest.mark.parametrize("kind,name", CASES, ids=CASE_IDS)
def test_backward_matches_loops(kind, name):
    (q, k, v, do), kw = inputs(kind, name)
    options, cu_q, cu_k = split(kw)
    o, lse = attention_ref(q, k, v, **kw)
    grads = attention_backward_ref(do, q, k, v, o, lse, **kw)
    want = naive_backward(do, q, k, v, o, lse, cu_q, cu_k, **options)
    for got, ref, x in zip(grads, want, (q, k, v)):
        assert got.dtype == np.float64 and got.shape == x.shape
        assert not np.isnan(got).any()
        assert_close(got, ref, 1e-12)


def finite_differences(f, x, eps=1e-6):
    """The central-difference gradient of the scalar f at x (float64), element by element."""
    grad = np.zeros_like(x)
    flat, g = x.reshape(-1), grad.reshape(-1)
    for n in range(flat.size):
        keep = flat[n]
        flat[n] = keep + eps
        up = f()
        flat[n] = keep - eps
        down = f()
        flat[n] = keep
        g[n] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("kind,name", CASES, ids=CASE_IDS)
def test_gradients_by_finite_differences(kind, name):
    (q, k, v, do), kw = inputs(kind, name)
    q, k, v = q.copy(), k.copy(), v.copy()

    def loss():
        return float(np.sum(attention_ref(q, k, v, **kw)[0] * do))

    o, lse = attention_ref(q, k, v, **kw)
    grads = attention_backward_ref(do, q, k, v, o, lse, **kw)
    for got, x in zip(grads, (q, k, v)):
        num = finite_differences(loss, x)
        scale = max(np.linalg.norm(num), 1e-3)
        assert np.linalg.norm(got - num) <= 1e-6 * scale, (
            np.linalg.norm(got - num) / scale)
        # entries with no influence on the output have an exactly zero gradient
        assert np.all(got[num == 0] == 0)


@pytest.mark.parametrize("name", ["plain", "causal_sq>sk_gqa", "softcap+window_mqa", "dv!=d"])
def test_bhsd_is_transposed_bshd(name):
    (q, k, v, do), kw = dense_inputs(name)

    def t(x):
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))

    o, lse = attention_ref(q, k, v, **kw)
    o_t, lse_t = attention_ref(t(q), t(k), t(v), layout="bhsd", **kw)
    np.testing.assert_array_equal(o_t, t(o))
    np.testing.assert_array_equal(lse_t, lse)
    grads = attention_backward_ref(do, q, k, v, o, lse, **kw)
    grads_t = attention_backward_ref(t(do), t(q), t(k), t(v), o_t, lse_t, layout="bhsd", **kw)
    for g, g_t in zip(grads, grads_t):
        np.testing.assert_array_equal(g_t, t(g))


@pytest.mark.parametrize("name", list(VARLEN))
def test_varlen_is_each_sequence_dense(name):
    (q, k, v, do), kw = varlen_inputs(name)
    options, cu_q, cu_k = split(kw)
    o, lse = attention_ref(q, k, v, **kw)
    dq, dk, dv = attention_backward_ref(do, q, k, v, o, lse, **kw)
    for b in range(len(cu_q) - 1):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o_b, lse_b = attention_ref(q[None, rq], k[None, rk], v[None, rk], **options)
        np.testing.assert_allclose(o[rq], o_b[0], rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(np.isneginf(lse[:, rq]), np.isneginf(lse_b[0]))
        np.testing.assert_allclose(lse[:, rq], lse_b[0], rtol=1e-13, atol=1e-13)
        grads_b = attention_backward_ref(do[None, rq], q[None, rq], k[None, rk], v[None, rk],
                                         o_b, lse_b, **options)
        for g, g_b, rows in zip((dq, dk, dv), grads_b, (rq, rk, rk)):
            np.testing.assert_allclose(g[rows], g_b[0], rtol=1e-13, atol=1e-13)


def check_empty_rows(q, k, v, do, kw, empty):
    """``empty``: (lse-shaped bool) the rows with no allowed key, checked to be 0 / -inf with
    zero gradients, no NaN and no floating-point warning; gradients of k and v that only
    empty rows read are 0."""
    with np.errstate(divide="raise", invalid="raise", over="raise"):
        o, lse = attention_ref(q, k, v, **kw)
        dq, dk, dv = attention_backward_ref(do, q, k, v, o, lse, **kw)
    assert empty.any()
    for x in (o, dq, dk, dv):
        assert not np.isnan(x).any()
    assert not np.isnan(lse).any()
    assert np.all(np.isneginf(lse) == empty)
    # lse is (B, H, S) or (H, T); o and dq (B, S, H, D) or (T, H, D)
    rows = empty.transpose(0, 2, 1) if empty.ndim == 3 else empty.T
    assert np.all(o[rows] == 0) and np.all(dq[rows] == 0)
    assert np.all(np.abs(o[~rows]) > 0)
    return dk, dv


def test_fully_masked_rows_causal_window():
    # window (0, 0) under causal with S_q > S_k: query i sees only key i - 3, if any
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 5, 4, 3))
    k = rng.standard_normal((2, 2, 2, 3))
    v = rng.standard_normal((2, 2, 2, 3))
    do = rng.standard_normal((2, 5, 4, 3))
    empty = np.zeros((2, 4, 5), dtype=bool)
    empty[:, :, :3] = True
    check_empty_rows(q, k, v, do, {"causal": True, "window": (0, 0)}, empty)
    # every row masked: all zero, dk and dv too
    empty[:] = True
    k = rng.standard_normal((2, 0, 2, 3))
    v = rng.standard_normal((2, 0, 2, 3))
    dk, dv = check_empty_rows(q, k, v, do, {}, empty)
    assert dk.shape == k.shape and dv.shape == v.shape


def test_fully_masked_rows_varlen_empty_keys():
    rng = np.random.default_rng(12)
    cu_q, cu_k = cu_of([0, 1, 5, 3]), cu_of([3, 2, 0, 4])
    q = rng.standard_normal((9, 2, 3))
    k = rng.standard_normal((9, 1, 3))
    v = rng.standard_normal((9, 1, 3))
    do = rng.standard_normal((9, 2, 3))
    empty = np.zeros((2, 9), dtype=bool)
    empty[:, 1:6] = True  # sequence 2: five queries, no key
    kw = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "softcap": 2.0}
    dk, dv = check_empty_rows(q, k, v, do, kw, empty)
    # sequence 0 (no query) gets zero key gradients
    assert np.all(dk[:3] == 0) and np.all(dv[:3] == 0)
    assert np.all(dk[3:] != 0) and np.all(dv[3:] != 0)


def test_backward_takes_flash2_plus_inf_lse():
    (q, k, v, do), kw = dense_inputs("causal_sq>sk_gqa")
    o, lse = attention_ref(q, k, v, **kw)
    assert np.isneginf(lse).any()
    want = attention_backward_ref(do, q, k, v, o, lse, **kw)
    got = attention_backward_ref(do, q, k, v, o, np.where(np.isneginf(lse), np.inf, lse), **kw)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def masked_scores(q, k, **kw):
    """(B, H, S_q, S_k) dense bshd scores, -inf where masked, by einsum."""
    heads, kv_heads, dim = q.shape[2], k.shape[2], q.shape[3]
    ke = np.repeat(k, heads // kv_heads, axis=2)
    scale = kw.get("scale") or 1.0 / math.sqrt(dim)
    s = np.einsum("bqhd,bkhd->bhqk", q, ke) * scale
    if kw.get("softcap"):
        s = kw["softcap"] * np.tanh(s / kw["softcap"])
    mask = allowed_mask(q.shape[1], k.shape[1], kw.get("causal", False), kw.get("window"))
    return np.where(mask, s, -np.inf)


@pytest.mark.parametrize("name", list(DENSE))
def test_lse_and_softmax_rows(name):
    (q, k, v, _), kw = dense_inputs(name)
    o, lse = attention_ref(q, k, v, **kw)
    s = masked_scores(q, k, **kw)
    live = np.isfinite(s).any(axis=-1)
    want = np.full(lse.shape, -np.inf)
    want[live] = np.logaddexp.reduce(s[live], axis=-1)
    assert_close(lse, want, 1e-13)
    # the probabilities exp(s - lse) of a row with a key sum to 1
    with np.errstate(invalid="ignore"):
        p = np.exp(s - lse[..., None])
    np.testing.assert_allclose(p[live].sum(axis=-1), 1.0, rtol=1e-13)
    # so v of ones gives an output of ones there (and 0 on empty rows)
    o1, _ = attention_ref(q, k, np.ones_like(v), **kw)
    np.testing.assert_allclose(o1.transpose(0, 2, 1, 3)[live], 1.0, rtol=1e-13)
    assert np.all(o1.transpose(0, 2, 1, 3)[~live] == 0)


def test_default_scale():
    (q, k, v, _), kw = dense_inputs("plain")
    o, lse = attention_ref(q, k, v)
    o_s, lse_s = attention_ref(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]))
    np.testing.assert_array_equal(o, o_s)
    np.testing.assert_array_equal(lse, lse_s)
    # softcap 0 is no soft-capping
    np.testing.assert_array_equal(attention_ref(q, k, v, softcap=0.0)[0], o)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_low_precision_inputs_are_upcast(dtype):
    (q, k, v, do), kw = dense_inputs("softcap+causal_gqa")
    low = [x.astype(dtype) for x in (q, k, v, do)]
    up = [x.astype(np.float64) for x in low]
    o, lse = attention_ref(*low[:3], **kw)
    o_up, lse_up = attention_ref(*up[:3], **kw)
    assert o.dtype == lse.dtype == np.float64
    np.testing.assert_array_equal(o, o_up)
    np.testing.assert_array_equal(lse, lse_up)
    grads = attention_backward_ref(low[3], *low[:3], o.astype(dtype), lse.astype(np.float32),
                                   **kw)
    grads_up = attention_backward_ref(up[3], *up[:3], o.astype(dtype).astype(np.float64),
                                      lse.astype(np.float32).astype(np.float64), **kw)
    for g, g_up in zip(grads, grads_up):
        assert g.dtype == np.float64
        np.testing.assert_array_equal(g, g_up)


def test_refusals():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 3, 4, 2))
    k = rng.standard_normal((1, 3, 2, 2))
    good = {"q": q, "k": k, "v": k}
    bad = [
        ({"window": 2}, "window"),
        ({"window": [2, 1]}, "window"),
        ({"window": (2,)}, "window"),
        ({"window": (-2, 0)}, "window"),
        ({"window": (1.0, 0)}, "window"),
        ({"softcap": -1.0}, "softcap"),
        ({"layout": "sbhd"}, "layout"),
        ({"k": rng.standard_normal((1, 3, 3, 2)), "v": rng.standard_normal((1, 3, 3, 2))},
         "multiple"),
        ({"k": rng.standard_normal((1, 3, 2, 3)), "v": rng.standard_normal((1, 3, 2, 3))},
         "head dimension"),
        ({"v": rng.standard_normal((1, 4, 2, 2))}, "agree"),
        ({"k": rng.standard_normal((2, 3, 2, 2)), "v": rng.standard_normal((2, 3, 2, 2))},
         "batch"),
        ({"q": q[0]}, "4-D"),
    ]
    for change, match in bad:
        args = {**good, **change}
        with pytest.raises(ValueError, match=match):
            attention_ref(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    with pytest.raises(ValueError, match="between|-1|int"):
        allowed_mask(-1, 2)
    qp, kp = q[0], k[0]
    cu = np.array([0, 1, 3], dtype=np.int32)
    bad_cu = [
        ({"cu_seqlens_q": cu}, "both"),
        ({"cu_seqlens_q": np.array([1, 1, 3]), "cu_seqlens_k": cu}, "start at 0"),
        ({"cu_seqlens_q": np.array([0, 2, 1, 3]), "cu_seqlens_k": np.array([0, 1, 2, 3])},
         "decrease"),
        ({"cu_seqlens_q": np.array([0, 1, 2]), "cu_seqlens_k": cu}, "end at 3"),
        ({"cu_seqlens_q": np.array([0, 3]), "cu_seqlens_k": cu}, "same length"),
        ({"cu_seqlens_q": np.array([0.0, 1, 3]), "cu_seqlens_k": cu}, "integer"),
        ({"cu_seqlens_q": cu, "cu_seqlens_k": cu, "layout": "bhsd"}, "layout"),
    ]
    for kw, match in bad_cu:
        with pytest.raises(ValueError, match=match):
            attention_ref(qp, kp, kp, **kw)
    o, lse = attention_ref(q, k, k)
    with pytest.raises(ValueError, match="lse must have shape"):
        attention_backward_ref(o, q, k, k, o, lse[0])
    with pytest.raises(ValueError, match="do must have shape"):
        attention_backward_ref(o[:, :2], q, k, k, o, lse)
