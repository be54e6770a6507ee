"""gemm_bias_act on the tensor cores (float16, bfloat16, tf32, 3xTF32) against a float64 NumPy
reference.

The reference is computed from the same rounded inputs the GPU reads. Outputs are poisoned
with NaN before each call, inputs are fresh random numbers for each check (never zeros), and
||Y - ref|| / ||ref|| stays below 1e-2 for bfloat16, 5e-3 for float16, 1e-3 for tf32 and 1e-5
for 3xTF32 (float32 inputs, ``precision="tf32x3"``, compared with the exact float32 inputs).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import ge2jit
from ge2jit.jit.device import device_arch
from ge2jit.ops.gemm.reference import gemm_bias_act_ref, magnitude_scale, rel_error
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    MMA_TF32_CONFIGS,
    MMA_X3_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_X3_CONFIGS,
    Act,
)

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.gpu

#: name -> (numpy dtype of a and b, precision, tolerance)
KINDS = {
    "bf16": (np.dtype(ml_dtypes.bfloat16), None, 1e-2),
    "f16": (np.dtype(np.float16), None, 5e-3),
    "tf32": (np.dtype(np.float32), "tf32", 1e-3),
    "tf32x3": (np.dtype(np.float32), "tf32x3", 1e-5),
}
ACTS = [a.value for a in Act]
#: Shapes whose operands' rows are 16-byte aligned take the Hopper kernel (TMA) on sm_90;
#: 4-byte aligned ones the mma.sync kernel (narrower cp.async copies).
ALIGNED, UNALIGNED = (136, 72, 48), (130, 66, 46)
BIAS_KINDS = ["none", "scalar", "col", "col2d", "row"]
LAYOUTS = list(itertools.product("rc", repeat=2))

_rng = np.random.default_rng(2024)


def rand(dtype, *shape, layout="r"):
    """Random values of ``dtype`` on the GPU ('c': a column-major, transposed view)."""
    host = _rng.standard_normal(shape).astype(np.float32).astype(dtype)
    if layout == "c" and len(shape) == 2:
        return cp.asarray(np.ascontiguousarray(host.T)).T
    return cp.asarray(host)


def poisoned(m, n, dtype):
    return cp.full((m, n), np.nan, dtype=np.float32).astype(dtype)


def host64(x):
    return None if x is None else cp.asnumpy(x).astype(np.float64)


def tf32(x):
    """float32 values as the tensor cores read them: the low 13 mantissa bits cut off."""
    h = np.ascontiguousarray(cp.asnumpy(x), dtype=np.float32)
    return (h.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def check(kind, a, b, bias=None, *, act="none", c=None, alpha=1.0, beta=0.0,
          save_preact=False, leaky_slope=0.01, config=None, out_dtype=None):
    dtype, precision, tol = KINDS[kind]
    m, n = a.shape[0], b.shape[1]
    y_dtype = np.dtype(out_dtype) if out_dtype is not None else dtype
    y = poisoned(m, n, y_dtype)
    z = poisoned(m, n, y_dtype) if save_preact else None
    got = ge2jit.gemm_bias_act(a, b, bias, act=act, c=c, alpha=alpha, beta=beta,
                               save_preact=save_preact, out=y, preact_out=z,
                               leaky_slope=leaky_slope, config=config, precision=precision,
                               out_dtype=out_dtype)
    assert (got[0] is y and got[1] is z) if save_preact else got is y
    host = [host64(x) for x in (a, b, bias, c)]
    if kind == "tf32":   # the reference reads the inputs as the tensor cores do
        host[0], host[1] = tf32(a), tf32(b)
    ref_y, ref_z = gemm_bias_act_ref(host[0], host[1], host[2], act=act, c=host[3], alpha=alpha,
                                     beta=beta, leaky_slope=leaky_slope)
    floor = 0.5 * magnitude_scale(host[0], host[1], host[2], c=host[3], alpha=alpha, beta=beta)
    y_host = host64(y)
    assert np.isfinite(y_host).all(), "every element of Y is written"
    y_floor = floor * (leaky_slope if act == "leaky_relu" else 1.0)
    err = rel_error(y_host, ref_y, y_floor)
    assert err < tol, f"Y ({kind}): relative error {err:.3g}"
    if save_preact:
        z_host = host64(z)
        assert np.isfinite(z_host).all()
        errz = rel_error(z_host, ref_z, floor)
        assert errz < tol, f"Z ({kind}): relative error {errz:.3g}"
    return y_host


def make_bias(dtype, kind, m, n):
    return {"none": None, "scalar": rand(dtype, 1), "col": rand(dtype, n),
            "col2d": rand(dtype, 1, n), "row": rand(dtype, m, 1)}[kind]


def hopper() -> bool:
    return device_arch(cp.cuda.runtime.getDevice()) == "sm_90"


def expected_family(kind, a, b) -> str:
    """The kernel family a call with the default choice should use on this GPU."""
    from ge2jit.ops.gemm.problem import layout_of

    def aligned(x, to):
        return x.data.ptr % to == 0 and (layout_of(x, "")[1] * x.itemsize) % to == 0

    if kind == "tf32x3" and min(a.shape[0], b.shape[1]) <= 64:
        return "_v"   # too narrow for the split copies to pay: the exact (pipelined) kernel
    layouts = layout_of(a, "")[0].value + layout_of(b, "")[0].value
    # tf32 operands that are not K-major are read through an aligned K-major copy; 3xTF32
    # reads both through split copies
    stage_a = kind == "tf32x3" or (kind == "tf32" and layouts[0] == "c")
    stage_b = kind == "tf32x3" or (kind == "tf32" and layouts[1] == "r")
    if hopper() and (stage_a or aligned(a, 16)) and (stage_b or aligned(b, 16)):
        return "_wgmma_"
    if aligned(a, 4) and aligned(b, 4):
        return "_mma_"
    return "_64x64x8_4x4_"   # the fallback kernel


@pytest.mark.parametrize("shape", [ALIGNED, UNALIGNED], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("bias_kind", BIAS_KINDS)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", KINDS)
def test_act_bias_layout(kind, act, bias_kind, la, lb, shape):
    dtype = KINDS[kind][0]
    m, n, k = shape
    a, b = rand(dtype, m, k, layout=la), rand(dtype, k, n, layout=lb)
    check(kind, a, b, make_bias(dtype, bias_kind, m, n), act=act, alpha=1.25)
    name = ge2jit.explain(a, b, act=act, precision=KINDS[kind][1]).kernel_names[0]
    assert expected_family(kind, a, b) in name, name


@pytest.mark.parametrize("shape", [(80, 136, 72), (75, 129, 72)], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("c_type", ["input", "float32"])
@pytest.mark.parametrize("lc", "rc")
@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("kind", KINDS)
def test_alpha_beta_c_and_types_of_c_bias_y(kind, la, lb, lc, c_type, shape):
    dtype = KINDS[kind][0]
    other = dtype if c_type == "input" else np.float32
    m, n, k = shape
    a, b = rand(dtype, m, k, layout=la), rand(dtype, k, n, layout=lb)
    c = rand(other, m, n, layout=lc)
    check(kind, a, b, rand(other, n), act="silu", c=c, alpha=-1.5, beta=0.75, save_preact=True)
    check(kind, a, b, rand(dtype, m, 1), act="gelu", c=c, beta=2.0, out_dtype=np.float32)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", KINDS)
def test_save_preact_in_output_dtype(kind, act):
    dtype = KINDS[kind][0]
    m, n, k = 65, 66, 96
    check(kind, rand(dtype, m, k), rand(dtype, k, n), rand(dtype, n), act=act, save_preact=True,
          leaky_slope=0.2)


SIZES = [1, 3, 17, 127, 1000]


@pytest.mark.parametrize("m, n", list(itertools.product(SIZES, SIZES)))
@pytest.mark.parametrize("kind", KINDS)
def test_sizes_not_multiple_of_tiles(kind, m, n):
    dtype = KINDS[kind][0]
    k = [2, 6, 18, 130, 1002, 4096][(SIZES.index(m) + 2 * SIZES.index(n)) % 6]
    check(kind, rand(dtype, m, k), rand(dtype, k, n, layout="c"), rand(dtype, n),
          act="gelu_tanh")


@pytest.mark.parametrize("m, n", list(itertools.product([8, 64, 136, 1000], [8, 72, 256, 1032])))
@pytest.mark.parametrize("kind", KINDS)
def test_aligned_sizes_not_multiple_of_tiles(kind, m, n):
    dtype = KINDS[kind][0]
    k = {8: 24, 64: 1000, 136: 4096, 1000: 72}[m]
    a, b = rand(dtype, m, k), rand(dtype, k, n, layout="c")
    check(kind, a, b, rand(dtype, n), act="gelu_tanh", save_preact=True)
    assert expected_family(kind, a, b) in ge2jit.explain(
        a, b, precision=KINDS[kind][1]).kernel_names[0]


@pytest.mark.parametrize("k", [2, 8, 16, 24, 40, 64, 66, 200, 1000, 4098])
@pytest.mark.parametrize("kind", KINDS)
def test_k_sweep(kind, k):
    dtype = KINDS[kind][0]
    check(kind, rand(dtype, 127, k), rand(dtype, k, 131), rand(dtype, 131), act="gelu",
          save_preact=True)


def _configs(kind):
    if kind == "tf32x3":
        return [c.name for c in (*MMA_X3_CONFIGS, *WGMMA_X3_CONFIGS)]
    mma = MMA_TF32_CONFIGS if kind == "tf32" else MMA_16BIT_CONFIGS
    return [c.name for c in (*mma, *WGMMA_CONFIGS)]


@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("shape", [(1, 64, 8), (256, 256, 128), (320, 264, 136),
                                   (300, 270, 130)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind, config", [(k, c) for k in KINDS for c in _configs(k)])
def test_every_candidate_config(kind, config, shape, la, lb):
    if config.startswith("wgmma_") and not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype = KINDS[kind][0]
    m, n, k = shape
    a, b = rand(dtype, m, k, layout=la), rand(dtype, k, n, layout=lb)
    check(kind, a, b, rand(dtype, m, 1), act="leaky_relu", c=rand(dtype, m, n), beta=0.5,
          save_preact=True, config=config)
    name = ge2jit.explain(a, b, config=config, precision=KINDS[kind][1]).kernel_names[0]
    if config.startswith("mma_"):
        family = "_mma_"
    elif kind == "tf32x3":   # split copies: any alignment, and a pinned config is taken as is
        family = "_wgmma_"
    else:
        family = expected_family(kind, a, b)
    assert family in name, name
    if family == "_wgmma_":
        assert config in name


@pytest.mark.parametrize("shape", [(2000, 2056, 200), (320, 264, 1000), (8, 8, 24)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("c_type", ["input", "float32"])
@pytest.mark.parametrize("kind, config", [(k, c) for k in KINDS for c in _configs(k)
                                          if c.startswith("wgmma_")])
def test_c_through_the_ring_every_hopper_config(kind, config, c_type, shape):
    """beta * C with a row-major C whose rows are 16-byte aligned: C arrives by TMA through
    the ring after each tile's k-tiles and the staged epilogue reads it from shared memory
    ('_ct' kernels), on every Hopper config: several tiles a block (the ring's positions
    wrap across tiles), partial tiles, K shorter than the ring; bfloat16/float32 Y. A C tile
    that needs more than two ring positions, or a saved Z, keeps the direct reads."""
    from ge2jit.ops.gemm.epilogue import Epilogue, Layout
    from ge2jit.ops.gemm.spec import WgmmaConfig, WgmmaGemmSpec
    from ge2jit.runtime.dtypes import SUPPORTED_DTYPES, DType

    if not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype, precision, _ = KINDS[kind]
    other = np.dtype(dtype if c_type == "input" else np.float32)
    m, n, k = shape
    a, b = rand(dtype, m, k), rand(dtype, k, n, layout="c")
    c = rand(other, m, n)
    for out_dtype in (None, np.float32):
        check(kind, a, b, rand(dtype, n), act="gelu", c=c, alpha=0.5, beta=-1.25,
              config=config, out_dtype=out_dtype)
    names = ge2jit.explain(a, b, rand(dtype, n), act="gelu", c=c, beta=-1.25, config=config,
                           precision=precision).kernel_names
    c_dt = SUPPORTED_DTYPES[other.name]
    unfit = WgmmaGemmSpec.c_tma_unfit(WgmmaConfig.parse(config), Epilogue(
        out_dtype=DType.F32, layout_c=Layout.ROW, c_dtype=c_dt))
    assert ("_ct_" in names[0]) == (unfit is None), (names, unfit)
    # Z saved with a C term: read directly
    check(kind, a, b, None, act="relu", c=c, beta=0.5, save_preact=True, config=config)
    assert "_ct_" not in ge2jit.explain(a, b, act="relu", c=c, beta=0.5, save_preact=True,
                                        config=config, precision=precision).kernel_names[0]


#: (gate activation, from Y, C's layout, C's type): each source of the derivative, layout and
#: type of C at least once with each config
GATES = [(Act.GELU, False, "r", "input"), (Act.SILU, False, "c", "f32"),
         (Act.SIGMOID, True, "r", "f32"), (Act.LEAKY_RELU, True, "c", "input")]


@pytest.mark.parametrize("shape", [(320, 264, 136), (300, 270, 130)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("gate, from_y, lc, c_type", GATES, ids=lambda x: getattr(x, "value", x))
@pytest.mark.parametrize("kind, config", [(k, c) for k in KINDS for c in _configs(k)] +
                         [(k, "wgmma_128x128_s6_k3") for k in ("bf16", "tf32")])
def test_gating_epilogue_every_candidate_config(kind, config, gate, from_y, lc, c_type, shape):
    """Y = alpha * A @ B * gate'(C) (the backward's dA of a layer whose input came from an
    activation), on every config, split-K's reduction included; the tile-staged Hopper
    epilogue reads C in 16-byte segments when its rows allow it, element by element when not
    (270 columns) or when C is column-major."""
    from ge2jit.ops.gemm.epilogue import Epilogue, Layout
    from ge2jit.ops.gemm.op import gated_gemm
    from ge2jit.ops.gemm.reference import activation, activation_grad
    from ge2jit.ops.gemm.spec import WgmmaConfig, WgmmaGemmSpec
    from ge2jit.runtime.dtypes import SUPPORTED_DTYPES, DType

    if config.startswith("wgmma_") and not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype, precision, tol = KINDS[kind]
    m, n, k = shape
    a, b = rand(dtype, m, k), rand(dtype, k, n, layout="c")
    c = rand(np.float32 if c_type == "f32" else dtype, m, n, layout=lc)
    if from_y:   # C is an activation's output: its values are in the activation's range
        c = cp.asarray(activation(gate.value, host64(c), 0.2).astype(c.dtype))
        if lc == "c":
            c = cp.asfortranarray(c)
    sums = None
    for rep in range(2):   # the second call takes the prepared path
        if rep == 0:
            y, call, sums = gated_gemm(a, b, c, gate, from_y, -0.75, 0.2, precision, config,
                                       bgrad=True)
        else:
            sums = cp.full(sums.shape, np.nan, np.float32) if sums is not None else None
            y = call(a, b, sums, c, -0.75, 1.0, 0.2, None, None)
        host = [host64(x) for x in (a, b)]
        if kind == "tf32":
            host = [tf32(a), tf32(b)]
        if from_y:
            slope = np.where(host64(c) > 0, 1.0, 0.2) if gate is Act.LEAKY_RELU else None
            d = slope if slope is not None else host64(c) * (1 - host64(c))
        else:
            d = activation_grad(gate.value, host64(c))
        want = -0.75 * (host[0] @ host[1]) * d
        err = rel_error(host64(y), want)
        assert err < tol, f"{kind} {config} {gate.value}: relative error {err:.3g}"
        names = "".join(kk.spec.kernel_name for kk in call.plan.kernels)
        if config.startswith("mma_"):
            family = "_mma_"
        elif kind == "tf32x3":   # split copies: any alignment
            family = "_wgmma_"
        else:   # unaligned rows fall back from the Hopper kernel
            family = expected_family(kind, a, b)
        assert call is not None and family in names, names
        if family == "_wgmma_":
            assert config.split("_k")[0] in names, names
            if "_k" not in config:   # a row-major C with aligned rows arrives by TMA
                unfit = WgmmaGemmSpec.c_tma_unfit(WgmmaConfig.parse(config), Epilogue(
                    out_dtype=DType.F32, layout_c=Layout.ROW,
                    c_dtype=SUPPORTED_DTYPES[c.dtype.name], gate=gate))
                assert ("_ct_" in names) == (lc == "r" and n % 8 == 0 and unfit is None), names
        # the column sums of each 16 rows of Y as stored, where the kernel makes them
        assert (sums is not None) == ("_bg" in names), names
        if sums is not None:
            assert sums.shape == (-(-m // 16), n)
            y16 = np.pad(host64(y), ((0, -m % 16), (0, 0))).reshape(-1, 16, n).sum(axis=1)
            assert rel_error(host64(sums), y16) < 1e-5
        a, b = rand(dtype, m, k), rand(dtype, k, n, layout="c")


@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_hopper_split_k(kind, split, la, lb):
    """Slices of K on the persistent grid, partial sums in a float32 workspace, the epilogue
    once in the reduction (uneven last slices, C and bias in either type, Z, float32 Y)."""
    if not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype = KINDS[kind][0]
    m, n, k = 200, 136, 1000
    a, b = rand(dtype, m, k, layout=la), rand(dtype, k, n, layout=lb)
    config = f"wgmma_128x128_s6_k{split}"
    check(kind, a, b, rand(dtype, m, 1), act="gelu", c=rand(dtype, m, n, layout="c"),
          beta=0.5, alpha=-1.25, save_preact=True, config=config)
    check(kind, a, b, rand(np.float32, n), act="silu", c=rand(np.float32, m, n), beta=1.0,
          out_dtype=np.float32, config=config)
    info = ge2jit.explain(a, b, config=config, precision=KINDS[kind][1])
    assert info.choice.split_k == split and info.reason == "pinned"
    assert "_splitk" in info.kernel_names[0] and "splitk_reduce" in info.kernel_names[1]


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_narrow_copies_for_partly_aligned_operands(kind):
    """Leading dimensions that allow 8- or 4-byte copies only take those cp.async widths."""
    dtype = KINDS[kind][0]
    m, n, k = 200, 150, 100
    a8 = rand(dtype, m, k)                         # ld 100: rows of 200 bytes, 8-byte aligned
    b4 = rand(dtype, k, n)                         # ld 150: rows of 300 bytes, 4-byte aligned
    info = ge2jit.explain(a8, b4)
    assert "_a8b4" in info.kernel_names[0], info.kernel_names
    check(kind, a8, b4, rand(dtype, n), act="relu")
    a_c = rand(dtype, k, m + 2).T[:, :]            # column-major, ld m + 2
    check(kind, a_c[:m], b4, None, act="tanh")


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_misaligned_16bit_operands_take_the_fallback(kind):
    from ge2jit.ops.gemm import plans

    dtype = KINDS[kind][0]
    m, n, k = 90, 70, 61
    a = rand(dtype, m, k)                          # ld 61: 2-byte aligned rows
    b = rand(dtype, k + 1, n)[1:]                  # base off by one element
    plans._warned.clear()
    with pytest.warns(RuntimeWarning, match="not 4-byte aligned"):
        info = ge2jit.explain(a, b)
    assert info.reason == "fallback" and "4-byte aligned" in info.choice.detail
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(kind, a, b, rand(dtype, n), act="sigmoid", save_preact=True)
        y_big = poisoned(m, n + 1, dtype)
        ge2jit.gemm_bias_act(a, b, act="relu", out=y_big[:, 1:])   # Y at an odd address
    ref, _ = gemm_bias_act_ref(host64(a), host64(b), act="relu")
    assert rel_error(host64(y_big[:, 1:]), ref) < KINDS[kind][2]
    assert np.isnan(host64(y_big[:, 0])).all()


@pytest.mark.parametrize("kind", KINDS)
def test_default_output_dtype_and_out_dtype(kind):
    dtype, precision, _ = KINDS[kind]
    a, b = rand(dtype, 64, 32), rand(dtype, 32, 48)
    y = ge2jit.gemm_bias_act(a, b, precision=precision)
    assert y.dtype == dtype and y.shape == (64, 48)
    y32, z32 = ge2jit.gemm_bias_act(a, b, precision=precision, out_dtype="float32",
                                    save_preact=True, act="relu")
    assert y32.dtype == np.float32 and z32.dtype == np.float32


@pytest.mark.parametrize("la, lb", LAYOUTS, ids=lambda x: x)
def test_tf32_truncates_inputs_and_ieee_does_not(la, lb):
    a, b = rand(np.float32, 256, 512, layout=la), rand(np.float32, 512, 264, layout=lb)
    ieee = host64(ge2jit.gemm_bias_act(a, b))
    fast = host64(ge2jit.gemm_bias_act(a, b, precision="tf32"))
    x3 = host64(ge2jit.gemm_bias_act(a, b, precision="tf32x3"))
    ref, _ = gemm_bias_act_ref(host64(a), host64(b))
    ref_tf32, _ = gemm_bias_act_ref(tf32(a), tf32(b))
    assert rel_error(ieee, ref) < 1e-6
    assert 1e-5 < rel_error(fast, ref) < 1e-3, "tf32 cuts its inputs' mantissas"
    assert rel_error(fast, ref_tf32) < 1e-5, "products of truncated inputs, summed in float32"
    assert rel_error(x3, ref) < 2e-6, "3xTF32: about float32's accuracy"
    assert rel_error(x3, ref) < rel_error(fast, ref) / 50
    assert "mma_" in ge2jit.explain(a, b, precision="tf32").kernel_names[0]
    assert "mma_" in ge2jit.explain(a, b, precision="tf32x3").kernel_names[0]
    assert "mma_" not in ge2jit.explain(a, b).kernel_names[0]


@pytest.mark.parametrize("k", [1000, 8192])
def test_tf32x3_error_is_of_float32_size_over_long_k(k):
    """Against float64, 3xTF32 stays within a small factor of the exact float32 kernel's own
    rounding error, while plain tf32 is hundreds of times off."""
    m, n = 192, 200
    a, b = rand(np.float32, m, k), rand(np.float32, k, n, layout="c")
    ref, _ = gemm_bias_act_ref(host64(a), host64(b))
    err = {p: rel_error(host64(ge2jit.gemm_bias_act(a, b, precision=p)), ref)
           for p in ("ieee", "tf32", "tf32x3")}
    assert err["tf32x3"] < max(4 * err["ieee"], 1e-6), err
    assert err["tf32x3"] < err["tf32"] / 50, err


def test_tf32x3_special_values_behave_as_in_float32():
    """inf and NaN go through as in float32 arithmetic (inf * 0 = NaN, inf - inf = NaN, inf * x
    = inf), and values near float32's maximum are split without overflowing."""
    m, n, k = 64, 80, 96
    big = np.finfo(np.float32).max
    ha = _rng.standard_normal((m, k)).astype(np.float32)
    hb = _rng.standard_normal((k, n)).astype(np.float32)
    ha[3, 7], ha[5, 9], ha[6, 9], ha[8, 11] = np.inf, -np.inf, np.nan, big
    ha[8, :11] = ha[8, 12:] = 0.0                   # row 8 is big * B[11]: finite
    hb[11, :] = 0.25
    hb[9, 4] = 0.0                                  # -inf * 0 = NaN at (5, 4); row 6 NaN
    hb[20, 30] = np.inf                             # column 30: +-inf, or NaN in row 8
    hb[7, 31] = 1.0                                 # exactly tf32: hi = 1, lo = 0
    a, b = cp.asarray(ha), cp.asarray(hb)
    ref = ha.astype(np.float64) @ hb.astype(np.float64)
    for la in "rc":
        a_l = a if la == "r" else cp.asarray(np.asfortranarray(ha))
        y = host64(ge2jit.gemm_bias_act(a_l, b, precision="tf32x3"))
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
        np.testing.assert_array_equal(np.isposinf(y), np.isposinf(ref))
        np.testing.assert_array_equal(np.isneginf(y), np.isneginf(ref))
        fin = np.isfinite(ref)
        cols = np.arange(n) != 30
        assert np.isposinf(y[3, 31]) and np.isnan(y[5, 4]) and np.isnan(y[6]).all()
        assert np.isfinite(y[8, cols]).all()
        np.testing.assert_allclose(y[8, cols], ref[8, cols], rtol=1e-6)
        assert rel_error(y[fin], ref[fin]) < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_large_problem_default_choice(kind):
    dtype = KINDS[kind][0]
    m, n, k = 2048, 1536, 1024
    a, b = rand(dtype, m, k), rand(dtype, k, n, layout="c")
    assert ge2jit.explain(a, b, precision=KINDS[kind][1]).reason == "heuristic"
    check(kind, a, b, rand(dtype, n), act="gelu_tanh")


@pytest.mark.parametrize("config", ["wgmma_128x256_s4", "wgmma_128x128_s6_pp"])
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_outputs_into_views_leave_their_surroundings(kind, config):
    """Y and Z written into column windows of wider arrays (16-byte aligned rows: the TMA
    stores of the Hopper kernel): the window is exact, the elements around it keep their
    poison, edge tiles included."""
    if config.startswith("wgmma_") and not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype, _, tol = KINDS[kind]
    m, n, k = 300, 200, 96
    a, b, bias = rand(dtype, m, k), rand(dtype, k, n), rand(dtype, n)
    y_big, z_big = poisoned(m + 5, n + 24, dtype), poisoned(m + 5, n + 24, dtype)
    y, z = y_big[2:m + 2, 8:n + 8], z_big[2:m + 2, 8:n + 8]
    assert "_yt_" in ge2jit.explain(a, b, bias, act="gelu", config=config, out=y,
                                    save_preact=True, preact_out=z).kernel_names[0]
    ge2jit.gemm_bias_act(a, b, bias, act="gelu", config=config, out=y, save_preact=True,
                         preact_out=z)
    ref_y, ref_z = gemm_bias_act_ref(host64(a), host64(b), host64(bias), act="gelu")
    assert rel_error(host64(y), ref_y) < tol and rel_error(host64(z), ref_z) < tol
    for big in (y_big, z_big):
        rest = host64(big)
        rest[2:m + 2, 8:n + 8] = np.nan
        assert np.isnan(rest).all(), "nothing written outside the output window"


#: Elementwise bounds on |Y - ref| for 16-bit outputs: rtol |ref| + atol (1 + |z|). rtol: the
#: output's rounding plus tanh.approx's relative error (2^-11); atol: where an activation
#: subtracts from 1 (GELU's 1 + tanh for z < 0), tanh.approx's absolute error, times |z| / 2.
ELEMENTWISE = {"bf16": (2.0**-8 + 2.0**-10, 2.0**-11), "f16": (2.0**-10 + 2.0**-11, 2.0**-11)}


@pytest.mark.parametrize("act", [a for a in ACTS if a != "none"])
@pytest.mark.parametrize("config", [None, "wgmma_128x256_s4", MMA_16BIT_CONFIGS[0].name])
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_activations_elementwise_16bit(kind, config, act):
    """Every output element, not only the norm: the fast activations of 16-bit outputs
    (tanh.approx; ex2/rcp sigmoid) over pre-activations from -40 to 40, tails included."""
    if config is not None and config.startswith("wgmma_") and not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype = KINDS[kind][0]
    m, n, k = 200, 264, 32
    a = cp.asarray((_rng.standard_normal((m, k)) * 2.5).astype(np.float32).astype(dtype))
    b = rand(dtype, k, n)
    bias = rand(dtype, n)
    y = poisoned(m, n, dtype)
    ge2jit.gemm_bias_act(a, b, bias, act=act, out=y, config=config)
    ref, z = gemm_bias_act_ref(host64(a), host64(b), host64(bias), act=act)
    assert np.abs(z).max() > 30, "the pre-activations reach the tails"
    rtol, atol = ELEMENTWISE[kind]
    err = np.abs(host64(y) - ref)
    bound = rtol * np.abs(ref) + atol * (1.0 + np.abs(z))
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), (f"{act}: z = {z[worst]:.6g}, got {host64(y)[worst]:.6g}, "
                                  f"want {ref[worst]:.6g}")


@pytest.mark.parametrize("bias_kind", ["col", "row"])
@pytest.mark.parametrize("config", [c.name for c in WGMMA_CONFIGS])
def test_hopper_bias_tiles_every_config(config, bias_kind):
    """Each Hopper config stages a tile's bias in shared memory: rows or columns, edge tiles
    (M, N not multiples of the tile), several tiles per block, 16-bit and float32 outputs."""
    if not hopper():
        pytest.skip("wgmma configs need sm_90")
    dtype = KINDS["bf16"][0]
    m, n, k = 1000, 1288, 136         # several waves of tiles on a persistent grid
    a, b = rand(dtype, m, k), rand(dtype, k, n, layout="c")
    bias = make_bias(dtype, bias_kind, m, n)
    check("bf16", a, b, bias, act="silu", save_preact=True, config=config)
    check("bf16", a, b, bias, act="relu", out_dtype=np.float32, config=config)


@pytest.mark.parametrize("kind", KINDS)
def test_nan_propagates(kind):
    dtype, precision, _ = KINDS[kind]
    host = _rng.standard_normal((40, 64)).astype(np.float32)
    host[3, 7] = np.nan
    a = cp.asarray(host.astype(dtype))
    y = host64(ge2jit.gemm_bias_act(a, rand(dtype, 64, 50), rand(dtype, 50), act="silu",
                                    precision=precision))
    assert np.isnan(y[3]).all() and np.isfinite(np.delete(y, 3, axis=0)).all()


def test_bad_mixes_are_refused_with_real_arrays():
    h, f = rand(np.float16, 8, 4), rand(np.float32, 4, 6)
    with pytest.raises(ge2jit.ArgumentValueError, match="b: expected dtype float16"):
        ge2jit.gemm_bias_act(h, f)
    with pytest.raises(ge2jit.ArgumentValueError, match="precision: 'tf32' applies to float32"):
        ge2jit.gemm_bias_act(h, rand(np.float16, 4, 6), precision="tf32")
    with pytest.raises(ge2jit.ArgumentValueError, match="config: mma_.* float32 inputs need"):
        ge2jit.gemm_bias_act(rand(np.float32, 8, 4), f, config=MMA_TF32_CONFIGS[0].name)
    with pytest.raises(ge2jit.ArgumentValueError, match="float32 CUDA-core config"):
        ge2jit.gemm_bias_act(h, rand(np.float16, 4, 6), config="128x128x8_w32x64_s3")


def test_pytorch_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    a = torch.randn(96, 80, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(48, 80, device="cuda", dtype=torch.bfloat16)     # a Linear's (out, in)
    bias = torch.randn(48, device="cuda", dtype=torch.bfloat16)
    a_c, w_c, bias_c = (cp.from_dlpack(x) for x in (a, w, bias))
    y = ge2jit.gemm_bias_act(a_c, w_c.T, bias_c, act="gelu_tanh")
    want = torch.nn.functional.gelu(torch.nn.functional.linear(a.double(), w.double(),
                                                               bias.double()),
                                    approximate="tanh")
    got = torch.from_dlpack(y).double()
    assert ((got - want).norm() / want.norm()).item() < 1e-2
