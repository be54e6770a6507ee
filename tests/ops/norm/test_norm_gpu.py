"""rms_norm and layer_norm, forward and backward, on the GPU against the float64 reference
(``ge2jit.ops.norm.reference``) computed from the inputs' own values, h rounded as the
kernels round it (``x + residual`` added in float32, then rounded to h's type: compared bit
for bit).

Every dtype; rows of 1, 2, 31, 33, 1000, 4097, 16384 (the block variant's longest), 16385,
65536 and 100003 elements (the loop variant); 1, 3 and 130 rows, and enough rows for the warp
variants' two rows per lane group; with and without a weight, a bias, a residual (of x's type
and float32), ``dh``; mixed output types; in place; rows of wider arrays, aligned and not (the
narrow accesses), negative row strides, layouts that are copied; every config pinned, forward
and backward; NaN and infinite values; large means; the backward's determinism (two runs,
the same bits: dx, dweight, dbias); empty calls; PyTorch tensors; the argument errors with real
arrays. Outputs are poisoned with NaN before each call; inputs are fresh random values, never
zeros.

Tolerances follow float32's error bounds: the statistics' sums (at most about 20 roundings of
the row's largest value: 2e-6 relative to ``max|h| * rstd``), one rounding of y or dx to its
type (float32 1e-6, float16 2**-10, bfloat16 2**-7 relative: a whole unit where the float32
value lies near a rounding midpoint), and for the backward's row sums 3e-5 of the terms'
scale; dweight and dbias normwise (1e-5 in float32, one rounding in 16-bit types).
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.norm import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from ge2jit.ops.norm.reference import (
    layer_norm_backward_ref,
    layer_norm_ref,
    residual_sum,
    rms_norm_backward_ref,
    rms_norm_ref,
)
from ge2jit.ops.norm.spec import all_backward_configs, all_configs

from ...gpu_arrays import BF16, DT, DTYPES, cp, host, poisoned, same_bits

pytestmark = pytest.mark.gpu

KINDS = ["rms", "layer"]
#: one rounding of a result to its type, relative (a whole unit: see the module's docstring)
ROUNDING = {"float32": 1e-6, "float16": 2.0**-10, "bfloat16": 2.0**-7}
LENGTHS = [1, 2, 31, 33, 1000, 4097, 16384, 16385, 65536, 100003]
ROW_COUNTS = [1, 3, 130]
EPS = {"rms": 1e-6, "layer": 1e-5}

_rng = np.random.default_rng(2025)


@pytest.fixture(autouse=True, scope="module")
def _give_back_memory():
    """The pool's blocks go back to the GPU after this module (its largest test holds about a
    hundred MB)."""
    yield
    cp.get_default_memory_pool().free_all_blocks()


def host_rand(shape, dtype, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    """Normal values times ``scale`` plus ``shift``, rounded to ``dtype``, none zero."""
    v = (_rng.standard_normal(shape) * scale + shift).astype(np.float32)
    v[v == 0] = 0.5
    return v.astype(dtype)


def f64(a) -> np.ndarray:
    return host(a).astype(np.float64)


def same_values(a, b) -> bool:
    """The same type and values (exactly; NaN where NaN, whatever its payload: the GPU's
    arithmetic makes the canonical NaN, NumPy keeps the input's)."""
    a, b = host(a), host(b)
    return a.dtype == b.dtype and np.array_equal(a.astype(np.float64), b.astype(np.float64),
                                                 equal_nan=True)


def assert_within(got, ref, bound, what: str) -> None:
    """|got - ref| <= bound elementwise, NaN where the reference is NaN (and only there),
    equal infinities."""
    got, ref = f64(got), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    nan = np.isnan(ref)
    bad = np.isnan(got) != nan
    fin = ~nan & ~np.isnan(got)
    inf = fin & (np.isinf(ref) | np.isinf(got))
    bad |= inf & (got != ref)
    with np.errstate(invalid="ignore"):
        bad |= fin & ~inf & ~(np.abs(got - ref) <= bound)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} off, first at {i}: got "
                             f"{got[i]!r}, reference {ref[i]!r}, bound "
                             f"{np.broadcast_to(bound, ref.shape)[i]!r}")


def normwise(got, ref, tol: float, what: str) -> None:
    got, ref = f64(got), np.asarray(ref, np.float64)
    assert got.shape == ref.shape and np.isfinite(got).all(), what
    err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err <= tol, (what, err, tol)


def _rowmax(a) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        m = np.nanmax(np.abs(a), axis=-1, initial=0.0)
    return np.where(np.isfinite(m), m, 0.0)


# ---- the forward, checked

def forward_ref(kind, x, weight, bias, residual, eps, h_dtype):
    if kind == "rms":
        y, h, rstd = rms_norm_ref(x, weight, eps=eps, residual=residual, h_dtype=h_dtype)
        mean = np.zeros(rstd.shape)
    else:
        y, h, mean, rstd = layer_norm_ref(x, weight, bias, eps=eps, residual=residual,
                                          h_dtype=h_dtype)
    return y, h, mean, rstd


def y_bound(kind, h, mean, rstd, weight, bias, y_ref, y_dtype: str) -> np.ndarray:
    """How far y may be from the reference (the module's docstring)."""
    h64 = np.asarray(h, np.float64)
    r = np.where(np.isfinite(rstd), rstd, 0.0)[..., None]
    w = 1.0 if weight is None else max(1.0, float(np.abs(f64(weight)).max()))
    b = 0.0 if bias is None else float(np.abs(f64(bias)).max())
    xhat = _rowmax((h64 - (mean[..., None] if kind == "layer" else 0.0)) * r)[..., None]
    atol = 2e-6 * (_rowmax(h64)[..., None] * r + xhat) * w + 2e-6 * b + 1e-30
    return atol + ROUNDING[y_dtype] * np.abs(np.nan_to_num(y_ref))


def run_forward(kind, x, weight=None, bias=None, residual=None, *, eps=None, out_dtype=None,
                h_dtype=None, config=None, out=None, residual_out=None, in_place=None):
    """The op on device copies of the host arrays, into poisoned outputs (or those given),
    statistics saved; every output checked against the reference. Returns the result."""
    eps = EPS[kind] if eps is None else eps
    dev = {k: None if a is None else cp.asarray(a) for k, a in
           (("x", x), ("weight", weight), ("bias", bias), ("residual", residual))}
    y_dt = np.dtype(out_dtype) if out_dtype else x.dtype
    h_dt = None if residual is None else (np.dtype(h_dtype) if h_dtype else residual.dtype)
    if in_place == "x":
        out = dev["x"]
    elif out is None:
        out = poisoned(x.shape, y_dt)
    if residual is not None and residual_out is None:
        residual_out = dev["residual"] if in_place == "x" else poisoned(x.shape, h_dt)
    fn = rms_norm if kind == "rms" else layer_norm
    kw = dict(eps=eps, residual=dev["residual"], out=out, residual_out=residual_out,
              save_stats=True, config=config)
    if kind == "layer":
        res = fn(dev["x"], dev["weight"], dev["bias"], **kw)
    else:
        res = fn(dev["x"], dev["weight"], **kw)
    assert isinstance(res, ge2jit.NormOutput) and res.y is out
    assert (res.h is residual_out) if residual is not None else res.h is None
    y_ref, h_ref, mean_ref, rstd_ref = forward_ref(kind, x, weight, bias, residual, eps, h_dt)
    if residual is not None:
        assert same_values(res.h, h_ref), "h differs from x + residual rounded to its type"
    assert res.rstd.shape == x.shape[:-1] and res.rstd.dtype == np.float32
    assert_within(res.rstd, rstd_ref, 2e-6 * np.abs(np.nan_to_num(rstd_ref)) + 1e-30, "rstd")
    if kind == "layer":
        bound = 2e-6 * _rowmax(np.asarray(h_ref, np.float64)) + 1e-30
        assert_within(res.mean, mean_ref, bound, "mean")
    else:
        assert res.mean is None
    y = cp.asnumpy(res.y)
    assert y.dtype == y_dt
    assert_within(y, y_ref, y_bound(kind, h_ref, mean_ref, rstd_ref, weight, bias, y_ref,
                                    y_dt.name), "y")
    return res


def affine(kind, n, dtype, what: str):
    """(weight, bias) host arrays: "none", "weight" or "both"."""
    w = host_rand(n, dtype) if what != "none" else None
    b = host_rand(n, dtype, 0.5) if what == "both" and kind == "layer" else None
    return w, b


# ---- rows along the last axis

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_reference(kind, dtype, n):
    dt = DT[dtype]
    for rows in ROW_COUNTS:
        if rows * n > 4 * 2**20:
            continue
        for what, res in (("both", None), ("none", None), ("weight", dt), ("both", np.float32)):
            w, b = affine(kind, n, dt, what)
            x = host_rand((rows, n), dt, 2.0, 0.5)
            r = None if res is None else host_rand((rows, n), res)
            run_forward(kind, x, w, b, r)


@pytest.mark.parametrize("n", [1, 5, 33, 128, 257, 512])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_many_short_rows(kind, dtype, n):
    """Enough rows for the warp variants' two rows per lane group, and a last block whose
    rows run out."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = 8 * sms * 128 * 2 // max(1, min(32, n // 8)) + 3
    x = host_rand((rows, n), DT[dtype], 1.5, -0.3)
    w, b = affine(kind, n, DT[dtype], "both")
    run_forward(kind, x, w, b, host_rand((rows, n), DT[dtype]))


@pytest.mark.parametrize("kind", KINDS)
def test_very_long_rows(kind):
    """The loop variant over rows of a million elements, with a residual."""
    x = host_rand((2, 2**20 + 7), BF16, 1.0, 3.0)
    w, b = affine(kind, 2**20 + 7, np.float32, "both")
    run_forward(kind, x, w, b, host_rand((2, 2**20 + 7), np.float32))


@pytest.mark.parametrize("n", [64, 4096, 20000])
@pytest.mark.parametrize("kind", KINDS)
def test_leading_shapes_and_new_outputs(kind, n):
    x = host_rand((2, 3, 5, n), np.float32, 1.0, 0.25)
    dx = cp.asarray(x)
    y = rms_norm(dx) if kind == "rms" else layer_norm(dx)
    assert isinstance(y, cp.ndarray) and y.shape == x.shape and y.dtype == np.float32
    ref = forward_ref(kind, x, None, None, None, EPS[kind], None)
    assert_within(y, ref[0], y_bound(kind, x, ref[2], ref[3], None, None, ref[0], "float32"),
                  "y")
    r = host_rand(x.shape, BF16)
    y, h = (rms_norm if kind == "rms" else layer_norm)(dx, residual=cp.asarray(r))
    assert y.dtype == np.float32 and h.dtype == BF16
    assert same_values(h, residual_sum(x, r))
    one = host_rand((n,), BF16)
    y1 = (rms_norm if kind == "rms" else layer_norm)(cp.asarray(one), save_stats=True)
    assert y1.rstd.shape == () and y1.y.shape == (n,)


@pytest.mark.parametrize("n", [33, 1000, 4097, 16385])
@pytest.mark.parametrize("types", [("bfloat16", "float32", "float32", "float32"),
                                   ("float16", "float32", "float16", "float32"),
                                   ("float32", "bfloat16", "float32", "bfloat16"),
                                   ("bfloat16", "float16", "bfloat16", "bfloat16")],
                         ids="-".join)
@pytest.mark.parametrize("kind", KINDS)
def test_mixed_types(kind, types, n):
    """(x, y, residual, h) types; the weight and bias float32 or x's."""
    x_dt, y_dt, r_dt, h_dt = (DT[t] for t in types)
    for w_dt in (np.float32, x_dt):
        w, b = affine(kind, n, np.dtype(w_dt), "both")
        run_forward(kind, host_rand((5, n), x_dt), w, b, host_rand((5, n), r_dt),
                    out_dtype=y_dt, h_dtype=h_dt)


@pytest.mark.parametrize("n", [33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_in_place(kind, dtype, n):
    dt = DT[dtype]
    w, b = affine(kind, n, dt, "both")
    run_forward(kind, host_rand((6, n), dt), w, b, in_place="x")          # out = x
    x, r = host_rand((6, n), dt), host_rand((6, n), dt)
    run_forward(kind, x, w, b, r, in_place="x")             # out = x, residual_out = residual
    dx, dr = cp.asarray(x), cp.asarray(r)                   # crossed: y over r, h over x
    fn = rms_norm if kind == "rms" else layer_norm
    args = (dx, cp.asarray(w)) if kind == "rms" else (dx, cp.asarray(w), cp.asarray(b))
    y, h = fn(*args, residual=dr, out=dr, residual_out=dx)
    assert y is dr and h is dx
    ref = forward_ref(kind, x, w, b, r, EPS[kind], dt)
    assert same_values(h, ref[1])
    assert_within(y, ref[0], y_bound(kind, ref[1], ref[2], ref[3], w, b, ref[0], dtype), "y")


@pytest.mark.parametrize("offsets", [(0, 0, 0), (1, 3, 5), (8, 8, 8), (2, 0, 1)], ids=str)
@pytest.mark.parametrize("n", [33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_rows_of_wider_arrays(kind, dtype, n, offsets):
    """x, the residual and out are column slices of wider arrays (any row stride, aligned or
    not: narrower accesses); the rest of out's array is left alone."""
    ox, orr, oy = offsets
    dt, rows = DT[dtype], 9
    wide_x, wide_r = host_rand((rows, n + 64), dt), host_rand((rows, n + 72), dt)
    x, r = cp.asarray(wide_x)[:, ox:ox + n], cp.asarray(wide_r)[:, orr:orr + n]
    out_wide = poisoned((rows, n + 40), dt)
    out = out_wide[:, oy:oy + n]
    w, b = affine(kind, n, dt, "both")
    fn = rms_norm if kind == "rms" else layer_norm
    args = (x, cp.asarray(w)) if kind == "rms" else (x, cp.asarray(w), cp.asarray(b))
    y, h = fn(*args, residual=r, out=out)
    assert y is out
    xh, rh = wide_x[:, ox:ox + n], wide_r[:, orr:orr + n]
    ref = forward_ref(kind, xh, w, b, rh, EPS[kind], dt)
    assert same_values(h, ref[1])
    assert_within(out, ref[0], y_bound(kind, ref[1], ref[2], ref[3], w, b, ref[0], dtype), "y")
    rest = f64(out_wide)
    assert np.isnan(rest[:, :oy]).all() and np.isnan(rest[:, oy + n:]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_negative_strides_and_copied_layouts(kind):
    fn = rms_norm if kind == "rms" else layer_norm
    h = host_rand((7, 3000), np.float32, 1.0, 0.5)
    y = fn(cp.asarray(h)[::-1])
    ref = forward_ref(kind, h[::-1], None, None, None, EPS[kind], None)
    assert_within(y, ref[0], y_bound(kind, h[::-1], ref[2], ref[3], None, None, ref[0],
                                     "float32"), "reversed rows")
    out_wide = poisoned((14, 3000), np.float32)
    fn(cp.asarray(h), out=out_wide[::-2])
    ref = forward_ref(kind, h, None, None, None, EPS[kind], None)
    assert_within(out_wide[::-2], ref[0], y_bound(kind, h, ref[2], ref[3], None, None, ref[0],
                                                  "float32"), "reversed out")
    assert np.isnan(f64(out_wide[-2::-2])).all()
    t = host_rand((300, 50), BF16)              # a transposed x: copied first
    yt = fn(cp.asarray(t).T)
    ref = forward_ref(kind, t.T, None, None, None, EPS[kind], None)
    assert_within(yt, ref[0], y_bound(kind, t.T, ref[2], ref[3], None, None, ref[0],
                                      "bfloat16"), "transposed")
    cube = host_rand((4, 8, 300), BF16)
    yc = fn(cp.asarray(cube)[:, :5, :])         # rows not one stride apart: copied first
    ref = forward_ref(kind, cube[:, :5, :], None, None, None, EPS[kind], None)
    assert_within(yc, ref[0], y_bound(kind, cube[:, :5, :], ref[2], ref[3], None, None, ref[0],
                                      "bfloat16"), "sliced")
    with pytest.raises(ge2jit.ArgumentValueError, match="out: expected rows along a "
                                                        "unit-stride last axis"):
        fn(cp.asarray(t), out=cp.empty((50, 300), BF16).T)
    bcast = cp.broadcast_to(cp.asarray(h[:1]), (6, 3000))     # a zero row stride is read
    yb = fn(bcast)
    ref = forward_ref(kind, np.broadcast_to(h[:1], (6, 3000)), None, None, None, EPS[kind], None)
    assert_within(yb, ref[0], y_bound(kind, np.broadcast_to(h[:1], (6, 3000)), ref[2], ref[3],
                                      None, None, ref[0], "float32"), "broadcast")


# ---- pinned configs

def _lengths_for(config) -> list[int]:
    cap = config.capacity
    if cap is None:
        return [1, 1000, 70001]
    return sorted({cap, max(1, cap - cap // 3 - 1)})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [c.name for c in all_configs()])
@pytest.mark.parametrize("kind", KINDS)
def test_pinned_config(kind, name, dtype):
    cfg = next(c for c in all_configs() if c.name == name)
    dt = DT[dtype]
    for n in _lengths_for(cfg):
        w, b = affine(kind, n, dt, "both")
        x = np.concatenate([host_rand((37, n), dt), special_rows(n, dt)])
        run_forward(kind, x, w, b, host_rand(x.shape, np.float32), config=name)
        run_forward(kind, x, w, b, in_place="x", config=cfg)


@pytest.mark.parametrize("n", [1, 33, 1000, 4097, 40000])
@pytest.mark.parametrize("kind", KINDS)
def test_heuristic_choice_pinned_gives_the_same_bits(kind, n):
    from ge2jit.ops.norm.spec import ForwardTypes, choose
    from ge2jit.runtime.dtypes import DType

    x = cp.asarray(host_rand((20, n), np.float32))
    fn = rms_norm if kind == "rms" else layer_norm
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    name = choose(kind, 20, n, ForwardTypes(DType.F32, DType.F32), sms).config.name
    assert same_bits(fn(x), fn(x, config=name)), name


# ---- special values

def special_rows(n: int, dtype) -> np.ndarray:
    """Rows whose normalization needs care: a NaN, +inf, -inf, a constant row, a large mean
    with a small spread, tiny values, values near the type's largest."""
    dtype = np.dtype(dtype)
    big = 6e4 if dtype == np.float16 else 1e19

    def base():
        return (_rng.standard_normal(n) * 2).astype(np.float32)

    def at():
        return _rng.integers(0, n)

    rows = []
    for v in (np.nan, np.inf, -np.inf):
        r = base()
        r[at()] = v
        rows.append(r)
    rows.append(np.full(n, 0.75, np.float32))                        # constant
    rows.append((base() * 0.01 + 300.0).astype(np.float32))          # a large mean
    rows.append(base() * np.float32(1e-4 if dtype == np.float16 else 1e-30))
    r = base()
    r[at()] = big
    rows.append(r)
    return np.stack(rows).astype(dtype)


@pytest.mark.parametrize("n", [1, 2, 33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_special_values(kind, dtype, n):
    dt = DT[dtype]
    x = np.concatenate([special_rows(n, dt), host_rand((3, n), dt)])
    w, b = affine(kind, n, dt, "both")
    res = run_forward(kind, x, w, b)
    y, rstd = f64(res.y), f64(res.rstd)
    assert np.isnan(y[0]).all()                                      # a NaN: the row is NaN
    if kind == "layer":
        assert np.isnan(y[1:3]).all()                                # infinities: NaN
    else:   # rstd 0: NaN where infinite, 0 times the weight elsewhere
        assert (rstd[1:3] == 0).all() and np.isnan(y[1:3]).sum() == 2
    assert np.isfinite(y[3:]).all() and np.isfinite(rstd[3:]).all()  # the other rows


def test_special_values_by_hand():
    x = cp.asarray(np.array([[1.0, np.inf, 2.0], [3.0, 3.0, 3.0], [np.nan, 1.0, 1.0],
                             [1.0, -1.0, 1.0]], np.float32))
    y = cp.asnumpy(rms_norm(x))
    np.testing.assert_array_equal(y[0, [0, 2]], [0.0, 0.0])
    assert np.isnan(y[0, 1]) and np.isnan(y[2]).all()
    np.testing.assert_allclose(y[1], 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[3], [1.0, -1.0, 1.0], rtol=1e-6)
    ln = cp.asnumpy(layer_norm(x, None, cp.full(3, 0.25, np.float32)))
    assert np.isnan(ln[0]).all() and np.isnan(ln[2]).all()
    np.testing.assert_array_equal(ln[1], [0.25] * 3)                 # constant row: the bias
    big = cp.asarray(np.array([[1e30, -1e30, 2e30]], np.float32))
    out = rms_norm(big, save_stats=True)        # the mean square overflows float32: rstd 0
    assert float(out.rstd[0]) == 0.0 and (cp.asnumpy(out.y) == 0).all()


# ---- the backward

def backward_ref(kind, dy, h, weight, dh, eps):
    if kind == "rms":
        dx, dw = rms_norm_backward_ref(dy, h, weight, eps=eps, dh=dh)
        db = None
    else:
        dx, dw, db = layer_norm_backward_ref(dy, h, weight, eps=eps, dh=dh)
    return dx, dw, db


def dx_bound(kind, dy, h, weight, dh, eps, dx_ref, dx_dtype: str):
    h64, dy64 = f64(h), f64(dy)
    stats = forward_ref(kind, h, None, None, None, eps, None)
    mean, rstd = stats[2][..., None], stats[3][..., None]
    xhat = (h64 - (mean if kind == "layer" else 0.0)) * rstd
    g = dy64 * (f64(weight) if weight is not None else 1.0)
    # g - c2 - x-hat * c1: each term's size, and x-hat's own error (the statistics': relative
    # to max|h| * rstd) times c1
    spread = (_rowmax(xhat) + _rowmax(h64) * rstd[..., 0])[..., None]
    scale = rstd * (_rowmax(g)[..., None] + spread * _rowmax(g * xhat)[..., None])
    atol = 3e-5 * scale + (0.0 if dh is None else 1e-6 * np.abs(f64(dh)))
    return atol + ROUNDING[dx_dtype] * np.abs(dx_ref)


def run_backward(kind, dy, h, weight=None, bias=None, dh=None, *, eps=None, config=None,
                 stats=None):
    """The backward on device copies, the statistics from the forward's kernel (or those
    given), checked against the reference. Returns the gradients."""
    eps = EPS[kind] if eps is None else eps
    d = {k: None if a is None else cp.asarray(a) for k, a in
         (("dy", dy), ("h", h), ("weight", weight), ("bias", bias), ("dh", dh))}
    if stats is None:
        fn = rms_norm if kind == "rms" else layer_norm
        stats = fn(d["h"], eps=eps, save_stats=True)
    if kind == "rms":
        g = rms_norm_backward(d["dy"], d["h"], d["weight"], stats.rstd, dh=d["dh"],
                              config=config)
        assert g.dbias is None
    else:
        g = layer_norm_backward(d["dy"], d["h"], d["weight"], stats.mean, stats.rstd,
                                bias=d["bias"], dh=d["dh"], config=config)
    assert isinstance(g, ge2jit.NormGradients)
    dx_ref, dw_ref, db_ref = backward_ref(kind, dy, h, weight, dh, eps)
    assert g.dx.dtype == h.dtype and g.dx.shape == h.shape
    assert_within(g.dx, dx_ref, dx_bound(kind, dy, h, weight, dh, eps, dx_ref, h.dtype.name),
                  "dx")
    rows = max(1, h.size // h.shape[-1])
    if weight is None:
        assert g.dweight is None
    else:
        assert g.dweight.dtype == weight.dtype and g.dweight.shape == weight.shape
        tol = max(1e-5 * (1 + np.log2(rows)), ROUNDING[weight.dtype.name])
        normwise(g.dweight, dw_ref, tol, "dweight")
    if bias is None:
        assert g.dbias is None
    else:
        assert g.dbias.dtype == bias.dtype and g.dbias.shape == bias.shape
        tol = max(1e-5 * (1 + np.log2(rows)), ROUNDING[bias.dtype.name])
        normwise(g.dbias, db_ref, tol, "dbias")
    return g


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_backward_matches_reference(kind, dtype, n):
    dt = DT[dtype]
    for rows in ROW_COUNTS:
        if rows * n > 4 * 2**20:
            continue
        for what, with_dh in (("both", False), ("none", True), ("weight", True),
                              ("both", True)):
            w, b = affine(kind, n, dt, what)
            h = host_rand((rows, n), dt, 2.0, 0.5)
            dh = host_rand((rows, n), dt) if with_dh else None
            run_backward(kind, host_rand((rows, n), dt), h, w, b, dh)


@pytest.mark.parametrize("n", [33, 1000, 5000, 20000])
@pytest.mark.parametrize("kind", KINDS)
def test_backward_mixed_types(kind, n):
    """dy in y's type, h (and dx, dh) float32 from a float32 residual stream, the weight and
    bias in x's type or float32."""
    for dy_dt, w_dt in ((BF16, BF16), (BF16, np.float32), (np.float16, np.float32)):
        w, b = affine(kind, n, np.dtype(w_dt), "both")
        run_backward(kind, host_rand((7, n), dy_dt), host_rand((7, n), np.float32, 1.0, 2.0),
                     w, b, host_rand((7, n), np.float32))


@pytest.mark.parametrize("n", [8, 200, 3000, 12000])
@pytest.mark.parametrize("kind", KINDS)
def test_backward_many_rows(kind, n):
    """Resident blocks walking many rows each: the partial sums of dweight and dbias."""
    rows = 2**22 // n
    w, b = affine(kind, n, np.float32, "both")
    run_backward(kind, host_rand((rows, n), BF16), host_rand((rows, n), BF16, 1.0, 0.5), w, b,
                 host_rand((rows, n), BF16))


@pytest.mark.parametrize("n", [64, 1000, 5000, 30000])
@pytest.mark.parametrize("kind", KINDS)
def test_backward_is_deterministic(kind, n):
    """Two runs give the same bits (dx, dweight, dbias: no atomics, a fixed order)."""
    rows = max(3, 2**21 // n)
    d = {k: cp.asarray(host_rand((rows, n), BF16)) for k in ("dy", "h", "dh")}
    w, b = (cp.asarray(a) for a in affine("layer", n, np.float32, "both"))
    if kind == "rms":
        st = rms_norm(d["h"], w, save_stats=True)
        runs = [rms_norm_backward(d["dy"], d["h"], w, st.rstd, dh=d["dh"]) for _ in range(2)]
    else:
        st = layer_norm(d["h"], w, b, save_stats=True)
        runs = [layer_norm_backward(d["dy"], d["h"], w, st.mean, st.rstd, bias=b, dh=d["dh"])
                for _ in range(2)]
    for a, c in zip(*runs):
        assert (a is None) == (c is None)
        if a is not None:
            assert same_bits(a, c)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", [c.name for c in all_backward_configs()])
@pytest.mark.parametrize("kind", KINDS)
def test_backward_pinned_config(kind, name, dtype):
    cfg = next(c for c in all_backward_configs() if c.name == name)
    dt = DT[dtype]
    for n in _lengths_for(cfg):
        for rows in (1, 37):
            w, b = affine(kind, n, dt, "both")
            run_backward(kind, host_rand((rows, n), dt), host_rand((rows, n), dt, 1.0, 0.5), w,
                         b, host_rand((rows, n), dt), config=name)


@pytest.mark.parametrize("kind", KINDS)
def test_backward_layouts_and_stats_shapes(kind):
    """Rows of wider arrays, unaligned (narrow accesses), a transposed h (copied), statistics
    of shape (rows,) and of the leading shape."""
    n, rows = 1001, 6
    wide = {k: host_rand((rows, n + 9), np.float32) for k in ("dy", "h", "dh")}
    views = {k: cp.asarray(v)[:, 1:1 + n] for k, v in wide.items()}
    hosts = {k: v[:, 1:1 + n] for k, v in wide.items()}
    w = host_rand(n, np.float32)
    fn = rms_norm if kind == "rms" else layer_norm
    st = fn(views["h"], save_stats=True)
    g = (rms_norm_backward(views["dy"], views["h"], cp.asarray(w), st.rstd, dh=views["dh"])
         if kind == "rms" else
         layer_norm_backward(views["dy"], views["h"], cp.asarray(w), st.mean, st.rstd,
                             dh=views["dh"]))
    ref = backward_ref(kind, hosts["dy"], hosts["h"], w, hosts["dh"], EPS[kind])
    assert_within(g.dx, ref[0], dx_bound(kind, hosts["dy"], hosts["h"], w, hosts["dh"],
                                         EPS[kind], ref[0], "float32"), "dx")
    normwise(g.dweight, ref[1], 1e-5 * 4, "dweight")
    h3, dy3 = host_rand((2, 3, 700), BF16), host_rand((2, 3, 700), BF16)
    run_backward(kind, dy3, h3)                         # statistics of shape (2, 3)
    st3 = fn(cp.asarray(h3), save_stats=True)           # ... and (6,)
    flat = st3._replace(rstd=st3.rstd.reshape(6),
                        mean=None if st3.mean is None else st3.mean.reshape(6))
    run_backward(kind, dy3, h3, stats=flat)
    t = host_rand((300, 50), np.float32)
    d = cp.asarray(t).T                                   # transposed: copied
    st = fn(d, save_stats=True)
    g = (rms_norm_backward(d, d, None, st.rstd) if kind == "rms" else
         layer_norm_backward(d, d, None, st.mean, st.rstd))
    ref = backward_ref(kind, t.T, t.T, None, None, EPS[kind])
    assert_within(g.dx, ref[0], dx_bound(kind, t.T, t.T, None, None, EPS[kind], ref[0],
                                         "float32"), "dx of a transposed h")


@pytest.mark.parametrize("kind", KINDS)
def test_backward_special_values(kind):
    """A NaN in one row of dy: that row's dx is NaN and so are dweight and dbias (they sum
    every row); the other rows' dx are not touched by it."""
    n = 300
    dy, h = host_rand((5, n), np.float32), host_rand((5, n), np.float32)
    dy[2, 7] = np.nan
    w, b = affine(kind, n, np.float32, "both")
    d = {k: cp.asarray(a) for k, a in (("dy", dy), ("h", h))}
    fn = rms_norm if kind == "rms" else layer_norm
    st = fn(d["h"], save_stats=True)
    g = (rms_norm_backward(d["dy"], d["h"], cp.asarray(w), st.rstd) if kind == "rms" else
         layer_norm_backward(d["dy"], d["h"], cp.asarray(w), st.mean, st.rstd,
                             bias=cp.asarray(b)))
    dx = f64(g.dx)
    assert np.isnan(dx[2]).all() and np.isfinite(dx[[0, 1, 3, 4]]).all()
    assert np.isnan(f64(g.dweight)[7]) and np.isfinite(np.delete(f64(g.dweight), 7)).all()
    if kind == "layer":
        assert np.isnan(f64(g.dbias)[7])


def test_forward_then_backward_of_a_pre_norm_block():
    """The pattern the fusion is for: h = x + residual in a float32 residual stream, y =
    rms_norm(h) in bfloat16; the backward takes dy and the gradient arriving at h."""
    rows, n = 256, 2048
    x, r = host_rand((rows, n), BF16), host_rand((rows, n), np.float32)
    w = host_rand(n, BF16)
    res = run_forward("rms", x, w, None, r)
    assert res.h.dtype == np.float32 and res.y.dtype == BF16
    dy, dh = host_rand((rows, n), BF16), host_rand((rows, n), np.float32)
    g = rms_norm_backward(cp.asarray(dy), res.h, cp.asarray(w), res.rstd, dh=cp.asarray(dh))
    ref = backward_ref("rms", dy, cp.asnumpy(res.h), w, dh, EPS["rms"])
    assert g.dx.dtype == np.float32 and g.dweight.dtype == BF16
    assert_within(g.dx, ref[0], dx_bound("rms", dy, cp.asnumpy(res.h), w, dh, EPS["rms"],
                                         ref[0], "float32"), "dx")
    normwise(g.dweight, ref[1], ROUNDING["bfloat16"], "dweight")


# ---- repeated calls, empty calls, PyTorch, errors

@pytest.mark.parametrize("kind", KINDS)
def test_repeated_calls_take_the_prepared_path(kind):
    """The same argument pattern on fresh arrays: the prepared call, with the same results as
    a first call would give."""
    n = 1536
    w, b = affine(kind, n, BF16, "both")
    for _ in range(3):
        run_forward(kind, host_rand((40, n), BF16), w, b, host_rand((40, n), BF16))
        run_backward(kind, host_rand((40, n), BF16), host_rand((40, n), BF16), w, b,
                     host_rand((40, n), BF16))


@pytest.mark.parametrize("kind", KINDS)
def test_empty_calls(kind):
    fn = rms_norm if kind == "rms" else layer_norm
    for shape in ((0, 5), (3, 0, 4)):
        y = fn(cp.empty(shape, np.float32))
        assert y.shape == shape
    out = fn(cp.empty((0, 7), BF16), save_stats=True, residual=cp.empty((0, 7), np.float32))
    assert out.y.shape == out.h.shape == (0, 7) and out.rstd.shape == (0,)
    w = cp.asarray(host_rand(7, np.float32))
    g = (rms_norm_backward(cp.empty((0, 7), BF16), cp.empty((0, 7), BF16), w,
                           cp.empty((0,), np.float32)) if kind == "rms" else
         layer_norm_backward(cp.empty((0, 7), BF16), cp.empty((0, 7), BF16), w,
                             cp.empty((0,), np.float32), cp.empty((0,), np.float32), bias=w))
    assert g.dx.shape == (0, 7) and (cp.asnumpy(g.dweight) == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_pytorch_tensors(kind):
    torch = pytest.importorskip("torch")
    fn = rms_norm if kind == "rms" else layer_norm
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16) * 3 + 1
    r = torch.randn(64, 1000, device="cuda", dtype=torch.float32)
    w = torch.randn(1000, device="cuda", dtype=torch.float32)
    args = (x, w) if kind == "rms" else (x, w, torch.randn_like(w))
    y, h = fn(*args, residual=r)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and h.dtype == torch.float32
    torch.testing.assert_close(h, x.float() + r, rtol=0, atol=0)
    ref = (torch.nn.functional.rms_norm(h, (1000,), w, eps=1e-6) if kind == "rms" else
           torch.nn.functional.layer_norm(h, (1000,), w, args[2], eps=1e-5))
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                    # queued on PyTorch's current stream
        y2, _ = fn(*args, residual=r)
    s.synchronize()
    assert torch.equal(y, y2)


def test_bad_arguments_are_refused():
    x = cp.asarray(host_rand((4, 1000), np.float32))
    with pytest.raises(ge2jit.ArgumentTypeError, match="x: expected a GPU array .*numpy"):
        rms_norm(cp.asnumpy(x))
    with pytest.raises(ge2jit.ArgumentValueError, match="x: dtype float64 is not supported"):
        rms_norm(x.astype(cp.float64))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"weight: expected shape \(1000,\)"):
        layer_norm(x, cp.ones(999, np.float32))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        buf = cp.asarray(host_rand((5, 1000), np.float32))
        rms_norm(buf[:4], out=buf[1:])
    with pytest.raises(ge2jit.ArgumentValueError, match="residual_out: given without residual"):
        rms_norm(x, residual_out=cp.empty_like(x))
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: warp32_v4_r1 holds rows of at most 128 elements"):
        rms_norm(x, config="warp32_v4_r1")
    with pytest.raises(ge2jit.ArgumentValueError, match="rstd: expected dtype float32"):
        rms_norm_backward(x, x, None, cp.ones(4, np.float16))


@pytest.mark.parametrize("where", ["x", "residual", "weight"])
def test_arrays_on_another_device_are_refused(where):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    arrays = {"x": cp.ones((4, 8), np.float32), "residual": cp.ones((4, 8), np.float32),
              "weight": cp.ones(8, np.float32)}
    with cp.cuda.Device(1):
        arrays[where] = cp.ones(arrays[where].shape, np.float32)
    message = f"{where}: expected an array on the current device"
    with pytest.raises(ge2jit.DeviceMismatchError, match=message):
        rms_norm(arrays["x"], arrays["weight"], residual=arrays["residual"])


# the compiled launch path (``jit.fastlaunch``): after a signature's first call, its program

def _compiled_tables(kind):
    from ge2jit.ops.norm import op as norm_op

    return norm_op._COMPILED[kind], norm_op._COMPILED_BACKWARD[kind]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_repeated_calls_take_fresh_inputs_on_the_compiled_path(kind, given, residual):
    """Calls of one signature after the first run its program in C: fresh inputs, outputs
    poisoned (given) or made by the program, every output against the reference; the
    backward's too, with the forward's statistics."""
    from ge2jit.jit.fastlaunch import available

    fwd, bwd = _compiled_tables(kind)
    before = fwd.stats()["hits"], bwd.stats()["hits"]
    n, rows = 1000, 33
    for _ in range(3):
        x = host_rand((rows, n), BF16)
        w = host_rand((n,), np.float32, 0.5, 1.0)
        b = host_rand((n,), np.float32) if kind == "layer" else None
        r = host_rand((rows, n), np.float32) if residual else None
        if given:   # into poisoned outputs, checked by run_forward
            res = run_forward(kind, x, w, b, r)
        else:   # outputs the op (or its program) makes
            dev = [None if a is None else cp.asarray(a) for a in (x, w, b, r)]
            args = dev[:2] if kind == "rms" else dev[:3]
            fn = rms_norm if kind == "rms" else layer_norm
            res = fn(*args, eps=EPS[kind], residual=dev[3], save_stats=True)
            y_ref, h_ref, mean_ref, rstd_ref = forward_ref(kind, x, w, b, r, EPS[kind],
                                                           None if r is None else r.dtype)
            assert isinstance(res, ge2jit.NormOutput) and res.y.dtype == BF16
            assert (res.mean is None) == (kind == "rms") and (res.h is None) != residual
            assert_within(res.rstd, rstd_ref, 2e-6 * np.abs(rstd_ref) + 1e-30, "rstd")
            assert_within(res.y, y_ref, y_bound(kind, h_ref, mean_ref, rstd_ref, w, b, y_ref,
                                                "bfloat16"), "y")
            if residual:
                assert same_values(res.h, h_ref)
        h = host(res.h) if residual else x
        g = run_backward(kind, host_rand((rows, n), BF16), h, w, b,
                         stats=res if residual else None)
        assert g.dx.dtype == h.dtype
    if available():
        assert fwd.stats()["hits"] - before[0] >= 2
        assert bwd.stats()["hits"] - before[1] >= 2


@pytest.mark.parametrize("kind", KINDS)
def test_the_compiled_path_gives_the_python_paths_bits(kind):
    """A program's results, bit for bit, against the Python path's on the same inputs (the
    tables cleared: the next call checks and launches from Python again)."""
    from ge2jit.ops.norm import op as norm_op

    x = cp.asarray(host_rand((130, 4097), np.float16))
    r = cp.asarray(host_rand((130, 4097), np.float32))
    w = cp.asarray(host_rand((4097,), np.float16, 0.5, 1.0))
    b = cp.asarray(host_rand((4097,), np.float16)) if kind == "layer" else None
    dy = cp.asarray(host_rand((130, 4097), np.float16))

    def step():
        if kind == "layer":
            out = layer_norm(x, w, b, residual=r, save_stats=True)
            g = layer_norm_backward(dy, out.h, w, out.mean, out.rstd, bias=b)
        else:
            out = rms_norm(x, w, residual=r, save_stats=True)
            g = rms_norm_backward(dy, out.h, w, out.rstd)
        return [a for a in (*out, *g) if a is not None]

    step()   # checked and stored
    compiled = step()
    for table in (*_compiled_tables(kind), norm_op._prepared, norm_op._prepared_backward):
        table.clear()
    python = step()
    assert len(compiled) == len(python)
    for a, b_ in zip(compiled, python):
        assert same_bits(a, b_)


def test_outputs_given_are_checked_on_the_compiled_path():
    """A program stored for a call with its output given still checks each call's output
    against the inputs: one over x (not x itself) is refused before any launch; x itself
    (in place) runs, on its own program."""
    buf = poisoned((2, 8, 256), np.float32)   # out in the first plane, x in the second
    x, w = buf[1, :, 128:192], cp.asarray(host_rand((64,), np.float32, 0.5, 1.0))
    x[...] = cp.asarray(host_rand((8, 64), np.float32))
    x_before = host(x)
    want = rms_norm_ref(x_before, host(w), eps=EPS["rms"])[0]

    def close(a):
        return np.allclose(host(a), want, rtol=1e-5, atol=1e-6)

    for _ in range(2):   # the second call runs the program
        out = buf[0, :, :64]
        assert rms_norm(x, w, eps=EPS["rms"], out=out) is out and close(out)
    buf[0] = np.nan
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        rms_norm(x, w, eps=EPS["rms"], out=buf[1, :, 96:160])   # the same signature, over x
    assert np.isnan(host(buf[0])).all() and same_bits(x, x_before)   # nothing launched
    for _ in range(2):
        y = cp.asarray(x_before)
        assert rms_norm(y, w, eps=EPS["rms"], out=y) is y and close(y)
