"""gemm_bias_act_backward on the GPU against a float64 NumPy reference, and the reference's
gradients against central finite differences of the float64 forward.

Inputs are fresh random numbers (never zeros); outputs of the forward are poisoned with NaN
before it runs. Tolerances (||got - ref|| / ||ref||): 1e-5 for float32, 5e-3 for float16 and
1e-2 for bfloat16 (dZ is stored in the inputs' type for the two GEMMs, as autograd does).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.gemm.reference import (
    activation,
    activation_grad,
    gemm_bias_act_backward_ref,
    rel_error,
)
from ge2jit.ops.gemm.spec import ACTS_FROM_Y, Act
from ge2jit.runtime.arrays import CUPY

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.gpu

KINDS = {"f32": (np.dtype(np.float32), 1e-5), "bf16": (np.dtype(ml_dtypes.bfloat16), 1e-2),
         "f16": (np.dtype(np.float16), 5e-3)}
ACTS = [a.value for a in Act]
BIAS_KINDS = ["none", "scalar", "col", "col2d", "row"]
_rng = np.random.default_rng(7)


def rand(dtype, *shape, layout="r", scale=1.0):
    host = (_rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)
    if layout == "c" and len(shape) == 2:
        return cp.asarray(np.ascontiguousarray(host.T)).T
    return cp.asarray(host)


def host64(x):
    return None if x is None else cp.asnumpy(x).astype(np.float64)


def make_bias(dtype, kind, m, n):
    return {"none": None, "scalar": rand(dtype, 1), "col": rand(dtype, n),
            "col2d": rand(dtype, 1, n), "row": rand(dtype, m, 1)}[kind]


def forward(a, b, bias, act, c=None, beta=0.0, alpha=1.0, slope=0.01):
    m, n = a.shape[0], b.shape[1]
    y = cp.full((m, n), np.nan, dtype=np.float32).astype(a.dtype)
    z = cp.full((m, n), np.nan, dtype=np.float32).astype(a.dtype)
    ge2jit.gemm_bias_act(a, b, bias, act=act, c=c, alpha=alpha, beta=beta, leaky_slope=slope,
                         save_preact=True, out=y, preact_out=z)
    return y, z


def check(kind, a, b, bias, act, source="z", c=None, alpha=1.0, beta=0.0, slope=0.01,
          needs=("a", "b", "bias", "c")):
    dtype, tol = KINDS[kind]
    m, n = a.shape[0], b.shape[1]
    y, z = forward(a, b, bias, act, c, beta, alpha, slope)
    gy = rand(dtype, m, n)
    src = {"z": {"z": z}, "y": {"y": y}, "recompute": {}}[source]
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act, c=c, alpha=alpha, beta=beta,
                                        leaky_slope=slope, needs=needs, **src)
    want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias), act=act,
                                      c=host64(c), alpha=alpha, beta=beta, leaky_slope=slope)
    # dBias sums many terms of both signs: its error scales with the terms' magnitudes, not
    # with the (cancelling) sum, so the denominator has the floor of the summed |dZ|
    abs_bias = None if bias is None else gemm_bias_act_backward_ref(
        np.abs(host64(gy)), host64(a), host64(b), host64(bias), act=act, c=host64(c),
        alpha=alpha, beta=beta, leaky_slope=slope, abs_dz=True)[2]
    for name, g, w, x in zip(("a", "b", "bias", "c"), got, want, (a, b, bias, c)):
        if name not in needs or x is None:
            assert g is None, name
            continue
        assert g.shape == x.shape and g.dtype == x.dtype, (name, g.shape, g.dtype)
        g = host64(g)
        assert np.isfinite(g).all(), name
        floor = 1e-30
        if name == "bias":
            floor = float(np.linalg.norm(abs_bias)) / np.sqrt(max(w.size and m * n // w.size, 1))
        err = rel_error(g, w, floor)
        assert err < tol, f"d{name} ({kind}, {act}, {source}): relative error {err:.3g}"
    return got


@pytest.mark.parametrize("bias_kind", BIAS_KINDS)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_act_and_bias_kind(kind, act, bias_kind):
    dtype = KINDS[kind][0]
    m, n, k = 150, 136, 72
    a, b = rand(dtype, m, k), rand(dtype, k, n)
    check(kind, a, b, make_bias(dtype, bias_kind, m, n), act)


@pytest.mark.parametrize("la, lb", list(itertools.product("rc", repeat=2)), ids=lambda x: x)
@pytest.mark.parametrize("kind", KINDS)
def test_every_layout_and_sizes_not_multiples_of_tiles(kind, la, lb):
    dtype = KINDS[kind][0]
    m, n, k = 203, 131, 97 if kind == "f32" else 96
    a, b = rand(dtype, m, k, layout=la), rand(dtype, k, n, layout=lb)
    check(kind, a, b, rand(dtype, n), "gelu_tanh")
    # dB in B's layout (a column-major B: a transposed view, as a Linear's weight)
    grads = ge2jit.gemm_bias_act_backward(rand(dtype, m, n), a, b, act="relu", y=rand(dtype, m, n),
                                          needs=("b",))
    assert grads.b.shape == (k, n)
    assert grads.b.flags.c_contiguous == (lb == "r") and grads.b.flags.f_contiguous == (lb == "c")


@pytest.mark.parametrize("lb", ["r", "c"])
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_float32_db_comes_from_the_gemm(kind, lb):
    """``db_dtype="float32"`` (master weights' gradients): dB written by its GEMM in float32,
    in B's layout, not rounded to 16 bits; dA, dBias as without it. The gated GEMM's too."""
    dtype, tol = KINDS[kind]
    m, n, k = 203, 136, 72
    a, b, bias = rand(dtype, m, k), rand(dtype, k, n, layout=lb), rand(dtype, n)
    y, z = forward(a, b, bias, "silu")
    gy = rand(dtype, m, n)
    for needs in (("a", "b", "bias"), ("b",)):
        got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="silu", z=z, needs=needs,
                                            db_dtype="float32")
        same = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="silu", z=z, needs=needs)
        assert got.b.dtype == np.float32 and got.b.shape == (k, n)
        assert got.b.flags.f_contiguous == (lb == "c")
        want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias),
                                          act="silu")[1]
        assert rel_error(host64(got.b), want) < tol
        # float32, as accumulated: most values are not 16-bit numbers; rounded, they are
        # the default call's dB (to within its rounding)
        db = cp.asnumpy(got.b)
        assert (db.astype(dtype).astype(np.float32) != db).mean() > 0.5
        assert rel_error(db.astype(dtype).astype(np.float64), host64(same.b)) < tol / 4
        if "a" in needs:
            assert cp.array_equal(got.a, same.a) and cp.array_equal(got.bias, same.bias)
    # a gated GEMM's dB (interleaved pairs) alike
    bg = rand(dtype, k, 2 * n, layout=lb)
    zg = cp.full((m, 2 * n), np.nan, dtype=np.float32).astype(dtype)
    ge2jit.gemm_gated(a, bg, act="silu", save_preact=True, preact_out=zg)
    got = ge2jit.gemm_gated_backward(gy, a, bg, act="silu", z=zg, db_dtype="float32")
    same = ge2jit.gemm_gated_backward(gy, a, bg, act="silu", z=zg)
    assert got.b.dtype == np.float32 and got.b.flags.f_contiguous == (lb == "c")
    assert rel_error(cp.asnumpy(got.b).astype(np.float64), host64(same.b)) < tol / 4
    assert cp.array_equal(got.a, same.a)
    # an empty K: zeros, float32
    e = ge2jit.gemm_bias_act_backward(gy, a[:, :0], b[:0], needs=("b",), db_dtype="float32")
    assert e.b.shape == (0, n) and e.b.dtype == np.float32


@pytest.mark.parametrize("act, source", [(a, s) for a in ACTS for s in ("z", "y", "recompute")
                                          if s != "y" or Act(a) in ACTS_FROM_Y])
@pytest.mark.parametrize("kind", ["f32", "bf16"])
def test_sources_of_act_prime(kind, act, source):
    """From the saved Z, from Y (the activations that allow it: the others are refused, see
    test_bad_input_is_refused) or by recomputing Z."""
    dtype = KINDS[kind][0]
    m, n, k = 96, 200, 64
    check(kind, rand(dtype, m, k), rand(dtype, k, n), rand(dtype, 1, n), act, source=source,
          slope=0.2)


@pytest.mark.parametrize("kind", KINDS)
def test_alpha_beta_c_and_subsets_of_needs(kind):
    dtype = KINDS[kind][0]
    m, n, k = 130, 70, 50
    a, b, c = rand(dtype, m, k), rand(dtype, k, n), rand(dtype, m, n, layout="c")
    check(kind, a, b, rand(np.float32, n), "silu", c=c, alpha=-0.75, beta=1.5)
    check(kind, a, b, rand(dtype, m, 1), "tanh", c=c, beta=0.5, source="recompute")
    check(kind, a, b, rand(dtype, n), "gelu", c=c, beta=0.25, needs=("bias", "c"))
    check(kind, a, b, rand(dtype, n), "relu", needs=("b",))
    got = check(kind, a, b, None, "sigmoid", c=c, beta=0.0)
    assert not cp.asnumpy(got.c).any(), "dC = 0 * dZ when beta is 0"


@pytest.mark.parametrize("source", ["z", "y", "recompute"])
def test_repeated_calls_take_the_prepared_path(source):
    """The second call of an argument pattern skips validation; its results are those of its
    own arrays."""
    from ge2jit.ops.gemm import backward

    backward._prepared.clear()
    for _ in range(3):
        a, b, bias = rand(np.float32, 70, 40), rand(np.float32, 40, 90), rand(np.float32, 90)
        check("f32", a, b, bias, "relu", source=source)
    assert len(backward._prepared) == 1, "one argument pattern, prepared once"


@pytest.mark.parametrize("a_act, from_a", [(a, False) for a in ACTS] +
                         [(a.value, True) for a in ACTS_FROM_Y])
@pytest.mark.parametrize("kind", KINDS)
def test_a_act_gives_the_previous_layers_dz(kind, a_act, from_a):
    """With A = a_act(a_z) (the previous layer's output), dA's GEMM multiplies by
    a_act'(a_z) in its epilogue: from a_z, or from A itself for the activations that allow
    it. dB and dBias are as without it."""
    dtype, tol = KINDS[kind]
    m, k0, k, n = 150, 40, 72, 136
    a, a_z = forward(rand(dtype, m, k0), rand(dtype, k0, k), rand(dtype, k), a_act, slope=0.2)
    b, bias = rand(dtype, k, n), rand(dtype, n)
    _, z = forward(a, b, bias, "gelu")
    gy = rand(dtype, m, n)
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="gelu", z=z, a_act=a_act,
                                        a_z=None if from_a else a_z, a_leaky_slope=0.2)
    want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias),
                                      act="gelu", a_act=a_act, a_z=host64(a_z),
                                      a_leaky_slope=0.2)
    assert got.a.shape == a.shape and got.a.dtype == dtype
    for name, g, w in zip("ab", got, want):
        err = rel_error(host64(g), w)
        assert err < tol, f"d{name} ({kind}, a_act {a_act}, from a: {from_a}): {err:.3g}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_z_float32_column_major_and_prepared_repeats(kind):
    """a_z of another type and layout than A; the second and third calls take the prepared
    path with their own arrays."""
    dtype, tol = KINDS[kind]
    m, k, n = 97, 66, 130
    for _ in range(3):
        a_z = rand(np.float32, m, k, layout="c")
        a = cp.asarray(activation("silu", host64(a_z)).astype(dtype))
        b, bias = rand(dtype, k, n), rand(dtype, 1, n)
        _, z = forward(a, b, bias, "tanh", alpha=0.5)
        gy = rand(dtype, m, n)
        got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="tanh", z=z, a_act="silu",
                                            a_z=a_z, alpha=0.5)
        want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias),
                                          act="tanh", alpha=0.5, a_act="silu",
                                          a_z=host64(a_z))
        assert rel_error(host64(got.a), want[0]) < tol


@pytest.mark.parametrize("shape", [(300, 136, 264), (97, 66, 130)],
                         ids=["aligned", "unaligned"])
@pytest.mark.parametrize("kind, precision", [("f32", None), ("f32", "tf32x3"), ("bf16", None),
                                             ("f16", None)])
def test_a_bias_gives_the_previous_layers_bias_gradient(kind, precision, shape):
    """a_bias: the column sums of the gated dA (the previous layer's dZ), from dA's epilogue
    on Hopper (aligned rows), else by a pass over dA; the second call takes the prepared
    path. Bias of either shape and type."""
    from ge2jit.jit import loader
    from ge2jit.jit.device import device_arch
    from ge2jit.ops.gemm.spec import DzSpec

    dtype, tol = KINDS[kind]
    m, n, k = shape
    loader._launchers.clear()
    for rep, prev_bias in enumerate([rand(dtype, k), rand(np.float32, 1, k)]):
        a_z = rand(dtype, m, k)
        a = cp.asarray(activation("gelu", host64(a_z)).astype(dtype))
        b, bias, gy = rand(dtype, k, n), rand(dtype, n), rand(dtype, m, n)
        got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, needs=("a", "b"), a_act="gelu",
                                            a_z=a_z, a_bias=prev_bias, precision=precision)
        want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias),
                                          a_act="gelu", a_z=host64(a_z))
        assert got.bias is None and got.a_bias.shape == prev_bias.shape
        assert got.a_bias.dtype == prev_bias.dtype
        assert rel_error(host64(got.a), want[0]) < tol
        # sums of dA as stored (rounded to its dtype) against the exact sums
        err = rel_error(host64(got.a_bias).ravel(), want[0].sum(axis=0))
        assert err < tol, f"a_bias ({kind}, call {rep}): {err:.3g}"
    passes = [s for s, _ in loader._launchers if isinstance(s, DzSpec)
              and s.act is Act.NONE and not s.write_dz]
    hopper = device_arch(cp.cuda.runtime.getDevice()) == "sm_90"
    from_epilogue = hopper and shape[0] == 300 and (kind != "f32" or precision == "tf32x3")
    assert bool(passes) != from_epilogue, passes


@pytest.mark.parametrize("rows", [1, 7, 512, 513, 2100])
def test_column_sums_in_one_or_two_rounds(rows):
    """The partial sums' reduction: up to 2 x 256 rows in one kernel, more in chunks of 256
    rows and then their sums; the same bits on a second run."""
    from ge2jit.ops.gemm.backward import _column_summer
    from ge2jit.ops.gemm.spec import DType

    partial = rand(np.float32, rows, 70)
    for dt, out_np, tol in ((DType.F32, np.float32, 1e-6), (DType.BF16, KINDS["bf16"][0], 1e-2)):
        run = _column_summer(dt, cp.cuda.runtime.getDevice(), CUPY)
        outs = []
        for _ in range(2):
            out = cp.full(70, np.nan, np.float32).astype(out_np)
            run(cp.cuda.get_current_stream().ptr, partial, out.data.ptr)
            outs.append(host64(out))
        assert rel_error(outs[0], host64(partial).sum(axis=0)) < tol
        assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("gy_kind", ["input", "f32"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradient_of_z_goes_straight_to_the_gemms(kind, gy_kind):
    """act="none" with gy in the inputs' dtype: gy is dZ, read by the GEMMs as it is (no dZ
    is written; the pass only sums dBias); a float32 gy for 16-bit inputs is converted."""
    from ge2jit.jit import loader
    from ge2jit.ops.gemm.spec import DzSpec

    dtype, tol = KINDS[kind]
    m, k, n = 120, 64, 88
    a, b, bias = rand(dtype, m, k), rand(dtype, k, n), rand(dtype, n)
    gy = rand(dtype if gy_kind == "input" else np.float32, m, n)
    loader._launchers.clear()
    ge2jit.ops.gemm.clear_plans()   # ("f32", "input") and ("f32", "f32") share a signature
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias)
    want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias))
    for g, w in zip(got[:3], want[:3]):
        assert rel_error(host64(g), w) < tol
    passes = [s for s, _ in loader._launchers if isinstance(s, DzSpec)]
    assert len(passes) == 1 and not passes[0].reads_src
    assert passes[0].write_dz == (gy.dtype != a.dtype)


@pytest.mark.parametrize("precision, tol", [("tf32", 2e-3), ("tf32x3", 1e-5)])
def test_float32_precisions(precision, tol):
    """float32 inputs with the tensor-core precisions: dA and dB by the same GEMM mode."""
    a, b, bias = rand(np.float32, 200, 136), rand(np.float32, 136, 264), rand(np.float32, 264)
    z = ge2jit.gemm_bias_act(a, b, bias, act="silu", save_preact=True, precision="tf32x3")[1]
    gy = rand(np.float32, 200, 264)
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="silu", z=z, precision=precision)
    want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias),
                                      act="silu")
    for g, w in zip(got[:3], want[:3]):
        assert rel_error(host64(g), w) < tol


def test_float32_gradient_from_bf16_forward():
    """A float32 gY (e.g. from a float32 loss) for bfloat16 operands."""
    dtype = KINDS["bf16"][0]
    a, b, bias = rand(dtype, 64, 48), rand(dtype, 48, 80), rand(np.float32, 80)
    _, z = forward(a, b, bias, "gelu")
    gy = rand(np.float32, 64, 80)
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="gelu", z=z)
    want = gemm_bias_act_backward_ref(host64(gy), host64(a), host64(b), host64(bias),
                                      act="gelu")
    assert got.bias.dtype == np.float32 and got.a.dtype == dtype
    for g, w in zip(got[:3], want[:3]):
        assert rel_error(host64(g), w) < 1e-2


def test_empty_and_degenerate_sizes():
    a, b, bias = rand(np.float32, 0, 5), rand(np.float32, 5, 7), rand(np.float32, 7)
    got = ge2jit.gemm_bias_act_backward(cp.zeros((0, 7), np.float32), a, b, bias, act="relu")
    assert got.a.shape == (0, 5) and got.b.shape == (5, 7) and not cp.asnumpy(got.b).any()
    assert got.bias.shape == (7,) and not cp.asnumpy(got.bias).any()
    a, b = rand(np.float32, 6, 0), rand(np.float32, 0, 4)
    gy, bias = rand(np.float32, 6, 4), rand(np.float32, 4)
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="gelu")   # K = 0: Z is the bias
    assert got.a.shape == (6, 0) and got.b.shape == (0, 4)
    want = host64(gy).sum(axis=0) * activation_grad("gelu", host64(bias))
    assert np.allclose(host64(got.bias), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ACTS)
def test_gpu_gradients_match_finite_differences(act):
    """ge2jit's float32 gradients against central differences of the float64 forward."""
    rng = np.random.default_rng(12)
    m, n, k = 33, 40, 24
    a64, b64 = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    bias64, gy64 = rng.standard_normal(n), rng.standard_normal((m, n))
    a, b, bias, gy = (cp.asarray(x.astype(np.float32)) for x in (a64, b64, bias64, gy64))
    a64, b64, bias64, gy64 = (host64(x) for x in (a, b, bias, gy))
    got = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act=act, leaky_slope=0.1)

    def loss(a_, b_, bias_):
        return float((gy64 * activation(act, a_ @ b_ + bias_, 0.1)).sum())

    h = 1e-6
    for x, grad, pos in ((a64, host64(got.a), 0), (b64, host64(got.b), 1),
                         (bias64, host64(got.bias), 2)):
        for _ in range(5):
            idx = tuple(rng.integers(0, s) for s in x.shape)
            args_up, args_down = [a64, b64, bias64], [a64, b64, bias64]
            up, down = x.copy(), x.copy()
            up[idx] += h
            down[idx] -= h
            args_up[pos], args_down[pos] = up, down
            fd = (loss(*args_up) - loss(*args_down)) / (2 * h)
            assert abs(fd - grad[idx]) <= 2e-4 * max(1.0, abs(fd)), (act, pos, idx, fd)


def test_bad_input_is_refused():
    a, b = rand(np.float32, 8, 4), rand(np.float32, 4, 6)
    gy = rand(np.float32, 8, 6)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"gy: expected shape \(8, 6\)"):
        ge2jit.gemm_bias_act_backward(rand(np.float32, 6, 8), a, b)
    with pytest.raises(ge2jit.ArgumentValueError, match="gy: expected dtype float32"):
        ge2jit.gemm_bias_act_backward(gy.astype(np.float16), a, b)
    with pytest.raises(ge2jit.ArgumentValueError, match="y: act 'gelu' has no derivative"):
        ge2jit.gemm_bias_act_backward(gy, a, b, act="gelu", y=gy)
    with pytest.raises(ge2jit.ArgumentValueError, match="z, y: pass one"):
        ge2jit.gemm_bias_act_backward(gy, a, b, act="relu", y=gy, z=gy)
    with pytest.raises(ge2jit.ArgumentValueError, match="needs: expected names"):
        ge2jit.gemm_bias_act_backward(gy, a, b, needs=("a", "weights"))
    with pytest.raises(ge2jit.ArgumentValueError, match="leaky_slope -0.5 < 0"):
        ge2jit.gemm_bias_act_backward(gy, a, b, act="leaky_relu", leaky_slope=-0.5, y=gy)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"z: expected shape \(8, 6\)"):
        ge2jit.gemm_bias_act_backward(gy, a, b, act="gelu", z=gy[:4])
    with pytest.raises(ge2jit.ArgumentTypeError, match="gy: expected a GPU array"):
        ge2jit.gemm_bias_act_backward(cp.asnumpy(gy), a, b)
    with pytest.raises(ge2jit.ArgumentValueError, match="b: expected shape"):
        ge2jit.gemm_bias_act_backward(gy, a, rand(np.float32, 5, 6))
    with pytest.raises(ge2jit.ArgumentValueError, match="db_dtype: expected float32 "):
        ge2jit.gemm_bias_act_backward(gy, a, b, db_dtype="float16")
    with pytest.raises(ge2jit.ArgumentValueError, match="a_z: a_act 'gelu' needs"):
        ge2jit.gemm_bias_act_backward(gy, a, b, a_act="gelu")
    with pytest.raises(ge2jit.ArgumentValueError, match=r"a_z: expected shape \(8, 4\)"):
        ge2jit.gemm_bias_act_backward(gy, a, b, a_act="gelu", a_z=gy)


def test_warmup_entry_covers_the_backward(tmp_path):
    """After ``ge2jit warmup`` of a [[gemm_bias_act_backward]] entry (and an [[adam_update]]
    one), the calls they describe compile nothing: in a fresh process whose NVRTC compile
    refuses, they run."""
    import os
    import subprocess
    import sys
    import textwrap

    cfg = tmp_path / "w.toml"
    cfg.write_text(textwrap.dedent("""
        [[gemm_bias_act_backward]]
        dtypes = ["bfloat16", "float32"]
        acts = ["gelu_tanh", "none"]
        sources = ["z"]
        bias = ["col", "none"]
        a_acts = ["none", "gelu_tanh"]
        a_bias = [false, true]
        shapes = [[300, 136, 264], [1000, 520, 384]]

        [[adam_update]]
        grad_dtypes = ["bfloat16", "float32"]
        copy_dtypes = ["bfloat16", "none"]
    """))
    env = {**os.environ, "GE2JIT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "ge2jit", "warmup", str(cfg), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr
    script = textwrap.dedent("""
        import numpy as np, cupy as cp, ml_dtypes, ge2jit
        from ge2jit.jit import nvrtc

        def refuse(source, name, *args, **kw):
            raise AssertionError("compiled at run time: " + name)

        nvrtc.compile_to_cubin = refuse
        rng = np.random.default_rng(0)

        def rand(dt, *shape):
            return cp.asarray(rng.standard_normal(shape).astype(np.float32).astype(dt))

        for dt in (ml_dtypes.bfloat16, np.float32):
            for m, n, k in ((300, 136, 264), (1000, 520, 384)):
                a, b, gy, z = rand(dt, m, k), rand(dt, k, n), rand(dt, m, n), rand(dt, m, n)
                bias, a_z, a_bias = rand(dt, n), rand(dt, m, k), rand(dt, k)
                ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="gelu_tanh", z=z)
                ge2jit.gemm_bias_act_backward(gy, a, b, bias, needs=("a", "b"),
                                              a_act="gelu_tanh", a_z=a_z, a_bias=a_bias)
                ge2jit.gemm_bias_act_backward(gy, a, b, bias, a_act="gelu_tanh", a_z=a_z)
        w32, m, v = rand(np.float32, 64, 32), cp.zeros((64, 32), np.float32), \
            cp.zeros((64, 32), np.float32)
        ge2jit.adam_update(w32, rand(ml_dtypes.bfloat16, 64, 32), m, v, step=1,
                           param_copy=cp.zeros((64, 32), ml_dtypes.bfloat16))
        ge2jit.adam_update(w32, rand(np.float32, 64, 32), m, v, step=2)
        cp.cuda.Device().synchronize()
        print("ran without compiling")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and "ran without compiling" in r.stdout, r.stdout + r.stderr
