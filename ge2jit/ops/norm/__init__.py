"""RMSNorm and LayerNorm over the last axis, optionally fused with the residual add of a
pre-norm block, and their backward with deterministic weight and bias gradients:
``rms_norm``, ``layer_norm``, ``rms_norm_backward``, ``layer_norm_backward``. The kernels and
their choice are in ``spec.py``, the calls in ``op.py``, the float64 reference in
``reference.py``, the PyTorch layer in ``torch_ops.py`` and ``torch_modules.py`` (imported by
``ge2jit.torch`` only)."""

from __future__ import annotations

from .op import (
    NormGradients,
    NormOutput,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)
from .spec import NormBackwardConfig, NormConfig, parse_backward_config, parse_config

__all__ = ["rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward", "NormOutput",
           "NormGradients", "NormConfig", "NormBackwardConfig", "parse_config",
           "parse_backward_config"]

from ...runtime.registry import register  # noqa: E402 - the ops above are what it registers
from .registration import LAYER_NORM, LAYER_NORM_BACKWARD, RMS_NORM, RMS_NORM_BACKWARD  # noqa: E402

for _op in (RMS_NORM, LAYER_NORM, RMS_NORM_BACKWARD, LAYER_NORM_BACKWARD):
    register(_op)
