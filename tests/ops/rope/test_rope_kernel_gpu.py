"""The rope kernel launched by itself (``ge2jit.jit.loader.launcher_for``, not the op) on CuPy
arrays, against the float64 reference of the inputs as stored.

Every array is a view into a wider buffer: the inputs' buffers hold NaN around them (a read
outside shows as NaN in the result) and the outputs' a sentinel (a write outside shows; it must
survive), the outputs themselves NaN before the launch (an element never written shows).
Inputs are fresh random values; the tables hold cos and sin of random angles. Covered: both
layouts, every type and table type, positions none/int32/int64 (2-D, 1-D, and batched tables),
the backward (and backward after forward giving the input back), in place and out of place,
partial rotary dimensions (the rest copied, or left alone in place), Hk = 0, non-contiguous and
odd strides (narrower accesses), every vec, launch shapes other than ``launch_geometry``'s
(grid-stride, any block) and positions outside the table (NaN).

Tolerances: the float32 math is about 2 ulp of |x1| + |x2| (4e-6 absolute at the inputs'
magnitudes); float16 and bfloat16 outputs add one rounding (1e-3 and 8e-3 relative)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ge2jit.jit.loader import launcher_for
from ge2jit.ops.rope.reference import rope_reference
from ge2jit.ops.rope.spec import check_fits, launch_geometry, make_spec, max_vec

from ...gpu_arrays import DT, cp

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

RTOL = {"float32": 0.0, "float16": 1e-3, "bfloat16": 8e-3}
ATOL = 4e-6
SENTINEL = -7.25           # the outputs' buffers around them (exact in every type)
POISON_POSITION = 10**9    # the positions' buffer around them (outside any table: NaN)

_rng = np.random.default_rng(20240611)


def placed(host: np.ndarray, pad: tuple, fill, out_fill=None):
    """``host`` copied into a new GPU buffer that is wider by ``pad[i]`` = (before, after)
    along each axis and holds ``fill`` elsewhere; (the view, the buffer). ``out_fill``: the
    view's own elements (an output's NaN) instead of ``host``'s values."""
    shape = tuple(n + a + b for n, (a, b) in zip(host.shape, pad))
    if np.issubdtype(host.dtype, np.integer):
        buf = cp.full(shape, fill, dtype=host.dtype)
    else:
        buf = cp.full(shape, fill, dtype=np.float32).astype(host.dtype)
    view = buf[tuple(slice(a, a + n) for n, (a, _) in zip(host.shape, pad))]
    if out_fill is None:
        view[...] = cp.asarray(host)
    else:
        view[...] = cp.asarray(np.full(host.shape, out_fill, np.float32).astype(host.dtype))
    return view, buf


def _el(a) -> list[int]:
    return [st // a.itemsize for st in a.strides]


def _used(a) -> tuple[int, ...]:
    """Strides of dimensions of more than one index, but the last (unit)."""
    return tuple(st for n, st in zip(a.shape[:-1], _el(a)[:-1]) if n > 1)


def launch(q, k, cos, sin, positions, q_out, k_out, *, interleaved=False, backward=False,
           vec=None, shape=None):
    """Run the kernel on these views (k, k_out, positions may be None); ``vec``: the widest
    the layout allows unless given; ``shape``: (grid, block) instead of launch_geometry's."""
    b, s, hq, d = q.shape
    hk = 0 if k is None else k.shape[2]
    half = cos.shape[-1]
    copy_rest = 2 * half < d and q_out.data.ptr != q.data.ptr
    arrays = [(a.data.ptr, _used(a)) for a in (q, k, q_out, k_out) if a is not None]
    widest = max_vec(q.dtype, cos.dtype, half=half, head_dim=d, copy_rest=copy_rest,
                     arrays=arrays, tables=[(t.data.ptr, _used(t)) for t in (cos, sin)])
    assert vec is None or vec <= widest
    spec = make_spec(q.dtype, cos.dtype, positions=None if positions is None else positions.dtype,
                     interleaved=interleaved, backward=backward, copy_rest=copy_rest,
                     vec=widest if vec is None else vec)
    check_fits(spec, half, d)
    grid, block = shape or launch_geometry(spec, b * s, hq + hk, half)

    def strides4(a):
        return (0, 0, 0) if a is None else tuple(_el(a)[:3])

    def table2(t):
        st = _el(t)
        return (0, st[0]) if t.ndim == 2 else (st[0], st[1])

    def pos2(p):
        if p is None:
            return 0, 0
        st = _el(p)
        return (0, st[0]) if p.ndim == 1 else (st[0], st[1])

    params = dict(zip(("qb", "qs", "qh", "kb", "ks", "kh", "qob", "qos", "qoh",
                       "kob", "kos", "koh"),
                      (*strides4(q), *strides4(k), *strides4(q_out), *strides4(k_out))))
    params.update(zip(("cb", "cr"), table2(cos)))
    params.update(zip(("sb", "sr"), table2(sin)))
    params.update(zip(("pb", "ps"), pos2(positions)))
    ptr = {n: 0 if a is None else a.data.ptr for n, a in (
        ("q", q), ("k", k), ("q_out", q_out), ("k_out", k_out), ("cos", cos), ("sin", sin),
        ("positions", positions))}
    stream = cp.cuda.get_current_stream()
    launcher_for(spec, cp.cuda.runtime.getDevice()).launch(
        grid, block, 0, stream.ptr, **ptr, tokens=b * s, seq=s, hq=hq, hk=hk, head_dim=d,
        half=half, table_rows=cos.shape[-2], **params)
    stream.synchronize()
    return spec


def tables(rows: int, half: int, dtype, batch: int | None = None):
    """Host cos and sin of random angles, (rows, half) or (batch, rows, half)."""
    shape = (rows, half) if batch is None else (batch, rows, half)
    theta = _rng.uniform(-20, 20, shape)
    return (np.cos(theta).astype(np.float32).astype(DT[dtype]),
            np.sin(theta).astype(np.float32).astype(DT[dtype]))


def check(got, x_host, ref, half):
    """An output against the reference: the rotated part within the tolerance (NaN where the
    reference is), the rest exactly the input's."""
    got = cp.asnumpy(got)
    name = got.dtype.name
    r = 2 * half
    g = got[..., :r].astype(np.float64)
    want = ref[..., :r]
    assert np.array_equal(np.isnan(g), np.isnan(want)), "NaN where the reference has none"
    ok = ~np.isnan(want)
    np.testing.assert_allclose(g[ok], want[ok], rtol=RTOL[name], atol=ATOL)
    assert np.array_equal(got[..., r:].view(np.uint8), x_host[..., r:].view(np.uint8))


def run_case(dtype, table_dtype=None, *, b=2, s=9, hq=4, hk=2, d=64, half=32, rows=None,
             positions=None, batched_table=False, interleaved=False, backward=False,
             in_place=False, odd=False, vec=None, bad_positions=(), shape=None):
    """One launch on fresh inputs, checked; ``odd``: views at odd offsets and strides (the
    widest access then 1 or 2 elements), else 16-byte aligned views of wider buffers."""
    table_dtype = table_dtype or dtype
    dt = DT[dtype]
    rows = rows or s + 3
    pad4 = ((1, 1), (0, 2), (1, 2), (0, 3)) if odd else ((1, 1), (0, 1), (0, 1), (0, 8))
    pad_t = ((1, 0), (0, 1)) if odd else ((0, 0), (0, 8))
    qh = _rng.standard_normal((b, s, hq, d)).astype(np.float32).astype(dt)
    kh = _rng.standard_normal((b, s, hk, d)).astype(np.float32).astype(dt) if hk else None
    ch, sh = tables(rows, half, table_dtype, b if batched_table else None)
    pos_h = None
    if positions is not None:
        shape_p = (s,) if positions.endswith("1d") else (b, s)
        pos_h = _rng.integers(0, rows, shape_p).astype(positions.removesuffix("_1d"))
        for where in bad_positions:
            pos_h[where] = {"low": -1, "end": rows, "far": -(2**31) if pos_h.dtype == np.int32
                            else 2**40}[bad_positions[where]]
    q, qbuf = placed(qh, pad4, np.nan)
    k, kbuf = placed(kh, pad4, np.nan) if hk else (None, None)
    tpad = ((0, 1), *pad_t) if batched_table else pad_t
    cos, _ = placed(ch, tpad, np.nan)
    sin, _ = placed(sh, tpad, np.nan)
    pos = None
    if pos_h is not None:
        pos, _ = placed(pos_h, tuple((0, 2) for _ in pos_h.shape), POISON_POSITION)
    if in_place:
        q_out, k_out, qo_buf, ko_buf = q, k, qbuf, kbuf
        before = [cp.asnumpy(x) for x in (qbuf, kbuf) if x is not None]
    else:
        q_out, qo_buf = placed(qh, pad4, SENTINEL, out_fill=np.nan)
        k_out, ko_buf = placed(kh, pad4, SENTINEL, out_fill=np.nan) if hk else (None, None)
    spec = launch(q, k, cos, sin, pos, q_out, k_out, interleaved=interleaved, backward=backward,
                  vec=vec, shape=shape)
    ref_q, ref_k = rope_reference(qh, kh, ch, sh, interleaved=interleaved, positions=pos_h,
                                  backward=backward)
    check(q_out, qh, ref_q, half)
    if hk:
        check(k_out, kh, ref_k, half)
    # nothing outside the outputs was written
    for out, buf in ((q_out, qo_buf), (k_out, ko_buf)):
        if out is None:
            continue
        outside = cp.asnumpy(buf).copy()
        outside[tuple(slice(a, a + n) for n, (a, _) in zip(out.shape, pad4))] = 0
        if in_place:
            kept = before[0 if out is q_out else 1].copy()
            kept[tuple(slice(a, a + n) for n, (a, _) in zip(out.shape, pad4))] = 0
            assert np.array_equal(outside.view(np.uint8), kept.view(np.uint8))
        else:
            mask = np.ones(outside.shape, bool)
            mask[tuple(slice(a, a + n) for n, (a, _) in zip(out.shape, pad4))] = False
            assert (outside[mask].astype(np.float32) == SENTINEL).all()
    return spec


# ---- the cases

@pytest.mark.parametrize("dtype, table_dtype", list(itertools.product(DT, DT)))
@pytest.mark.parametrize("interleaved", [False, True])
def test_types_and_layouts(dtype, table_dtype, interleaved):
    spec = run_case(dtype, table_dtype, interleaved=interleaved)
    assert spec.vec == (4 if dtype == "float32" else 8)      # aligned views: 16-byte accesses


@pytest.mark.parametrize("positions", [None, "int32", "int64", "int32_1d", "int64_1d"])
@pytest.mark.parametrize("batched_table", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_positions_tables_and_backward(positions, batched_table, backward):
    run_case("bfloat16", "float32", positions=positions, batched_table=batched_table,
             backward=backward, interleaved=backward, rows=40)


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_partial_rotary_in_place_and_not(dtype, interleaved, in_place):
    # head_dim 80, rotary dimension 32: 48 elements passed through (copied, or left alone)
    spec = run_case(dtype, d=80, half=16, interleaved=interleaved, in_place=in_place,
                    positions="int64")
    assert spec.copy_rest is not in_place


@pytest.mark.parametrize("dtype", list(DT))
def test_without_k(dtype):
    run_case(dtype, hk=0, positions="int32")
    run_case(dtype, hk=0, in_place=True, interleaved=True)


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("d, half", [(20, 6), (13, 5), (64, 32)])
def test_odd_strides_and_offsets(dtype, d, half):
    spec = run_case(dtype, "float16", d=d, half=half, odd=True, positions="int64",
                    interleaved=half % 2 == 1)
    assert spec.vec <= 2
    run_case(dtype, d=d, half=half, odd=True, in_place=True)


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_every_vec(dtype, vec):
    if vec * DT[dtype].itemsize > 16:
        pytest.skip("wider than 16 bytes")
    for interleaved in (False, True):
        spec = run_case(dtype, "bfloat16", d=72, half=24, vec=vec, interleaved=interleaved)
        assert spec.vec == vec and spec.copy_rest


@pytest.mark.parametrize("shape", [((1, 1, 1), (1, 1, 1)), ((3, 1, 1), (3, 5, 2)),
                                   ((2, 1, 1), (32, 1, 4)), ((5, 1, 1), (2, 64, 1))])
def test_any_launch_shape(shape):
    # grid-stride over the tokens, chunk and head loops of any length
    run_case("float16", b=3, s=7, hq=5, hk=3, d=40, half=16, vec=2, positions="int32",
             shape=shape)


@pytest.mark.parametrize("positions", ["int32", "int64"])
@pytest.mark.parametrize("in_place", [False, True])
def test_positions_outside_the_table_give_nan(positions, in_place):
    bad = {(0, 0): "low", (1, 3): "end", (1, 8): "far"}
    run_case("bfloat16", positions=positions, bad_positions=bad, d=48, half=16,
             in_place=in_place, rows=12)
    run_case("float32", positions=positions, bad_positions=bad, interleaved=True, rows=12)


def test_without_positions_rows_past_the_table_give_nan():
    run_case("float16", s=9, rows=6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_backward_undoes_forward(dtype):
    dt = DT[dtype]
    b, s, h, d, half = 2, 17, 3, 32, 16
    xh = _rng.standard_normal((b, s, h, d)).astype(np.float32).astype(dt)
    ch, sh = tables(s, half, "float32")
    x = cp.asarray(xh)
    cos, sin = cp.asarray(ch), cp.asarray(sh)
    for interleaved in (False, True):
        y = cp.empty_like(x)
        launch(x, None, cos, sin, None, y, None, interleaved=interleaved)
        launch(y, None, cos, sin, None, y, None, interleaved=interleaved, backward=True)
        tol = 1e-5 if dtype == "float32" else 3e-2
        np.testing.assert_allclose(cp.asnumpy(y).astype(np.float64), xh.astype(np.float64),
                                   rtol=tol, atol=tol)


def test_llama_shape():
    # B = 2, S = 512, Hq = 32, Hk = 8, D = 128, bfloat16, int64 positions into a longer table
    run_case("bfloat16", b=2, s=512, hq=32, hk=8, d=128, half=64, rows=4096,
             positions="int64")
