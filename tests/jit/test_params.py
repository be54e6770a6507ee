"""Kernel parameters declared once: every template's ``extern "C"`` signature is its spec's
``params``."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from ge2jit.jit.params import Kind, Param, pointer
from ge2jit.jit.render import render
from ge2jit.jit.spec import KernelSpec
from ge2jit.ops.gemm import spec as g
from ge2jit.ops.optim import UpdateSpec

R, C = g.Layout.ROW, g.Layout.COL
F32, F16, BF16 = g.DType.F32, g.DType.F16, g.DType.BF16
NONE, ROW, COL, SCALAR = g.BiasKind.NONE, g.BiasKind.ROW, g.BiasKind.COL, g.BiasKind.SCALAR
Act = g.Act
WG = g.WGMMA_CONFIGS[0]


def _wgmma(dtype, la=R, lb=C, lc=None, **kw):
    return g.WgmmaGemmSpec(dtype, la, lb, lc, Act.NONE, COL, False, WG, **kw)


SPECS = [
    *(g.GemmSpec(d, R, C, lc, Act.RELU, b, z, g.SIMT_F32_TILES[0], out_dtype=o)
      for d in g.DType for lc, b, z, o in ((None, NONE, False, None), (C, ROW, True, F32))),
    g.GemmSpec(F16, R, R, R, Act.NONE, NONE, False, g.SIMT_F32_TILES[1], gate=Act.GELU),
    *(g.PipelinedGemmSpec(F32, C, R, lc, Act.GELU, COL, False, g.PIPELINED_F32_CONFIGS[0],
                          True, True, True, split)
      for lc, split in ((R, False), (None, True))),
    *(g.MmaGemmSpec(d, R, C, C, Act.SILU, SCALAR, True, cfg, c_dtype=F32)
      for d, cfg in ((F16, g.MMA_16BIT_CONFIGS[0]), (BF16, g.MMA_16BIT_CONFIGS[2]),
                     (F32, g.MMA_TF32_CONFIGS[0]))),
    _wgmma(BF16),                                       # 4 tensor maps (TMA stores of Y, Z)
    _wgmma(F16, C, R, store16=False),                   # 2
    _wgmma(F16, out_dtype=F32),                         # 2: float32 Y leaves without TMA
    _wgmma(F32),
    _wgmma(BF16, split_k=True),
    g.WgmmaGemmSpec(BF16, R, C, R, Act.NONE, NONE, False, WG, gate=Act.GELU,
                    bgrad=True),                        # the bias pointer is bgrad's output
    *(g.SplitKReduceSpec(d, lc, Act.TANH, b, z, v, bias_dtype=F32)
      for d in g.DType for lc, b, z, v in ((None, NONE, False, True), (C, ROW, True, False))),
    *(g.TransposeSpec(d) for d in g.DType),
    *(g.Tf32SplitSpec(t, o) for t in (False, True) for o in ("hhl", "hlh")),
    g.DzSpec(Act.GELU, False, COL, BF16, F32, BF16),
    g.DzSpec(Act.RELU, True, SCALAR, F16, F16, F16, write_dc=True, dc_dtype=F32, vec=True),
    g.DzSpec(Act.NONE, False, ROW, F32, F32, F32, write_dz=False, write_dc=True,
             dc_dtype=BF16),
    *(g.DbiasSpec(d, total) for d in g.DType for total in (False, True)),
    *(UpdateSpec(rule, grad, copy, nesterov) for rule, grad, copy, nesterov in (
        ("adam", F32, None, False), ("adam", BF16, BF16, False), ("sgd", F16, None, False),
        ("sgd", F32, F16, True))),
]

_SIGNATURE = re.compile(
    r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*(\w+)\(([^)]*)\)')
_SCALARS = {"long long": Kind.INT64, "double": Kind.DOUBLE,
            "const __grid_constant__ TensorMap": Kind.TENSOR_MAP}


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


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernel_name)
def test_signature_is_the_specs_params(spec):
    source = render(spec)
    name, declared = _declared(source)
    assert name == spec.kernel_name
    assert declared == list(spec.params)
    if any(p.kind is Kind.TENSOR_MAP for p in declared):
        assert "struct __align__(64) TensorMap { unsigned long long opaque[16]; };" in source


def test_the_gemm_families_share_one_layout_after_their_tensor_maps():
    def layout_of(spec):
        return [(p.name, p.kind) for p in spec.params if p.kind is not Kind.TENSOR_MAP]

    gemms = [s for s in SPECS if isinstance(s, (g.GemmSpec, g.PipelinedGemmSpec, g.MmaGemmSpec,
                                                g.WgmmaGemmSpec))]
    assert len({tuple(layout_of(s)) for s in gemms}) == 1
    maps = {(s.tma_store, tuple(p.name for p in s.params if p.kind is Kind.TENSOR_MAP))
            for s in gemms if isinstance(s, g.WgmmaGemmSpec)}
    assert maps == {(False, ("tma_a", "tma_b")), (True, ("tma_a", "tma_b", "tma_y", "tma_z"))}


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
