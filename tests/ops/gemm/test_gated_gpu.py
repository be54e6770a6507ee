"""gemm_gated and gemm_gated_backward on the GPU against the float64 NumPy reference (whose
gradients tests/ops/gemm/test_reference.py checks against finite differences).

Inputs are fresh random numbers (never zeros); outputs are poisoned with NaN before each run.
Tolerances (||got - ref|| / ||ref||): 1e-5 for float32, 5e-3 for float16, 1e-2 for
bfloat16 (Y and Z rounded once to their type), 2e-3 for tf32.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.gemm.reference import gemm_gated_backward_ref, gemm_gated_ref, rel_error
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    MMA_TF32_CONFIGS,
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_X3_CONFIGS,
)

from .test_backward_gpu import host64, rand  # noqa: E402 - the shared input makers

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
KINDS = {"f32": (np.dtype(np.float32), "ieee", 1e-5), "tf32": (np.dtype(np.float32), "tf32", 2e-3),
         "tf32x3": (np.dtype(np.float32), "tf32x3", 1e-5),
         "f16": (np.dtype(np.float16), None, 5e-3), "bf16": (BF16, None, 1e-2)}
ACTS = ["silu", "gelu", "gelu_tanh", "relu", "sigmoid", "none", "leaky_relu", "tanh"]


def hopper() -> bool:
    return cp.cuda.Device().compute_capability == "90"


def poisoned(shape, dtype):
    return cp.full(shape, np.nan, dtype=np.float32).astype(dtype)


def run_forward(a, b, bias, act, *, save=True, out_dtype=None, **kw):
    m, n2 = a.shape[0], b.shape[1]
    ydt = np.dtype(out_dtype) if out_dtype is not None else a.dtype
    y = poisoned((m, n2 // 2), ydt)
    z = poisoned((m, n2), ydt) if save else None
    res = ge2jit.gemm_gated(a, b, bias, act=act, save_preact=save, out=y, preact_out=z,
                            out_dtype=out_dtype, **kw)
    if save:
        assert res[0] is y and res[1] is z
    else:
        assert res is y
    return y, z


def check_forward(a, b, bias, act, tol, alpha=1.0, save=True, out_dtype=None, **kw):
    y, z = run_forward(a, b, bias, act, save=save, out_dtype=out_dtype, alpha=alpha, **kw)
    y_ref, z_ref = gemm_gated_ref(host64(a), host64(b), host64(bias), act=act, alpha=alpha)
    floor = np.sqrt(y_ref.size) * 1e-3
    err = rel_error(host64(y), y_ref, floor)
    assert err < tol, (act, err)
    if save:
        err_z = rel_error(host64(z), z_ref, floor)
        assert err_z < tol, (act, err_z)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("act", ACTS)
def test_forward_every_dtype_and_act(kind, act):
    dtype, precision, tol = KINDS[kind]
    m, n, k = 129, 200, 96
    a, b = rand(dtype, m, k), rand(dtype, k, 2 * n, scale=0.3)
    bias = rand(dtype, 2 * n)
    check_forward(a, b, bias, act, tol, precision=precision)
    check_forward(a, b, None, act, tol, precision=precision, save=False, alpha=0.5)


@pytest.mark.parametrize("kind", ["bf16", "f16", "tf32", "f32"])
@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
def test_forward_layouts(kind, layouts):
    dtype, precision, tol = KINDS[kind]
    m, n, k = 77, 96, 130
    a = rand(dtype, m, k, layout=layouts[0])
    b = rand(dtype, k, 2 * n, layout=layouts[1], scale=0.3)
    check_forward(a, b, rand(np.float32, 2 * n), "silu", tol, precision=precision)


@pytest.mark.parametrize("kind", ["bf16", "f32"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (3, 31, 17), (1, 33, 64), (31, 1000, 33),
                                     (3, 4097, 40), (257, 130, 1), (64, 64, 4100)])
def test_forward_odd_sizes(kind, m, n, k):
    dtype, precision, tol = KINDS[kind]
    a, b = rand(dtype, m, k), rand(dtype, k, 2 * n, scale=0.3)
    check_forward(a, b, rand(dtype, 2 * n), "gelu", tol, precision=precision)


def test_forward_k0_is_the_bias_unit():
    a = cp.empty((5, 0), np.float32)
    b = cp.empty((0, 8), np.float32)
    bias = rand(np.float32, 8)
    y = ge2jit.gemm_gated(a, b, bias, act="silu")
    ref, _ = gemm_gated_ref(np.zeros((5, 0)), np.zeros((0, 8)), host64(bias), act="silu")
    np.testing.assert_allclose(host64(y), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["bf16", "f16", "f32"])
def test_forward_float32_output(kind):
    dtype, precision, tol = KINDS[kind]
    a, b = rand(dtype, 100, 64), rand(dtype, 64, 2 * 72, scale=0.3)
    check_forward(a, b, rand(dtype, 144), "silu", min(tol, 1e-3) if kind != "f32" else tol,
                  out_dtype="float32", precision=precision)


def _configs():
    out = [("bf16", c.name) for c in MMA_16BIT_CONFIGS]
    out += [("tf32", c.name) for c in MMA_TF32_CONFIGS]
    out += [("f32", c.name) for c in PIPELINED_F32_CONFIGS]
    out += [("f32", c.name + "_k3") for c in PIPELINED_F32_CONFIGS[:2]]
    out += [("bf16", c.name) for c in TILED_CONFIGS] + [("f32", TILED_CONFIGS[0].name)]
    out += [("bf16", "wgmma_" + c.name if not c.name.startswith("wgmma") else c.name)
            for c in WGMMA_CONFIGS]
    out += [("bf16", WGMMA_CONFIGS[0].name + "_k2"), ("tf32", WGMMA_CONFIGS[1].name)]
    out += [("tf32x3", c.name) for c in WGMMA_X3_CONFIGS]
    return out


@pytest.mark.parametrize("kind, config", _configs())
@pytest.mark.parametrize("save", [False, True])
def test_every_config(kind, config, save):
    if "wgmma" in config and not hopper():
        pytest.skip("Hopper kernels")
    dtype, precision, tol = KINDS[kind]
    m, n, k = 300, 328, 200   # partial tiles in M and N (2N = 656)
    a, b = rand(dtype, m, k), rand(dtype, k, 2 * n, scale=0.3)
    for out_dtype in (None, "float32"):
        check_forward(a, b, rand(dtype, 2 * n), "silu", tol, save=save, out_dtype=out_dtype,
                      precision=precision, config=config)


def test_misaligned_operands_take_the_fallback_and_stay_right():
    base = rand(BF16, 64 * 200 + 1)
    a = base[1:].reshape(64, 200)[:, :199]       # odd pointer and leading dimension
    b = rand(BF16, 199, 2 * 40, scale=0.3)
    with warnings.catch_warnings():   # (said once a process: maybe said already)
        warnings.simplefilter("ignore", RuntimeWarning)
        check_forward(a, b, None, "silu", 1e-2)


def test_special_values_propagate_as_the_reference():
    a = rand(np.float32, 8, 16)
    b = rand(np.float32, 16, 2 * 24, scale=0.3)
    a[2, 3] = np.inf
    a[5, :] = np.nan
    y, z = run_forward(a, b, None, "silu")
    y_ref, z_ref = gemm_gated_ref(host64(a), host64(b), act="silu")
    got = host64(y)
    assert np.array_equal(np.isnan(got), np.isnan(y_ref))
    finite = np.isfinite(y_ref)
    np.testing.assert_allclose(got[finite], y_ref[finite], rtol=1e-5, atol=1e-5)


def test_pytorch_style_weights():
    """A (2N, K) weight (a Linear's) read as w.T: column-major B, no copy."""
    k, n = 64, 48
    w_gate, w_up = rand(BF16, n, k, scale=0.3), rand(BF16, n, k, scale=0.3)
    w = ge2jit.interleave_gate_up(w_gate.T, w_up.T).T.copy()   # (2N, K), rows alternate
    x = rand(BF16, 10, k)
    y = ge2jit.gemm_gated(x, w.T, act="silu")
    ref = gemm_gated_ref(host64(x), host64(w).T, act="silu")[0]
    assert rel_error(host64(y), ref) < 1e-2
    g, u = ge2jit.split_gate_up(w.T)
    assert cp.array_equal(g, w_gate.T) and cp.array_equal(u, w_up.T)


def test_repeated_calls_take_the_prepared_path_and_stay_right():
    a, b = rand(BF16, 50, 64), rand(BF16, 64, 2 * 40, scale=0.3)
    bias = rand(BF16, 80)
    for _ in range(3):
        a = rand(BF16, 50, 64)
        check_forward(a, b, bias, "gelu_tanh", 1e-2)


# the backward


def run_backward(kind, m, n, k, act, bias_on, with_z, layouts="rr", needs=("a", "b", "bias")):
    dtype, precision, tol = KINDS[kind]
    a = rand(dtype, m, k, layout=layouts[0])
    b = rand(dtype, k, 2 * n, layout=layouts[1], scale=0.3)
    bias = rand(dtype, 2 * n) if bias_on else None
    gy = rand(dtype, m, n)
    z = None
    if with_z:
        _, z = ge2jit.gemm_gated(a, b, bias, act=act, save_preact=True, precision=precision)
    g = ge2jit.gemm_gated_backward(gy, a, b, bias, act=act, z=z, needs=needs,
                                   precision=precision)
    ref = gemm_gated_backward_ref(host64(gy), host64(a), host64(b), host64(bias), act=act)
    return g, ref, tol, (a, b, bias, gy)


def term_scales(gy, a, b, bias, act):
    """dA, dB and dBias summed over the absolute values of their terms (dZ from the float64
    Z): their rounding errors (dZ is rounded to the inputs' type before the GEMMs) are
    relative to these, not to sums that may cancel (a 1 x 1 x 1 problem's dA is two terms)."""
    from ge2jit.ops.gemm.reference import activation, activation_grad

    z = host64(a) @ host64(b) + (0.0 if bias is None else host64(bias))
    gy64, gate, up = host64(gy), z[:, 0::2], z[:, 1::2]
    dz = np.empty_like(z)
    dz[:, 0::2] = np.abs(gy64 * up * activation_grad(act, gate))
    dz[:, 1::2] = np.abs(gy64 * activation(act, gate))
    return dz @ np.abs(host64(b)).T, np.abs(host64(a)).T @ dz, dz.sum(axis=0)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu", "sigmoid", "none"])
@pytest.mark.parametrize("with_z", [True, False])
def test_backward(kind, act, with_z):
    g, ref, tol, (a, b, bias, _) = run_backward(kind, 97, 72, 80, act, True, with_z)
    tol = max(tol, 2e-2) if kind in ("bf16", "f16") else max(tol, 3e-3) if kind == "tf32" \
        else 1e-4
    if act == "relu" and kind not in ("f32", "tf32x3"):
        # a gate within rounding of 0 takes the other side of the kink: d(gate) jumps by
        # gY * up there (a few elements of thousands)
        tol = 5e-2
    for got, want, name in zip(g[:3], ref, ("a", "b", "bias")):
        assert got.shape == want.shape, name
        err = rel_error(host64(got), want, np.sqrt(want.size) * 1e-3)
        assert err < tol, (name, err)
    assert g.c is None


@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (3, 31, 33), (33, 1000, 17), (5, 4097, 8)])
def test_backward_layouts_and_odd_sizes(layouts, m, n, k):
    g, ref, _, (a, b, bias, gy) = run_backward("bf16", m, n, k, "silu", True, True, layouts)
    for got, want, scale in zip(g[:3], ref, term_scales(gy, a, b, bias, "silu")):
        assert rel_error(host64(got), want, np.linalg.norm(scale)) < 2e-2
    # dB in B's layout
    assert (g.b.strides[0] < g.b.strides[1]) == (layouts[1] == "c") or g.b.shape[0] == 1


def test_backward_needs_subset_and_no_bias():
    g, ref, _, _ = run_backward("f32", 40, 24, 16, "silu", False, True, needs=("b",))
    assert g.a is None and g.bias is None
    assert rel_error(host64(g.b), ref[1]) < 1e-4


def test_backward_refuses_what_it_cannot_do():
    a, b = rand(np.float32, 8, 4), rand(np.float32, 4, 6)
    gy = rand(np.float32, 8, 3)
    with pytest.raises(ge2jit.Ge2jitError, match="gy: expected"):
        ge2jit.gemm_gated_backward(rand(np.float32, 8, 6), a, b)
    with pytest.raises(ge2jit.Ge2jitError, match="needs"):
        ge2jit.gemm_gated_backward(gy, a, b, needs=("a", "c"))
    with pytest.raises(ge2jit.Ge2jitError, match="b: expected"):
        ge2jit.gemm_gated(a, rand(np.float32, 4, 5))
    with pytest.raises(ge2jit.Ge2jitError, match="bias: expected None or shape"):
        ge2jit.gemm_gated(a, b, rand(np.float32, 8, 1))


def test_backward_deterministic():
    a, b = rand(BF16, 300, 64), rand(BF16, 64, 2 * 96, scale=0.3)
    bias, gy = rand(BF16, 192), rand(BF16, 300, 96)
    _, z = ge2jit.gemm_gated(a, b, bias, save_preact=True)
    runs = [ge2jit.gemm_gated_backward(gy, a, b, bias, z=z) for _ in range(3)]
    for r in runs[1:]:
        for x, y in zip(r[:3], runs[0][:3]):
            assert cp.array_equal(x.view(np.uint16), y.view(np.uint16))


@pytest.mark.parametrize("m, n, k", list(itertools.product([4096], [1376], [512])))
def test_large_bf16_against_plain_gemm(m, n, k):
    """The gated kernel at the heuristic's tile, against the plain GEMM's Z."""
    a, b = rand(BF16, m, k), rand(BF16, k, 2 * n, scale=0.1)
    y, z = run_forward(a, b, None, "silu")
    z_plain = ge2jit.gemm_bias_act(a, b)
    assert cp.array_equal(z.view(np.uint16), z_plain.view(np.uint16))
    zz = host64(z)
    y_from_z = zz[:, 0::2] / (1 + np.exp(-zz[:, 0::2])) * zz[:, 1::2]
    assert rel_error(host64(y), y_from_z) < 1e-2


@pytest.mark.parametrize("kind", ["bf16", "f32", "tf32"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "relu"])
def test_a_glu_makes_the_units_dz_in_the_next_layers_da(kind, act):
    """The layer after a gated unit: its dA GEMM writes the unit's dZ (a_glu) and the unit's
    bias gradient comes as its column sums."""
    dtype, precision, tol = KINDS[kind]
    m, n, k, d = 130, 72, 64, 48
    x, w = rand(dtype, m, k), rand(dtype, k, 2 * n, scale=0.3)
    b, wd = rand(dtype, 2 * n), rand(dtype, n, d, layout="c", scale=0.3)
    h, z = ge2jit.gemm_gated(x, w, b, act=act, save_preact=True, precision=precision)
    gy = rand(dtype, m, d)
    g = ge2jit.gemm_bias_act_backward(gy, h, wd, needs=("a", "b"), precision=precision,
                                      a_glu=act, a_z=z, a_bias=b)
    dh = host64(gy) @ host64(wd).T
    zz = host64(z)
    from ge2jit.ops.gemm.reference import activation, activation_grad

    dz = np.empty_like(zz)
    dz[:, 0::2] = dh * zz[:, 1::2] * activation_grad(act, zz[:, 0::2])
    dz[:, 1::2] = dh * activation(act, zz[:, 0::2])
    tol = 5e-2 if act == "relu" and kind != "f32" else max(tol, 2e-2 if kind == "bf16" else 3e-3)
    assert g.a.shape == (m, 2 * n)
    assert rel_error(host64(g.a), dz) < tol
    assert rel_error(host64(g.a_bias), dz.sum(axis=0)) < tol
    assert rel_error(host64(g.b), host64(h).T @ host64(gy)) < max(tol, 1e-4)


@pytest.mark.parametrize("cfg", WGMMA_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("kind", ["bf16", "f16"])
@pytest.mark.parametrize("act, n", [("silu", 200), ("gelu", 200), ("gelu_tanh", 74),
                                    ("sigmoid", 36)])
def test_a_glu_on_every_hopper_tile(cfg, kind, act, n):
    """The next layer's dA GEMM writing a gated unit's dZ, pinned to each Hopper tile: dZ
    formed in the staging blocks from Z copied there (Z and dZ rows 16-byte aligned: N a
    multiple of 4) or from the registers (N = 74); rows and columns past the tiles' edges,
    dZ's memory poisoned first."""
    from ge2jit.ops.gemm import op
    from ge2jit.ops.gemm.epilogue import Act
    from ge2jit.ops.gemm.reference import activation, activation_grad

    if not hopper():
        pytest.skip("the Hopper tiles")
    dtype, _, _ = KINDS[kind]
    m, k = 300, 96
    gy, wd, z = rand(dtype, m, k), rand(dtype, k, n, scale=0.3), rand(dtype, m, 2 * n)
    poison = poisoned((m, 2 * n), dtype)   # the pool gives its memory to dZ
    del poison
    dz, _ = op.glu_grad_gemm(gy, wd, z, Act(act), 1.0, 0.01, None, config=cfg.name)
    dh, zz = host64(gy) @ host64(wd), host64(z)
    ref = np.empty_like(zz)
    ref[:, 0::2] = dh * zz[:, 1::2] * activation_grad(act, zz[:, 0::2])
    ref[:, 1::2] = dh * activation(act, zz[:, 0::2])
    assert dz.shape == (m, 2 * n)
    assert rel_error(host64(dz), ref) < 1e-2
    assert np.abs(host64(dz) - ref).max() < 3e-2 * np.abs(ref).max()   # every element



@pytest.mark.parametrize("act, cfg", [("silu", "wgmma_128x128_s6_pp"),
                                      ("gelu_tanh", "wgmma_128x128_s6_pp"),
                                      ("silu", "wgmma_64x256_s4_pp"),
                                      ("gelu", "wgmma_64x256_s4_pp")])
def test_a_glu_ping_pong_tiles_take_turns(act, cfg):
    """dZ on the ping-pong tiles that the heuristic gives a gated unit's backward, on 3 SMs:
    each block walks many tiles, its two consumers taking turns (one's epilogue under the
    other's main loop), the last tiles cut by M and N; then the default at a size where the
    heuristic takes a ping-pong tile on the whole GPU. dZ's memory poisoned first."""
    from ge2jit.ops.gemm import op
    from ge2jit.ops.gemm.epilogue import Act, Epilogue, Layout
    from ge2jit.ops.gemm.reference import activation, activation_grad
    from ge2jit.ops.gemm.select import glu_kind, heuristic
    from ge2jit.ops.gemm.spec import DType as GemmDType

    if not hopper():
        pytest.skip("the Hopper tiles")

    def check(m, n, k, config):
        gy, wd, z = rand(BF16, m, k), rand(BF16, k, n, scale=0.2), rand(BF16, m, 2 * n)
        poison = poisoned((m, 2 * n), BF16)
        del poison
        dz, _ = op.glu_grad_gemm(gy, wd, z, Act(act), 1.0, 0.01, None, config=config)
        dh, zz = host64(gy) @ host64(wd), host64(z)
        ref = np.empty_like(zz)
        ref[:, 0::2] = dh * zz[:, 1::2] * activation_grad(act, zz[:, 0::2])
        ref[:, 1::2] = dh * activation(act, zz[:, 0::2])
        assert rel_error(host64(dz), ref) < 1e-2
        assert np.abs(host64(dz) - ref).max() < 3e-2 * np.abs(ref).max()

    ge2jit.set_num_sms(3)
    try:
        check(1000, 600, 136, cfg)   # 8 x 5 (or 16 x 3) tiles of dH on 3 blocks
    finally:
        ge2jit.set_num_sms(None)
    ep = Epilogue(out_dtype=GemmDType.BF16, layout_c=Layout.ROW, c_dtype=GemmDType.BF16,
                  glu_grad=Act(act))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    m, n, k = 2176, 1160, 264   # 17 x 10 tiles of 128 x 128, 34 x 5 of 64 x 256
    choice = heuristic(m, n, k, sms, 90, "rr", GemmDType.BF16, glu=glu_kind(ep))
    if choice.config.name == cfg:
        check(m, n, k, None)
