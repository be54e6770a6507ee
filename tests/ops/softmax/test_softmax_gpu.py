"""softmax on the GPU against a float64 NumPy reference, ``e = exp(x - max); e / sum(e)``
computed from the input's own values (16-bit inputs included).

Every dtype, row lengths from 1 to 65536 (the edges of every variant) and several row counts;
rows holding -inf, NaN, +inf, only -inf, values of ±1e30 (±6e4 in float16), tiny values and
values near the type's maximum; mixed input/output types; in place (``out=x``); rows that are
slices of wider arrays (aligned and not, negative row strides); other axes (the strided
variant) and layouts that are copied; every config pinned, on full and partial rows, also in
place; empty and 0-d arrays; the argument errors with real arrays. Outputs are poisoned with
NaN before each run; inputs are fresh random values (never zeros), except in the ``bigmem``
tests of rows and columns past 2**31 elements, whose structured inputs have a known answer.

Tolerances: float32 4e-6 relative (the exponent's argument is rounded once to float32 and
scaled by log2(e): about |x - max| * 1.2e-7 relative error, 2.4e-6 at a spread of 20) with
1e-9 absolute; float16 and bfloat16 outputs one rounding (1e-3 and 8e-3 relative; float16's
subnormals below 6.1e-5: 2**-24 absolute).
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.softmax import all_configs, choose, heuristic, parse_config, softmax
from ge2jit.ops.softmax.reference import softmax_ref as reference

from ...gpu_arrays import BF16, DT, DTYPES, cp, poisoned, same_bits

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

TOL = {"float32": (4e-6, 1e-9), "float16": (1e-3, 2.0**-24), "bfloat16": (8e-3, 1e-9)}
LENGTHS = [1, 2, 31, 32, 33, 1000, 1024, 4097, 32768, 65536,
           7, 129, 777, 2049, 12345, 40000]           # the last six: "random" lengths
ROW_COUNTS = [1, 3, 130]

_rng = np.random.default_rng(2024)


def host_rand(shape, dtype, scale: float = 2.0) -> np.ndarray:
    """Standard normal values times ``scale``, rounded to ``dtype`` (never all zeros)."""
    return (_rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


def check(y, x_host: np.ndarray, axis: int = -1, dtype: str | None = None) -> None:
    """y (on the GPU, or copied to the host) against the reference of x_host; ``dtype``: y's
    expected dtype (default x_host's)."""
    got = cp.asnumpy(y) if isinstance(y, cp.ndarray) else np.asarray(y)
    want = np.dtype(DT[dtype] if dtype else x_host.dtype)
    assert got.dtype == want, (got.dtype, want)
    assert got.shape == x_host.shape
    rtol, atol = TOL[want.name]
    np.testing.assert_allclose(got.astype(np.float64), reference(x_host, axis), rtol=rtol,
                               atol=atol, equal_nan=True)


def special_rows(n: int, dtype) -> np.ndarray:
    """Rows of ``n`` elements holding the values whose softmax needs care (see the module's
    docstring)."""
    dtype = np.dtype(dtype)
    f16 = dtype == np.float16
    big = 6e4 if f16 else 1e30
    top = 6e4 if f16 else 3e38           # near the type's maximum
    tiny = 1e-5 if f16 else 1e-30
    inf, nan = np.inf, np.nan

    def base():
        return (_rng.standard_normal(n) * 2).astype(np.float32)

    def at(k=1):
        return _rng.choice(n, size=min(k, n), replace=False)

    rows = [base()]
    r = base()
    r[at(max(1, n // 3))] = -inf                   # some -inf
    rows.append(r)
    r = base()
    r[at()] = nan                                  # one NaN: the row is NaN
    rows.append(r)
    r = base()
    r[at()] = inf                                  # one +inf: NaN (inf - inf)
    rows.append(r)
    rows.append(np.full(n, -inf, np.float32))      # only -inf: NaN (0/0)
    r = base()
    r[at(2)] = inf                                 # two +inf
    rows.append(r)
    r = base()
    i = at(2)
    r[i[0]] = big
    r[i[-1]] = -big if n > 1 else big              # huge magnitudes
    rows.append(r)
    rows.append(base() * np.float32(tiny))          # tiny values: nearly uniform
    rows.append(np.full(n, big, np.float32))        # all equal and huge: 1/n
    rows.append(np.full(n, -big, np.float32))
    r = np.full(n, -inf, np.float32)
    r[at()] = 1.5                                  # one finite value among -inf: 1 there
    rows.append(r)
    r = np.full(n, -inf, np.float32)
    r[at()] = nan                                  # -inf and NaN: NaN
    rows.append(r)
    r = np.full(n, top, np.float32)
    r[at()] = -top                                 # near the maximum: differences overflow
    rows.append(r)
    r = base()
    r[at(max(1, n // 2))] = -inf
    r[at()] = inf                                  # -inf and +inf: NaN
    rows.append(r)
    return np.stack(rows).astype(dtype)


def _run(h: np.ndarray, axis: int = -1, config=None, out_dtype: str | None = None):
    """softmax of cp.asarray(h) into a poisoned output; checked; returns the output."""
    x = cp.asarray(h)
    out = poisoned(h.shape, DT[out_dtype] if out_dtype else h.dtype)
    y = softmax(x, axis, out=out, config=config)
    assert y is out
    check(out, h, axis, out_dtype)
    assert same_bits(cp.asnumpy(x), h), "the input changed"
    return out


# ---- rows along the last axis


@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_match_reference(dtype, n, rows):
    _run(host_rand((rows, n), DT[dtype]))


@pytest.mark.parametrize("n", [1, 2, 5, 31, 33, 128, 129, 1000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_many_short_rows(dtype, n):
    """Enough rows for the heuristic's several rows per lane group (warp variants _r2, _r4),
    and a last block of rows that is not full."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    most = heuristic(10**9, n, dtype, sm_count=sms)          # the most rows per lane group
    rows = 8 * sms * (128 // most.lanes) * 2 + 1             # enough to keep two of them
    assert heuristic(rows, n, dtype, sm_count=sms).rows == min(2, most.rows)
    _run(host_rand((rows, n), DT[dtype]))


@pytest.mark.parametrize("n", [33, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_new_output(dtype, n):
    h = host_rand((5, n), DT[dtype])
    y = softmax(cp.asarray(h))
    assert isinstance(y, cp.ndarray) and y.dtype == DT[dtype] and y.shape == (5, n)
    check(y, h)


@pytest.mark.parametrize("n", [1, 33, 1000, 4097, 40000])
@pytest.mark.parametrize("types", [("float32", "bfloat16"), ("float32", "float16"),
                                   ("bfloat16", "float32"), ("float16", "float32"),
                                   ("bfloat16", "float16")], ids="->".join)
def test_mixed_output_types(types, n):
    src, dst = types
    _run(host_rand((9, n), DT[src]), out_dtype=dst)
    _run(special_rows(n, DT[src]), out_dtype=dst)


@pytest.mark.parametrize("layout", ["rows", "axis0"])
@pytest.mark.parametrize("n", [1, 2, 33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype, n, layout):
    h = special_rows(n, DT[dtype])
    if layout == "rows":
        _run(h)
    else:
        _run(np.ascontiguousarray(h.T), axis=0)


def test_special_values_by_hand():
    x = cp.asarray(np.array([[1.0, -np.inf, 1.0], [np.inf, 0.0, 0.0], [-np.inf] * 3,
                             [np.nan, 0.0, 0.0], [1e30, -1e30, 0.0]], np.float32))
    got = cp.asnumpy(softmax(x))
    np.testing.assert_array_equal(got[0], [0.5, 0.0, 0.5])
    assert np.isnan(got[1:4]).all()
    np.testing.assert_array_equal(got[4], [1.0, 0.0, 0.0])
    one = cp.asnumpy(softmax(cp.asarray(np.array([[5.0], [-1e30], [-np.inf]], np.float32))))
    np.testing.assert_array_equal(one[:2], [[1.0], [1.0]])
    assert np.isnan(one[2, 0])


@pytest.mark.parametrize("n", [1, 33, 1000, 4097, 40000, 70001])
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place(dtype, n):
    h = np.concatenate([host_rand((6, n), DT[dtype]), special_rows(n, DT[dtype])])
    x = cp.asarray(h)
    assert softmax(x, out=x) is x
    check(x, h)
    hc = np.ascontiguousarray(h.T)          # the strided variant in place
    xc = cp.asarray(hc)
    assert softmax(xc, axis=0, out=xc) is xc
    check(xc, hc, axis=0)


@pytest.mark.parametrize("offsets", [(0, 0), (1, 3), (8, 8), (5, 0)], ids=str)
@pytest.mark.parametrize("n", [33, 1000, 4097, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_wider_arrays(dtype, n, offsets):
    """x and out are column slices of wider arrays (any row stride, aligned or not); the rest
    of out's array is left alone."""
    ox, oy = offsets
    rows = 9
    wide = host_rand((rows, n + 64), DT[dtype])
    x = cp.asarray(wide)[:, ox:ox + n]
    out_wide = poisoned((rows, n + 40), DT[dtype])
    out = out_wide[:, oy:oy + n]
    assert softmax(x, out=out) is out
    check(out, wide[:, ox:ox + n])
    rest = cp.asnumpy(out_wide).astype(np.float64)
    assert np.isnan(rest[:, :oy]).all() and np.isnan(rest[:, oy + n:]).all()


@pytest.mark.parametrize("n", [33, 4097, 40000])
def test_negative_row_stride(n):
    h = host_rand((7, n), np.float32)
    y = softmax(cp.asarray(h)[::-1])
    check(y, h[::-1])
    out_wide = poisoned((14, n), np.float32)
    softmax(cp.asarray(h), out=out_wide[::-2])
    check(out_wide[::-2], h)
    assert np.isnan(cp.asnumpy(out_wide[-2::-2])).all()


# ---- other axes and layouts

@pytest.mark.parametrize("shape, axis", [
    ((5, 300, 7), 1), ((5, 300, 7), 0), ((5, 300, 7), -3), ((5, 300, 7), 2),
    ((1000,), 0), ((4, 3, 5, 6), 2), ((4, 3, 5, 6), -4), ((7, 40000), 0), ((2, 70001, 3), 1),
    ((3, 1, 5), 1), ((3, 1, 5), 0), ((1, 1, 1), 2), ((40000, 2), 0),
], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_other_axes(dtype, shape, axis):
    _run(host_rand(shape, DT[dtype]), axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_and_sliced_layouts(dtype):
    h = host_rand((300, 50), DT[dtype])
    xt = cp.asarray(h).T                       # last axis with stride 50: strided variant
    check(softmax(xt), h.T)
    check(softmax(xt, axis=0), h.T, axis=0)
    big = host_rand((4, 8, 300), DT[dtype])
    xs = cp.asarray(big)[:, :5, :]             # rows not one stride apart: copied first
    hs = big[:, :5, :]
    for axis in (2, 1, 0, -1):
        check(softmax(xs, axis), hs, axis)
    out_big = poisoned((4, 8, 300), DT[dtype])
    out = out_big[:, :5, :]                    # written through a temporary
    assert softmax(cp.asarray(hs), out=out) is out
    check(out, hs)
    assert np.isnan(cp.asnumpy(out_big[:, 5:, :]).astype(np.float64)).all()
    xi = cp.asarray(big)[:, :5, :]
    assert softmax(xi, axis=2, out=xi) is xi   # in place through the copies
    check(xi, hs, 2)
    bcast = cp.broadcast_to(cp.asarray(h[:1]), (6, 50))   # zero row stride: read as it is
    check(softmax(bcast), np.broadcast_to(h[:1], (6, 50)))


# ---- pinned configs


def _config_cases(name: str):
    """(host input, axis) cases a config accepts: full and partial rows for warp and block,
    short, medium and multi-step rows for loop, columns and rows for strided; each with the
    special rows."""
    cfg = parse_config(name)
    if cfg.variant == "strided":
        lengths = [1, 333, 5000]
    elif cfg.variant == "loop":
        lengths = [1, 1000, 70001]
    else:
        cap = cfg.capacity
        lengths = sorted({cap, max(1, cap - cap // 3 - 1)})
    for n in lengths:
        yield n, -1
        if cfg.variant == "strided":
            yield n, 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", [c.name for c in all_configs()])
def test_pinned_config(name, dtype):
    for n, axis in _config_cases(name):
        h = np.concatenate([host_rand((37, n), DT[dtype]), special_rows(n, DT[dtype])])
        if axis == 0:
            h = np.ascontiguousarray(h.T)
        _run(h, axis, config=name)
        x = cp.asarray(h)
        assert softmax(x, axis, out=x, config=parse_config(name)) is x
        check(x, h, axis)


@pytest.mark.parametrize("n", [1, 33, 1000, 4097, 40000])
def test_heuristic_choice_pinned_gives_the_same_bits(n):
    h = host_rand((20, n), np.float32)
    x = cp.asarray(h)
    dev = cp.cuda.Device()
    name = choose(20, n, "float32", dev.attributes["MultiProcessorCount"]).config.name
    a = cp.asnumpy(softmax(x))
    b = cp.asnumpy(softmax(x, config=name))
    assert same_bits(a, b), name


# ---- empty, 0-d, PyTorch, errors


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_arrays(dtype):
    for shape, axis in [((0, 5), -1), ((5, 0), -1), ((0,), 0), ((3, 0, 4), 1),
                        ((3, 0, 4), 0)]:
        x = cp.empty(shape, DT[dtype])
        y = softmax(x, axis)
        assert y.shape == shape and y.dtype == DT[dtype]
        out = cp.empty(shape, np.float32)
        assert softmax(x, axis, out=out, config="block_1024_v32") is out


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_d(dtype):
    for value, want in [(3.0, 1.0), (-1e4, 1.0), (-np.inf, np.nan), (np.inf, np.nan),
                        (np.nan, np.nan)]:
        x = cp.asarray(np.array(value, dtype=np.float32).astype(DT[dtype]))
        for axis in (0, -1):
            y = softmax(x, axis)
            assert y.shape == () and y.dtype == DT[dtype]
            got = float(cp.asnumpy(y).astype(np.float64))
            assert got == want or (np.isnan(want) and np.isnan(got)), (value, got)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"axis: expected an int in \[-1, 1\)"):
        softmax(cp.asarray(np.float32(1.0)), 1)


def test_pytorch_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    t = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16) * 3
    x = cp.from_dlpack(t)
    y = softmax(x)
    check(y, cp.asnumpy(x))
    want = torch.softmax(t.float(), -1).cpu().numpy()
    np.testing.assert_allclose(cp.asnumpy(y).astype(np.float32), want, rtol=8e-3, atol=1e-9)
    t32 = torch.randn(3, 5000, 7, device="cuda")
    y32 = softmax(cp.from_dlpack(t32), axis=1)
    np.testing.assert_allclose(cp.asnumpy(y32), torch.softmax(t32, 1).cpu().numpy(),
                               rtol=1e-5, atol=1e-8)


def test_bad_arguments_are_refused():
    x = cp.asarray(host_rand((4, 1000), np.float32))
    with pytest.raises(ge2jit.ArgumentTypeError, match="x: expected a GPU array .*numpy.ndarray"):
        softmax(cp.asnumpy(x))
    with pytest.raises(ge2jit.ArgumentValueError, match="x: dtype float64 is not supported"):
        softmax(x.astype(cp.float64))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"axis: expected an int in \[-2, 2\)"):
        softmax(x, 2)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"out: expected shape \(4, 1000\)"):
        softmax(x, out=cp.empty((1000, 4), np.float32))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: dtype float64 is not supported"):
        softmax(x, out=cp.empty((4, 1000), np.float64))
    buf = cp.asarray(host_rand((5, 1000), np.float32))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        softmax(buf[:4], out=buf[1:])
    with pytest.raises(ge2jit.ArgumentValueError, match="out: expected an array that holds"):
        softmax(cp.asarray(host_rand((2, 1000), np.float32)),
                out=cp.broadcast_to(cp.empty((1, 1000), np.float32), (2, 1000)))
    with pytest.raises(ge2jit.ArgumentValueError, match="config: expected a softmax variant"):
        softmax(x, config="fastest")
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: warp32_v4_r1 holds rows of at most 128 elements"):
        softmax(x, config="warp32_v4_r1")
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: block_1024_v16 reads rows along a unit-stride last"):
        softmax(x, axis=0, config="block_1024_v16")


def test_arrays_on_another_device_are_refused():
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(1):
        other = cp.ones((4, 8), np.float32)
    with pytest.raises(ge2jit.DeviceMismatchError, match="x: expected an array on the current"):
        softmax(other)
    with pytest.raises(ge2jit.DeviceMismatchError, match="out: expected an array on the"):
        softmax(cp.ones((4, 8), np.float32), out=other)


# ---- past 2**31 elements (64-bit offsets); tens of GB: the bigmem marker

def _need_bytes(n: int) -> None:
    free, _ = cp.cuda.runtime.memGetInfo()
    if free < n * 1.05:
        pytest.skip(f"needs {n / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} free")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def bf16_bits(v: float) -> int:
    return int(np.array([v], np.float32).astype(BF16).view(np.uint16)[0])


BF16_NAN = 0x7FC0


@pytest.mark.bigmem
@pytest.mark.parametrize("n, variant", [(128, "warp"), (4096, "block"), (40000, "loop")])
def test_rows_past_2_31_elements(n, variant):
    rows = 2**31 // n + 3
    _need_bytes(2 * rows * n * 2)
    assert choose(rows, n, "bfloat16").config.variant == variant
    x = cp.empty((rows, n), BF16)
    head, tail = host_rand((1, n), BF16), host_rand((5, n), BF16)
    x.view(cp.uint16)[...] = cp.asarray(_bits(head))          # every row the same ...
    x.view(cp.uint16)[-5:] = cp.asarray(_bits(tail))          # ... but the last five
    out = cp.empty((rows, n), BF16)
    out.view(cp.uint16).fill(BF16_NAN)
    assert softmax(x, out=out) is out
    check(out[-5:], tail)
    check(out[:2], np.concatenate([head, head]))
    check(out[rows // 2:rows // 2 + 1], head)


@pytest.mark.bigmem
def test_one_row_past_2_31_elements():
    """The loop variant walks one row of 2**31 + 5 bfloat16 values: zeros, 3 at 7, 10 at
    2**31 + 2."""
    n = 2**31 + 5
    _need_bytes(2 * n * 2)
    x = cp.zeros(n, BF16)
    x16 = x.view(cp.uint16)
    x16[7] = bf16_bits(3.0)
    x16[2**31 + 2] = bf16_bits(10.0)
    out = cp.empty(n, BF16)
    out.view(cp.uint16).fill(BF16_NAN)
    softmax(x, out=out)
    at = [0, 7, 2**30, 2**31 + 1, 2**31 + 2, n - 1]
    got = cp.asnumpy(out.view(cp.uint16)[cp.asarray(at)]).view(BF16).astype(np.float64)
    total = (n - 2) * np.exp(-10.0) + np.exp(-7.0) + 1.0
    want = np.array([np.exp(-10.0), np.exp(-7.0), np.exp(-10.0), np.exp(-10.0), 1.0,
                     np.exp(-10.0)]) / total
    np.testing.assert_allclose(got, want, rtol=TOL["bfloat16"][0])


@pytest.mark.bigmem
def test_columns_past_2_31_elements():
    """The strided variant over axis 0 of a (65537, 32768) bfloat16 array: offsets up to
    65536 * 32768 + 32767."""
    n, inner = 65537, 32768
    _need_bytes(2 * n * inner * 2)
    x = cp.zeros((n, inner), BF16)
    x16 = x.view(cp.uint16)
    for (i, j), v in [((0, 5), 1.0), ((n - 1, 5), 2.0), ((40000, inner - 1), -np.inf),
                      ((n - 1, inner - 1), 4.0), ((n - 2, inner - 2), np.nan)]:
        x16[i, j] = bf16_bits(v)
    out = cp.empty((n, inner), BF16)
    out.view(cp.uint16).fill(BF16_NAN)
    softmax(x, axis=0, out=out)
    for j in (0, 5, inner - 2, inner - 1):
        col = cp.asnumpy(x16[:, j]).view(BF16)
        got = cp.asnumpy(out.view(cp.uint16)[:, j]).view(BF16)
        check(got, col, axis=0)
