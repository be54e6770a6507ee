"""softmax_backward on the GPU against the float64 reference ``y * (dy - sum(dy * y))``
computed from the inputs' own values (16-bit inputs included).

Every dtype, row lengths from 1 to 40000 (the edges of every backward variant: warp up to 512,
block up to 16384, loop beyond) and several row counts; mixed output types; in place (``out=dy``
and ``out=y``); rows of wider arrays (aligned and not); other axes (the strided variant) and
layouts that are copied; every backward config pinned; NaN and infinities; empty and 0-d
arrays; the same bits on every run; PyTorch tensors against PyTorch's own softmax backward.
Outputs are poisoned with NaN before each run; inputs are fresh random values: ``y`` a real
softmax output (rounded to the dtype), ``dy`` standard normal.

Tolerance, elementwise: the float32 math's error, 1e-5 * y * (|dy| + sum |dy * y|) (the dot
product's rounding over a row, relative to the terms it adds), plus one rounding of a 16-bit
output (float16 2**-11, bfloat16 2**-8 relative; float16's subnormals 2**-24 absolute).
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.softmax import all_configs, choose, heuristic, parse_config, softmax_backward
from ge2jit.ops.softmax.reference import softmax_backward_ref, softmax_ref

from ...gpu_arrays import BF16, DT, DTYPES, cp, poisoned, same_bits

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

OUT_ROUNDING = {"float32": (0.0, 0.0), "float16": (2.0**-11, 2.0**-24),
                "bfloat16": (2.0**-8, 1e-30)}
LENGTHS = [1, 2, 31, 32, 33, 512, 513, 1000, 4097, 16384, 16385, 40000,
           7, 777, 12345]                       # the last three: "random" lengths
ROW_COUNTS = [1, 3, 130]

_rng = np.random.default_rng(77)


def inputs(shape, dtype, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(dy, y) on the host: y a softmax of random logits along ``axis``, dy standard normal,
    both rounded to ``dtype``."""
    x = _rng.standard_normal(shape) * 3
    y = softmax_ref(x, axis).astype(np.float32).astype(dtype)
    dy = _rng.standard_normal(shape).astype(np.float32).astype(dtype)
    return dy, y


def check(dx, dy: np.ndarray, y: np.ndarray, axis: int = -1, dtype=None) -> None:
    """dx (GPU or host) against the reference of the host inputs; ``dtype``: dx's expected
    dtype name (default dy's)."""
    got = cp.asnumpy(dx) if isinstance(dx, cp.ndarray) else np.asarray(dx)
    want = np.dtype(DT[dtype] if dtype else dy.dtype)
    assert got.dtype == want and got.shape == dy.shape, (got.dtype, got.shape)
    ref = softmax_backward_ref(dy, y, axis)
    g, v = dy.astype(np.float64), y.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.abs(v) * (np.abs(g) + np.sum(np.abs(g * v), axis=axis, keepdims=True))
        rel, atol = OUT_ROUNDING[want.name]
        bound = 1e-5 * scale + rel * np.abs(ref) + atol + 1e-30
        got64 = got.astype(np.float64)
        bad = ~((np.abs(got64 - ref) <= bound) | (np.isnan(ref) & np.isnan(got64))
                | (np.isinf(ref) & (got64 == ref)))
    assert not bad.any(), (np.argwhere(bad)[:5], got64[bad][:5], ref[bad][:5])


def _run(dy: np.ndarray, y: np.ndarray, axis: int = -1, config=None, out_dtype=None):
    """softmax_backward of the host inputs into a poisoned output, checked; the inputs must
    be left alone."""
    gdy, gy = cp.asarray(dy), cp.asarray(y)
    out = poisoned(dy.shape, DT[out_dtype] if out_dtype else dy.dtype)
    assert softmax_backward(gdy, gy, axis, out=out, config=config) is out
    check(out, dy, y, axis, out_dtype)
    assert same_bits(cp.asnumpy(gdy), dy) and same_bits(cp.asnumpy(gy), y)
    return out


@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_match_reference(dtype, n, rows):
    _run(*inputs((rows, n), DT[dtype]))


@pytest.mark.parametrize("n", [1, 5, 33, 128, 129, 500])
@pytest.mark.parametrize("dtype", DTYPES)
def test_many_short_rows(dtype, n):
    """Enough rows for several rows per lane group (warp _r2, _r4) and a partial last block."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    most = heuristic(10**9, n, dtype, sm_count=sms, backward=True)
    rows = 8 * sms * (128 // most.lanes) * 2 + 1
    assert heuristic(rows, n, dtype, sm_count=sms, backward=True).rows == min(2, most.rows)
    _run(*inputs((rows, n), DT[dtype]))


@pytest.mark.parametrize("n", [1, 33, 1000, 20000])
@pytest.mark.parametrize("types", [("float32", "bfloat16"), ("float32", "float16"),
                                   ("bfloat16", "float32"), ("float16", "float32")],
                         ids="->".join)
def test_mixed_output_types(types, n):
    src, dst = types
    _run(*inputs((9, n), DT[src]), out_dtype=dst)


@pytest.mark.parametrize("n", [1, 33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_new_output_and_in_place(dtype, n):
    dy, y = inputs((6, n), DT[dtype])
    dx = softmax_backward(cp.asarray(dy), cp.asarray(y))
    assert isinstance(dx, cp.ndarray) and dx.dtype == DT[dtype]
    check(dx, dy, y)
    for which in ("dy", "y"):
        gdy, gy = cp.asarray(dy), cp.asarray(y)
        target = gdy if which == "dy" else gy
        assert softmax_backward(gdy, gy, out=target) is target
        check(target, dy, y)
    gdy, gy = cp.asarray(np.ascontiguousarray(dy.T)), cp.asarray(np.ascontiguousarray(y.T))
    assert softmax_backward(gdy, gy, axis=0, out=gdy) is gdy       # strided, in place
    check(gdy, np.ascontiguousarray(dy.T), np.ascontiguousarray(y.T), axis=0)


@pytest.mark.parametrize("n", [2, 33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype, n):
    dy, y = inputs((6, n), DT[dtype])
    dy, y = dy.astype(np.float32), y.astype(np.float32)
    dy[0, n // 2] = np.nan                 # the row's dx: NaN
    y[1, n - 1] = np.nan                   # likewise
    dy[2, 0] = np.inf                      # an infinite dot product
    dy[3, :] = 0.0                         # dx = 0
    y[4, :] = 0.0                          # dx = 0
    dy[5, :] = 1.0                         # dx = y * (1 - sum(y)): about 0
    dy, y = dy.astype(DT[dtype]), y.astype(DT[dtype])
    out = _run(dy, y)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all()
    assert (got[3] == 0).all() and (got[4] == 0).all()
    _run(np.ascontiguousarray(dy.T), np.ascontiguousarray(y.T), axis=0)


@pytest.mark.parametrize("offsets", [(0, 0, 0), (1, 3, 5), (8, 8, 8), (5, 0, 2)], ids=str)
@pytest.mark.parametrize("n", [33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_wider_arrays(dtype, n, offsets):
    """dy, y and out are column slices of wider arrays (row strides of their own, aligned or
    not); the rest of out's array is left alone."""
    og, oy, ox = offsets
    rows = 9
    wdy, wy = inputs((rows, n + 64), DT[dtype])
    dy, y = cp.asarray(wdy)[:, og:og + n], cp.asarray(wy)[:, oy:oy + n]
    out_wide = poisoned((rows, n + 40), DT[dtype])
    out = out_wide[:, ox:ox + n]
    assert softmax_backward(dy, y, out=out) is out
    check(out, wdy[:, og:og + n], wy[:, oy:oy + n])
    rest = cp.asnumpy(out_wide).astype(np.float64)
    assert np.isnan(rest[:, :ox]).all() and np.isnan(rest[:, ox + n:]).all()


@pytest.mark.parametrize("shape, axis", [
    ((5, 300, 7), 1), ((5, 300, 7), 0), ((5, 300, 7), 2), ((1000,), 0), ((4, 3, 5, 6), 2),
    ((7, 20000), 0), ((2, 70001, 3), 1), ((3, 1, 5), 1), ((1, 1, 1), 2),
], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_other_axes(dtype, shape, axis):
    _run(*inputs(shape, DT[dtype], axis), axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_and_copied_layouts(dtype):
    dy, y = inputs((4, 8, 300), DT[dtype])
    gdy, gy = cp.asarray(dy)[:, :5, :], cp.asarray(y)[:, :5, :]      # copied first
    hdy, hy = dy[:, :5, :], y[:, :5, :]
    for axis in (2, 1, 0):
        check(softmax_backward(gdy, gy, axis), hdy, hy, axis)
    out_big = poisoned((4, 8, 300), DT[dtype])
    out = out_big[:, :5, :]                   # written through a temporary
    assert softmax_backward(gdy, gy, out=out) is out
    check(out, hdy, hy)
    assert np.isnan(cp.asnumpy(out_big[:, 5:, :]).astype(np.float64)).all()
    t_dy, t_y = inputs((300, 50), DT[dtype], axis=0)
    check(softmax_backward(cp.asarray(t_dy).T, cp.asarray(t_y).T), t_dy.T, t_y.T)


def _lengths(name: str) -> list[int]:
    cfg = parse_config(name)
    if cfg.variant == "strided":
        return [1, 333]
    if cfg.variant == "loop":
        return [1, 1000, 70001]
    cap = cfg.capacity
    return sorted({cap, max(1, cap - cap // 3 - 1)})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [c.name for c in all_configs(backward=True)])
def test_pinned_config(name, dtype):
    for n in _lengths(name):
        dy, y = inputs((37, n), DT[dtype])
        axis = -1
        if parse_config(name).strided:
            dy, y, axis = np.ascontiguousarray(dy.T), np.ascontiguousarray(y.T), 0
        _run(dy, y, axis, config=name)
        gdy, gy = cp.asarray(dy), cp.asarray(y)
        assert softmax_backward(gdy, gy, axis, out=gdy, config=parse_config(name)) is gdy
        check(gdy, dy, y, axis)


@pytest.mark.parametrize("n", [1, 33, 1000, 4097, 40000])
def test_heuristic_choice_pinned_gives_the_same_bits_every_run(n):
    dy, y = cp.asarray(inputs((20, n), np.float32)[0]), cp.asarray(inputs((20, n), np.float32)[1])
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    name = choose(20, n, "float32", sms, backward=True).config.name
    a = cp.asnumpy(softmax_backward(dy, y))
    for _ in range(3):
        assert same_bits(a, cp.asnumpy(softmax_backward(dy, y)))
    assert same_bits(a, cp.asnumpy(softmax_backward(dy, y, config=name))), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_and_zero_d(dtype):
    for shape, axis in [((0, 5), -1), ((5, 0), -1), ((3, 0, 4), 1)]:
        e = cp.empty(shape, DT[dtype])
        assert softmax_backward(e, e, axis).shape == shape
    one = cp.asarray(np.array(1.0, np.float32).astype(DT[dtype]))
    g = cp.asarray(np.array(2.5, np.float32).astype(DT[dtype]))
    dx = softmax_backward(g, one)
    assert dx.shape == () and float(cp.asnumpy(dx).astype(np.float64)) == 0.0


def test_pytorch_tensors_against_pytorch():
    torch = pytest.importorskip("torch")
    for dtype, np_dtype in ((torch.float32, np.float32), (torch.bfloat16, BF16)):
        x = (torch.randn(64, 3000, device="cuda") * 3).to(dtype)
        y = torch.softmax(x, -1)
        dy = torch.randn_like(y)
        dx = softmax_backward(dy, y)
        assert isinstance(dx, torch.Tensor) and dx.dtype == dtype

        check(*(t.float().cpu().numpy().astype(np_dtype) for t in (dx, dy, y)))
        want = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32)
        tol = 1e-5 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(dx.float(), want, rtol=tol, atol=tol * want.abs().max())


def test_bad_arguments_are_refused():
    dy, y = (cp.asarray(a) for a in inputs((4, 1000), np.float32))
    with pytest.raises(ge2jit.ArgumentTypeError, match="dy: expected a GPU array"):
        softmax_backward(cp.asnumpy(dy), y)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"y: expected shape \(4, 1000\)"):
        softmax_backward(dy, y[:3])
    with pytest.raises(ge2jit.ArgumentValueError, match=r"y: expected dtype float32 \(dy's\)"):
        softmax_backward(dy, y.astype(cp.float16))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps y without being y"):
        buf = cp.asarray(inputs((5, 1000), np.float32)[1])
        softmax_backward(dy, buf[:4], out=buf[1:])
    with pytest.raises(ge2jit.ArgumentValueError, match="config: block_1024_v32 would hold"):
        softmax_backward(dy, y, config="block_1024_v32")
    with pytest.raises(ge2jit.ArgumentValueError, match="config: warp32_v4_r1 holds rows of at"):
        softmax_backward(dy, y, config="warp32_v4_r1")
