"""The fused GEMM op: validation (problem), kernel specs (spec) and the launcher (op)."""

from .op import choose_tile, gemm_bias_act
from .spec import SIMT_F32_TILES, Act, BiasKind, DType, GemmSpec, Layout, TileConfig

__all__ = ["gemm_bias_act", "choose_tile", "GemmSpec", "TileConfig", "SIMT_F32_TILES", "Act",
           "BiasKind", "DType", "Layout"]
