"""ge2jit: fused GEMM + bias + activation CUDA kernels, compiled just in time with NVRTC.

    >>> y = ge2jit.gemm_bias_act(a, b, bias, act="gelu")   # Y = act(A @ B + bias)
"""

from __future__ import annotations

from . import graph  # ge2jit.graph: capture a step as a CUDA graph
from ._version import __version__
from .composed import linear_cross_entropy
from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CacheNotWritableError,
    CacheWarning,
    DeviceMismatchError,
    Ge2jitError,
    GraphCaptureError,
    KernelCompileError,
    KernelLaunchError,
    MissingDependencyError,
    NvrtcError,
    SettingsError,
)
from .jit import nvrtc as _nvrtc
from .jit.device import get_num_sms, set_num_sms, set_persistent
from .jit.fastlaunch import launch_path
from .jit.nvrtc import nvrtc_info
from .notebook import benchmark_configs
from .notebook import inspect as inspect  # public, not in __all__ (see below)
from .ops.attention import attention, attention_backward
from .ops.cross_entropy import cross_entropy
from .ops.gemm import (
    Gradients,
    MmaConfig,
    PipelineConfig,
    TileConfig,
    WgmmaConfig,
    gemm_bias_act,
    gemm_bias_act_backward,
    gemm_gated,
    gemm_gated_backward,
    interleave_gate_up,
    split_gate_up,
)
from .ops.norm import (
    NormGradients,
    NormOutput,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)
from .ops.optim import adam_update, sgd_update
from .ops.quantize import quantize_fp8
from .ops.rope import rope, rope_backward
from .ops.softmax import softmax, softmax_backward
from .precompile import warmup
from .runtime.tools import explain, tune


def cache_info() -> dict:
    """The kernel cache of this process: location, entries, size, and hit/miss counters."""
    from .jit.cache import default_cache

    return default_cache().info()


# ``inspect`` is public (ge2jit.inspect) but not star-exported: it would replace the standard
# library's inspect module in the importer's namespace.
__all__ = [
    "__version__",
    "gemm_bias_act",
    "gemm_bias_act_backward",
    "gemm_gated",
    "gemm_gated_backward",
    "interleave_gate_up",
    "split_gate_up",
    "Gradients",
    "adam_update",
    "sgd_update",
    "softmax",
    "softmax_backward",
    "cross_entropy",
    "linear_cross_entropy",
    "rms_norm",
    "layer_norm",
    "rms_norm_backward",
    "layer_norm_backward",
    "quantize_fp8",
    "rope",
    "rope_backward",
    "attention",
    "attention_backward",
    "NormOutput",
    "NormGradients",
    "graph",
    "tune",
    "explain",
    "warmup",
    "benchmark_configs",
    "cache_info",
    "set_num_sms",
    "get_num_sms",
    "set_persistent",
    "PipelineConfig",
    "MmaConfig",
    "WgmmaConfig",
    "TileConfig",
    "nvrtc_info",
    "launch_path",
    "Ge2jitError",
    "ArgumentTypeError",
    "ArgumentValueError",
    "DeviceMismatchError",
    "KernelCompileError",
    "KernelLaunchError",
    "GraphCaptureError",
    "MissingDependencyError",
    "NvrtcError",
    "SettingsError",
    "CacheNotWritableError",
    "CacheWarning",
]

try:  # choose the NVRTC before CuPy loads one (errors are reported at the first compile)
    _nvrtc.preload()
except NvrtcError:
    pass
