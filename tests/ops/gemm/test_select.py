"""Kernel choice without a GPU: config names, candidates and the shape heuristic."""

from __future__ import annotations

import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.ops.gemm.select import (
    FALLBACK_TILE,
    Choice,
    candidates,
    check_config,
    heuristic,
    parse_config,
)
from ge2jit.ops.gemm.spec import (
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    DType,
    PipelineConfig,
    Precision,
    TileConfig,
)


def test_parse_config_names():
    cfg = PIPELINED_F32_CONFIGS[0]
    assert parse_config(cfg.name) == (cfg, 1)
    assert parse_config(cfg.name + "_k4") == (cfg, 4)
    assert parse_config(cfg) == (cfg, 1)
    assert parse_config("64x64x8_4x4") == (TileConfig(64, 64, 8, 4, 4), 1)
    assert parse_config(Choice(cfg, 3)) == (cfg, 3)
    assert PipelineConfig.parse("128x128x8_w32x64_s3_l4_b2") == PipelineConfig(
        128, 128, 8, 32, 64, 3, lanes_n=4, min_blocks=2)


@pytest.mark.parametrize("args, match", [
    ((128, 128, 8, 48, 64, 3), "multiples of wm"),
    ((128, 128, 12, 32, 64, 3), "bk must be a multiple of 8"),
    ((128, 128, 8, 32, 64, 1), "stages"),
    ((64, 64, 8, 32, 8, 3), "4x4 sub-tiles"),
])
def test_pipeline_config_validation(args, match):
    with pytest.raises(ValueError, match=match):
        PipelineConfig(*args)


def test_every_candidate_name_round_trips():
    for cfg in PIPELINED_F32_CONFIGS:
        assert PipelineConfig.parse(cfg.name) == cfg
    for cfg, split in candidates(8192, 64, 4096, 90):
        assert parse_config(Choice(cfg, split).name) == (cfg, split)


def test_candidates():
    big = candidates(4096, 4096, 4096, 90)
    assert {c for c, _ in big} == set(PIPELINED_F32_CONFIGS)
    assert all(s == 1 for _, s in big), "no split-K where M*N fills the GPU"
    skinny = candidates(8192, 64, 4096, 90)
    assert any(s > 1 for _, s in skinny)
    assert candidates(100, 100, 100, 75) == [(t, 1) for t in TILED_CONFIGS]


def test_heuristic():
    assert heuristic(4096, 4096, 4096, 132, 90).config.name == "128x128x8_w32x64_s3"
    assert heuristic(4096, 4096, 4096, 132, 90, "cr").config.name == "128x128x16_w32x64_s2"
    assert heuristic(4096, 4096, 4096, 132, 90, "rc").config.name == "128x128x8_w32x64_s4"
    mid = heuristic(2048, 1024, 1024, 132, 90)
    assert mid.config.bm * mid.config.bn < 128 * 128 and mid.split_k == 1
    skinny = heuristic(8192, 64, 4096, 132, 90)
    assert skinny.split_k > 1 and "split" in skinny.detail
    small = heuristic(64, 64, 64, 132, 90)
    assert small.split_k == 1
    old = heuristic(4096, 4096, 4096, 40, 75)
    assert old.reason == "fallback" and old.family == "tiled"
    assert heuristic(10, 10, 10, 40, 75).config == FALLBACK_TILE
    assert "heuristic" in str(mid)


def test_tensor_core_heuristic_and_candidates():
    from ge2jit.ops.gemm.spec import DType, MmaConfig, Precision, WgmmaConfig

    big = heuristic(4096, 4096, 4096, 132, 90, "rr", DType.BF16)
    assert isinstance(big.config, WgmmaConfig) and big.config.name == "wgmma_128x256_s4"
    # (M, N, K, dtype) -> the Hopper config the heuristic takes with 132 SMs
    for (m, n, k, dtype), want in {
        (16384, 1024, 4096, DType.BF16): "wgmma_128x256_s4",
        (2048, 2048, 2048, DType.BF16): "wgmma_128x256_s4",
        (2048, 2048, 512, DType.BF16): "wgmma_128x128_s6_pp",
        (8192, 16384, 4096, DType.BF16): "wgmma_128x256_s4",
        (8192, 1024, 1024, DType.F16): "wgmma_128x256_s4",
        (4096, 4096, 64, DType.F16): "wgmma_128x128_s6_pp",
        (512, 1024, 4096, DType.F16): "wgmma_64x128_s8",
        (1024, 1024, 16384, DType.BF16): "wgmma_128x128_s6_k2",
    }.items():
        got = heuristic(m, n, k, 132, 90, "rr", dtype).name
        assert got == want, ((m, n, k, dtype), got)
    # the gating epilogue (its C through the ring): as ungated
    for (m, n, k), want in {(16384, 4096, 1024): "wgmma_128x256_s4",
                            (4096, 4096, 1024): "wgmma_128x256_s4",
                            (16384, 1024, 4096): "wgmma_128x256_s4",
                            (512, 4096, 1024): "wgmma_128x128_s6"}.items():
        got = heuristic(m, n, k, 132, 90, "rc", DType.BF16, gated=True).name
        assert got == want, ((m, n, k), got)
    a100 = heuristic(4096, 4096, 4096, 108, 80, "rr", DType.F16)
    assert isinstance(a100.config, MmaConfig)
    tf32 = heuristic(4096, 4096, 4096, 132, 90, "rc", DType.F32, Precision.TF32)
    assert isinstance(tf32.config, WgmmaConfig)
    ieee = heuristic(4096, 4096, 4096, 132, 90, "rc", DType.F32, Precision.IEEE)
    assert ieee.family == "pipelined"
    names = [c.name for c, _ in candidates(512, 512, 512, 90, DType.BF16)]
    assert any(n.startswith("wgmma_") for n in names) and any(n.startswith("mma_") for n in names)
    assert not any(n.startswith("wgmma_") for n, _ in
                   ((c.name, s) for c, s in candidates(512, 512, 512, 80, DType.BF16)))


def test_resolve_steps_down_by_layout_and_alignment():
    from ge2jit.ops.gemm.epilogue import Epilogue
    from ge2jit.ops.gemm.select import Choice, kernel_set, resolve, tma_fits
    from ge2jit.ops.gemm.spec import WGMMA_CONFIGS, DType, Layout

    wg = Choice(WGMMA_CONFIGS[0], 1, "heuristic")
    assert resolve(wg, DType.BF16, "cr", (16, 16, 16, 16), 512, 512, 512, 132) is wg
    assert tma_fits((8, 16, 16), DType.BF16, "rr", 64).startswith("TMA needs 16-byte")
    # tf32 operands that are not K-major go through an aligned K-major copy
    assert tma_fits((16, 4, 16), DType.F32, "rr", 64) is None
    assert tma_fits((4, 16, 16), DType.F32, "rr", 64).startswith("TMA needs")
    down = resolve(wg, DType.BF16, "rr", (8, 16, 4), 512, 512, 512, 132)
    assert down.family == "mma" and "TMA needs 16-byte" in down.detail
    assert down.reason == "heuristic"
    fallback = resolve(wg, DType.F16, "rr", (2, 16, 16, 16), 512, 512, 512, 132)
    assert fallback.family == "tiled" and fallback.reason == "fallback"
    assert "not 4-byte aligned" in fallback.detail
    assert resolve(wg, DType.F32, "cr", (4, 4, 16, 16), 512, 512, 512, 132) is wg
    plain = Epilogue(out_dtype=DType.F32)
    ks = kernel_set(DType.F32, Layout.COL, Layout.ROW, plain, WGMMA_CONFIGS[0], 1, 512,
                    (4, 4, 16, 16))
    assert ks.prep_a == ks.prep_b and ks.prep_a.kernel_name == "transpose_f32"
    assert (ks.main.layout_a, ks.main.layout_b) == (Layout.ROW, Layout.COL)
    assert ks.specs == (ks.main, ks.prep_a)
    ks = kernel_set(DType.F32, Layout.ROW, Layout.COL, plain, WGMMA_CONFIGS[0], 1, 512,
                    (16, 16, 16, 16))
    assert ks.prep_a is None and ks.prep_b is None and ks.specs == (ks.main,)


@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
@pytest.mark.parametrize("family", ["wgmma", "mma"])
def test_tf32x3_splits_both_operands_into_k_major_copies(layouts, family):
    from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue
    from ge2jit.ops.gemm.select import Choice, k_parts, kernel_set, resolve
    from ge2jit.ops.gemm.spec import MMA_TF32_CONFIGS, WGMMA_CONFIGS, DType, Layout, Precision

    cfg = WGMMA_CONFIGS[3] if family == "wgmma" else MMA_TF32_CONFIGS[3]
    x3 = Precision.TF32X3
    assert k_parts(x3) == 3 and k_parts(Precision.TF32) == 1
    # any alignment: the split copies are aligned by construction
    ch = Choice(cfg, 1, "heuristic")
    assert resolve(ch, DType.F32, layouts, (4, 4, 4, 16), 300, 500, 70, 132, x3) is ch
    la, lb = Layout(layouts[0]), Layout(layouts[1])
    gelu = Epilogue(out_dtype=DType.F32, act=Act.GELU, bias=BiasKind.COL, bias_dtype=DType.F32)
    ks = kernel_set(DType.F32, la, lb, gelu, cfg, 1, 70, (4, 4, 4, 16), precision=x3)
    assert (ks.main.layout_a, ks.main.layout_b) == (Layout.ROW, Layout.COL)
    assert ks.prep_a.kernel_name == "tf32x3_split_hhl" + ("_t" if layouts[0] == "c" else "")
    assert ks.prep_b.kernel_name == "tf32x3_split_hlh" + ("_t" if layouts[1] == "r" else "")
    assert ks.main.promote and "_p_" in ks.main.kernel_name
    if family == "mma":
        assert (ks.main.copy_a, ks.main.copy_b) == (16, 16)
        with pytest.raises(ArgumentValueError, match="too large for the separate product"):
            kernel_set(DType.F32, la, lb, gelu, MMA_TF32_CONFIGS[0], 1, 70, (4, 4, 4, 16),
                       precision=x3)
    else:   # a config without room for the rounded second set of accumulators is refused
        with pytest.raises(ArgumentValueError, match="too many for the second set"):
            kernel_set(DType.F32, la, lb, gelu, WGMMA_CONFIGS[0], 1, 70, (4, 4, 4, 16),
                       precision=x3)
    # K = 0 reads no operand: nothing to split
    ks0 = kernel_set(DType.F32, la, lb, gelu, MMA_TF32_CONFIGS[3], 1, 0, (4, 4, 4, 16),
                     precision=x3)
    assert ks0.prep_a is None and ks0.prep_b is None
    # the CUDA-core configs stay exact float32
    from ge2jit.ops.gemm.select import FALLBACK_TILE

    ks = kernel_set(DType.F32, la, lb, gelu, FALLBACK_TILE, 1, 70, (4, 4, 4, 16), precision=x3)
    assert ks.prep_a is None and ks.specs == (ks.main,)


def test_tf32x3_heuristic_and_candidates():
    from ge2jit.ops.gemm.spec import WGMMA_X3_CONFIGS, DType, Precision, WgmmaConfig

    x3 = Precision.TF32X3
    assert heuristic(8192, 4096, 1024, 132, 90, "rr", DType.F32, x3).config.name == \
        "wgmma_128x128_s6"
    assert heuristic(1024, 2048, 4096, 132, 90, "rr", DType.F32, x3).config.name == \
        "wgmma_128x128_s6"
    small = heuristic(512, 1024, 4096, 132, 90, "rr", DType.F32, x3)
    assert (small.config.name, small.split_k) == ("wgmma_128x64_s8", 2)
    short = heuristic(512, 1024, 32, 132, 90, "rr", DType.F32, x3)
    assert (short.config.name, short.split_k) == ("wgmma_128x64_s8", 1)
    narrow = heuristic(8192, 64, 4096, 132, 90, "rr", DType.F32, x3)
    assert isinstance(narrow.config, PipelineConfig) and "exact float32" in narrow.detail
    assert narrow.reason == "heuristic"
    skinny = heuristic(8192, 256, 4096, 132, 90, "rr", DType.BF16)
    assert (skinny.config.name, skinny.split_k) == ("wgmma_128x128_s6", 1)
    # only configs with room for the second, rounded set of accumulators
    assert [c for c, _ in candidates(4096, 4096, 4096, 90, DType.F32, x3)
            if isinstance(c, WgmmaConfig)] == list(WGMMA_X3_CONFIGS)
    assert all(c.can_promote for c in WGMMA_X3_CONFIGS)
    assert not WgmmaConfig(128, 256, 4).can_promote


def test_config_names_of_every_family_parse():
    from ge2jit.ops.gemm.spec import MMA_16BIT_CONFIGS, WGMMA_CONFIGS

    for cfg in (*MMA_16BIT_CONFIGS, *WGMMA_CONFIGS):
        assert parse_config(cfg.name) == (cfg, 1)
    assert parse_config("wgmma_128x256_s4_k2") == (WGMMA_CONFIGS[0], 2)
    with pytest.raises(ValueError, match="the mma.sync configs have no split-K"):
        parse_config(MMA_16BIT_CONFIGS[0].name + "_k2")
    with pytest.raises(ValueError, match="wgmma_BMxBN_sSTAGES"):
        parse_config("wgmma_128x256")
    with pytest.raises(ValueError, match="bn must be 64, 128, 192 or 256"):
        parse_config("wgmma_128x96_s4")


def test_hopper_split_k_specs_and_names():
    from ge2jit.ops.gemm.epilogue import PARTIAL_SUMS, Act, BiasKind, Epilogue
    from ge2jit.ops.gemm.select import kernel_set
    from ge2jit.ops.gemm.spec import WGMMA_CONFIGS, DType, Layout, Precision

    cfg = WGMMA_CONFIGS[3]
    assert parse_config(cfg.name + "_k3") == (cfg, 3)
    with pytest.raises(ArgumentValueError, match="mma.sync configs have no split-K"):
        parse_config("mma_128x128x32_w64x64_s4_k2")
    # 1000 of K in 64-wide bf16 k-tiles: 16, in slices of 6, 6 and 4
    epilogue = Epilogue(out_dtype=DType.BF16, act=Act.GELU, bias=BiasKind.ROW,
                        bias_dtype=DType.BF16, layout_c=Layout.COL, c_dtype=DType.F32,
                        save_z=True)
    ks = kernel_set(DType.BF16, Layout.ROW, Layout.ROW, epilogue, cfg, 3, 1000, (16, 16, 16, 16))
    assert (ks.splits, ks.k_tiles_per_split) == (3, 6)
    assert ks.main.split_k and ks.main.kernel_name.endswith("_splitk")
    assert ks.main.epilogue == PARTIAL_SUMS
    r = ks.reduce
    assert r.epilogue == epilogue and r.fast_act and r.vec_y
    # 3xTF32 slices the tripled K: 3 x 100 floats in 32-wide k-tiles = 10
    ks = kernel_set(DType.F32, Layout.ROW, Layout.COL, Epilogue(out_dtype=DType.F32), cfg, 4,
                    100, (16, 16, 16, 16), precision=Precision.TF32X3)
    assert (ks.splits, ks.k_tiles_per_split) == (4, 3) and ks.main.promote
    # a split that K cannot feed is no split
    ks = kernel_set(DType.BF16, Layout.ROW, Layout.COL, Epilogue(out_dtype=DType.BF16), cfg, 4,
                    64, (16, 16, 16, 16))
    assert ks.splits == 1 and ks.reduce is None and not ks.main.split_k
    # candidates: slices for few tiles and a long K only
    few = [s for c, s in candidates(256, 256, 8192, 90, DType.BF16) if c == cfg]
    many = [s for c, s in candidates(8192, 8192, 8192, 90, DType.BF16) if c == cfg]
    assert few == [1, 2, 4] and many == [1]


@pytest.mark.parametrize("name, arch, dtype, precision, start", [
    ("wgmma_128x256_s4", "sm_80", DType.BF16, Precision.IEEE,
     "config: wgmma_128x256_s4 is a wgmma config, which runs on sm_90 (Hopper); this GPU is sm_80"),
    ("mma_128x128x32_w64x64_s4", "sm_75", DType.F16, Precision.IEEE,
     "config: mma_128x128x32_w64x64_s4 is a mma config, which runs on sm_80 or newer"),
    ("128x128x16_w32x64_s3", "sm_75", DType.F32, Precision.IEEE,
     "config: 128x128x16_w32x64_s3 is a pipelined config, which runs on sm_80 or newer"),
    ("mma_128x128x32_w64x64_s4", "sm_90", DType.F32, Precision.IEEE,
     "config: mma_128x128x32_w64x64_s4 runs on the tensor cores: float32 inputs need"),
])
def test_check_config_refuses_in_one_line(name, arch, dtype, precision, start):
    cfg, _ = parse_config(name)
    with pytest.raises(ArgumentValueError) as e:
        check_config(cfg, arch, dtype, precision, target="this GPU")
    assert str(e.value).startswith(start) and "\n" not in str(e.value)
    check_config(cfg, "sm_90", DType.BF16, Precision.IEEE)      # runs there: no error


def test_a_float32_accumulator_takes_the_tile_that_stages_it():
    """Adding into a row-major float32 C with 16-bit inputs (a gradient summed over chunks):
    the 128x256 tile cannot take that C through its ring and would store unstaged; the
    heuristic takes the 128x128 tile, whose kernel set reads C by TMA and stages its stores."""
    from ge2jit.ops.gemm.epilogue import Epilogue
    from ge2jit.ops.gemm.select import adds_wide_c, kernel_set
    from ge2jit.ops.gemm.spec import Layout as L
    from ge2jit.ops.gemm.spec import WgmmaGemmSpec

    acc = Epilogue(out_dtype=DType.F32, layout_c=L.ROW, c_dtype=DType.F32)
    assert adds_wide_c(acc, DType.BF16) and not adds_wide_c(acc, DType.F32)
    assert not adds_wide_c(Epilogue(out_dtype=DType.F32), DType.BF16)
    m, n, k = 128256, 2048, 2048
    plain = heuristic(m, n, k, 132, 90, "cr", DType.BF16)
    assert plain.config.name == "wgmma_128x256_s4"
    assert WgmmaGemmSpec.c_tma_unfit(plain.config, acc) is not None
    ch = heuristic(m, n, k, 132, 90, "cr", DType.BF16, wide_c=True)
    assert ch.config.name == "wgmma_128x128_s6" and "float32 C" in ch.detail
    ks = kernel_set(DType.BF16, L.COL, L.ROW, acc, ch.config, 1, k, (16, 16, 16, 16))
    assert ks.main.c_tma and ks.main.store16
