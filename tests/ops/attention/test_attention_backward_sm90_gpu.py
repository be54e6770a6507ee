"""The Hopper attention backward's dq and dkv kernels (``kernel_templates/attention/
bwd_sm90.cu``) launched by themselves with their tensor maps, on the forward's o and lse (delta
computed here, as the "dot" kernel does), against the float64 backward with
``helpers.check_grads``'s bounds. Needs an sm_90 GPU; run with ``-x``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ge2jit
from ge2jit.jit.loader import launcher_for
from ge2jit.ops.attention.spec import bwd_specs_for, make_bwd_sm90_specs
from ge2jit.runtime.dtypes import SUPPORTED_DTYPES

from ...gpu_arrays import DT, cp
from .helpers import check_grads, inputs, rng_for, tensor_map_of

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory", "sm90")]

def _strides(x, varlen):
    el = [st // x.itemsize for st in x.strides]
    return (0, el[0], el[1]) if varlen else (el[0], el[1], el[2])


def _run(dtype="bfloat16", d=128, s_q=200, s_k=300, b=2, h=4, h_kv=None, causal=False,
         window=None, softcap=None, scale=None, seqlens=None, fused=False):
    """``fused``: the one-kernel backward (dkvq: dq added into a zeroed float32 array by
    atomics, scaled and rounded here) in place of the dq and dkv kernels, at its narrow step
    (config "sm90n"); "wide": at its wide step (config "sm90w"); "deferred": each step's dq
    product under the next step's (config "sm90d": at head_dim 64 the default's step for
    these queries)."""
    h_kv = h if h_kv is None else h_kv
    rng = rng_for("bwd sm90", dtype, d, s_q, s_k, b, h, h_kv, causal, window, softcap, seqlens)
    q, k, v, cu_q, cu_k = inputs(rng, dtype, b, s_q, s_k, h, h_kv, d, seqlens)
    do = rng.standard_normal(q.shape).astype(np.float32).astype(DT[dtype])
    varlen = seqlens is not None
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale)
    dev = {n: cp.asarray(x) for n, x in (("q", q), ("k", k), ("v", v), ("do", do))}
    if varlen:
        cu = (cp.asarray(cu_q), cp.asarray(cu_k))
        kw.update(cu_seqlens_q=cu[0], cu_seqlens_k=cu[1], max_seqlen_q=max(seqlens[0]),
                  max_seqlen_k=max(seqlens[1]))
        batch, lens_q, lens_k = len(seqlens[0]), max(seqlens[0]), max(seqlens[1])
    else:
        cu = (None, None)
        batch, lens_q, lens_k = b, s_q, s_k
    o, lse = ge2jit.attention(dev["q"], dev["k"], dev["v"], return_lse=True, **kw)
    o_h, lse_h = cp.asnumpy(o).astype(np.float64), cp.asnumpy(lse).astype(np.float64)
    prod = (do.astype(np.float64) * o_h).sum(-1)            # (B, S, H) or (T, H)
    # (H, T) or (B, H, S), C-ordered: cp.asarray keeps a transposed 2-D array's F order
    delta = cp.asarray(np.ascontiguousarray(prod.T if varlen else prod.transpose(0, 2, 1),
                                            np.float32))
    grads = {n: cp.full(dev[x].shape, np.nan, np.float32).astype(DT[dtype])
             for n, x in (("dq", "q"), ("dk", "k"), ("dv", "v"))}
    flags = dict(causal=causal, window=window is not None, softcap=bool(softcap), varlen=varlen)
    if fused:
        family = {"wide": "sm90w", "deferred": "sm90d"}.get(fused, "sm90n")
        specs = bwd_specs_for(family, SUPPORTED_DTYPES[dtype], d, seqlen_q=lens_q,
                              **flags)[1:2]
        assert specs[0].kind == "dkvq"
    else:
        specs = make_bwd_sm90_specs(SUPPORTED_DTYPES[dtype], d, **flags)
    pad = specs[0].step   # dq_accum: each sequence's rows from a whole tile of the step
    total = int(cu_q[-1]) if varlen else 0
    accum = cp.zeros((h, total + batch * pad, d) if varlen
                     else (batch, h, -(-lens_q // pad) * pad, d), np.float32)
    left, right = window if window is not None else (-1, -1)
    common = dict(lse=lse.data.ptr, delta=delta.data.ptr, dq_accum=accum.data.ptr if fused else 0,
                  dq=grads["dq"].data.ptr, dk=grads["dk"].data.ptr, dv=grads["dv"].data.ptr,
                  cu_seqlens_q=0 if cu[0] is None else cu[0].data.ptr,
                  cu_seqlens_k=0 if cu[1] is None else cu[1].data.ptr, B=batch, H=h, H_kv=h_kv,
                  S_q=lens_q, S_k=lens_k,
                  scale=1.0 / math.sqrt(d) if scale is None else float(scale),
                  softcap=float(softcap or 0.0), window_left=left, window_right=right)
    for n in ("dq", "dk", "dv"):
        common.update(zip((n + "b", n + "s", n + "h"), _strides(grads[n], varlen)))
    stream = cp.cuda.get_current_stream()
    for spec in specs:
        own, step = (("q", "do"), ("k", "v")) if spec.kind == "dq" else (("k", "v"), ("q", "do"))
        maps = {f"tma_{n}": tensor_map_of(dtype, dev[n], 128 if n in own else spec.step, varlen)
                for n in ("q", "k", "v", "do")}
        launcher_for(spec, cp.cuda.runtime.getDevice()).launch(
            spec.grid(batch, h, h_kv, lens_q, lens_k), (spec.threads, 1, 1), spec.smem_bytes,
            stream.ptr, **maps, **common)
    if fused:   # dq_accum's rows to dq's layout, each row's 4-column groups put back
        grads["dq"][...] = cp.asarray((_from_accum(cp.asnumpy(accum), cu_q, lens_q, pad)
                                       * common["scale"]).astype(DT[dtype]))
    stream.synchronize()
    host = [cp.asnumpy(grads[n]).astype(np.float64) for n in ("dq", "dk", "dv")]
    check_grads(dtype, q, k, v, do, o_h, lse_h, host, causal=causal, window=window,
                softcap=softcap, scale=scale, cu_q=cu_q, cu_k=cu_k)


def _from_accum(acc, cu_q, lens_q, pad):
    """dq (B, S, H, D) or packed (T, H, D) from the one-kernel backward's float32 dq_accum
    (masks.cuh's dq_accum_row and dq_accum_col)."""
    d = acc.shape[-1]
    cols = np.arange(d)
    where = np.stack([(((cols >> 2) ^ r) << 2) | (cols & 3) for r in range(8)])   # [i % 8]
    if cu_q is None:
        rows = acc[:, :, :lens_q]                                   # (B, H, S, D)
        rows = np.take_along_axis(rows, where[np.arange(lens_q) % 8][None, None], axis=-1)
        return rows.transpose(0, 2, 1, 3)
    out = np.zeros((int(cu_q[-1]), acc.shape[0], d), np.float32)
    for b in range(len(cu_q) - 1):
        n = int(cu_q[b + 1] - cu_q[b])
        start = int(cu_q[b]) + b * pad
        rows = acc[:, start:start + n]                              # (H, n, D)
        rows = np.take_along_axis(rows, where[np.arange(n) % 8][None], axis=-1)
        out[int(cu_q[b]):int(cu_q[b]) + n] = rows.transpose(1, 0, 2)
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_head_dim(dtype, d):
    _run(dtype, d=d, s_q=128, s_k=128, b=1, h=1)
    _run(dtype, d=d, s_q=200, s_k=333)


@pytest.mark.parametrize("options", [
    dict(causal=True), dict(causal=True, s_q=100, s_k=400), dict(causal=True, s_q=400, s_k=100),
    dict(window=(30, 10)), dict(softcap=15.0), dict(softcap=5.0, causal=True),
    dict(h=8, h_kv=2), dict(h=8, h_kv=1, causal=True), dict(d=256, causal=True, h=4, h_kv=2),
    dict(scale=0.05),
], ids=str)
def test_options(options):
    _run("bfloat16", **options)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_packed_sequences(d):
    seqlens = ([5, 0, 300, 130], [70, 3, 300, 0])
    _run("float16", d=d, h=4, h_kv=2, seqlens=seqlens, causal=True)
    _run("bfloat16", d=d, h=4, seqlens=seqlens, window=(20, 20), softcap=8.0)


@pytest.mark.parametrize("options", [
    dict(d=64), dict(d=128), dict(d=64, dtype="float16", s_q=128, s_k=128, b=1, h=1),
    dict(d=128, causal=True, s_q=100, s_k=400), dict(d=128, causal=True, s_q=400, s_k=100),
    dict(d=64, window=(30, 10), softcap=15.0), dict(d=128, h=8, h_kv=2, causal=True),
    dict(d=64, h=8, h_kv=1), dict(d=128, scale=0.05),
    dict(d=128, seqlens=([5, 0, 300, 130], [70, 3, 300, 0]), h=4, h_kv=2, causal=True),
    dict(d=64, seqlens=([5, 0, 300, 130], [70, 3, 300, 0]), window=(20, 20), softcap=8.0),
], ids=str)
def test_the_one_kernel_backward(options):
    _run(options.pop("dtype", "bfloat16"), fused=True, **options)


@pytest.mark.parametrize("options", [
    dict(d=64), dict(d=128), dict(d=64, dtype="float16", s_q=96, s_k=96, b=1, h=1),
    dict(d=128, causal=True, s_q=100, s_k=400), dict(d=128, causal=True, s_q=400, s_k=100),
    dict(d=64, window=(30, 10)), dict(d=128, h=8, h_kv=2, causal=True),
    dict(d=64, h=8, h_kv=1, s_q=385), dict(d=128, scale=0.05, s_q=1000, s_k=700),
    dict(d=64, seqlens=([5, 0, 300, 130], [70, 3, 300, 0]), h=4, h_kv=2, causal=True),
], ids=str)
def test_the_wide_one_kernel_backward(options):
    _run(options.pop("dtype", "bfloat16"), fused="wide", **options)


@pytest.mark.parametrize("options", [
    dict(), dict(dtype="float16", s_q=64, s_k=64, b=1, h=1), dict(s_q=1, s_k=1),
    dict(causal=True, s_q=100, s_k=400), dict(causal=True, s_q=400, s_k=100),
    dict(window=(30, 10), softcap=15.0), dict(h=8, h_kv=1, s_q=385), dict(scale=0.05),
    dict(seqlens=([5, 0, 300, 130], [70, 3, 300, 0]), h=4, h_kv=2, causal=True),
    dict(seqlens=([5, 0, 300, 130], [70, 3, 300, 0]), window=(20, 20), softcap=8.0),
    dict(causal=True, s_q=2048, s_k=2048, b=1, h=2),   # the wide step at head_dim 64
], ids=str)
@pytest.mark.parametrize("d", [64, 128])
def test_the_deferred_dq_one_kernel_backward(d, options):
    """Each step's dq product issued under the next step's products (a block's last one after
    its loop): one step (s_k 1), a block of one step's queries, masked rows, grouped heads."""
    if d == 128 and options.get("softcap"):
        pytest.skip("refused at head_dim 128 (it would spill): covered by the CPU tests")
    _run(options.pop("dtype", "bfloat16"), d=d, fused="deferred", **options)
