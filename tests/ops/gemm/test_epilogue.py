"""The GEMM epilogue as one value: its checks (one line naming the field, what was expected
and what came), its part of the kernel names, its kernel parameters, equality and hashing;
and the specs that carry it, which refuse an inconsistent combination instead of changing it
(kernel_set chooses the fields). No GPU needed."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.ops.gemm.epilogue import (
    ACTS_FROM_Y,
    PARTIAL_SUMS,
    Act,
    BiasKind,
    Epilogue,
    Layout,
)
from ge2jit.ops.gemm.select import kernel_set
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    WGMMA_CONFIGS,
    DType,
    MmaGemmSpec,
    PipelinedGemmSpec,
    SplitKReduceSpec,
    TiledGemmSpec,
    WgmmaGemmSpec,
)

F32, F16, BF16 = DType.F32, DType.F16, DType.BF16
R, C = Layout.ROW, Layout.COL


def gated(gate=Act.GELU, **kw) -> Epilogue:
    """A gating epilogue of bfloat16 inputs with a row-major C."""
    return Epilogue(**{"out_dtype": BF16, "layout_c": R, "c_dtype": BF16, "gate": gate, **kw})


# --- the checks --------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("out_dtype", "f32", "DType"), ("out_dtype", None, "DType"), ("act", "relu", "Act"),
    ("bias", None, "BiasKind"), ("bias_dtype", "f32", "DType or None"),
    ("layout_c", "r", "Layout or None"), ("c_dtype", 4, "DType or None"),
    ("save_z", 1, "bool"), ("gate", "gelu", "Act or None"), ("gate_from_y", None, "bool"),
    ("bgrad", "yes", "bool"),
])
def test_each_field_has_its_type(field, value, expected):
    with pytest.raises(TypeError) as info:
        Epilogue(**{"out_dtype": F32, field: value})
    assert str(info.value) == f"Epilogue.{field}: expected {expected}, got {value!r}"


@pytest.mark.parametrize("fields, message", [
    (dict(bias=BiasKind.COL),
     "Epilogue.bias_dtype: expected a DType with bias 'colbias' and None without a bias, got "
     "None"),
    (dict(bias_dtype=F32),
     "Epilogue.bias_dtype: expected a DType with bias 'nobias' and None without a bias, got "
     "<DType.F32: 'f32'>"),
    (dict(layout_c=C),
     "Epilogue.c_dtype: expected a DType with a C term (layout_c given) and None without one, "
     "got None with layout_c <Layout.COL: 'c'>"),
    (dict(c_dtype=F16),
     "Epilogue.c_dtype: expected a DType with a C term (layout_c given) and None without one, "
     "got <DType.F16: 'f16'> with layout_c None"),
    (dict(gate_from_y=True), "Epilogue.gate_from_y: expected False without a gate, got True"),
    (dict(bgrad=True),
     "Epilogue.bgrad: the column sums are a gated output's; expected False without a gate, "
     "got True"),
])
def test_types_of_what_is_not_there_and_flags_without_a_gate_are_refused(fields, message):
    with pytest.raises(ArgumentValueError) as info:
        Epilogue(out_dtype=F32, **fields)
    assert str(info.value) == message


@pytest.mark.parametrize("fields", [
    dict(act=Act.RELU), dict(bias=BiasKind.ROW, bias_dtype=BF16), dict(save_z=True),
    dict(layout_c=None, c_dtype=None),
])
def test_a_gate_reads_c_and_takes_nothing_else(fields):
    with pytest.raises(ArgumentValueError, match=r"^Epilogue: a gate \(Y = alpha \* A @ B \* "
                       r"act'\(C\)\) reads C and takes no activation, bias or saved Z$"):
        gated(**fields)


@pytest.mark.parametrize("gate", list(Act))
def test_a_gate_from_y_needs_a_derivative_in_terms_of_y(gate):
    if gate in ACTS_FROM_Y:
        assert gated(gate, gate_from_y=True).gate_from_y
    else:
        with pytest.raises(ArgumentValueError, match=f"^Epilogue: act '{gate.value}' has no "
                           "derivative in terms of its output$"):
            gated(gate, gate_from_y=True)


# --- the name ----------------------------------------------------------------------------

@pytest.mark.parametrize("epilogue, dtype, name", [
    (Epilogue(out_dtype=F32), F32, "_none_nobias"),
    (PARTIAL_SUMS, BF16, "_none_nobias_of32"),
    (Epilogue(out_dtype=F16, act=Act.GELU_TANH, bias=BiasKind.COL, bias_dtype=F16), F16,
     "_gelu_tanh_colbias"),
    (Epilogue(out_dtype=F32, act=Act.GELU, bias=BiasKind.COL, bias_dtype=BF16, layout_c=R,
              c_dtype=F32, save_z=True), BF16, "_gelu_colbias_crf32_of32_z"),
    (Epilogue(out_dtype=BF16, act=Act.SILU, bias=BiasKind.SCALAR, bias_dtype=F32, layout_c=C,
              c_dtype=BF16), BF16, "_silu_scalarbiasf32_cc"),
    (Epilogue(out_dtype=F32, act=Act.LEAKY_RELU, bias=BiasKind.ROW, bias_dtype=F32,
              save_z=True), F32, "_leaky_relu_rowbias_z"),
    (gated(), BF16, "_none_nobias_gzgelu_cr"),
    (gated(Act.SIGMOID, gate_from_y=True, c_dtype=F32), BF16, "_none_nobias_gysigmoid_crf32"),
    (gated(Act.RELU, gate_from_y=True, bgrad=True, layout_c=C), BF16,
     "_none_nobias_gyrelu_cc_bg"),
])
def test_name_part(epilogue, dtype, name):
    assert epilogue.name(dtype) == name


def test_kernel_names_are_the_families_parts_then_the_epilogues():
    epilogue = Epilogue(out_dtype=F32, act=Act.GELU, bias=BiasKind.COL, bias_dtype=BF16,
                        layout_c=R, c_dtype=F32, save_z=True)
    assert (TiledGemmSpec(BF16, R, C, epilogue, TILED_CONFIGS[0]).kernel_name ==
            "gemm_bf16_rc_128x128x8_8x8_gelu_colbias_crf32_of32_z")
    assert (SplitKReduceSpec(BF16, epilogue, True).kernel_name ==
            "gemm_splitk_reduce_bf16_gelu_colbias_crf32_of32_z_v4")
    hopper = WgmmaGemmSpec(BF16, R, C, gated(bgrad=True), WGMMA_CONFIGS[1])
    assert hopper.kernel_name == "gemm_bf16_rc_wgmma_128x128_s6_pp_yt_none_nobias_gzgelu_cr_bg"
    split = WgmmaGemmSpec(BF16, R, C, PARTIAL_SUMS, WGMMA_CONFIGS[0], split_k=True)
    assert split.kernel_name == "gemm_bf16_rc_wgmma_128x256_s4_y16_splitk"


# --- parameters, equality, immutability --------------------------------------------------

def test_params_type_an_absent_c_and_bias_as_the_inputs():
    decls = [p.declaration for p in Epilogue(out_dtype=F32).params(BF16)]
    assert decls == ["const bf16_t* __restrict__ C", "long long ldc",
                     "const bf16_t* __restrict__ bias", "long long bias_stride",
                     "float* __restrict__ Y", "long long ldy", "float* __restrict__ Z",
                     "long long ldz"]
    decls = [p.declaration for p in gated(bgrad=True, c_dtype=F32).params(BF16)]
    assert decls[0] == "const float* __restrict__ C"
    assert decls[2] == "float* __restrict__ bias", "bgrad writes its sums there"


def test_equal_epilogues_are_one_key():
    a = Epilogue(out_dtype=F16, act=Act.RELU, layout_c=R, c_dtype=F32)
    b = Epilogue(out_dtype=F16, act=Act.RELU, layout_c=R, c_dtype=F32)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != dataclasses.replace(a, save_z=True)
    assert len({a, b, dataclasses.replace(a, c_dtype=F16)}) == 2
    assert PARTIAL_SUMS == Epilogue(out_dtype=F32)


def test_an_epilogue_is_immutable():
    e = Epilogue(out_dtype=F32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.act = Act.RELU
    with pytest.raises(TypeError):
        Epilogue(F32)   # keyword-only: fields by name


# --- specs refuse what they cannot run, kernel_set chooses ------------------------------

def test_only_the_hopper_kernel_sums_columns():
    sums = gated(bgrad=True)
    with pytest.raises(ArgumentValueError, match="^MmaGemmSpec: bgrad sums a gated epilogue's "
                       r"staged blocks: only the Hopper kernel \(WgmmaGemmSpec\) stages them; "
                       "expected an epilogue without bgrad$"):
        MmaGemmSpec(BF16, R, C, sums, MMA_16BIT_CONFIGS[0])
    with pytest.raises(ArgumentValueError, match="^SplitKReduceSpec.epilogue: bgrad"):
        SplitKReduceSpec(BF16, sums, True)
    with pytest.raises(ArgumentValueError, match="it needs a gate and store16, not split-K"):
        WgmmaGemmSpec(BF16, R, C, sums, WGMMA_CONFIGS[0], store16=False)
    for wide in (c for c in WGMMA_CONFIGS if c.bn == 256):
        with pytest.raises(ArgumentValueError, match="narrower than 256 columns"):
            WgmmaGemmSpec(BF16, R, C, sums, wide, store16=not wide.pingpong)
        assert WgmmaGemmSpec(BF16, R, C, sums, wide, c_tma=True).can_bgrad   # C in the ring


def test_a_staged_epilogue_that_would_spill_is_refused_and_not_chosen():
    """The 64x256 ping-pong tile with a gate spills registers when staged with C read from
    memory: the spec refuses store16 there and kernel_set stores unstaged; with C through the
    ring it fits, and makes the column sums too."""
    from ge2jit.ops.gemm.select import _wgmma_heuristic

    pp256 = next(c for c in WGMMA_CONFIGS if c.pingpong and c.bn == 256)
    with pytest.raises(ArgumentValueError, match=r"^WgmmaGemmSpec.store16: wgmma_64x256_s4_pp "
                                                 "with a gate spills registers"):
        WgmmaGemmSpec(BF16, R, C, gated(), pp256)
    ks = kernel_set(BF16, R, C, gated(), pp256, 1, 4096, (16, 16, 16, 8))
    assert not ks.main.store16 and ks.main.vec_y
    ks = kernel_set(BF16, R, C, gated(bgrad=True), pp256, 1, 4096, (16, 16, 16, 16))
    assert ks.main.store16 and ks.main.c_tma and ks.main.epilogue.bgrad
    assert kernel_set(BF16, R, C, Epilogue(out_dtype=BF16), pp256, 1, 4096,
                      (16, 16, 16, 16)).main.store16   # no gate: staged as before
    for m, n, k in itertools.product((1024, 4096, 16384), (1024, 4096, 8192),
                                     (1024, 2048, 4096, 8192)):
        for sms in (66, 114, 132):
            assert _wgmma_heuristic(m, n, k, sms, True).config.name != pp256.name, (m, n, k)


def test_split_k_slices_take_the_partial_sums_epilogue():
    relu = Epilogue(out_dtype=F32, act=Act.RELU)
    with pytest.raises(ArgumentValueError, match=r"^WgmmaGemmSpec.epilogue: split-K slices "
                       r"store raw float32 partial products \(SplitKReduceSpec applies the "
                       r"epilogue\); expected PARTIAL_SUMS, got Epilogue\(out_dtype="):
        WgmmaGemmSpec(BF16, R, C, relu, WGMMA_CONFIGS[0], split_k=True)
    cfg = PIPELINED_F32_CONFIGS[0]
    with pytest.raises(ArgumentValueError, match="^PipelinedGemmSpec.epilogue: split-K"):
        PipelinedGemmSpec(F32, R, R, relu, cfg, vec_y=True, split_k=True)
    with pytest.raises(ArgumentValueError, match="^PipelinedGemmSpec.vec_y: split-K slices go "
                       "to a workspace of 16-byte rows in 16-byte stores; expected True with "
                       "split_k, got False$"):
        PipelinedGemmSpec(F32, R, R, PARTIAL_SUMS, cfg, split_k=True)


def test_hopper_staging_and_pipelined_copies_are_refused_where_they_cannot_run():
    with_c = Epilogue(out_dtype=BF16, layout_c=R, c_dtype=BF16)
    with pytest.raises(ArgumentValueError, match="^WgmmaGemmSpec.store16: reading C with the "
                       "accumulators leaves too few registers for the staging .* expected "
                       "False with layout_c 'r', no gate and no c_tma, got True$"):
        WgmmaGemmSpec(BF16, R, C, with_c, WGMMA_CONFIGS[0])
    assert not WgmmaGemmSpec(BF16, R, C, with_c, WGMMA_CONFIGS[0], store16=False).store16
    assert WgmmaGemmSpec(BF16, R, C, with_c, WGMMA_CONFIGS[0], c_tma=True).store16
    for ep, kw in ((with_c, {"store16": False}), (dataclasses.replace(with_c, layout_c=C), {}),
                   (Epilogue(out_dtype=BF16), {})):
        with pytest.raises(ArgumentValueError, match="^WgmmaGemmSpec.c_tma: C arrives by TMA "
                           "for the staged epilogue of a row-major C; expected False unless"):
            WgmmaGemmSpec(BF16, R, C, ep, WGMMA_CONFIGS[0], c_tma=True, **kw)
    with pytest.raises(ArgumentValueError, match="^WgmmaGemmSpec.vec_y: store16 stores whole "
                       "16-byte segments; expected True with store16, got False$"):
        WgmmaGemmSpec(BF16, R, C, Epilogue(out_dtype=BF16), WGMMA_CONFIGS[0], vec_y=False)
    plain, cfg = Epilogue(out_dtype=F32), PIPELINED_F32_CONFIGS[0]
    with pytest.raises(ArgumentValueError, match="^PipelinedGemmSpec.vec_a: .*expected False "
                       "with row-major A, got True$"):
        PipelinedGemmSpec(F32, R, R, plain, cfg, vec_a=True)
    with pytest.raises(ArgumentValueError, match="^PipelinedGemmSpec.vec_b: .*expected False "
                       "with column-major B, got True$"):
        PipelinedGemmSpec(F32, R, C, plain, cfg, vec_b=True)


def test_kernel_set_chooses_each_specs_fields_once():
    with_c = Epilogue(out_dtype=BF16, act=Act.GELU, layout_c=R, c_dtype=BF16)
    # C whose rows TMA can copy arrives through the ring, and the epilogue is staged
    ks = kernel_set(BF16, R, C, with_c, WGMMA_CONFIGS[0], 1, 4096, (16, 16, 16, 16))
    assert ks.main.epilogue == with_c and ks.main.store16 and ks.main.c_tma
    assert ks.main.kernel_name.endswith("_ct" + with_c.name(BF16))
    assert [p.name for p in ks.main.params[:5]] == ["tma_a", "tma_b", "tma_y", "tma_z", "tma_c"]
    # else C is read with the accumulators, unstaged
    ks = kernel_set(BF16, R, C, with_c, WGMMA_CONFIGS[0], 1, 4096, (16, 16, 16, 2))
    assert not ks.main.store16 and not ks.main.c_tma and ks.main.vec_y
    column_c = dataclasses.replace(with_c, layout_c=C)
    ks = kernel_set(BF16, R, C, column_c, WGMMA_CONFIGS[0], 1, 4096, (16, 16, 16, 16))
    assert not ks.main.store16 and not ks.main.c_tma
    # a gate's C: through the ring when it can, else read after staging
    ks = kernel_set(BF16, R, C, gated(), WGMMA_CONFIGS[1], 1, 4096, (16, 16, 16, 16))
    assert ks.main.store16 and ks.main.c_tma
    ks = kernel_set(BF16, R, C, gated(), WGMMA_CONFIGS[1], 1, 4096, (16, 16, 16, 8))
    assert ks.main.store16 and not ks.main.c_tma
    # the slices store partial sums; the reduction applies the problem's epilogue
    ks = kernel_set(BF16, R, C, with_c, WGMMA_CONFIGS[0], 2, 4096, (16, 16, 16, 16))
    assert ks.main.epilogue == PARTIAL_SUMS and ks.main.store16
    assert ks.reduce.epilogue == with_c
    ks = kernel_set(F32, R, R, Epilogue(out_dtype=F32), PIPELINED_F32_CONFIGS[0], 2, 4096,
                    (16, 16, 4, 16))
    assert (ks.main.vec_a, ks.main.vec_b, ks.main.vec_y) == (False, True, True)
    assert ks.reduce.vec_y is False
    # the column sums: asked by the problem's epilogue, made by the Hopper kernel where it can
    # (not by the 256-wide Hopper tiles: their staged sums spill registers)
    made_by = {c.name: True for c in WGMMA_CONFIGS}   # (C through the ring: aligned here)
    assert made_by == {"wgmma_128x256_s4": True, "wgmma_64x256_s4_pp": True,
                       "wgmma_128x128_s6_pp": True, "wgmma_128x128_s6": True,
                       "wgmma_128x64_s8": True, "wgmma_64x128_s8": True}
    for cfg, made in (*((c, made_by[c.name]) for c in WGMMA_CONFIGS),
                      (MMA_16BIT_CONFIGS[0], False), (TILED_CONFIGS[0], False)):
        ks = kernel_set(BF16, R, C, gated(bgrad=True), cfg, 1, 4096, (16, 16, 16, 16))
        assert ks.main.epilogue == gated(bgrad=made), cfg.name
