"""Kernel parameters declared once: every template's ``extern "C"`` signature is its spec's
``params``, the launcher packs them where the kernel reads them, and the generated launch
functions take them by name (no GPU: the driver call is replaced)."""

from __future__ import annotations

import ctypes
import functools
import re
import struct
from dataclasses import dataclass

import pytest

from ge2jit.jit.params import Kind, Param, array, double, int64, layout, pointer, tensor_maps
from ge2jit.jit.render import render
from ge2jit.jit.spec import KernelSpec
from ge2jit.ops.gemm import spec as g
from ge2jit.ops.gemm.epilogue import PARTIAL_SUMS, Epilogue
from ge2jit.ops.optim import UpdateSpec
from ge2jit.runtime.dtypes import FLOAT_DTYPES

R, C = g.Layout.ROW, g.Layout.COL
F32, F16, BF16 = g.DType.F32, g.DType.F16, g.DType.BF16
NONE, ROW, COL, SCALAR = g.BiasKind.NONE, g.BiasKind.ROW, g.BiasKind.COL, g.BiasKind.SCALAR
Act = g.Act
WG = g.WGMMA_CONFIGS[0]


def _wgmma(dtype, la=R, lb=C, out=None, **kw):
    epilogue = Epilogue(out_dtype=out or dtype, bias=COL, bias_dtype=dtype)
    return g.WgmmaGemmSpec(dtype, la, lb, epilogue, WG, **kw)


SPECS = [
    *(g.TiledGemmSpec(d, R, C, e, g.TILED_CONFIGS[0])
      for d in FLOAT_DTYPES for e in (
          Epilogue(out_dtype=d, act=Act.RELU),
          Epilogue(out_dtype=F32, act=Act.RELU, bias=ROW, bias_dtype=d, layout_c=C, c_dtype=d,
                   save_z=True))),
    g.TiledGemmSpec(F16, R, R, Epilogue(out_dtype=F16, layout_c=R, c_dtype=F16, gate=Act.GELU),
                    g.TILED_CONFIGS[1]),
    g.PipelinedGemmSpec(F32, C, R, Epilogue(out_dtype=F32, act=Act.GELU, bias=COL,
                                            bias_dtype=F32, layout_c=R, c_dtype=F32),
                        g.PIPELINED_F32_CONFIGS[0], True, True, True, False),
    g.PipelinedGemmSpec(F32, C, R, PARTIAL_SUMS, g.PIPELINED_F32_CONFIGS[0], True, True, True,
                        True),
    *(g.MmaGemmSpec(d, R, C, Epilogue(out_dtype=d, act=Act.SILU, bias=SCALAR, bias_dtype=d,
                                      layout_c=C, c_dtype=F32, save_z=True), cfg)
      for d, cfg in ((F16, g.MMA_16BIT_CONFIGS[0]), (BF16, g.MMA_16BIT_CONFIGS[2]),
                     (F32, g.MMA_TF32_CONFIGS[0]))),
    _wgmma(BF16),                                       # 4 tensor maps (TMA stores of Y, Z)
    _wgmma(F16, C, R, store16=False),                   # 2
    _wgmma(F16, out=F32),                               # 2: float32 Y leaves without TMA
    _wgmma(F32),
    g.WgmmaGemmSpec(BF16, R, C, PARTIAL_SUMS, WG, split_k=True),
    g.WgmmaGemmSpec(BF16, R, C, Epilogue(out_dtype=BF16, layout_c=R, c_dtype=BF16,
                                         gate=Act.GELU, bgrad=True),
                    g.WGMMA_CONFIGS[1]),                # the bias pointer is bgrad's output
    *(g.SplitKReduceSpec(d, e, v) for d in FLOAT_DTYPES for e, v in (
        (Epilogue(out_dtype=d, act=Act.TANH), True),
        (Epilogue(out_dtype=d, act=Act.TANH, bias=ROW, bias_dtype=F32, layout_c=C, c_dtype=d,
                  save_z=True), False))),
    *(g.TransposeSpec(d) for d in FLOAT_DTYPES),
    *(g.Tf32SplitSpec(t, o) for t in (False, True) for o in ("hhl", "hlh")),
    g.DzSpec(Act.GELU, False, COL, BF16, F32, BF16),
    g.DzSpec(Act.RELU, True, SCALAR, F16, F16, F16, write_dc=True, dc_dtype=F32, vec=True),
    g.DzSpec(Act.NONE, False, ROW, F32, F32, F32, write_dz=False, write_dc=True,
             dc_dtype=BF16),
    *(g.DbiasSpec(d, total) for d in FLOAT_DTYPES for total in (False, True)),
    *(UpdateSpec(rule, grad, copy, nesterov) for rule, grad, copy, nesterov in (
        ("adam", F32, None, False), ("adam", BF16, BF16, False), ("sgd", F16, None, False),
        ("sgd", F32, F16, True))),
]

_SIGNATURE = re.compile(
    r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*(\w+)\(([^)]*)\)')
_SCALARS = {"long long": Kind.INT64, "double": Kind.DOUBLE,
            "const __grid_constant__ TensorMap": Kind.TENSOR_MAP}
#: bytes of each kind's C type (TensorMap: the struct the Hopper template defines)
_C_SIZES = {Kind.POINTER: 8, Kind.INT64: 8, Kind.DOUBLE: 8, Kind.TENSOR_MAP: 16 * 8}


def _declared(source: str) -> tuple[str, list[Param]]:
    """The kernel's name and parameters, parsed from its ``extern "C"`` declaration."""
    (name, text), = _SIGNATURE.findall(source)
    params = []
    for decl in text.split(","):
        ctype, pname = re.fullmatch(r"\s*(.*?)\s*(\w+)\s*", decl, re.S).groups()
        ctype = " ".join(ctype.split())
        if ctype in _SCALARS:
            params.append(Param(pname, _SCALARS[ctype]))
        else:
            assert ctype.endswith("* __restrict__"), decl
            params.append(Param(pname, Kind.POINTER, ctype))
    return name, params


def _values(params) -> dict:
    """A distinct value of the right kind for each parameter."""
    out = {}
    for i, p in enumerate(params):
        out[p.name] = {Kind.POINTER: 0x1000 + i, Kind.INT64: -1 - i, Kind.DOUBLE: i + 0.5,
                       Kind.TENSOR_MAP: bytes([i + 1]) * 128}[p.kind]
    return out


def _decoded(buffer: bytes, params, offsets) -> dict:
    """Each parameter read back from its slot of a packed buffer."""
    return {p.name: struct.unpack_from("<" + p.kind.code, buffer, at)[0]
            for p, at in zip(params, offsets)}


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernel_name)
def test_signature_is_the_specs_params(spec):
    source = render(spec)
    name, declared = _declared(source)
    assert name == spec.kernel_name
    assert declared == list(spec.params)
    if any(p.kind is Kind.TENSOR_MAP for p in declared):
        assert "struct __align__(64) TensorMap { unsigned long long opaque[16]; };" in source


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernel_name)
def test_launcher_packs_each_parameter_in_its_slot(spec, cupy):
    from ge2jit.jit.launch import Launcher

    launcher = Launcher.for_spec(spec, 0)
    params = spec.params
    assert launcher.name == spec.kernel_name and launcher.params == params
    sizes = [b - a for a, b in zip(launcher.offsets, (*launcher.offsets[1:], launcher.size))]
    assert sizes == [_C_SIZES[p.kind] for p in params]
    assert launcher.offsets[0] == 0 and all(s % 8 == 0 for s in sizes)
    values = _values(params)
    buffer = bytearray(launcher.size)
    launcher.pack(buffer, **values)
    assert _decoded(buffer, params, launcher.offsets) == values


def test_the_gemm_families_share_one_layout_after_their_tensor_maps():
    def layout_of(spec):
        return [(p.name, p.kind) for p in spec.params if p.kind is not Kind.TENSOR_MAP]

    gemms = [s for s in SPECS if isinstance(s, (g.TiledGemmSpec, g.PipelinedGemmSpec, g.MmaGemmSpec,
                                                g.WgmmaGemmSpec))]
    assert len({tuple(layout_of(s)) for s in gemms}) == 1
    maps = {(s.tma_store, tuple(p.name for p in s.params if p.kind is Kind.TENSOR_MAP))
            for s in gemms if isinstance(s, g.WgmmaGemmSpec)}
    assert maps == {(False, ("tma_a", "tma_b")), (True, ("tma_a", "tma_b", "tma_y", "tma_z"))}


PARAMS = (*tensor_maps("tma"), *array("A", "float", "lda", const=True), *array("Y", "bf16_t"),
          *int64("M_", "N_"), *double("alpha_", "beta_"))


def _recording(launcher, calls: list) -> None:
    """Replace the driver call by one that reads every parameter back through the pointer
    array, as the driver would."""
    sizes = [p.kind.size for p in launcher.params]

    def launch(fptr, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        pointers = (ctypes.c_uint64 * len(sizes)).from_address(params)
        raw = b"".join(ctypes.string_at(int(p), n) for p, n in zip(pointers, sizes))
        calls.append(((fptr, (gx, gy, gz), (bx, by, bz), smem, stream), raw))

    launcher._launch = launch


@pytest.fixture
def launcher(cupy):
    from ge2jit.jit.launch import Launcher

    return Launcher("kern", 77, PARAMS)


def test_keywords_in_any_order_pack_as_the_declared_order(launcher):
    values = _values(PARAMS)
    expected = struct.pack(layout(PARAMS)[2], *values.values())
    for order in (list(values), list(reversed(values)), sorted(values)):
        buffer = bytearray(launcher.size)
        launcher.pack(buffer, **{n: values[n] for n in order})
        assert bytes(buffer) == expected


def test_missing_and_unknown_names_are_type_errors_naming_them(launcher):
    values = _values(PARAMS)
    buffer = bytearray(launcher.size)
    missing = {n: v for n, v in values.items() if n != "lda"}
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'lda'"):
        launcher.pack(buffer, **missing)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'lda'"):
        launcher.launch((1, 1, 1), (32, 1, 1), 0, 0, **missing)
    with pytest.raises(TypeError, match="unexpected keyword argument 'ldb'"):
        launcher.launch((1, 1, 1), (32, 1, 1), 0, 0, **values, ldb=3)
    with pytest.raises(TypeError, match="kern: no parameter named ldb, K_"):
        launcher.bind((1, 1, 1), (32, 1, 1), 0, lda=1, ldb=2, K_=3)
    bound = launcher.bind((1, 1, 1), (32, 1, 1), 0, lda=1, M_=2)
    rest = {n: v for n, v in values.items() if n not in ("lda", "M_")}
    with pytest.raises(TypeError, match=r"kern\(\) got an unexpected keyword argument 'lda'"):
        bound(0, **rest, lda=1)
    with pytest.raises(TypeError, match=r"kern\(\) missing 1 required keyword-only argument: "
                                        "'alpha_'"):
        bound(0, **{n: v for n, v in rest.items() if n != "alpha_"})


@pytest.mark.parametrize("fixed", [(), ("lda", "M_", "N_"), ("tma", "beta_"),
                                   tuple(p.name for p in PARAMS)])
def test_bind_packs_what_the_full_call_packs(launcher, fixed):
    calls: list = []
    _recording(launcher, calls)
    values = _values(PARAMS)
    launcher.launch((4, 5, 6), (128, 1, 1), 512, 999, **values)
    bound = launcher.bind((4, 5, 6), (128, 1, 1), 512, **{n: values[n] for n in fixed})
    bound(999, **{n: v for n, v in values.items() if n not in fixed})
    buffer = bytearray(launcher.size)
    launcher.pack(buffer, **values)
    (full_shape, full), (bound_shape, packed) = calls
    assert full_shape == bound_shape == (77, (4, 5, 6), (128, 1, 1), 512, 999)
    assert full == packed == bytes(buffer)


def test_bound_functions_keep_their_own_fixed_values(launcher):
    calls: list = []
    _recording(launcher, calls)
    values = _values(PARAMS)
    rest = {n: v for n, v in values.items() if n != "M_"}
    one = launcher.bind((1, 1, 1), (32, 1, 1), 0, M_=1)
    two = launcher.bind((1, 1, 1), (32, 1, 1), 0, M_=2)
    one(0, **rest)
    two(0, **rest)
    one(0, **rest)
    at = launcher.offsets[[p.name for p in PARAMS].index("M_")]
    assert [struct.unpack_from("<q", raw, at)[0] for _, raw in calls] == [1, 2, 1]


def test_a_failed_launch_names_the_kernel(launcher):
    from ge2jit.errors import KernelLaunchError

    def fail(*args):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    launcher._launch = fail
    with pytest.raises(KernelLaunchError, match="launch of kern failed: CUDA_ERROR_INVALID"):
        launcher.launch((1, 1, 1), (32, 1, 1), 0, 0, **_values(PARAMS))
    with pytest.raises(KernelLaunchError, match="launch of kern failed"):
        launcher.bind((1, 1, 1), (32, 1, 1), 0)(0, **_values(PARAMS))


class _NoContext(Exception):
    status = 201   # CUDA_ERROR_INVALID_CONTEXT, as CuPy's CUDADriverError carries it


@pytest.mark.parametrize("bound", [False, True])
def test_a_thread_without_a_context_gets_it_current_and_the_launch_retried(launcher, cupy,
                                                                          monkeypatch, bound):
    """PyTorch's autograd threads may run with no current context (device 0 set without
    one): the first launch there makes the device's primary context current and launches
    again; a second failure is the launch's error."""
    from ge2jit.errors import KernelLaunchError

    calls, set_to = [], []
    _recording(launcher, calls)
    recorded = launcher._launch

    def first_fails(*args):
        if not set_to:
            raise _NoContext("CUDA_ERROR_INVALID_CONTEXT: invalid device context")
        recorded(*args)

    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 3)
    monkeypatch.setattr(cupy.cuda.runtime, "setDevice", set_to.append)
    values = _values(PARAMS)
    launcher._launch = first_fails
    run = (launcher.bind((1, 1, 1), (32, 1, 1), 0) if bound
           else functools.partial(launcher.launch, (1, 1, 1), (32, 1, 1), 0))
    run(0, **values)
    assert set_to == [3] and len(calls) == 1

    def always(*args):
        raise _NoContext("CUDA_ERROR_INVALID_CONTEXT: invalid device context")

    launcher._launch = always
    run = (launcher.bind((1, 1, 1), (32, 1, 1), 0) if bound
           else functools.partial(launcher.launch, (1, 1, 1), (32, 1, 1), 0))
    with pytest.raises(KernelLaunchError, match="launch of kern failed: CUDA_ERROR_INVALID_CON"):
        run(0, **values)
    assert set_to == [3, 3]


@pytest.mark.parametrize("name", ["in", "_x", "2d", "a b"])
def test_parameter_names_are_identifiers_of_c_and_python(name):
    with pytest.raises(ValueError, match="expected an identifier"):
        Param(name, Kind.INT64)


def test_pointers_and_only_pointers_take_a_c_type():
    assert pointer("x", "f16_t", const=True).declaration == "const f16_t* __restrict__ x"
    assert Param("n", Kind.INT64).declaration == "long long n"
    with pytest.raises(ValueError, match="pointers, and only they"):
        Param("x", Kind.POINTER)
    with pytest.raises(ValueError, match="pointers, and only they"):
        Param("n", Kind.INT64, "long")


def test_a_spec_without_params_says_so():
    @dataclass(frozen=True)
    class Bare(KernelSpec):
        template = "gemm/dbias.cu"

    with pytest.raises(NotImplementedError, match="Bare declares no kernel parameters"):
        Bare().param_list()
