"""quantize_fp8 on the GPU against its float32 host reference (``reference.py``: the same
float32 operations, then ml_dtypes' rounding to the format after saturation): q must match
bit for bit (NaN positions included), dynamic scales and the amax exactly.

Every input type and both formats; per-tensor and per-row scales, dynamic, on the device
(one value, one per row with a stride) and on the host; amax_out in every mode; row lengths
from 1 to 50000 (every variant's edges) and row counts from 1 to 4100; special values (NaN,
infinities, zero rows, values past the format's range); rows of wider arrays and copied
layouts; out= given (uint8 and the format's dtype); prepared calls with new data and scales;
every config pinned; empty and 0-d arrays; PyTorch tensors; and a GEMM fed by the quantized
operands. Outputs are poisoned (0xff bytes: NaN in both formats) before each call; inputs
are fresh random numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.jit.device import device_arch
from ge2jit.ops.quantize import all_configs, quantize_fp8
from ge2jit.ops.quantize import reference as ref

from ...gpu_arrays import DT, DTYPES, cp, ml_dtypes

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("free_gpu_memory")]

FMTS = {"e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2)}
SHAPES = [(1, 1), (3, 7), (130, 4096), (64, 33), (2, 50000), (4, 3, 100), (4100, 256),
          (5, 1024), (7, 1025), (3, 16384), (2, 16385), (9,)]
_rng = np.random.default_rng(19)


@pytest.fixture(autouse=True)
def _fp8_gpu():
    arch = device_arch(cp.cuda.runtime.getDevice())
    if int(arch[3:].rstrip("a")) < 89:
        pytest.skip("8-bit conversions need sm_89 or newer")


def rand(shape, dtype, spread=3.0) -> np.ndarray:
    """Normal numbers times ``spread`` with a few larger ones, in ``dtype`` (never zeros)."""
    h = _rng.standard_normal(shape).astype(np.float32) * np.float32(spread)
    flat = h.reshape(-1)
    flat[_rng.integers(0, flat.size, max(1, flat.size // 97))] *= 40
    return h.astype(DT[dtype])


def poisoned_q(shape, fmt):
    return cp.full(shape, 0xFF, np.uint8).view(FMTS[fmt])


def check_q(q, want) -> None:
    got = cp.asnumpy(q.view(np.uint8)).view(want.dtype)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def check_scale(s, want) -> None:
    got = cp.asnumpy(s)
    assert got.dtype == np.float32 and got.shape == np.shape(want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("per_row", [False, True], ids=["tensor", "row"])
def test_dynamic_scales(shape, dtype, fmt, per_row):
    h = rand(shape, dtype)
    amax = cp.full((), np.nan, np.float32)
    q, s = quantize_fp8(cp.asarray(h), fmt=fmt, per_row=per_row, amax_out=amax)
    assert q.dtype == FMTS[fmt] and q.shape == shape
    want_q, want_s = ref.quantize_fp8(h, fmt, per_row=per_row)
    check_scale(s, want_s)
    check_q(q, want_q)
    assert float(amax) == float(ref.amax(h))


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 7), (130, 4096), (2, 50000), (4100, 256), (9,)], ids=str)
@pytest.mark.parametrize("kind", ["host", "device", "rows"])
def test_given_scales(shape, dtype, fmt, kind):
    h = rand(shape, dtype)
    rows = shape[:-1]
    if kind == "host":
        scale, want = 0.037, 0.037
    elif kind == "device":
        want = np.float32(0.05)
        scale = cp.asarray(np.array([[want]]))
    else:      # one per row, every other element of a wider array
        want = _rng.uniform(0.01, 0.2, rows).astype(np.float32)
        wide = cp.zeros(rows + (2,), np.float32)
        wide[..., 0] = cp.asarray(want)
        scale = wide[..., 0]
    amax = cp.full((1,), np.nan, np.float32)
    out = poisoned_q(shape, fmt)
    q, s = quantize_fp8(cp.asarray(h), fmt=fmt, scale=scale, per_row=kind == "rows",
                        amax_out=amax, out=out)
    assert q is out and s is scale
    check_q(q, ref.quantize(h, want, fmt))
    assert float(amax[0]) == float(ref.amax(h))


def special(n: int) -> np.ndarray:
    rows = [_rng.standard_normal(n).astype(np.float32) for _ in range(6)]
    rows[0][n // 2] = np.nan                       # NaN: NaN scale, NaN row
    rows[1][n // 3] = np.inf                       # inf: inf scale: 0, NaN at the inf
    rows[2][:] = 0.0                               # zeros: scale 1
    rows[3][n // 2] = -np.inf
    rows[4] *= np.float32(1e-30)                   # tiny: subnormal scales
    rows[5] *= np.float32(1e30)                    # huge
    return np.stack(rows)


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("n", [5, 256, 4096, 20000])
def test_special_values(n, fmt):
    h = special(n)
    for per_row in (True, False):
        q, s = quantize_fp8(cp.asarray(h), fmt=fmt, per_row=per_row)
        want_q, want_s = ref.quantize_fp8(h, fmt, per_row=per_row)
        check_scale(s, want_s)
        check_q(q, want_q)
    # a given scale: values past the range saturate, NaN stays NaN
    q, _ = quantize_fp8(cp.asarray(h[[0, 1, 3, 5]]), fmt=fmt, scale=1.0)
    check_q(q, ref.quantize(h[[0, 1, 3, 5]], 1.0, fmt))
    # the huge row (1e30 times normal numbers, of either sign) is all at +-largest
    huge = cp.asnumpy(q.view(np.uint8)).view(FMTS[fmt])[3].astype(np.float32)
    assert (np.abs(huge) == ref.as_fp8(fmt).largest).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_wider_arrays_and_copied_layouts(dtype):
    big = rand((40, 300), dtype)
    d = cp.asarray(big)
    for view, hv in ((d[3:33, 5:260], big[3:33, 5:260]), (d[::2, :128], big[::2, :128]),
                     (d[:, :100].T, big[:, :100].T), (d[::-1, 7:], big[::-1, 7:])):
        for per_row in (False, True):
            q, s = quantize_fp8(view, per_row=per_row)
            want_q, want_s = ref.quantize_fp8(hv, "e4m3", per_row=per_row)
            check_scale(s, want_s)
            check_q(q, want_q)
    out = cp.full((30, 512), 0xFF, np.uint8)[:, 100:355]
    q, _ = quantize_fp8(d[3:33, 5:260], per_row=True, out=out)
    assert q is out
    check_q(q, ref.quantize_fp8(big[3:33, 5:260], "e4m3", per_row=True)[0])


@pytest.mark.parametrize("per_row", [False, True])
def test_prepared_calls_take_new_data_and_scales(per_row):
    shape = (64, 512)
    for i in range(4):
        h = rand(shape, "bfloat16", spread=1.0 + i)
        q, s = quantize_fp8(cp.asarray(h), fmt="e5m2", per_row=per_row)
        want_q, want_s = ref.quantize_fp8(h, "e5m2", per_row=per_row)
        check_scale(s, want_s)
        check_q(q, want_q)
        if not per_row:
            host = 0.01 * (i + 1)
            q, s = quantize_fp8(cp.asarray(h), fmt="e5m2", scale=host)
            assert s == host
            check_q(q, ref.quantize(h, host, "e5m2"))


@pytest.mark.parametrize("config", [c.name for c in all_configs()])
def test_every_config_pinned(config):
    from ge2jit.ops.quantize import parse_config

    c = parse_config(config)
    n = c.capacity - 3 if c.capacity and c.capacity > 3 else (c.capacity or 3000)
    h = rand((37, n), "bfloat16")
    cases = [(False, None), (False, 0.02)] + ([] if c.flat else [(True, None)])
    for per_row, scale in cases:
        amax = cp.full((), np.nan, np.float32)
        q, s = quantize_fp8(cp.asarray(h), per_row=per_row, scale=scale, config=config,
                            amax_out=amax)
        want_q, want_s = ref.quantize_fp8(h, "e4m3", scale=scale, per_row=per_row)
        check_q(q, want_q)
        if scale is None:
            check_scale(s, want_s)
        assert float(amax) == float(ref.amax(h))
    e = ge2jit.explain(quantize_fp8, cp.asarray(h), config=config)
    assert e.config == config and e.reason == "pinned"


def test_empty_and_zero_d_arrays():
    q, s = quantize_fp8(cp.zeros((0, 5), np.float32))
    assert q.shape == (0, 5) and float(s) == 1.0
    q, s = quantize_fp8(cp.zeros((3, 0), np.float32), per_row=True)
    assert q.shape == (3, 0) and cp.asnumpy(s).tolist() == [1.0, 1.0, 1.0]
    q, s = quantize_fp8(cp.zeros((0, 5), np.float32), per_row=True)
    assert q.shape == (0, 5) and s.shape == (0,)
    amax = cp.full((), np.nan, np.float32)
    quantize_fp8(cp.zeros((0, 5), np.float32), amax_out=amax, scale=1.0)
    assert float(amax) == 0.0
    h = np.array(-3.5, np.float32)
    for per_row in (False, True):
        q, s = quantize_fp8(cp.asarray(h), per_row=per_row)
        assert q.shape == () and s.shape == ()
        check_q(q, ref.quantize_fp8(h.reshape(1, 1), "e4m3")[0].reshape(()))


def test_explain_names_the_kernels():
    x = cp.asarray(rand((256, 4096), "bfloat16"))
    e = ge2jit.explain(quantize_fp8, x)
    assert e.config == "flat_512" and e.reason == "heuristic"
    assert e.kernel_names == ("quantize_fp8_tensor_flat512_v32_x8_bf16_e4m3",
                              "quantize_fp8_amax_flat512_v32_x8_bf16")
    assert all(s == 0 for s in e.spill_bytes)
    e = ge2jit.explain(quantize_fp8, x, per_row=True, fmt="e5m2")
    assert e.kernel_names == ("quantize_fp8_row_block256_v16_x8_bf16_e5m2",)


def test_bad_arguments_are_refused_with_real_arrays():
    x = cp.ones((4, 8), np.float32)
    with pytest.raises(ge2jit.ArgumentValueError, match="scale: expected shape"):
        quantize_fp8(x, scale=cp.ones(5, np.float32), per_row=True)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x"):
        quantize_fp8(x, out=x.view(np.uint8)[:, :8])
    with pytest.raises(ge2jit.ArgumentTypeError, match="per_row: expected True or False"):
        quantize_fp8(x, per_row=1)
    with pytest.raises(ge2jit.ArgumentValueError, match="config: flat_512 takes one scale"):
        quantize_fp8(x, per_row=True, config="flat_512")


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(96, 640, device="cuda", dtype=torch.bfloat16) * 3
    q, s = quantize_fp8(x, per_row=True)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (96,)
    h = x.float().cpu().numpy().astype(DT["bfloat16"])
    want_q, want_s = ref.quantize_fp8(h, "e4m3", per_row=True)
    np.testing.assert_array_equal(s.cpu().numpy(), want_s)
    np.testing.assert_array_equal(q.float().cpu().numpy(), want_q.astype(np.float32))
    q, s = quantize_fp8(x, fmt=torch.float8_e5m2)
    assert q.dtype == torch.float8_e5m2 and s.shape == ()
    # scale * q is x to within e4m3's rounding: half its 3-bit mantissa's step, relative
    q, s = quantize_fp8(x, per_row=True)
    err = (q.double() * s.double()[:, None] - x.double()).abs()
    assert bool((err <= x.double().abs() * 2.0**-4 + s.double()[:, None] * 2.0**-10).all())


@pytest.mark.parametrize("fmt", list(FMTS))
def test_quantized_operands_feed_the_fp8_gemm(fmt):
    """bfloat16 activations (M, K) per row and weights (N, K) per output channel, quantized,
    then Y = (s_a ⊙ A_q)(B_q ⊙ s_b) + bias by the FP8 GEMM: against the float64 product of
    the dequantized operands, and near the bfloat16 product."""
    if device_arch(cp.cuda.runtime.getDevice()) != "sm_90":
        pytest.skip("8-bit GEMMs run on Hopper")
    m, n, k = 256, 384, 512
    a = rand((m, k), "bfloat16", 1.0)
    w = rand((n, k), "bfloat16", 0.05)
    qa, sa = quantize_fp8(cp.asarray(a), fmt=fmt, per_row=True)
    qw, sw = quantize_fp8(cp.asarray(w), fmt=fmt, per_row=True)
    y = ge2jit.gemm_bias_act(qa, qw.T, scale_a=sa, scale_b=sw, out_dtype="float32")
    deq_a = cp.asnumpy(qa.view(np.uint8)).view(FMTS[fmt]).astype(np.float64) \
        * cp.asnumpy(sa)[:, None]
    deq_w = cp.asnumpy(qw.view(np.uint8)).view(FMTS[fmt]).astype(np.float64) \
        * cp.asnumpy(sw)[:, None]
    want = deq_a @ deq_w.T
    got = cp.asnumpy(y).astype(np.float64)
    # (the FP8 tensor cores' own sums over 128 of K lose bits: about 1.3e-4 of full-range
    # operands; these use the whole range of the format)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
    exact = a.astype(np.float64) @ w.astype(np.float64).T
    tol = {"e4m3": 0.06, "e5m2": 0.12}[fmt]
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < tol
