"""Rendering: every parameter combination renders, names itself, and uses what it was given."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from ge2jit.jit.render import files_under, render, template_dir, tree_digest
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    MMA_TF32_CONFIGS,
    TILED_CONFIGS,
    DType,
    MmaConfig,
    MmaGemmSpec,
    TileConfig,
    TiledGemmSpec,
)
from ge2jit.runtime.dtypes import FLOAT_DTYPES

F32 = DType.F32
ALL_SPECS = [
    TiledGemmSpec(F32, la, lb, Epilogue(out_dtype=F32, act=act, bias=bias,
                                        bias_dtype=None if bias is BiasKind.NONE else F32,
                                        layout_c=lc, c_dtype=None if lc is None else F32,
                                        save_z=z), tile)
    for la, lb, lc, act, bias, z, tile in itertools.product(
        Layout, Layout, (None, *Layout), Act, BiasKind, (False, True), TILED_CONFIGS)
]


def _flag(src: str, name: str) -> bool:
    """The value of the preamble's ``constexpr bool NAME`` (exactly one such line)."""
    found = re.findall(rf"^constexpr bool {name} = (true|false);", src, re.M)
    assert len(found) == 1, (name, found)
    return found[0] == "true"


def test_template_dir_exists():
    assert (template_dir() / "gemm" / "tiled.cu").is_file()


def test_the_fingerprints_walk_is_rglobs_and_a_file_edited_changes_the_digest(tmp_path):
    for root, suffix in ((template_dir(), ""), (Path(__file__).parents[2] / "ge2jit", ".py")):
        assert files_under(root, suffix) == [
            (p.relative_to(root).as_posix(), str(p)) for p in sorted(root.rglob(f"*{suffix}"))
            if p.is_file()]
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "a" / "x.cuh").write_text("one")
    (tmp_path / "pkg" / "ops").mkdir(parents=True)
    (tmp_path / "pkg" / "ops" / "m.py").write_text("two")
    first = tree_digest(b"seed", tmp_path / "t", tmp_path / "pkg", ("ops",))
    assert first == tree_digest(b"seed", tmp_path / "t", tmp_path / "pkg", ("ops",))
    (tmp_path / "pkg" / "ops" / "m.py").write_text("three")   # another size: read again
    assert tree_digest(b"seed", tmp_path / "t", tmp_path / "pkg", ("ops",)) != first


def test_every_combination_renders():
    names = set()
    for spec in ALL_SPECS:
        src = render(spec)
        name = spec.kernel_name
        names.add(name)
        assert re.search(r"extern \"C\" __global__ void __launch_bounds__\(THREADS(, 1)?\)\n" + name
                         + r"\(", src), name
        assert "{{" not in src and "{%" not in src
        ep = spec.epilogue
        # the variant is the preamble's constants (the body is the same C++ for all)
        assert f"constexpr Act ACT = Act::{ep.act.value};" in src
        assert f"constexpr int BM = {spec.tile.bm};" in src
        assert f"constexpr int TN = {spec.tile.tn};" in src
        assert _flag(src, "SAVE_Z") == ep.save_z
        assert _flag(src, "HAS_C") == ep.has_c
        assert _flag(src, "C_ROW") == (ep.layout_c is Layout.ROW)
        for kind, name in ((BiasKind.SCALAR, "SCALAR_BIAS"), (BiasKind.COL, "COL_BIAS"),
                           (BiasKind.ROW, "ROW_BIAS")):
            assert _flag(src, name) == (ep.bias is kind)
        assert _flag(src, "A_ROW") == (spec.layout_a is Layout.ROW)
        assert _flag(src, "B_ROW") == (spec.layout_b is Layout.ROW)
    assert len(names) == len(ALL_SPECS), "kernel names must be unique per spec"


def test_kernel_name_is_procedural():
    spec = TiledGemmSpec(F32, Layout.ROW, Layout.COL,
                         Epilogue(out_dtype=F32, act=Act.GELU, bias=BiasKind.COL, bias_dtype=F32),
                         TileConfig(128, 64, 8, 8, 4))
    assert spec.kernel_name == "gemm_f32_rc_128x64x8_8x4_gelu_colbias"
    spec2 = TiledGemmSpec(F32, Layout.COL, Layout.ROW,
                          Epilogue(out_dtype=F32, act=Act.SILU, bias=BiasKind.ROW,
                                   bias_dtype=F32, layout_c=Layout.ROW, c_dtype=F32,
                                   save_z=True),
                          TileConfig(64, 64, 8, 4, 4))
    assert spec2.kernel_name == "gemm_f32_cr_64x64x8_4x4_silu_rowbias_cr_z"


def test_element_types_reach_the_kernel_signature():
    bf16 = DType.BF16
    spec = TiledGemmSpec(bf16, Layout.ROW, Layout.COL,
                         Epilogue(out_dtype=F32, act=Act.GELU, bias=BiasKind.COL,
                                  bias_dtype=bf16, layout_c=Layout.ROW, c_dtype=F32, save_z=True),
                         TILED_CONFIGS[0])
    assert spec.kernel_name == ("gemm_bf16_rc_128x128x8_8x8_gelu_colbias_crf32_of32_z")
    src = render(spec)
    for decl in ("const bf16_t* __restrict__ A", "const bf16_t* __restrict__ B",
                 "const float* __restrict__ C", "const bf16_t* __restrict__ bias",
                 "float* __restrict__ Y", "float* __restrict__ Z"):
        assert decl in src
    # A C and bias that are not read have no type: their pointers take the inputs'.
    plain = render(TiledGemmSpec(DType.F16, Layout.ROW, Layout.ROW,
                                 Epilogue(out_dtype=DType.F16), TILED_CONFIGS[0]))
    assert "const f16_t* __restrict__ C" in plain and "const f16_t* __restrict__ bias" in plain


@pytest.mark.parametrize("dtype", list(FLOAT_DTYPES))
def test_mma_specs_render(dtype):
    configs = MMA_TF32_CONFIGS if dtype is DType.F32 else MMA_16BIT_CONFIGS
    instr = {"f32": "m16n8k8.row.col.f32.tf32.tf32.f32", "f16": "m16n8k16.row.col.f32.f16.f16",
             "bf16": "m16n8k16.row.col.f32.bf16.bf16"}[dtype.value]
    for la, lb in itertools.product(Layout, Layout):
        epilogue = Epilogue(out_dtype=F32, act=Act.SILU, bias=BiasKind.ROW, bias_dtype=dtype,
                            layout_c=Layout.COL, c_dtype=dtype, save_z=True)
        spec = MmaGemmSpec(dtype, la, lb, epilogue, configs[0], copy_a=8)
        src = render(spec)
        assert "{{" not in src and "{%" not in src
        assert f"mma.sync.aligned.{instr}" in src
        assert "constexpr int COPY_A = 8;" in src and "constexpr int COPY_B = 16;" in src
        assert "float* __restrict__ Y" in src
        # 16-bit operands stored MN-contiguous are read transposed by ldmatrix; tf32 ones
        # word by word: the preamble's constants pick the branch.
        assert _flag(src, "A_KCONT") == (la is Layout.ROW)
        assert _flag(src, "B_KCONT") == (lb is Layout.COL)
        assert _flag(src, "TF32") == (dtype is DType.F32)
    with pytest.raises(ValueError, match="BK = .* does not fit"):
        MmaGemmSpec(dtype, la, lb, Epilogue(out_dtype=dtype),
                    MmaConfig(64, 64, 64 if dtype is DType.F32 else 16, 32, 32, 4))


def test_spec_is_hashable_and_frozen():
    a = ALL_SPECS[5]
    b = TiledGemmSpec(a.dtype, a.layout_a, a.layout_b, a.epilogue, a.tile)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.tile = TILED_CONFIGS[0]


def test_spec_rejects_wrong_types():
    with pytest.raises(TypeError, match=r"TiledGemmSpec.epilogue: expected Epilogue, got 'gelu'"):
        TiledGemmSpec(F32, Layout.ROW, Layout.ROW, "gelu", TILED_CONFIGS[0])


@pytest.mark.parametrize("args, match", [
    ((128, 128, 8, 7, 8), "multiple of tm"),
    ((128, 128, 8, 1, 1), "threads"),
    ((0, 128, 8, 8, 8), "positive"),
])
def test_tile_config_validation(args, match):
    with pytest.raises(ValueError, match=match):
        TileConfig(*args)


def test_tile_config_parse_round_trip():
    for t in TILED_CONFIGS:
        assert TileConfig.parse(t.name) == t
    with pytest.raises(ValueError, match="BMxBNxBK_TMxTN"):
        TileConfig.parse("128-128")
