"""The fused GEMM op: validation (problem), kernel specs (spec), kernel choice (select) and the
launcher with its plans, tuning and explanation (op)."""

from .op import Explanation, TuneResult, clear_plans, explain, gemm_bias_act, tune
from .select import Choice
from .spec import (
    PIPELINED_F32_CONFIGS,
    SIMT_F32_TILES,
    Act,
    BiasKind,
    DType,
    GemmSpec,
    Layout,
    PipelineConfig,
    PipelinedGemmSpec,
    SplitKReduceSpec,
    TileConfig,
)

__all__ = ["gemm_bias_act", "tune", "explain", "clear_plans", "Explanation", "TuneResult",
           "Choice", "GemmSpec", "PipelinedGemmSpec", "SplitKReduceSpec", "TileConfig",
           "PipelineConfig", "SIMT_F32_TILES", "PIPELINED_F32_CONFIGS", "Act", "BiasKind",
           "DType", "Layout"]
