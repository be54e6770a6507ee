"""Every bad argument of gemm_bias_act is refused before a launch, with a message that names the
argument, what was expected and what came. Runs without a GPU (on stand-in arrays)."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.gemm import problem
from ge2jit.ops.gemm.epilogue import ACT_NAMES, Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.problem import layout_of, validate
from ge2jit.ops.gemm.spec import DType, Precision

from ...fake_cupy import FakeArray, make_module

M, K, N = 6, 5, 7


@pytest.fixture(autouse=True)
def fake_cupy(monkeypatch):
    from ge2jit.runtime import arrays, checks

    for module in (problem, checks):   # the op's checks and the shared kit's
        monkeypatch.setattr(module, "_cupy", lambda: make_module(0))
    monkeypatch.setattr(arrays, "_cupy_mod", make_module(0))   # stand-ins are CuPy arrays
    monkeypatch.setattr(arrays, "current_device", lambda: 0)


def ok(**kw):
    args = dict(a=FakeArray((M, K)), b=FakeArray((K, N)), bias=None, act="none", c=None,
                alpha=1.0, beta=0.0, leaky_slope=0.01, out=None, preact_out=None,
                save_preact=False)
    args.update(kw)
    return validate(**args)


def refused(exc, match, **kw):
    with pytest.raises(exc, match=match) as info:
        ok(**kw)
    assert isinstance(info.value, ge2jit.Ge2jitError)
    return str(info.value)


def test_valid_call():
    p = ok(act="gelu")
    assert (p.m, p.n, p.k, p.epilogue.act) == (M, N, K, Act.GELU)
    assert p.layout_a is Layout.ROW and p.lda == K and p.ldb == N


def test_numpy_array_says_to_use_cupy_asarray():
    msg = refused(TypeError, r"a: expected a GPU array", a=np.ones((M, K), np.float32))
    assert "cupy.asarray(a)" in msg
    msg = refused(TypeError, r"bias: expected a GPU array", bias=np.ones(N, np.float32))
    assert "cupy.asarray(bias)" in msg


def test_other_types():
    refused(TypeError, "b: expected a GPU array .*, got list", b=[[1.0]])
    refused(TypeError, "c: expected a GPU array .*, got int", c=3, beta=1.0)
    refused(TypeError, "out: expected a GPU array", out="y")


@pytest.mark.parametrize("name, shape", [("a", (M,)), ("a", (1, M, K)), ("b", (K,))])
def test_ndim(name, shape):
    refused(ValueError, f"{name}: expected a 2-D", **{name: FakeArray(shape)})


def test_unsupported_dtype_lists_supported():
    msg = refused(ValueError, "a: dtype float64 is not supported",
                  a=FakeArray((M, K), np.float64), b=FakeArray((K, N), np.float64))
    assert "supported dtypes: float32, float16, bfloat16" in msg


def test_mixed_dtypes():
    refused(ValueError, "b: expected dtype float32 .* got float16", b=FakeArray((K, N), np.float16))
    refused(ValueError, "bias: expected dtype float32", bias=FakeArray((N,), np.float64))
    refused(ValueError, "c: expected dtype float32", c=FakeArray((M, N), np.float64), beta=1.0)
    refused(ValueError, r"out: expected dtype float32 \(a and b are float32\), got float64",
            out=FakeArray((M, N), np.float64))
    refused(ValueError, r"out: expected shape \(6, 7\) and dtype float32",
            out=FakeArray((M, N + 1), np.float32))


def half(*shape):
    return FakeArray(shape, np.float16)


def test_16bit_inputs_types_of_bias_c_and_y():
    p = ok(a=half(M, K), b=half(K, N))
    assert p.dtype is DType.F16 and p.precision is Precision.IEEE
    assert p.epilogue == Epilogue(out_dtype=DType.F16)
    p = ok(a=half(M, K), b=half(K, N), bias=FakeArray((N,)), c=FakeArray((M, N)), beta=1.0,
           out_dtype="float32")
    e = p.epilogue
    assert (e.bias_dtype, e.c_dtype, e.out_dtype) == (DType.F32, DType.F32, DType.F32)
    p = ok(a=half(M, K), b=half(K, N), bias=half(N), out=FakeArray((M, N)))
    e = p.epilogue
    assert e.out_dtype is DType.F32 and e.bias_dtype is DType.F16  # Y's type from out
    p = ok(a=half(M, K), b=half(K, N), out_dtype=np.float16, out=half(M, N))
    assert p.epilogue.out_dtype is DType.F16
    p = ok(a=half(M, K), b=half(K, N), c=FakeArray((M, N)), beta=0.0)
    assert p.c is None and p.epilogue.c_dtype is None   # C unread: no type


def test_16bit_refusals():
    h = dict(a=half(M, K), b=half(K, N))
    refused(ValueError, r"b: expected dtype float16 \(the dtype of a\), got float32",
            a=half(M, K))
    refused(ValueError, r"bias: expected dtype float16 or float32 \(a and b are float16\), "
            r"got float64", bias=FakeArray((N,), np.float64), **h)
    refused(ValueError, r"c: expected dtype float16 or float32", beta=1.0,
            c=FakeArray((M, N), np.float64), **h)
    refused(ValueError, r"out_dtype: expected float16 or float32 \(a and b are float16\), got "
            r"'float64'", out_dtype="float64", **h)
    refused(ValueError, r"out_dtype: expected float32 \(a and b are float32\)",
            out_dtype="float16")
    refused(ValueError, r"out: expected shape \(6, 7\) and dtype float32",
            out=half(M, N), out_dtype="float32", **h)
    refused(ValueError, r"preact_out: expected shape \(6, 7\) and dtype float16",
            out=half(M, N), preact_out=FakeArray((M, N)), save_preact=True, **h)
    refused(ValueError, r"out_dtype: expected .* got <object", out_dtype=object(), **h)


def test_precision():
    assert ok(precision="tf32").precision is Precision.TF32
    assert ok(precision="tf32x3").precision is Precision.TF32X3
    assert ok(precision=Precision.TF32X3).precision is Precision.TF32X3
    assert ok(precision=None).precision is Precision.IEEE
    refused(ValueError, r"precision: expected one of ieee, tf32, tf32x3, fast_accum or None, "
            r"got 'fp8'", precision="fp8")
    refused(ValueError, r"precision: 'tf32' applies to float32 inputs; a and b are float16",
            a=half(M, K), b=half(K, N), precision="tf32")
    refused(ValueError, r"precision: 'tf32x3' applies to float32 inputs; a and b are float16",
            a=half(M, K), b=half(K, N), precision="tf32x3")


def test_precision_default_from_environment(monkeypatch):
    from ge2jit.settings import reload_settings

    monkeypatch.setenv("GE2JIT_FLOAT32_PRECISION", "tf32")
    reload_settings()
    try:
        assert ok().precision is Precision.TF32
        assert ok(a=half(M, K), b=half(K, N)).precision is Precision.IEEE
        monkeypatch.setenv("GE2JIT_FLOAT32_PRECISION", "tf32x3")
        reload_settings()
        assert ok().precision is Precision.TF32X3
        monkeypatch.setenv("GE2JIT_FLOAT32_PRECISION", "half")
        with pytest.raises(ValueError, match="GE2JIT_FLOAT32_PRECISION: expected one of ieee, "
                                             "tf32, tf32x3, got 'half'"):
            reload_settings()
            ok()
    finally:
        monkeypatch.delenv("GE2JIT_FLOAT32_PRECISION")
        reload_settings()


def test_bfloat16_by_name():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = np.dtype(ml_dtypes.bfloat16)
    p = ok(a=FakeArray((M, K), bf), b=FakeArray((K, N), bf), out_dtype=ml_dtypes.bfloat16)
    assert p.dtype is DType.BF16 and p.epilogue.out_dtype is DType.BF16
    refused(ValueError, r"b: expected dtype bfloat16 \(the dtype of a\), got float16",
            a=FakeArray((M, K), bf), b=half(K, N))


def test_inner_dimension_mismatch():
    refused(ValueError, r"b: expected shape \(5, N\) to match a of shape \(6, 5\).*got \(4, 7\)",
            b=FakeArray((K - 1, N)))


def test_unknown_activation_lists_valid_names():
    msg = refused(ValueError, "act: unknown activation 'gleu'", act="gleu")
    for name in ACT_NAMES:
        assert name in msg
    refused(ValueError, "act: unknown activation None", act=None)


@pytest.mark.parametrize("name", ["alpha", "beta", "leaky_slope"])
def test_scalars(name):
    refused(TypeError, f"{name}: expected a real number, got 'x'", **{name: "x"})
    refused(TypeError, f"{name}: expected a real number, got True", **{name: True})


@pytest.mark.parametrize("shape, kind", [
    ((), BiasKind.SCALAR), ((1,), BiasKind.SCALAR), ((1, 1), BiasKind.SCALAR),
    ((N,), BiasKind.COL), ((1, N), BiasKind.COL), ((M, 1), BiasKind.ROW),
])
def test_bias_shapes_accepted(shape, kind):
    assert ok(bias=FakeArray(shape)).epilogue.bias is kind


@pytest.mark.parametrize("shape", [(M,), (N, 1), (M, N), (1, 1, N), (N + 1,), (2, N)])
def test_bias_shapes_refused_list_accepted_ones(shape):
    msg = refused(ValueError, r"bias: shape .* does not broadcast", bias=FakeArray(shape))
    assert "(N,) or (1, N) per column" in msg and "(M, 1) per row" in msg


def test_a_full_mn_bias_is_pointed_to_c_and_beta():
    msg = refused(ValueError, r"bias: shape \(6, 7\) does not broadcast", bias=FakeArray((M, N)))
    assert msg.endswith("; pass a full (M, N) addend as c= with beta=1.0 (Z = alpha * A @ B + "
                        "beta * C + bias)")
    for shape in ((M,), (2, N)):   # not a full addend: no such hint
        assert "c=" not in refused(ValueError, "does not broadcast", bias=FakeArray(shape))
    # gemm_gated takes no C: no hint there either
    with pytest.raises(ge2jit.ArgumentValueError, match="does not broadcast") as info:
        ok(b=FakeArray((K, 2 * N)), bias=FakeArray((M, 2 * N)), glu=True)
    assert "c=" not in str(info.value)


def test_bias_strides_are_passed_not_copied():
    wide = FakeArray((N,), strides=(12,))
    p = ok(bias=wide)
    assert p.bias is wide and p.bias_stride == 3
    assert ok(bias=FakeArray((M, 1), strides=(8, 4))).bias_stride == 2


def test_c_shape_and_beta_without_c():
    refused(ValueError, r"c: expected shape \(6, 7\) \(M, N\), got \(7, 6\)",
            c=FakeArray((N, M)), beta=1.0)
    refused(ValueError, "beta: is 0.5, which needs c, but c is None", beta=0.5)


def test_c_with_zero_beta_is_not_read():
    p = ok(c=FakeArray((M, N)), beta=0.0)
    assert p.c is None and p.epilogue.layout_c is None


def test_out_checks():
    refused(ValueError, r"out: expected shape \(6, 7\)", out=FakeArray((M, N + 1)))
    refused(ValueError, "out: expected a row-major array", out=FakeArray((N, M)).T)
    a = FakeArray((M, K))
    refused(ValueError, "out: overlaps a", a=a, out=FakeArray((M, N), base=a.base))
    bias = FakeArray((N,))
    refused(ValueError, "out: overlaps bias", bias=bias,
            out=FakeArray((M, N), base=bias.base))
    y = FakeArray((M, N))
    refused(ValueError, "preact_out: overlaps out", out=y, save_preact=True,
            preact_out=FakeArray((M, N), base=y.base))
    refused(ValueError, "preact_out: given, but save_preact is False", preact_out=y)
    refused(ValueError, r"preact_out: expected shape \(6, 7\)", save_preact=True,
            preact_out=FakeArray((M, 1)))
    # a row slice of a wider array is a fine output
    assert ok(out=FakeArray((M, N), strides=(4 * (N + 3), 4))).out is not None


def test_out_may_be_c_itself_but_not_part_of_it():
    c = FakeArray((M, N))
    assert ok(c=c, beta=1.0, out=c).out is c                 # Y = A @ B + Y, in place
    assert ok(c=c, beta=1.0, out=FakeArray((M, N), base=c.base)).out is not None  # same view
    refused(ValueError, "out: overlaps c without being c; pass out=c",
            c=c, beta=1.0, out=FakeArray((M, N), base=c.base, offset=4))
    wide = FakeArray((M, N + 1))
    refused(ValueError, "out: overlaps c without being c", beta=1.0,
            c=FakeArray((M, N), strides=wide.strides, base=wide.base),
            out=FakeArray((M, N), strides=(4 * N, 4), base=wide.base))
    refused(ValueError, "preact_out: overlaps c; pass a separate", c=c, beta=1.0,
            save_preact=True, preact_out=c)


def test_overlap_is_decided_by_byte_ranges():
    a = FakeArray((M, K))
    # a second view of a's memory that starts past a's last byte does not overlap
    after = FakeArray((M, N), base=a.base, offset=4 * M * K)
    assert ok(a=a, out=after).out is after
    inside = FakeArray((M, N), base=a.base, offset=4 * (M * K - 1))
    refused(ValueError, "out: overlaps a", a=a, out=inside)
    b = FakeArray((K, N))
    refused(ValueError, "out: overlaps b", b=b, out=FakeArray((M, N), base=b.base, offset=8))


def test_arrays_on_other_devices():
    msg = refused(ValueError, "b: expected an array on the current device",
                  b=FakeArray((K, N), device=1))
    assert "got one on GPU 1" in msg
    refused(ge2jit.DeviceMismatchError, "out:", out=FakeArray((M, N), device=2))


def test_too_large_dimension():
    refused(ValueError, "K = 2147483648", a=FakeArray((M, 2**31)), b=FakeArray((2**31, N)))


def test_bad_config_name(monkeypatch):
    import ge2jit.ops.gemm.op as op

    monkeypatch.setattr(op, "validate", lambda *a, **k: ok())
    with pytest.raises(ge2jit.ArgumentValueError, match="config: expected a name like"):
        ge2jit.gemm_bias_act(None, None, config="big")
    with pytest.raises(ge2jit.ArgumentTypeError, match="config: expected a PipelineConfig"):
        ge2jit.gemm_bias_act(None, None, config=128)
    with pytest.raises(ge2jit.ArgumentValueError, match="split-K needs a pipelined config"):
        ge2jit.gemm_bias_act(None, None, config="64x64x8_4x4_k2")


# ---- layouts -------------------------------------------------------------------------------

def test_layout_row_col_and_slices():
    x = FakeArray((M, K))
    assert layout_of(x, "a")[:2] == (Layout.ROW, K)
    assert layout_of(FakeArray((K, M)).T, "a")[:2] == (Layout.COL, M)
    wide = FakeArray((M, K), strides=(4 * 100, 4))           # x[:, :K] of a (M, 100) array
    assert layout_of(wide, "a")[:2] == (Layout.ROW, 100)
    tall = FakeArray((M, K), strides=(4, 4 * 50))            # column-major with ld 50
    assert layout_of(tall, "a")[:2] == (Layout.COL, 50)
    assert layout_of(FakeArray((1, K), strides=(4, 4)), "a")[:2] == (Layout.ROW, K)
    assert layout_of(FakeArray((M, 1), strides=(4, 4)), "a")[:2] == (Layout.ROW, 1)


@pytest.mark.parametrize("strides", [(8 * K, 8), (-4 * K, 4), (4 * K, -4), (6, 4 * K)])
def test_other_strides_are_copied(strides):
    x = FakeArray((M, K), strides=strides)
    layout, ld, y = layout_of(x, "a")
    assert y is not x and (layout, ld) == (Layout.ROW, K)


def test_empty_and_k0():
    p = ok(a=FakeArray((0, K)), b=FakeArray((K, N)))
    assert p.empty
    p = ok(a=FakeArray((M, 0)), b=FakeArray((0, N)))
    assert not p.empty and p.k == 0


def backward_refused(match, exc=ValueError, **kw):
    args = dict(gy=FakeArray((M, N)), a=FakeArray((M, K)), b=FakeArray((K, N)))
    args.update(kw)
    with pytest.raises(exc, match=match) as info:
        ge2jit.gemm_bias_act_backward(**args)
    assert isinstance(info.value, ge2jit.Ge2jitError)


def test_backward_refuses_bad_gradients_and_sources():
    backward_refused(rf"gy: expected shape \({M}, {N}\) \(M, N\), got \({N}, {M}\)",
                     gy=FakeArray((N, M)))
    backward_refused("gy: expected dtype float32, got float16", gy=FakeArray((M, N), np.float16))
    backward_refused("gy: expected a GPU array", TypeError, gy=np.ones((M, N), np.float32))
    backward_refused(r"z: expected shape", act="gelu", z=FakeArray((M, 1)))
    backward_refused("y: act 'silu' has no derivative in terms of its output", act="silu",
                     y=FakeArray((M, N)))
    backward_refused("z, y: pass one of them", act="relu", y=FakeArray((M, N)),
                     z=FakeArray((M, N)))
    backward_refused(r"leaky_slope -0.5 < 0", act="leaky_relu", leaky_slope=-0.5,
                     y=FakeArray((M, N)))
    backward_refused(r"needs: expected names of a, b, bias, c, got \['w'\]", needs=("a", "w"))
    backward_refused("needs: expected names", needs=3)
    backward_refused("act: ", act="swish")
    backward_refused("b: expected shape", b=FakeArray((K + 1, N)))


def test_backward_refuses_bad_a_act_arguments():
    backward_refused("a_act: expected None or one of none, relu", a_act="swish")
    backward_refused("a_act: expected None or one of", a_act=1)
    backward_refused("a_z: a_act 'gelu_tanh' needs the pre-activation", a_act="gelu_tanh")
    backward_refused(rf"a_z: expected shape \({M}, {K}\) \(M, K\), like a, got \({M}, {N}\)",
                     a_act="gelu", a_z=FakeArray((M, N)))
    backward_refused("a_z: expected dtype float32, got float16", a_act="gelu",
                     a_z=FakeArray((M, K), np.float16))
    backward_refused("a_z: given without a_act", a_z=FakeArray((M, K)))
    backward_refused("a_z: with a_leaky_slope -0.1 < 0", a_act="leaky_relu",
                     a_leaky_slope=-0.1)
    backward_refused("a_leaky_slope: expected a real number", TypeError, a_act="relu",
                     a_leaky_slope="x")


def test_backward_refuses_bad_a_bias():
    backward_refused("a_bias: given without a_act", a_bias=FakeArray((K,)))
    backward_refused("a_bias: its gradient is the column sums of dA", a_act="relu",
                     a_bias=FakeArray((K,)), needs=("b", "bias"))
    backward_refused(rf"a_bias: expected the per-column bias of the layer that produced a, "
                     rf"shape \({K},\) or \(1, {K}\), got \({M}, 1\)", a_act="relu",
                     a_bias=FakeArray((M, 1)))
    backward_refused("a_bias: expected dtype float32, got float16", a_act="relu",
                     a_bias=FakeArray((1, K), np.float16))
    backward_refused("a_bias: expected a GPU array", TypeError, a_act="relu",
                     a_bias=np.zeros(K, np.float32))


# ---- sizes, strides and pointers the kernels cannot take are refused, never rounded ------------

def test_size_limits_name_the_size_and_the_limit():
    big = problem.MAX_MN + 1
    msg = refused(ValueError, f"M = {big}: at most {problem.MAX_MN}", a=FakeArray((big, K)))
    assert "2**31 - 2**16" in msg
    refused(ValueError, f"N = {big}: at most", b=FakeArray((K, big)))
    p = ok(a=FakeArray((1, 2**31 - 1)), b=FakeArray((2**31 - 1, 1)))   # the largest K
    assert p.k == 2**31 - 1


@pytest.mark.parametrize("name, shape", [("out", (M, N)), ("a", (M, K)), ("b", (K, N)),
                                         ("c", (M, N))])
def test_strides_that_are_not_whole_elements_are_refused(name, shape):
    # a row stride of 30 bytes used to become ld 7 (rounded down) for out
    odd = FakeArray(shape, strides=(30, 4) if shape[1] <= 7 else (4 * shape[1] + 2, 4))
    refused(ValueError, rf"{name}: expected strides that are multiples of its 4-byte elements",
            **{name: odd}, **({"beta": 1.0} if name == "c" else {}))


def test_bias_stride_of_two_bytes_is_refused():
    # a float32 bias with a 2-byte stride used to get bias_stride 0: every column's bias[0]
    refused(ValueError, "bias: expected strides that are multiples",
            bias=FakeArray((N,), strides=(2,)))
    refused(ValueError, "bias: expected strides", bias=FakeArray((M, 1), strides=(6, 4)))
    assert ok(bias=FakeArray((N,), strides=(8,))).bias_stride == 2


@pytest.mark.parametrize("name, shape", [("out", (M, N)), ("a", (M, K)), ("b", (K, N)),
                                         ("c", (M, N)), ("bias", (N,))])
def test_misaligned_pointers_are_refused(name, shape):
    x = FakeArray(shape, offset=2)      # a float32 view 2 bytes into a buffer
    msg = refused(ValueError, rf"{name}: expected a pointer aligned to its 4-byte elements",
                  **{name: x}, **({"beta": 1.0} if name == "c" else {}))
    assert "2 bytes past" in msg


def test_scalars_beyond_float64_are_refused():
    for name in ("alpha", "beta", "leaky_slope"):
        refused(ValueError, f"{name}: expected a real number within float64's range",
                **{name: 10**400}, c=FakeArray((M, N)))


def test_backward_needs_as_a_string_is_refused():
    backward_refused(r"needs: expected names of a, b, bias, c in a tuple such as \('a', 'b'\), "
                     r"got 'bias'", needs="bias")


def test_tf32x3_over_3k_beyond_32_bits():
    from ge2jit.ops.gemm import select
    from ge2jit.ops.gemm.spec import WgmmaConfig

    k = select.X3_MAX_3K // 3 + 1
    ch = select.heuristic(4096, 4096, k, 132, 90, "rr", DType.F32, Precision.TF32X3)
    assert not isinstance(ch.config, WgmmaConfig) and "3K" in ch.detail
    small = select.heuristic(4096, 4096, k - 1, 132, 90, "rr", DType.F32, Precision.TF32X3)
    assert isinstance(small.config, WgmmaConfig)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"3K = \d+, more than the 2147483647"):
        select.kernel_set(DType.F32, Layout.ROW, Layout.ROW, Epilogue(out_dtype=DType.F32),
                          small.config, 1, k, (16, 16, 16, 16), precision=Precision.TF32X3)


def test_backward_pass_grid_stays_within_65535_rows_of_blocks():
    from ge2jit.ops.gemm.backward import _pass_shape

    for m, n in ((2**31 - 2**16, 8), (70_000_000, 1), (1000, 1000)):
        tm, grid = _pass_shape(m, n, 1)
        assert grid[1] <= 65535 and tm * grid[1] >= m and grid[0] * 32 >= n


def test_backward_pass_spec_refuses_fields_it_does_not_read():
    from ge2jit.ops.gemm.spec import DzSpec

    f32, f16 = DType.F32, DType.F16
    with pytest.raises(ge2jit.ArgumentValueError, match="^DzSpec.from_y: act 'none' reads "
                       "neither Z nor Y; expected False, got True$"):
        DzSpec(Act.NONE, True, BiasKind.COL, f16, f16, f16)
    with pytest.raises(ge2jit.ArgumentValueError, match="^DzSpec.src_dtype: act 'none' reads "
                       "neither Z nor Y; expected the grad_dtype <DType.F32: 'f32'>, got "
                       "<DType.F16: 'f16'>$"):
        DzSpec(Act.NONE, False, BiasKind.COL, f32, f16, f16)
    with pytest.raises(ge2jit.ArgumentValueError, match=r"^DzSpec.dc_dtype: no dC is written "
                       r"\(write_dc False\); expected DType.F32, got <DType.F16: 'f16'>$"):
        DzSpec(Act.RELU, True, BiasKind.NONE, f16, f16, f16, dc_dtype=f16)
    spec = DzSpec(Act.NONE, False, BiasKind.ROW, f32, f32, f16, write_dc=True, dc_dtype=f16)
    assert (spec.from_y, spec.src_dtype, spec.dc_dtype) == (False, f32, f16)
