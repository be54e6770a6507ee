"""Kernel choice without a GPU: config names, candidates and the shape heuristic."""

from __future__ import annotations

import pytest

from ge2jit.ops.gemm.select import FALLBACK_TILE, Choice, candidates, heuristic, parse_config
from ge2jit.ops.gemm.spec import PIPELINED_F32_CONFIGS, SIMT_F32_TILES, PipelineConfig, TileConfig


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
    assert candidates(100, 100, 100, 75) == [(t, 1) for t in SIMT_F32_TILES]


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
    assert old.reason == "fallback" and old.family == "basic"
    assert heuristic(10, 10, 10, 40, 75).config == FALLBACK_TILE
    assert "heuristic" in str(mid)
