"""attention's call checks without a GPU (``tests/fake_cupy.py`` arrays): every refusal names its
argument in one line, and an accepted call gives the sizes, strides, scalars and spec the
forward kernel is launched with. (The op is not registered yet: the checks are called
directly, through the framework path ``op.check_arguments`` and ``op.checked``.)"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ge2jit.errors import ArgumentTypeError, ArgumentValueError, DeviceMismatchError
from ge2jit.ops.attention import op
from ge2jit.ops.attention.spec import (
    CONFIGS,
    L2_SECTION_BYTES,
    SM90_CONFIGS,
    SM90_SHORT_DEFAULT,
    AttentionConfig,
    default_config,
    default_configs,
    heads_group,
    make_sm90_spec,
)
from ge2jit.runtime import tools
from ge2jit.runtime.dtypes import DType

from ...fake_cupy import FakeArray

F16, BF16 = np.float16, ml_dtypes.bfloat16
B, SQ, SK, H, HKV, D = 2, 5, 7, 4, 2, 64


pytestmark = pytest.mark.usefixtures("fake_cupy")


def arr(shape, dtype=F16, **kw):
    return FakeArray(shape, dtype, **kw)


def qkv(b=B, sq=SQ, sk=SK, h=H, hkv=HKV, d=D, dtype=F16):
    """Dense (B, S, H, D) q, k, v."""
    return arr((b, sq, h, d), dtype), arr((b, sk, hkv, d), dtype), arr((b, sk, hkv, d), dtype)


def packed(tq=12, tk=20, h=H, hkv=HKV, d=D, n=2):
    """Packed q, k, v and the keywords of n sequences."""
    return ((arr((tq, h, d)), arr((tk, hkv, d)), arr((tk, hkv, d))),
            {"cu_seqlens_q": arr((n + 1,), np.int32), "cu_seqlens_k": arr((n + 1,), np.int32),
             "max_seqlen_q": 8, "max_seqlen_k": 11})


def check(q, k, v, **kw) -> op.Call:
    return op.check_arguments(q, k, v, **kw)[3]


def padded(shape, pad, dtype=F16, order=None, offset=0):
    """A view of ``shape`` into a C-contiguous buffer of ``shape + pad`` stored in ``order``
    (axes of the stored array, outermost first; default ``shape``'s own)."""
    order = list(range(len(shape))) if order is None else order
    stored = [shape[i] + pad[i] for i in order]
    st, acc = [0] * len(stored), np.dtype(dtype).itemsize
    for i in reversed(range(len(stored))):
        st[i], acc = acc, acc * stored[i]
    strides = [0] * len(shape)
    for pos, axis in enumerate(order):
        strides[axis] = st[pos]
    return arr(shape, dtype, strides=tuple(strides), offset=offset)


# ---------------------------------------------------------------- accepted calls


def test_a_dense_call_gives_its_sizes_strides_scalars_and_spec():
    q, k, v = qkv()
    call = check(q, k, v)
    assert call.q is q and call.k is k and call.v is v and call.out is None
    assert call.dtype is DType.F16 and call.layout == "bshd" and not call.varlen
    assert (call.batch, call.heads, call.kv_heads, call.seqlen_q, call.seqlen_k,
            call.head_dim) == (B, H, HKV, SQ, SK, D)
    assert (call.total_q, call.total_k) == (B * SQ, B * SK)
    assert call.q_strides == (SQ * H * D, H * D, D)
    assert call.k_strides == call.v_strides == (SK * HKV * D, HKV * D, D)
    assert call.out_strides == call.q_strides          # a new output, contiguous
    assert call.out_shape == (B, SQ, H, D) and call.lse_shape == (B, H, SQ)
    assert call.window == (-1, -1) and not call.causal
    assert call.scale == 1 / 8 and call.softcap == 0.0 and not call.return_lse
    assert not call.empty and not call.no_keys
    spec = call.spec
    assert spec.config == CONFIGS[64][0] == call.config
    assert (spec.dtype, spec.head_dim) == (DType.F16, 64)
    assert not (spec.causal or spec.window or spec.softcap or spec.varlen or spec.write_lse)
    with pytest.raises(AttributeError):   # frozen
        call.scale = 1.0


def test_bhsd_is_read_by_its_strides():
    q = arr((B, H, SQ, D), BF16)
    k, v = arr((B, HKV, SK, D), BF16), arr((B, HKV, SK, D), BF16)
    call = check(q, k, v, layout="bhsd")
    assert call.dtype is DType.BF16 and call.layout == "bhsd"
    assert (call.batch, call.heads, call.kv_heads, call.seqlen_q, call.seqlen_k) == (
        B, H, HKV, SQ, SK)
    assert call.q_strides == (H * SQ * D, D, SQ * D)        # (batch, seq, head)
    assert call.k_strides == (HKV * SK * D, D, SK * D)
    assert call.out_strides == call.q_strides and call.out_shape == (B, H, SQ, D)
    assert call.lse_shape == (B, H, SQ)
    # the transpose(1, 2) view of a (B, H, S, D) array passes as bshd, by strides too
    qt = padded((B, SQ, H, D), (0, 0, 0, 0), order=[0, 2, 1, 3])
    call = check(qt, *qkv()[1:])
    assert call.q_strides == (H * SQ * D, D, SQ * D)
    assert call.out_strides == (SQ * H * D, H * D, D)       # the new output is contiguous


def test_padded_views_and_a_given_output_keep_their_strides():
    q = padded((B, SQ, H, D), (1, 3, 1, 8))
    k = padded((B, SK, HKV, D), (0, 1, 2, 24))
    out = padded((B, SQ, H, D), (2, 0, 0, 16))
    v = padded((B, SK, HKV, D), (0, 0, 0, 8))
    call = check(q, k, v, out=out)
    assert call.q_strides == ((SQ + 3) * (H + 1) * 72, (H + 1) * 72, 72)
    assert call.k_strides == ((SK + 1) * (HKV + 2) * 88, (HKV + 2) * 88, 88)
    assert call.v_strides == (SK * HKV * 72, HKV * 72, 72)
    assert call.out is out and call.out_strides == (SQ * H * 80, H * 80, 80)
    # a dimension of one index may have any stride: it is never stepped along
    q1 = arr((1, 1, 1, D), strides=(6, 10, 14, 2))
    k1 = arr((1, SK, 1, D), strides=(2, 2 * D, 3, 2))
    call = check(q1, k1, k1)
    assert call.q_strides == (3, 5, 7) and call.k_strides == (1, D, 1)


@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_grouped_and_multi_query_attention(hkv):
    q, k, v = qkv(h=8, hkv=hkv)
    call = check(q, k, v)
    assert (call.heads, call.kv_heads) == (8, hkv)
    _, _, _, params = op.launch_params(call)
    assert (params["H"], params["H_kv"]) == (8, hkv)


def test_packed_sequences():
    (q, k, v), kw = packed()
    call = check(q, k, v, return_lse=True, **kw)
    assert call.varlen and call.spec.varlen and call.spec.write_lse and call.return_lse
    assert (call.batch, call.heads, call.kv_heads, call.seqlen_q, call.seqlen_k) == (
        2, H, HKV, 8, 11)
    assert (call.total_q, call.total_k) == (12, 20)
    assert call.q_strides == (0, H * D, D) and call.k_strides == (0, HKV * D, D)
    assert call.out_strides == (0, H * D, D) and call.out_shape == (12, H, D)
    assert call.lse_shape == (H, 12)
    assert call.cu_seqlens_q is kw["cu_seqlens_q"] and call.cu_seqlens_k is kw["cu_seqlens_k"]
    grid, block, smem, params = op.launch_params(call)
    assert grid == (1, H, 2) and params["B"] == 2 and params["S_q"] == 8
    assert params["S_k"] == 11 and params["qb"] == 0
    ptrs = op.pointers(call, arr((12, H, D)), arr((H, 12), np.float32))
    assert ptrs["cu_seqlens_q"] == kw["cu_seqlens_q"].data.ptr and ptrs["lse"] != 0
    # layout "bshd" is accepted with packed inputs; numpy ints as lengths
    call = check(q, k, v, layout="bshd", **{**kw, "max_seqlen_q": np.int32(3)})
    assert call.seqlen_q == 3


def test_several_sequences_a_row_take_their_bounds():
    """``seq_bounds``: the kernel with segments, the bounds' pointer its parameter, the
    tuning key marked (a key without them unchanged)."""
    q, k, v = qkv(sk=SQ)
    bounds = arr((B, SQ, 2), np.int32)
    call = check(q, k, v, causal=True, seq_bounds=bounds)
    assert call.spec.segments and call.seq_bounds is bounds and call.key["segments"]
    assert call.spec.params[-1].name == "seq_bounds" and not call.varlen
    assert op.pointers(call, arr(q.shape))["seq_bounds"] == bounds.data.ptr
    plain = check(q, k, v, causal=True)
    assert not plain.spec.segments and "segments" not in plain.key
    assert "seq_bounds" not in op.pointers(plain, arr(q.shape))


@pytest.mark.parametrize("window, causal, expected, spec_window", [
    (None, False, (-1, -1), False),
    (None, True, (-1, 0), False),
    ((-1, -1), False, (-1, -1), False),
    ((3, 5), False, (3, 5), True),
    ((3, 5), True, (3, 0), True),
    ((-1, 4), True, (-1, 0), False),     # causal covers it
    ((2, -1), False, (2, -1), True),
    ((-1, 0), False, (-1, 0), True),
    ([1, 2], False, (1, 2), True),
    ((np.int64(4), 0), False, (4, 0), True),
    ((2**40, 3), False, (-1, 3), True),  # wider than any length: unbounded
    ((2**40, 2**31), False, (-1, -1), False),
])
def test_windows_are_normalised(window, causal, expected, spec_window):
    call = check(*qkv(), window=window, causal=causal)
    assert call.window == expected and all(type(x) is int for x in call.window)
    assert call.spec.window == spec_window and call.spec.causal == causal
    _, _, _, params = op.launch_params(call)
    assert (params["window_left"], params["window_right"]) == expected


@pytest.mark.parametrize("d", [64, 128, 256])
def test_default_scale_and_config_per_head_dim(d):
    call = check(*qkv(d=d))
    assert call.scale == 1 / math.sqrt(d) and call.config == CONFIGS[d][0]
    assert call.spec.head_dim == d and call.spec.smem_bytes == CONFIGS[d][0].smem_bytes_for(d)


def test_scale_softcap_and_lse():
    call = check(*qkv(), scale=0.5, softcap=30, return_lse=True)
    assert call.scale == 0.5 and call.softcap == 30.0 and type(call.softcap) is float
    assert call.spec.softcap and call.spec.write_lse
    call = check(*qkv(), scale=np.float32(2.0), softcap=0)
    assert call.scale == 2.0 and call.softcap == 0.0 and not call.spec.softcap


@pytest.mark.parametrize("d, config", [(d, c) for d, cs in CONFIGS.items() for c in cs])
def test_a_config_by_name_or_object(d, config):
    assert check(*qkv(d=d), config=config.name).config == config
    assert check(*qkv(d=d), config=AttentionConfig(config.block_m, config.block_n,
                                                   config.warps)).config == config


def test_the_config_is_pinned_tuned_or_the_default(monkeypatch):
    keys = []

    def tuned(name, key):
        keys.append((name, key))
        return CONFIGS[128][1].name

    assert check(*qkv(d=128)).reason == "default"
    monkeypatch.setattr(tools, "tuned_config", tuned)
    call = check(*qkv(d=128), causal=True)
    assert (call.config, call.reason) == (CONFIGS[128][1], "tuned")
    assert keys == [("attention", call.key)]
    assert call.key == {"dtype": "f16", "head_dim": 128, "causal": True, "window": False,
                        "softcap": False, "varlen": False, "lse": False,
                        "seqlen_q": 8, "seqlen_k": 8, "rows": 8}
    call = check(*qkv(d=128), config=CONFIGS[128][2].name)
    assert (call.config, call.reason) == (CONFIGS[128][2], "pinned")
    # a stored name that is not a candidate (another version's) is the default
    monkeypatch.setattr(tools, "tuned_config", lambda name, key: "m8n8w1s2")
    assert (check(*qkv(d=128)).config, check(*qkv(d=128)).reason) == (CONFIGS[128][0],
                                                                      "default")


def test_launch_parameters_are_the_kernels():
    q, k, v = qkv(sq=300)
    out = padded((B, 300, H, D), (0, 0, 0, 8))
    call = check(q, k, v, out=out, causal=True, window=(16, 4), softcap=5.0, scale=0.25)
    grid, block, smem, params = op.launch_params(call)
    spec = call.spec
    assert grid == (3, H, B) and block == (spec.threads, 1, 1) == (256, 1, 1)
    assert smem == spec.smem_bytes
    ptrs = op.pointers(call, out)
    assert set(params) | set(ptrs) == {p.name for p in spec.params}
    assert not set(params) & set(ptrs)
    assert (params["qb"], params["qs"], params["qh"]) == call.q_strides
    assert (params["ob"], params["os"], params["oh"]) == (300 * H * 72, H * 72, 72)
    assert (params["kb"], params["ks"], params["kh"]) == (SK * HKV * D, HKV * D, D)
    assert params["S_q"] == 300 and params["S_k"] == SK and params["B"] == B
    assert params["scale"] == 0.25 and params["softcap"] == 5.0
    assert (params["window_left"], params["window_right"]) == (16, 0)
    assert ptrs["o"] == out.data.ptr and ptrs["q"] == q.data.ptr
    assert ptrs["lse"] == ptrs["cu_seqlens_q"] == ptrs["cu_seqlens_k"] == 0


def test_checked_takes_the_arguments_by_name():
    q, k, v = qkv()
    call = op.checked({"q": q, "k": k, "v": v, "causal": True})
    assert call.causal and call.window == (-1, 0)
    with pytest.raises(DeviceMismatchError, match=r"^k: expected an array on the current "):
        op.checked({"q": q, "k": arr(k.shape, device=1), "v": v}, device_id=0)
    with pytest.raises(DeviceMismatchError, match=r"^q: expected an array on the current "):
        op.checked({"q": q, "k": k, "v": v}, device_id=1)


# ---------------------------------------------------------------- zero-size calls


@pytest.mark.parametrize("kw", [dict(b=0), dict(sq=0), dict(h=0, hkv=0), dict(h=0),
                                dict(b=0, sq=0, sk=0)])
def test_zero_size_dense_calls_launch_nothing(kw):
    call = check(*qkv(**kw))
    assert call.empty and not call.no_keys
    call = check(*qkv(**kw), out=arr(call.out_shape, offset=2))   # empty: no alignment to check
    assert call.empty


def test_no_keys_is_a_fill_not_a_refusal():
    call = check(*qkv(sk=0))
    assert not call.empty and call.no_keys and call.seqlen_k == 0
    (q, k, v), kw = packed(tk=0)
    call = check(q, k, v, **{**kw, "max_seqlen_k": 0})
    assert call.no_keys and not call.empty


@pytest.mark.parametrize("tq, n, max_q", [(0, 2, 0), (12, 2, 0), (0, 0, 0), (0, 3, 5)])
def test_zero_size_packed_calls_launch_nothing(tq, n, max_q):
    (q, k, v), kw = packed(tq=tq, n=n)
    call = check(q, k, v, **{**kw, "max_seqlen_q": max_q})
    assert call.empty and call.batch == n


# ---------------------------------------------------------------- refusals

_q, _k, _v = (B, SQ, H, D), (B, SK, HKV, D), (B, SK, HKV, D)
_CU = {"cu_seqlens_q": (3,), "cu_seqlens_k": (3,)}


def _dense(**over):
    """The arguments of a good dense call with some replaced (callables get the arrays)."""
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v}
    for name, value in over.items():
        args[name] = value(args) if callable(value) else value
    return args


def _varlen(**over):
    (q, k, v), kw = packed()
    args = {"q": q, "k": k, "v": v, **kw}
    for name, value in over.items():
        args[name] = value(args) if callable(value) else value
    return args


def _drop(args, *names):
    return {n: x for n, x in args.items() if n not in names}


REFUSALS = [
    # types
    ("q", ArgumentTypeError, "expected a GPU array", _dense(q=np.zeros(_q, F16))),
    ("k", ArgumentTypeError, "expected a GPU array", _dense(k=[1.0])),
    ("v", ArgumentTypeError, "expected a GPU array", _dense(v=3)),
    ("out", ArgumentTypeError, "expected a GPU array", _dense(out=np.zeros(_q, F16))),
    ("cu_seqlens_q", ArgumentTypeError, "expected a GPU array",
     _varlen(cu_seqlens_q=np.zeros(3, np.int32))),
    ("q", ArgumentValueError, "expected dtype float16 or bfloat16",
     _dense(q=arr(_q, np.float32))),
    ("q", ArgumentValueError, "expected dtype float16 or bfloat16", _dense(q=arr(_q, np.int8))),
    ("k", ArgumentValueError, "expected q's dtype float16, got bfloat16",
     _dense(k=arr(_k, BF16))),
    ("v", ArgumentValueError, "expected q's dtype float16, got float32",
     _dense(v=arr(_v, np.float32))),
    ("causal", ArgumentTypeError, "expected True or False", _dense(causal=1)),
    ("return_lse", ArgumentTypeError, "expected True or False", _dense(return_lse="yes")),
    # dimensions
    ("q", ArgumentValueError, "expected 4 dimensions (batch, seq, heads, head_dim)",
     _dense(q=arr((SQ, H, D)))),
    ("k", ArgumentValueError, "expected 4 dimensions", _dense(k=arr((1, *_k)))),
    ("v", ArgumentValueError, "expected 4 dimensions (batch, heads, seq, head_dim)",
     _dense(layout="bhsd", q=arr((B, H, SQ, D)), k=arr((B, HKV, SK, D)), v=arr((SK, HKV, D)))),
    ("q", ArgumentValueError, "expected 3 dimensions (total, heads, head_dim)",
     _varlen(q=arr(_q))),
    ("k", ArgumentValueError, "expected 3 dimensions", _varlen(k=arr(_k))),
    # sizes
    ("k", ArgumentValueError, "heads that divides q's 4", _dense(k=arr((B, SK, 3, D)),
                                                                  v=arr((B, SK, 3, D)))),
    ("k", ArgumentValueError, "heads that divides q's 4", _dense(k=arr((B, SK, 0, D)),
                                                                  v=arr((B, SK, 0, D)))),
    ("v", ArgumentValueError, "expected k's shape", _dense(v=arr((B, SK + 1, HKV, D)))),
    ("v", ArgumentValueError, "expected k's shape", _dense(v=arr((B, SK, 1, D)))),
    ("q", ArgumentValueError, "expected head_dim 64, 128 or 256", _dense(
        q=arr((B, SQ, H, 96)), k=arr((B, SK, HKV, 96)), v=arr((B, SK, HKV, 96)))),
    ("q", ArgumentValueError, "expected head_dim 64, 128 or 256 (the kernel's), got 0", _dense(
        q=arr((B, SQ, H, 0)), k=arr((B, SK, HKV, 0)), v=arr((B, SK, HKV, 0)))),
    ("k", ArgumentValueError, "expected q's head_dim 64", _dense(k=arr((B, SK, HKV, 128)))),
    ("v", ArgumentValueError, "expected q's head_dim 64", _dense(v=arr((B, SK, HKV, 128)))),
    ("k", ArgumentValueError, "expected q's batch 2, got 3", _dense(k=arr((3, SK, HKV, D)),
                                                                     v=arr((3, SK, HKV, D)))),
    ("q", ArgumentValueError, "at most 65535 heads", _dense(
        q=arr((B, SQ, 65536, D)), k=arr((B, SK, 1, D)), v=arr((B, SK, 1, D)))),
    ("q", ArgumentValueError, "batch of at most 65535", _dense(
        q=arr((65536, SQ, H, D)), k=arr((65536, SK, HKV, D)), v=arr((65536, SK, HKV, D)))),
    ("k", ArgumentValueError, "sequence of at most 2147483647 rows", _dense(
        k=arr((B, 2**31, HKV, D)), v=arr((B, 2**31, HKV, D)))),
    # layouts in memory
    ("q", ArgumentValueError, "expected unit stride along head_dim", _dense(
        q=arr(_q, strides=(SQ * H * D * 4, H * D * 4, D * 4, 4)))),
    ("out", ArgumentValueError, "expected unit stride along head_dim", _dense(
        out=arr(_q, strides=(SQ * H * D * 4, H * D * 4, D * 4, 4)))),
    ("q", ArgumentValueError, "expected a 16-byte aligned pointer", _dense(
        q=arr(_q, offset=8))),
    ("v", ArgumentValueError, "expected a 16-byte aligned pointer", _dense(
        v=arr(_v, offset=2))),
    ("k", ArgumentValueError, "multiples of 8 elements", _dense(
        k=padded(_k, (0, 0, 0, 4)))),
    ("q", ArgumentValueError, "multiples of 8 elements", _dense(   # a batch stride of 1281
        q=arr(_q, strides=(SQ * H * D * 2 + 2, H * D * 2, D * 2, 2)))),
    ("out", ArgumentValueError, "multiples of 8 elements", _dense(
        out=padded(_q, (0, 0, 0, 2)))),
    # the output
    ("out", ArgumentValueError, "expected shape (2, 5, 4, 64) (q's)", _dense(out=arr(_k))),
    ("out", ArgumentValueError, "expected q's dtype float16, got bfloat16",
     _dense(out=arr(_q, BF16))),
    ("out", ArgumentValueError, "overlaps q; pass a separate array (attention does not write",
     _dense(out=lambda a: a["q"])),
    ("out", ArgumentValueError, "overlaps k", _dense(
        out=lambda a: arr(_q, base=a["k"].base))),
    ("out", ArgumentValueError, "holds each element once", _dense(
        out=arr(_q, strides=(0, H * D * 2, D * 2, 2)))),
    ("out", ArgumentValueError, "expected shape (12, 4, 64)", _varlen(out=arr((B, 6, H, D)))),
    # devices
    ("k", DeviceMismatchError, "expected an array on the current device (GPU 0)",
     _dense(k=arr(_k, device=1))),
    ("out", DeviceMismatchError, "GPU 1", _dense(out=arr(_q, device=1))),
    ("cu_seqlens_k", DeviceMismatchError, "GPU 1",
     _varlen(cu_seqlens_k=arr((3,), np.int32, device=1))),
    # scalars
    ("window", ArgumentTypeError, "(left, right) pair of ints", _dense(window=(1,))),
    ("window", ArgumentTypeError, "(left, right) pair of ints", _dense(window=4)),
    ("window", ArgumentTypeError, "(left, right) pair of ints", _dense(window=(1.5, 2))),
    ("window", ArgumentTypeError, "(left, right) pair of ints", _dense(window=(True, 0))),
    ("window", ArgumentValueError, "expected sides >= -1", _dense(window=(-2, 0))),
    ("window", ArgumentValueError, "expected sides >= -1", _dense(window=(0, -5))),
    ("softcap", ArgumentValueError, "finite number >= 0", _dense(softcap=-1.0)),
    ("softcap", ArgumentValueError, "finite number >= 0", _dense(softcap=float("inf"))),
    ("softcap", ArgumentValueError, "finite number >= 0", _dense(softcap=float("nan"))),
    ("softcap", ArgumentTypeError, "expected a real number", _dense(softcap="30")),
    ("scale", ArgumentValueError, "positive finite", _dense(scale=0)),
    ("scale", ArgumentValueError, "positive finite", _dense(scale=-0.1)),
    ("scale", ArgumentValueError, "positive finite", _dense(scale=float("inf"))),
    ("scale", ArgumentValueError, "positive finite", _dense(scale=float("nan"))),
    ("scale", ArgumentTypeError, "expected a real number", _dense(scale=True)),
    # the kernel's float32 scalars: scale log2(e), softcap log2(e), scale / softcap
    ("scale", ArgumentValueError, "as a float32", _dense(scale=3e38)),
    ("softcap", ArgumentValueError, "as a float32", _dense(softcap=3e38)),
    ("softcap", ArgumentValueError, "scale / softcap as a float32",
     _dense(scale=1.0, softcap=1e-39)),
    ("layout", ArgumentValueError, "expected None, 'bshd' or 'bhsd', got 'sbhd'",
     _dense(layout="sbhd")),
    ("layout", ArgumentTypeError, "expected None, 'bshd' or 'bhsd'", _dense(layout=2)),
    ("layout", ArgumentValueError, "expected None or 'bshd' with cu_seqlens",
     _varlen(layout="bhsd")),
    ("config", ArgumentValueError, "expected one of 'm128n64w8s2', 'm64n64w4s2' (head_dim "
     "64's candidates on this GPU), got 'm64n32w4s2'", _dense(config="m64n32w4s2")),
    ("config", ArgumentValueError, "head_dim 64's candidates on this GPU), got 'm32n32w2s2'",
     _dense(config=AttentionConfig(32, 32, 2))),
    ("config", ArgumentTypeError, "expected None, a config name", _dense(config=1)),
    # packed sequences
    ("cu_seqlens_k", ArgumentValueError, "expected an int32 array with cu_seqlens_q",
     _drop(_varlen(), "cu_seqlens_k")),
    ("cu_seqlens_q", ArgumentValueError, "expected an int32 array with cu_seqlens_k",
     _drop(_dense(cu_seqlens_k=arr((3,), np.int32)), "cu_seqlens_q")),
    ("cu_seqlens_q", ArgumentValueError, "expected dtype int32, got int64",
     _varlen(cu_seqlens_q=arr((3,), np.int64))),
    ("cu_seqlens_k", ArgumentValueError, "expected dtype int32, got float16",
     _varlen(cu_seqlens_k=arr((3,)))),
    ("cu_seqlens_q", ArgumentValueError, "1-D array of B + 1 >= 1 entries",
     _varlen(cu_seqlens_q=arr((3, 1), np.int32))),
    ("cu_seqlens_k", ArgumentValueError, "1-D array of B + 1 >= 1 entries",
     _varlen(cu_seqlens_k=arr((0,), np.int32))),
    ("cu_seqlens_q", ArgumentValueError, "expected a contiguous array",
     _varlen(cu_seqlens_q=arr((3,), np.int32, strides=(8,)))),
    ("cu_seqlens_q", ArgumentValueError, "aligned",
     _varlen(cu_seqlens_q=arr((3,), np.int32, offset=2))),
    ("cu_seqlens_k", ArgumentValueError, "expected cu_seqlens_q's length 3 (B + 1), got 4",
     _varlen(cu_seqlens_k=arr((4,), np.int32))),
    ("cu_seqlens_q", ArgumentValueError, "at most 65535 sequences",
     _varlen(cu_seqlens_q=arr((65537,), np.int32), cu_seqlens_k=arr((65537,), np.int32))),
    ("max_seqlen_q", ArgumentValueError, "expected an int with cu_seqlens",
     _drop(_varlen(), "max_seqlen_q")),
    ("max_seqlen_k", ArgumentValueError, "expected an int with cu_seqlens",
     _varlen(max_seqlen_k=None)),
    ("max_seqlen_q", ArgumentValueError, "from 0 to 2147483647 (the longest sequence), got -1",
     _varlen(max_seqlen_q=-1)),
    ("max_seqlen_k", ArgumentValueError, "expected an int from 0 to 2147483647",
     _varlen(max_seqlen_k=2**31)),
    ("max_seqlen_q", ArgumentTypeError, "expected an int, got 8.0", _varlen(max_seqlen_q=8.0)),
    ("max_seqlen_k", ArgumentTypeError, "expected an int, got True",
     _varlen(max_seqlen_k=True)),
    ("max_seqlen_q", ArgumentValueError, "expected None without cu_seqlens_q",
     _dense(max_seqlen_q=5)),
    ("max_seqlen_k", ArgumentValueError, "expected None without cu_seqlens_q",
     _dense(max_seqlen_k=7)),
    ("q", ArgumentValueError, "at most 2147483647 packed rows", _varlen(q=arr((2**31, H, D)))),
    # several sequences a row (seq_bounds)
    ("seq_bounds", ArgumentValueError, "expected None with cu_seqlens",
     _varlen(seq_bounds=arr((2, 6, 2), np.int32))),
    ("seq_bounds", ArgumentValueError, "expected q and k of one length",
     _dense(seq_bounds=arr((B, SQ, 2), np.int32))),
    ("seq_bounds", ArgumentTypeError, "expected a GPU array",
     _dense(k=arr(_q[:2] + _k[2:]), v=arr(_q[:2] + _v[2:]),
            seq_bounds=np.zeros((B, SQ, 2), np.int32))),
    ("seq_bounds", ArgumentValueError, "expected dtype int32, got int64",
     _dense(k=arr(_q[:2] + _k[2:]), v=arr(_q[:2] + _v[2:]),
            seq_bounds=arr((B, SQ, 2), np.int64))),
    ("seq_bounds", ArgumentValueError, "expected shape (2, 5, 2) (batch, seq, 2), got (2, 5)",
     _dense(k=arr(_q[:2] + _k[2:]), v=arr(_q[:2] + _v[2:]), seq_bounds=arr((B, SQ), np.int32))),
    ("seq_bounds", ArgumentValueError, "expected a contiguous array",
     _dense(k=arr(_q[:2] + _k[2:]), v=arr(_q[:2] + _v[2:]),
            seq_bounds=arr((B, SQ, 2), np.int32, strides=(SQ * 16, 16, 4)))),
    ("seq_bounds", DeviceMismatchError, "GPU 1",
     _dense(k=arr(_q[:2] + _k[2:]), v=arr(_q[:2] + _v[2:]),
            seq_bounds=arr((B, SQ, 2), np.int32, device=1))),
]


@pytest.mark.parametrize("name, error, fragment, args", REFUSALS,
                         ids=[f"{i}-{r[0]}" for i, r in enumerate(REFUSALS)])
def test_a_refusal_names_its_argument_in_one_line(name, error, fragment, args):
    with pytest.raises(error) as e:
        op.check_arguments(**args)
    message = str(e.value)
    assert message.startswith(f"{name}: "), message
    assert fragment in message, message
    assert "\n" not in message


def test_layout_messages_say_what_fixes_them():
    cases = [(_dense(q=arr(_q, offset=8)), "q.clone() or cupy.array(q)"),
             (_dense(k=padded(_k, (0, 0, 0, 4))), "pass k.contiguous() (a copy)"),
             (_dense(q=arr(_q, strides=(SQ * H * D * 4, H * D * 4, D * 4, 4))),
              "pass q.contiguous() (a copy)")]
    for args, hint in cases:
        with pytest.raises(ArgumentValueError) as e:
            op.check_arguments(**args)
        assert hint in str(e.value)


def test_an_unknown_keyword_is_refused():
    with pytest.raises(ArgumentTypeError, match=r"^window_size: not an argument of attention"):
        op.check_arguments(*qkv(), window_size=(1, 1))


def test_arrays_of_one_call_are_checked_against_q_device_without_a_current_one():
    q, k, v = qkv()
    with pytest.raises(DeviceMismatchError, match=r"^v: expected an array on q's device "
                                                  r"\(GPU 0\), got one on GPU 1"):
        op.checked({"q": q, "k": k, "v": arr(v.shape, device=1)})
    assert op.checked({"q": arr(q.shape, device=1), "k": arr(k.shape, device=1),
                       "v": arr(v.shape, device=1)}).batch == B


# ---------------------------------------------------------------- the Hopper kernel's choice


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 90)


def test_on_sm_90_the_hopper_kernel_is_the_default_and_sm_80_configs_can_be_pinned(hopper):
    call = check(*qkv(d=128), causal=True)
    assert call.hopper and call.config == SM90_CONFIGS[128][0] and call.reason == "default"
    assert call.spec == make_sm90_spec(DType.F16, 128, causal=True)
    pinned = check(*qkv(d=128), config=CONFIGS[128][1].name)
    assert not pinned.hopper and pinned.config == CONFIGS[128][1] and pinned.reason == "pinned"
    # no keys: nothing for the tensor maps to describe: the sm_80 kernel writes 0 and -inf
    assert not check(*qkv(sk=0)).hopper


def test_on_sm_90_short_causal_calls_at_head_dim_64_take_their_own_default(hopper):
    """Up to SM90_SHORT_DEFAULT's keys (the longest packed sequence's with cu_seqlens) a causal
    Hopper forward at head_dim 64 takes the smaller key block; calls without the mask, a pinned
    or tuned config, other head dims and sm_80 keep theirs."""
    keys, short = SM90_SHORT_DEFAULT[64]
    for sk in (1, keys):
        call = check(*qkv(d=64, sk=sk), causal=True)
        assert call.config == short
        assert call.reason == f"default for causal calls of at most {keys} keys"
        assert call.spec == make_sm90_spec(DType.F16, 64, config=short, causal=True)
        call = check(*qkv(d=64, sk=sk))   # no mask: the long sequences' default
        assert call.config == SM90_CONFIGS[64][0] and call.reason == "default"
    call = check(*qkv(d=64, sk=keys + 1), causal=True)
    assert call.config == SM90_CONFIGS[64][0] and call.reason == "default"
    assert check(*qkv(d=128, sk=16), causal=True).config == SM90_CONFIGS[128][0]
    assert check(*qkv(d=64, sk=16), causal=True, config="h256s2p").config == SM90_CONFIGS[64][0]
    (q, k, v), kw = packed(d=64)
    assert check(q, k, v, causal=True, **kw).config == short   # max_seqlen_k 11
    assert check(q, k, v, **kw).config == SM90_CONFIGS[64][0]
    assert default_config(64, 90, None, causal=True) == (SM90_CONFIGS[64][0], "default")
    assert default_config(64, 90, 16) == (SM90_CONFIGS[64][0], "default")
    assert default_config(64, 80, 16, causal=True) == (CONFIGS[64][0], "default")
    assert default_configs(64, 90, causal=True) == [SM90_CONFIGS[64][0], short]
    assert default_configs(64, 90) == [SM90_CONFIGS[64][0]]
    assert default_configs(128, 90, causal=True) == [SM90_CONFIGS[128][0]]
    assert short in SM90_CONFIGS[64]   # a candidate: tune and pins name it


def test_a_hopper_config_elsewhere_is_refused_in_one_line():
    with pytest.raises(ArgumentValueError, match=r"^config: expected one of .*; it runs the "
                                                 r"Hopper kernel: sm_90 only$"):
        check(*qkv(d=128), config=SM90_CONFIGS[128][0].name)


def test_the_hopper_launch_takes_tensor_maps_of_the_arrays_by_their_strides(hopper):
    q, k, v = qkv(d=128)
    call = check(q, k, v, causal=True, return_lse=True)
    grid, block, smem, params = op.launch_params(call)
    # the default at d128 is persistent: a block per SM (here none given: one per tile)
    assert call.spec.persistent and grid == (H * B, 1, 1)
    assert op.launch_params(call, sms=3)[0] == (3, 1, 1)
    plain = check(q, k, v, causal=True, return_lse=True, config="h128s2")
    assert op.launch_params(plain, sms=3)[0] == (1, H, B)
    assert block == (384, 1, 1) and smem == call.spec.smem_bytes
    assert "qs" not in params and (params["ob"], params["os"], params["oh"]) == \
        (SQ * H * 128, H * 128, 128)
    assert set(op.pointers(call, q, None)) == {"o", "lse", "cu_seqlens_q", "cu_seqlens_k"}
    geo = op.map_geometry(call)
    item = 2
    assert geo["tma_q"] == (0, (128, SQ, H, B), (H * 128 * item, 128 * item,
                                                 SQ * H * 128 * item), (64, 128, 1, 1))
    assert geo["tma_k"] == (1, (128, SK, HKV, B), (HKV * 128 * item, 128 * item,
                                                   SK * HKV * 128 * item),
                            (64, call.spec.block_n, 1, 1))
    # (B, H, S, D) read by its strides: the same dimensions, other strides
    bhsd = check(arr((B, H, SQ, 128)), arr((B, HKV, SK, 128)), arr((B, HKV, SK, 128)),
                 layout="bhsd")
    assert op.map_geometry(bhsd)["tma_q"] == (0, (128, SQ, H, B), (128 * item, SQ * 128 * item,
                                                                   H * SQ * 128 * item),
                                              (64, 128, 1, 1))


def test_the_persistent_forward_takes_heads_in_sections_that_fit_in_l2(hopper):
    call = check(*qkv(d=128), causal=True, config="h128s2p")
    _, _, _, params = op.launch_params(call, sms=132)
    assert params["heads_group"] == heads_group(B, H, HKV, SK, 128) == B * H   # all fit
    mib = 1 << 20
    # one kv head of 16384 keys at d128 in 16-bit: 8 MiB, 4 in 32 MiB; a group of 4 q heads
    assert heads_group(1, 32, 32, 16384, 128) == 4
    assert heads_group(4, 32, 8, 16384, 128) == 16
    assert heads_group(4, 32, 8, 4096, 128) == 64     # 16 kv heads of 2 MiB: 64 q heads
    assert heads_group(1, 8, 1, 1 << 20, 128) == 8    # a group too big for L2: still whole
    assert heads_group(2, 2, 2, 0, 64) == 4
    assert L2_SECTION_BYTES == 32 * mib


def test_packed_maps_and_strides_of_single_element_dims(hopper):
    (q, k, v), kw = packed(d=128)
    call = check(q, k, v, **kw)
    assert op.map_geometry(call)["tma_q"] == (0, (128, 12, H), (H * 256, 256), (64, 128, 1))
    # a dimension of one element: any stride it has becomes a contiguous array's
    assert op._map_strides((128, 5, 1, 1), (1024, 8, 3), 2) == (2048, 10240, 10240)
