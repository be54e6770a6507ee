"""The attention forward kernel (``kernel_templates/attention/fwd_sm80.cu``) launched by itself
(``ge2jit.jit.loader.launcher_for``, not an op) on CuPy arrays, against the float64 reference
(``ge2jit.ops.attention.reference.attention_ref``) of the inputs as stored.

The tests run from the simplest to the hardest, so that the first failure localizes a bug
(run with ``-x``: an illegal address poisons the CUDA context for every later test):
one key block; several key blocks and ragged lengths; batches and heads; lse; causal and
sliding windows (rows that see no key: o exactly 0, lse -inf); soft-capping and large logits;
GQA / MQA and (B, H, S, D) inputs by strides; varlen; D = 256; every config with every option
off and on; determinism.

Every array is a view into a wider buffer: the inputs' buffers hold NaN around them (rows past a
length, heads and batches beyond, 8+ elements past D: a read outside shows as NaN in o), the
outputs' (o, lse) a sentinel (a stray write shows), and o and lse themselves are NaN before the
launch (an element never written shows; lse stays NaN without ``write_lse``). q, k, v and o get
different paddings, so their strides differ (a stride used for the wrong array shows). Every
launch has fresh random inputs, seeded by its own arguments (a test reproduces by itself).

Tolerances, per element of o (documented choice, from the kernel's arithmetic): the output's
rounding to its 16-bit type (one ulp of the reference value) + the rounding of P to 16 bits
before P V (unit roundoff u = 2^-11 float16, 2^-8 bfloat16, relative to each p, so at most
u * sum_j p_j |v_j|, taken twice for slack; the reference gives that sum as attention over |v|)
+ with soft-capping, tanh.approx's error (about 2^-11 relative: a score error of at most
delta = softcap * 2^-11, which moves o by at most 2 delta * sum_j p_j |v_j|) + for float16,
P's subnormal flush (2^-25 per key, times S_k max|v|). The float32 scores and softmax (exact
16-bit products, float32 sums, ex2.approx) are orders of magnitude below these. A row that
sees no key must be exactly 0. lse (float32): 1e-4 * max(1, |lse_ref|) + delta, -inf exactly
where the reference has -inf."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ge2jit.jit.loader import launcher_for
from ge2jit.ops.attention.spec import CONFIGS, make_spec
from ge2jit.runtime.dtypes import SUPPORTED_DTYPES

from ...gpu_arrays import cp, same_bits
from .helpers import check, inputs, randn, rng_for

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

TYPES = ["float16", "bfloat16"]
SENTINEL = -7.25                  # around the outputs (exact in every type)

#: paddings (before, after) of the buffers around each array, token-major (B, S, H, D): outer
#: axes any amount (offsets stay multiples of the padded row, a multiple of 8 elements), D by
#: a multiple of 8 after (16-byte aligned rows); different for each array, so are the strides
PAD = {"q": ((1, 1), (3, 2), (1, 1), (0, 8)),
       "k": ((1, 0), (2, 3), (1, 2), (0, 8)),
       "v": ((0, 1), (1, 1), (0, 1), (0, 24)),
       "o": ((0, 2), (1, 4), (2, 1), (0, 16))}
LSE_PAD = (5, 7)

#: (head_dim, config): every candidate config of every head dimension
TILINGS = [pytest.param(d, cfg, id=f"d{d}-{cfg.name}") for d, cfgs in CONFIGS.items()
           for cfg in cfgs]


def _placed(host: np.ndarray, pad, fill, out_fill=None):
    """``host`` copied into a new GPU buffer wider by ``pad[i]`` = (before, after) along axis
    i, holding ``fill`` elsewhere; (the view, the buffer, the view's slices). ``out_fill``:
    the view's own elements (an output's NaN) instead of ``host``'s values."""
    shape = tuple(n + a + b for n, (a, b) in zip(host.shape, pad))
    if np.issubdtype(host.dtype, np.integer):
        buf = cp.full(shape, fill, dtype=host.dtype)
    else:
        buf = cp.full(shape, fill, dtype=np.float32).astype(host.dtype)
    where = tuple(slice(a, a + n) for n, (a, _) in zip(host.shape, pad))
    view = buf[where]
    if out_fill is None:
        view[...] = cp.asarray(np.ascontiguousarray(host))
    else:
        view[...] = cp.asarray(np.full(host.shape, out_fill, np.float32).astype(host.dtype))
    assert view.data.ptr % 16 == 0
    return view, buf, where


def _outside_is(buf, where, value) -> bool:
    """Whether every element of ``buf`` outside ``where`` still equals ``value``."""
    h = cp.asnumpy(buf).astype(np.float64)
    mask = np.ones(h.shape, bool)
    mask[where] = False
    return bool((h[mask] == value).all())


def _el(a) -> list[int]:
    return [st // a.itemsize for st in a.strides]


class Arrays:
    """A device array in token-major order (``view``: (B, S, H, D) or (T, H, D)) stored as
    ``bhsd`` asks, in its padded buffer."""

    def __init__(self, name: str, host: np.ndarray, *, varlen: bool, bhsd: bool,
                 output: bool = False):
        pad = PAD[name][1:] if varlen else PAD[name]
        fill, out_fill = (SENTINEL, np.nan) if output else (np.nan, None)
        if bhsd:
            # stored (B, H, S, D) contiguous but for the padding; the kernel sees its transpose
            stored, pad = host.transpose(0, 2, 1, 3), (pad[0], pad[2], pad[1], pad[3])
            view, self.buf, self.where = _placed(stored, pad, fill, out_fill)
            self.view = view.transpose(0, 2, 1, 3)
        else:
            self.view, self.buf, self.where = _placed(host, pad, fill, out_fill)
        st = _el(self.view)
        assert st[-1] == 1 and all(s % 8 == 0 for s in st[:-1])
        self.strides = (0, st[0], st[1]) if varlen else tuple(st[:3])   # (batch, seq, head)


def attend(dtype: str, q, k, v, *, causal=False, window=None, softcap=None, scale=None,
           write_lse=False, config=None, cu_q=None, cu_k=None, bhsd=False):
    """One launch of the kernel on host inputs q (B, S_q, H, D), k, v (B, S_k, H_kv, D)
    (packed (T, H, D) with ``cu_q``, ``cu_k``); ``bhsd``: stored (B, H, S, D), passed by
    strides. Checks that nothing outside o and lse was written (and lse not at all without
    ``write_lse``); returns (o, lse) on the host in float64, o token-major, lse (B, H, S_q) or
    (H, total_q) (None without ``write_lse``), and the spec."""
    varlen = cu_q is not None
    d = q.shape[-1]
    h, h_kv = q.shape[-2], k.shape[-2]
    if varlen:
        cu_q, cu_k = np.asarray(cu_q, np.int32), np.asarray(cu_k, np.int32)
        batch = len(cu_q) - 1
        s_q, s_k = int(np.diff(cu_q).max()), int(np.diff(cu_k).max())   # the longest
        lse_shape = (h, q.shape[0])
    else:
        batch, s_q, s_k = q.shape[0], q.shape[1], k.shape[1]
        lse_shape = (batch, h, s_q)
    spec = make_spec(SUPPORTED_DTYPES[dtype], d, causal=causal, window=window is not None,
                     softcap=bool(softcap), varlen=varlen, write_lse=write_lse, config=config)
    arrays = {name: Arrays(name, x, varlen=varlen, bhsd=bhsd) for name, x in
              (("q", q), ("k", k), ("v", v))}
    arrays["o"] = Arrays("o", q, varlen=varlen, bhsd=bhsd, output=True)
    n_lse = math.prod(lse_shape)
    lse_buf = cp.full(n_lse + sum(LSE_PAD), SENTINEL, dtype=np.float32)
    lse_where = (slice(LSE_PAD[0], LSE_PAD[0] + n_lse),)
    lse_buf[lse_where] = np.nan
    lse = lse_buf[lse_where].reshape(lse_shape)
    cu = {"cu_seqlens_q": 0, "cu_seqlens_k": 0}
    if varlen:
        cu_dev = (cp.asarray(cu_q), cp.asarray(cu_k))
        cu = {"cu_seqlens_q": cu_dev[0].data.ptr, "cu_seqlens_k": cu_dev[1].data.ptr}
    strides = {}
    for name, letter in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o")):
        strides.update(zip((letter + "b", letter + "s", letter + "h"), arrays[name].strides))
    left, right = window if window is not None else (-1, -1)
    stream = cp.cuda.get_current_stream()
    launcher_for(spec, cp.cuda.runtime.getDevice()).launch(
        spec.grid(batch, h, s_q), (spec.threads, 1, 1), spec.smem_bytes, stream.ptr,
        **{name: arrays[name].view.data.ptr for name in ("q", "k", "v", "o")},
        lse=lse.data.ptr, **cu, **strides, B=batch, H=h, H_kv=h_kv, S_q=s_q, S_k=s_k,
        scale=1.0 / math.sqrt(d) if scale is None else float(scale),
        softcap=float(softcap or 0.0), window_left=left, window_right=right)
    stream.synchronize()
    o = arrays["o"]
    assert _outside_is(o.buf, o.where, SENTINEL), "o: a write outside o"
    assert _outside_is(lse_buf, lse_where, SENTINEL), "lse: a write outside lse"
    lse_host = cp.asnumpy(lse).astype(np.float64)
    if not write_lse:
        assert np.isnan(lse_host).all(), "lse written without write_lse"
    return (cp.asnumpy(o.view).astype(np.float64), lse_host if write_lse else None), spec


def run_case(dtype, d, s_q, s_k, *, b=1, h=1, h_kv=None, causal=False, window=None,
             softcap=None, scale=None, write_lse=False, config=None, bhsd=False, sigma=1.0,
             seqlens=None):
    """Fresh random inputs (N(0, sigma^2), seeded by the arguments), one launch, checked;
    ``seqlens`` = (lengths of q, lengths of k): packed varlen inputs (then b, s_q, s_k are
    unused). Returns (o, lse, o_ref, lse_ref) on the host, float64."""
    h_kv = h if h_kv is None else h_kv
    rng = rng_for(dtype, d, s_q, s_k, b, h, h_kv, causal, window, softcap, scale, write_lse,
                  config, bhsd, sigma, seqlens)
    q, k, v, cu_q, cu_k = inputs(rng, dtype, b, s_q, s_k, h, h_kv, d, seqlens, sigma)
    opts = dict(causal=causal, window=window, softcap=softcap, scale=scale)
    (o, lse), spec = attend(dtype, q, k, v, write_lse=write_lse, config=config, cu_q=cu_q,
                            cu_k=cu_k, bhsd=bhsd, **opts)
    o_ref, lse_ref = check(dtype, q, k, v, o, lse, spec, cu_q=cu_q, cu_k=cu_k, **opts)
    return o, lse, o_ref, lse_ref


# ---- 1. the simplest: one query block, one key block, no option ----------------------------

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d, config", [t for t in TILINGS if t.values[0] in (64, 128)])
def test_one_key_block(dtype, d, config):
    # S_q = S_k = block_n: one key block, no mask; one batch, one head
    n = config.block_n
    run_case(dtype, d, n, n, config=config)


# ---- 2. several key blocks, ragged lengths, S_q != S_k both ways ---------------------------

LENGTHS = [(1, 1), (17, 17), (130, 130), (257, 257), (17, 130), (130, 17), (1, 257),
           (257, 1), (130, 257), (257, 130)]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s_q, s_k", LENGTHS)
def test_key_blocks_and_ragged_lengths(dtype, d, s_q, s_k):
    run_case(dtype, d, s_q, s_k)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_batches_and_heads(dtype, d):
    # the (b, h) indexing of q, k, v, o: 2 batches, 3 heads, each its own kv head
    run_case(dtype, d, 130, 77, b=2, h=3)


# ---- 3. lse ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s_q, s_k, b, h", [(64, 64, 1, 1), (17, 130, 1, 1), (257, 257, 2, 3),
                                            (130, 17, 2, 3)])
def test_lse(dtype, d, s_q, s_k, b, h):
    run_case(dtype, d, s_q, s_k, b=b, h=h, write_lse=True)


# ---- 4. causal and sliding windows --------------------------------------------------------

CAUSAL_LENGTHS = [(1, 1), (17, 17), (130, 130), (257, 257), (1, 130), (17, 257), (130, 257),
                  (130, 17), (257, 130), (257, 1), (200, 64)]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s_q, s_k", CAUSAL_LENGTHS)
def test_causal(dtype, d, s_q, s_k):
    # bottom-right: with S_q > S_k the first S_q - S_k rows see no key (o 0, lse -inf)
    o, lse, _, _ = run_case(dtype, d, s_q, s_k, b=2, h=2, causal=True, write_lse=True)
    if s_q > s_k:
        n = s_q - s_k
        assert (o[:, :n] == 0).all() and np.isneginf(lse[:, :, :n]).all()
        assert np.isfinite(lse[:, :, n:]).all()


WINDOWS = [(0, 0), (5, -1), (-1, 3), (0, -1), (63, 64), (130, 5), (-1, -1)]
WINDOW_LENGTHS = [(17, 17), (257, 257), (130, 257), (257, 130)]


@pytest.mark.parametrize("dtype, d", [("bfloat16", 64), ("float16", 128)])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s_q, s_k", WINDOW_LENGTHS)
def test_sliding_window(dtype, d, window, causal, s_q, s_k):
    # windows crossing block edges (block_n 64, block_m 128); causal replaces the right side
    # by 0 ((-1, 3) with causal is causal); (0, 0): one key a row
    run_case(dtype, d, s_q, s_k, h=2, window=window, causal=causal, write_lse=True)


# ---- 5. soft-capping and large logits ------------------------------------------------------

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("softcap", [30.0, 5.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(dtype, d, softcap, causal):
    # inputs of sigma 3: scores of standard deviation 9 (|s| up to about 40) before the cap
    run_case(dtype, d, 257, 130, h=2, softcap=softcap, causal=causal, write_lse=True, sigma=3.0)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("scale_factor", [1.0, 0.25, 2.0])
def test_large_logits_and_other_scales(dtype, d, scale_factor):
    # peaked softmax whose row max jumps between key blocks (the online rescale), any scale
    run_case(dtype, d, 257, 257, h=2, scale=scale_factor / math.sqrt(d), write_lse=True,
             sigma=3.0)


# ---- 6. GQA, MQA, (B, H, S, D) by strides ---------------------------------------------------

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("bhsd", [False, True], ids=["bshd", "bhsd"])
def test_bhsd_strides(dtype, d, bhsd):
    run_case(dtype, d, 130, 257, b=2, h=3, bhsd=bhsd, write_lse=True)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("h_kv", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("bhsd", [False, True], ids=["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa(dtype, d, h_kv, bhsd, causal):
    # H = 8 query heads over H_kv kv heads: head h reads kv head h // (8 // H_kv)
    run_case(dtype, d, 130, 257, b=2, h=8, h_kv=h_kv, bhsd=bhsd, causal=causal,
             write_lse=True)


# ---- 7. varlen --------------------------------------------------------------------------

SEQLENS = [([0, 1, 37, 130], [5, 0, 40, 129]),
           ([130, 0, 1, 37], [129, 5, 0, 40]),
           ([257], [257]),
           ([64, 128, 3], [200, 64, 64])]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"q{s[0]}-k{s[1]}")
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(dtype, d, seqlens, causal):
    # packed q (total_q, H, D), k/v (total_k, H_kv, D); lse (H, total_q); a sequence with
    # keys but no queries, one with a query but no key (o 0, lse -inf)
    _, lse, _, _ = run_case(dtype, d, 0, 0, h=4, h_kv=2, causal=causal, write_lse=True,
                            seqlens=seqlens)
    assert lse.shape == (4, sum(seqlens[0]))


@pytest.mark.parametrize("dtype, d", [("bfloat16", 64), ("float16", 128)])
@pytest.mark.parametrize("window", [(5, -1), (-1, 3), (40, 0)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_window(dtype, d, window, causal):
    run_case(dtype, d, 0, 0, h=4, h_kv=2, causal=causal, window=window, write_lse=True,
             seqlens=SEQLENS[0])


# ---- 8. D = 256 (Q from shared memory) and every config ------------------------------------

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("config", CONFIGS[256], ids=lambda c: c.name)
@pytest.mark.parametrize("lengths", ["one block", (17, 130), (257, 257), (257, 130)])
def test_head_dim_256(dtype, config, lengths):
    s_q, s_k = (config.block_n,) * 2 if lengths == "one block" else lengths
    run_case(dtype, 256, s_q, s_k, config=config, write_lse=lengths != "one block")


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d, config", TILINGS)
def test_every_config_no_option(dtype, d, config):
    run_case(dtype, d, 257, 190, b=2, h=2, config=config)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d, config", TILINGS)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_every_config_every_option(dtype, d, config, varlen):
    # causal + window + softcap + lse (+ varlen), GQA, (B, H, S, D) strides when dense
    opts = dict(h=4, h_kv=2, causal=True, window=(70, 3), softcap=20.0, write_lse=True,
                config=config, sigma=2.0)
    if varlen:
        run_case(dtype, d, 0, 0, seqlens=SEQLENS[0], **opts)
    else:
        run_case(dtype, d, 257, 190, b=2, bhsd=True, **opts)


# ---- 9. determinism -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_deterministic(dtype, d, varlen):
    rng = rng_for("deterministic", dtype, d, varlen)
    if varlen:
        cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in SEQLENS[0])
        shapes = ((int(cu_q[-1]), 4, d), (int(cu_k[-1]), 2, d))
    else:
        cu_q = cu_k = None
        shapes = ((2, 257, 4, d), (2, 190, 2, d))
    q, k, v = (randn(rng, s, dtype) for s in (shapes[0], shapes[1], shapes[1]))
    opts = dict(causal=True, write_lse=True, cu_q=cu_q, cu_k=cu_k)
    (o1, lse1), _ = attend(dtype, q, k, v, **opts)
    (o2, lse2), spec = attend(dtype, q, k, v, **opts)
    assert same_bits(o1, o2) and same_bits(lse1, lse2)
    check(dtype, q, k, v, o1, lse1, spec, causal=True, cu_q=cu_q, cu_k=cu_k)
