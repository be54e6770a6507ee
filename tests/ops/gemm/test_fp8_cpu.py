"""8-bit inputs without a GPU: the epilogue's scale fields, kernel names and parameters, the
kernels kernel_set makes (K-major copies, float32 sums, no staging of 8-bit Y), the heuristic
and candidates, and the one-line refusals."""

from __future__ import annotations

import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout, Scale
from ge2jit.ops.gemm.problem import check_out_dtype, check_precision
from ge2jit.ops.gemm.select import candidates, check_config, heuristic, kernel_set, staged
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    TILED_CONFIGS,
    WGMMA_FP8_CONFIGS,
    WGMMA_FP8_FAST_CONFIGS,
    DType,
    MmaGemmSpec,
    Precision,
    TiledGemmSpec,
    TransposeSpec,
    WgmmaGemmSpec,
)
from ge2jit.runtime.dtypes import FP8_DTYPES

E4M3, E5M2, BF16, F32 = DType.E4M3, DType.E5M2, DType.BF16, DType.F32
ALIGNED = (16, 16, 16, 16)


def test_the_formats():
    assert (E4M3.itemsize, E4M3.ctype, E4M3.numpy_name, E4M3.largest) == (
        1, "e4m3_t", "float8_e4m3fn", 448.0)
    assert (E5M2.numpy_name, E5M2.largest, E5M2.is_fp8, BF16.is_fp8) == (
        "float8_e5m2", 57344.0, True, False)
    assert {d.numpy_dtype.name for d in FP8_DTYPES.values()} == set(FP8_DTYPES)


def test_epilogue_scale_fields_and_names():
    ep = Epilogue(out_dtype=E4M3, act=Act.GELU, scale_a=Scale.ROW, scale_b=Scale.COL,
                  scale_y=True, amax=True)
    assert ep.scaled and ep.name(E4M3) == "_gelu_nobias_sar_sbc_sy_amax"
    assert Epilogue(out_dtype=BF16, scale_a=Scale.TENSOR).name(E5M2) == \
        "_none_nobias_obf16_sat"
    names = [p.name for p in Epilogue(out_dtype=BF16).params(E4M3)]
    assert names[-7:] == ["scale_a", "scale_a_stride", "scale_b", "scale_b_stride", "scale_y",
                          "amax", "y_scale_"]
    assert "scale_a" not in [p.name for p in Epilogue(out_dtype=BF16).params(BF16)]


@pytest.mark.parametrize("fields, match", [
    (dict(out_dtype=BF16, scale_a=Scale.COL), "scale_a is per tensor or per row"),
    (dict(out_dtype=BF16, scale_b=Scale.ROW), "scale_a is per tensor or per row"),
    (dict(out_dtype=BF16, scale_y=True), "scale_y: Y's scale applies to an 8-bit output"),
    (dict(out_dtype=E4M3, save_z=True), "save_z: Z of an 8-bit output"),
    (dict(out_dtype=BF16, amax=True, glu=True), "plain epilogues'"),
])
def test_epilogue_refusals(fields, match):
    with pytest.raises(ArgumentValueError, match=match):
        Epilogue(**fields)


def test_kernel_set_of_8bit_inputs():
    ep = Epilogue(out_dtype=BF16, act=Act.SILU, bias=BiasKind.COL, bias_dtype=BF16,
                  scale_a=Scale.ROW, scale_b=Scale.TENSOR, amax=True)
    ks = kernel_set(E4M3, Layout.ROW, Layout.COL, ep, WGMMA_FP8_CONFIGS[0], 1, 4096, ALIGNED)
    assert ks.main.promote and ks.main.tma_store and (ks.prep_a, ks.prep_b) == (None, None)
    assert ks.main.kernel_name.startswith("gemm_e4m3_rc_wgmma_128x192_s4_yt_p_silu")
    fast = kernel_set(E4M3, Layout.ROW, Layout.COL, ep, WGMMA_FP8_FAST_CONFIGS[0], 1, 4096,
                      ALIGNED, Precision.FAST_ACCUM)
    assert not fast.main.promote
    # other layouts and unaligned rows: copies into K-major, 16-byte aligned rows
    ks = kernel_set(E5M2, Layout.COL, Layout.ROW, ep, WGMMA_FP8_CONFIGS[1], 1, 100, ALIGNED)
    assert (ks.prep_a, ks.prep_b) == (TransposeSpec(E5M2), TransposeSpec(E5M2))
    assert (ks.main.layout_a, ks.main.layout_b) == (Layout.ROW, Layout.COL)
    ks = kernel_set(E4M3, Layout.ROW, Layout.COL, ep, WGMMA_FP8_CONFIGS[1], 1, 100,
                    (8, 16, 16, 16))
    assert ks.prep_a == TransposeSpec(E4M3, False) and ks.prep_b is None
    assert ks.prep_a.kernel_name == "copy_e4m3"
    assert staged(E4M3, "rc", aligns=(16, 1, 16, 16)) == (False, True)
    # 8-bit Y is staged and stored by TMA (64-byte rows) where its rows are 16-byte aligned,
    # else it leaves from the registers, in pairs where its rows allow
    ep8 = Epilogue(out_dtype=E4M3, act=Act.GELU, scale_y=True, amax=True)
    main = kernel_set(E4M3, Layout.ROW, Layout.COL, ep8, WGMMA_FP8_CONFIGS[0], 1, 256,
                      ALIGNED).main
    assert (main.store16, main.tma_store) == (True, True)
    assert "_yt_p_gelu" in main.kernel_name
    main = kernel_set(E4M3, Layout.ROW, Layout.COL, ep8, WGMMA_FP8_CONFIGS[0], 1, 256,
                      (16, 16, 2, 16)).main
    assert (main.store16, main.vec_y) == (False, True)
    main = kernel_set(E4M3, Layout.ROW, Layout.COL, ep8, WGMMA_FP8_CONFIGS[0], 1, 256,
                      (16, 16, 1, 16)).main
    assert not main.vec_y


def test_refusals_of_8bit_kernels():
    ep = Epilogue(out_dtype=BF16)
    with pytest.raises(ArgumentValueError, match="take no split of K"):
        kernel_set(E4M3, Layout.ROW, Layout.COL, ep, WGMMA_FP8_CONFIGS[1], 2, 8192, ALIGNED)
    with pytest.raises(ArgumentValueError, match="8-bit inputs run on the Hopper kernel"):
        TiledGemmSpec(E4M3, Layout.ROW, Layout.COL, ep, TILED_CONFIGS[0])
    with pytest.raises(ArgumentValueError, match="8-bit inputs run on the Hopper kernel"):
        MmaGemmSpec(E4M3, Layout.ROW, Layout.COL, ep, MMA_16BIT_CONFIGS[0])
    with pytest.raises(ArgumentValueError, match="K-major operands"):
        WgmmaGemmSpec(E4M3, Layout.COL, Layout.COL, ep, WGMMA_FP8_CONFIGS[1])
    with pytest.raises(ArgumentValueError, match="belong to 8-bit inputs"):
        WgmmaGemmSpec(BF16, Layout.ROW, Layout.COL, Epilogue(out_dtype=BF16, amax=True),
                      WGMMA_FP8_CONFIGS[1])
    with pytest.raises(ArgumentValueError, match="float32 sums need"):
        WgmmaGemmSpec(E4M3, Layout.ROW, Layout.COL, ep, WGMMA_FP8_FAST_CONFIGS[0],
                      promote=True)
    with pytest.raises(ArgumentValueError, match=r"a: float8_e4m3fn inputs run on Hopper"):
        check_config(WGMMA_FP8_CONFIGS[1], "sm_80", E4M3, Precision.IEEE)
    with pytest.raises(ArgumentValueError, match="'mma_' configs|Hopper kernel's"):
        check_config(MMA_16BIT_CONFIGS[0], "sm_90", E4M3, Precision.IEEE)


def test_heuristic_and_candidates():
    assert heuristic(8192, 8192, 8192, 132, 90, "rc", E4M3).config.name == "wgmma_192x128_s4"
    assert heuristic(512, 512, 8192, 132, 90, "rc", E4M3).config.name == "wgmma_64x128_s8"
    fast = heuristic(4096, 4096, 4096, 132, 90, "rc", E4M3, Precision.FAST_ACCUM)
    assert fast.config.name == "wgmma_64x256_s4_pp"
    small = heuristic(512, 512, 8192, 132, 90, "rc", E5M2, Precision.FAST_ACCUM)
    assert small.split_k == 1
    assert {c for c, _ in candidates(4096, 4096, 4096, 90, E4M3)} == set(WGMMA_FP8_CONFIGS)
    assert all(s == 1 for _, s in candidates(256, 256, 65536, 90, E4M3, Precision.FAST_ACCUM))
    assert candidates(4096, 4096, 4096, 80, E4M3) == []


def test_output_types_and_precisions():
    assert check_out_dtype(None, E4M3, None) is BF16
    assert check_out_dtype("float8_e5m2", E4M3, None) is E5M2
    assert check_out_dtype("float32", E5M2, None) is F32
    with pytest.raises(ArgumentValueError, match="out_dtype: expected bfloat16 or float16 or "
                                                 "float32 or float8_e4m3fn or float8_e5m2"):
        check_out_dtype("int8", E4M3, None)
    with pytest.raises(ArgumentValueError, match="out_dtype: expected bfloat16 or float32"):
        check_out_dtype("float8_e4m3fn", BF16, None)
    assert check_precision(None, E4M3) is Precision.IEEE
    assert check_precision("fast_accum", E5M2) is Precision.FAST_ACCUM
    with pytest.raises(ArgumentValueError, match="precision: 'fast_accum' applies to 8-bit"):
        check_precision("fast_accum", BF16)
    with pytest.raises(ArgumentValueError, match="precision: expected 'ieee'"):
        check_precision("tf32x3", E4M3)
