"""rope and rope_backward through the public op on the GPU against the float64 reference:
CuPy arrays and PyTorch tensors, both layouts, positions, batched tables, grouped-query k,
k absent, partial rotary dimensions, (batch, heads, seq, head_dim) arrays as transposed views,
outputs given, in place, repeated calls on the prepared path with fresh inputs, an
out-of-range position, explain and the warm-up table. Outputs are poisoned with NaN."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.rope.reference import rope_reference

from ...gpu_arrays import cp

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}
_rng = np.random.default_rng(7)


def _dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _host(shape, dtype):
    return (_rng.standard_normal(shape) * 2).astype(np.float32).astype(_dtype(dtype))


def _tables(rows, half, dtype, batch=None):
    shape = (rows, half) if batch is None else (batch, rows, half)
    angles = _rng.uniform(-np.pi, np.pi, shape)
    return (np.cos(angles).astype(np.float32).astype(_dtype(dtype)),
            np.sin(angles).astype(np.float32).astype(_dtype(dtype)))


def _close(got, ref, tol):
    got = cp.asnumpy(got).astype(np.float64)
    assert got.shape == ref.shape
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    err = np.abs(got[~nan] - ref[~nan]).max(initial=0) / max(np.abs(ref[~nan]).max(initial=1),
                                                              1e-30)
    assert err <= tol, err


def _run(dtype, *, b=2, s=33, hq=4, hk=2, d=64, half=None, interleaved=False, pos=None,
         table=None, batched=False, backward=False, out="new", hbsd=False):
    half = half or d // 2
    q, k = _host((b, s, hq, d), dtype), None if hk == 0 else _host((b, s, hk, d), dtype)
    rows = s + 5 if pos else s
    cos, sin = _tables(rows, half, table or dtype, b if batched else None)
    positions = None if pos is None else _rng.integers(0, rows, (b, s)).astype(pos)
    ref = rope_reference(*(x if x is None else x.astype(np.float64) for x in (q, k)),
                         cos.astype(np.float64), sin.astype(np.float64),
                         interleaved=interleaved, positions=positions, backward=backward)
    if hbsd:   # held as (batch, heads, seq, head_dim), passed as the transposed view
        gq = cp.asarray(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
        gk = None if k is None else cp.asarray(
            np.ascontiguousarray(k.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
    else:
        gq, gk = cp.asarray(q), None if k is None else cp.asarray(k)
    fn = ge2jit.rope_backward if backward else ge2jit.rope
    args = (gq, gk, cp.asarray(cos), cp.asarray(sin))
    kw = dict(interleaved=interleaved,
              positions=None if positions is None else cp.asarray(positions))
    if out == "new":
        qo, ko = fn(*args, **kw)
    elif out == "inplace":
        qo, ko = fn(*args, **kw, out=(gq, gk))
        assert qo is gq and ko is gk
    else:   # given: slices of wider buffers poisoned with NaN
        wide_q = cp.full((b, s, hq, d + 8), np.nan, gq.dtype)
        wide_k = None if k is None else cp.full((b, s, hk, d + 8), np.nan, gq.dtype)
        given = (wide_q[..., 8:], None if k is None else wide_k[..., 8:])
        qo, ko = fn(*args, **kw, out=given)
        assert qo is given[0]
        assert cp.isnan(wide_q[..., :8]).all()
    _close(qo, ref[0], TOL[dtype])
    if k is None:
        assert ko is None
    else:
        _close(ko, ref[1], TOL[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_both_layouts_and_directions(dtype, interleaved, backward):
    _run(dtype, interleaved=interleaved, backward=backward)


@pytest.mark.parametrize("opts", [
    dict(pos="int32"), dict(pos="int64", batched=True), dict(batched=True),
    dict(hk=0), dict(hk=8), dict(d=80, half=24), dict(d=6, half=3, interleaved=True),
    dict(d=128, half=32, pos="int64"), dict(table="float32"), dict(hbsd=True),
    dict(out="inplace"), dict(out="given"), dict(out="inplace", d=80, half=24),
    dict(b=1, s=1, hq=1, hk=1), dict(s=1000, hq=32, hk=8, d=128),
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_options(dtype, opts):
    _run(dtype, **opts)


@pytest.mark.parametrize("out", ["new", "given", "inplace"])
def test_repeated_calls_take_fresh_inputs_on_the_compiled_path(out):
    from ge2jit.jit.fastlaunch import available
    from ge2jit.ops.rope.op import _COMPILED

    for _ in range(3):
        _run("bfloat16", s=17, out=out, hbsd=True)
        _run("float32", s=17, out=out, hk=0)
    if available():
        assert _COMPILED[False].stats()["hits"] >= 2


def test_a_new_output_is_laid_out_as_its_input():
    q = cp.asarray(_host((2, 4, 8, 16), "float32")).swapaxes(1, 2)   # (2, 8, 4, 16) view
    cos, sin = (cp.asarray(t) for t in _tables(8, 8, "float32"))
    for _ in range(2):   # the Python path, then the compiled one
        qo, _ = ge2jit.rope(q, None, cos, sin)
        assert qo.strides == q.strides
        qo, _ = ge2jit.rope(cp.ascontiguousarray(q), None, cos, sin)
        assert qo.flags.c_contiguous


def test_an_out_of_range_position_gives_nan_and_no_fault():
    q = cp.asarray(_host((1, 4, 2, 16), "float32"))
    cos, sin = (cp.asarray(t) for t in _tables(8, 8, "float32"))
    positions = cp.asarray(np.array([[0, 7, 8, -1]], np.int64))
    qo, _ = ge2jit.rope(q, None, cos, sin, positions=positions)
    host = cp.asnumpy(qo)
    assert np.isfinite(host[0, :2]).all() and np.isnan(host[0, 2:]).all()
    cp.cuda.Device().synchronize()


def test_torch_tensors_and_explain():
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 8, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    ang = torch.rand(8, 32, device="cuda") * 6
    cos, sin = ang.cos(), ang.sin()
    qo, ko = ge2jit.rope(q, k, cos, sin)
    assert isinstance(qo, torch.Tensor) and qo.shape == q.shape and qo.dtype == q.dtype
    ref = rope_reference(q.double().cpu().numpy(), k.double().cpu().numpy(),
                         cos.double().cpu().numpy(), sin.double().cpu().numpy())
    assert np.abs(qo.double().cpu().numpy() - ref[0]).max() < 0.05
    e = ge2jit.explain(ge2jit.rope, q, k, cos, sin)
    assert e.kernel_names[0].startswith("rope_fwd_") and e.reason == "fixed"
    assert e.spill_bytes == (0,)


def test_empty_and_bad_calls_on_the_gpu():
    q = cp.empty((2, 0, 4, 16), cp.float32)
    cos = cp.ones((4, 8), cp.float32)
    qo, ko = ge2jit.rope(q, None, cos, cos)
    assert qo.shape == q.shape and ko is None
    q, k = (cp.asarray(_host((1, 4, 2, 16), "float32")) for _ in range(2))
    with pytest.raises(ge2jit.ArgumentValueError, match="q_out: overlaps k; pass a separate"):
        ge2jit.rope(q, k, cos, cos, out=(k, q))
