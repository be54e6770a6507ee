"""The Hopper attention forward (``kernel_templates/attention/fwd_sm90.cu``) launched by itself
on CuPy arrays with its tensor maps, against the float64 reference with the tolerances of
``helpers.check`` (the same arithmetic as the sm_80 kernel). From the simplest case to every
option: one key block, ragged lengths, every head dimension and type, masks, soft-capping,
GQA, (B, H, S, D) strides, packed sequences, lse. Needs an sm_90 GPU; run with ``-x``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ge2jit.jit.loader import launcher_for
from ge2jit.ops.attention.spec import SM90_CONFIGS, make_sm90_spec
from ge2jit.runtime.dtypes import SUPPORTED_DTYPES

from ...gpu_arrays import cp
from .helpers import check, inputs, rng_for, tensor_map_of

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory", "sm90")]

def _run(dtype="bfloat16", d=128, s_q=200, s_k=300, b=2, h=4, h_kv=None, causal=False,
         window=None, softcap=None, scale=None, lse=False, bhsd=False, seqlens=None,
         overlap=False, config=None):
    h_kv = h if h_kv is None else h_kv
    rng = rng_for("sm90", dtype, d, s_q, s_k, b, h, h_kv, causal, window, softcap, lse, bhsd,
                  seqlens, overlap, config)
    q, k, v, cu_q, cu_k = inputs(rng, dtype, b, s_q, s_k, h, h_kv, d, seqlens)
    varlen = seqlens is not None

    def dev(x):
        if bhsd:   # stored (B, H, S, D); the kernel sees its transposed view
            return cp.asarray(np.ascontiguousarray(x.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
        return cp.asarray(x)

    dq, dk, dv = dev(q), dev(k), dev(v)
    o = cp.full(q.shape, np.nan, np.float32).astype(q.dtype)
    if bhsd:
        o = cp.ascontiguousarray(o.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    config = config or next(c for c in SM90_CONFIGS[d] if c.overlap == overlap)
    spec = make_sm90_spec(SUPPORTED_DTYPES[dtype], d, config=config, causal=causal,
                          window=window is not None, softcap=bool(softcap), varlen=varlen,
                          write_lse=lse)
    if varlen:
        batch, lens_q, lens_k = len(seqlens[0]), max(seqlens[0]), max(seqlens[1])
        lse_shape = (h, q.shape[0])
        cu = (cp.asarray(cu_q), cp.asarray(cu_k))
    else:
        batch, lens_q, lens_k = b, s_q, s_k
        lse_shape = (b, h, s_q)
        cu = (None, None)
    lse_out = cp.full(lse_shape, np.nan, np.float32)
    el = [st // q.itemsize for st in o.strides]
    ob, os_, oh = (0, el[0], el[1]) if varlen else (el[0], el[1], el[2])
    left, right = window if window is not None else (-1, -1)
    stream = cp.cuda.get_current_stream()
    launcher_for(spec, cp.cuda.runtime.getDevice()).launch(
        # (persistent: 7 blocks, each taking several tiles, several of them past a sequence)
        spec.grid(batch, h, lens_q, sms=7), (spec.threads, 1, 1), spec.smem_bytes, stream.ptr,
        tma_q=tensor_map_of(dtype, dq, 128, varlen),
        tma_k=tensor_map_of(dtype, dk, spec.block_n, varlen),
        tma_v=tensor_map_of(dtype, dv, spec.block_n, varlen), o=o.data.ptr, lse=lse_out.data.ptr,
        cu_seqlens_q=0 if cu[0] is None else cu[0].data.ptr,
        cu_seqlens_k=0 if cu[1] is None else cu[1].data.ptr, ob=ob, os=os_, oh=oh, B=batch,
        H=h, H_kv=h_kv, S_q=lens_q, S_k=lens_k,
        scale=1.0 / math.sqrt(d) if scale is None else float(scale),
        softcap=float(softcap or 0.0), window_left=left, window_right=right,
        # (persistent: sections of 3 (sequence, head) pairs, the last one often smaller)
        heads_group=3)
    stream.synchronize()
    o_host = cp.asnumpy(o).astype(np.float64)
    lse_host = cp.asnumpy(lse_out).astype(np.float64) if lse else None
    if not lse:
        assert np.isnan(cp.asnumpy(lse_out)).all(), "lse written without write_lse"
    # the sm_80 spec's block_m only names rows in messages: the Hopper block's is 128
    check(dtype, q, k, v, o_host, lse_host, _Rows(), causal=causal, window=window,
          softcap=softcap, scale=scale, cu_q=cu_q, cu_k=cu_k)


class _Rows:
    """What ``check`` reads of a spec: the query rows of a block, for its messages."""

    class config:
        block_m = 128


OVERLAP = pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])


@OVERLAP
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_one_block_then_ragged_lengths(dtype, d, overlap):
    _run(dtype, d=d, s_q=128, s_k=64, b=1, h=1, overlap=overlap)
    _run(dtype, d=d, s_q=200, s_k=333, overlap=overlap)
    _run(dtype, d=d, s_q=300, s_k=1000, overlap=overlap)   # many key blocks


@pytest.mark.parametrize("options", [
    dict(causal=True), dict(causal=True, s_q=100, s_k=400), dict(causal=True, s_q=400, s_k=100),
    dict(window=(30, 10)), dict(causal=True, window=(64, -1)), dict(softcap=15.0),
    dict(h=8, h_kv=2), dict(h=8, h_kv=1, causal=True), dict(lse=True),
    dict(lse=True, causal=True, softcap=5.0), dict(bhsd=True), dict(bhsd=True, causal=True),
    dict(d=256, causal=True, lse=True), dict(d=64, window=(0, 0)), dict(scale=0.05),
], ids=str)
@OVERLAP
def test_options(options, overlap):
    _run("bfloat16", overlap=overlap, **options)


@OVERLAP
@pytest.mark.parametrize("d", [64, 128, 256])
def test_packed_sequences(d, overlap):
    seqlens = ([5, 0, 300, 130], [70, 3, 300, 0])
    _run("float16", d=d, h=4, h_kv=2, seqlens=seqlens, causal=True, lse=True, overlap=overlap)
    _run("bfloat16", d=d, h=4, seqlens=seqlens, window=(20, 20), overlap=overlap)


EVERY = [(d, c) for d, cs in SM90_CONFIGS.items() for c in cs]


@pytest.mark.parametrize("d, config", EVERY, ids=[f"{d}-{c.name}" for d, c in EVERY])
def test_every_candidate_config(d, config):
    _run("bfloat16", d=d, s_q=300, s_k=1000, config=config)
    _run("float16", d=d, s_q=257, s_k=129, causal=True, lse=True, h=4, h_kv=2, config=config)
    _run("bfloat16", d=d, s_q=200, s_k=333, window=(30, 10), softcap=10.0, config=config)
    _run("bfloat16", d=d, h=4, seqlens=([5, 0, 300, 130], [70, 3, 300, 0]), causal=True,
         config=config)
    _run("bfloat16", d=d, s_q=1000, s_k=1000, b=3, h=8, h_kv=2, causal=True, config=config)
