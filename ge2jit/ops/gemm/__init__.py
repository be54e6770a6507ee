"""The fused GEMM op: validation (problem), the epilogue (epilogue), kernel specs (spec), kernel
choice (select) and the launcher with its plans, tuning and explanation (op); the backward
(backward); what the tools know of both (registration)."""

from ...runtime.registry import register
from .backward import Gradients, gemm_bias_act_backward
from .epilogue import PARTIAL_SUMS, Epilogue
from .gated import gemm_gated, gemm_gated_backward, interleave_gate_up, split_gate_up
from .op import Explanation, TuneResult, clear_plans, explain, gemm_bias_act, tune
from .registration import BACKWARD, FORWARD, GATED, GATED_BACKWARD
from .select import Choice
from .spec import (
    MMA_16BIT_CONFIGS,
    MMA_TF32_CONFIGS,
    MMA_X3_CONFIGS,
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_X3_CONFIGS,
    Act,
    BiasKind,
    DbiasSpec,
    DType,
    DzSpec,
    Layout,
    MmaConfig,
    MmaGemmSpec,
    PipelineConfig,
    PipelinedGemmSpec,
    Precision,
    SplitKReduceSpec,
    Tf32SplitSpec,
    TileConfig,
    TiledGemmSpec,
    TransposeSpec,
    WgmmaConfig,
    WgmmaGemmSpec,
)

__all__ = ["gemm_bias_act", "gemm_bias_act_backward", "gemm_gated", "gemm_gated_backward",
           "interleave_gate_up", "split_gate_up", "Gradients", "DzSpec", "DbiasSpec", "tune",
           "explain", "clear_plans", "Explanation", "TuneResult",
           "Choice", "Epilogue", "PARTIAL_SUMS", "TiledGemmSpec", "PipelinedGemmSpec",
           "SplitKReduceSpec", "TileConfig",
           "PipelineConfig", "TILED_CONFIGS", "PIPELINED_F32_CONFIGS", "Act", "BiasKind",
           "DType", "Layout", "Precision", "MmaConfig", "MmaGemmSpec", "WgmmaConfig",
           "WgmmaGemmSpec", "TransposeSpec", "Tf32SplitSpec", "MMA_16BIT_CONFIGS",
           "MMA_TF32_CONFIGS",
           "WGMMA_CONFIGS", "WGMMA_X3_CONFIGS", "MMA_X3_CONFIGS"]

register(FORWARD, default=True)   # the op the tools use when given arrays first
register(BACKWARD)
register(GATED)
register(GATED_BACKWARD)
