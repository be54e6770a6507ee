"""Cross-entropy loss of logits against class indices, with its gradient in the same kernel
(float32 math; float32, float16 and bfloat16 logits, any number of classes):
``cross_entropy(logits, targets, *, ignore_index=-100, reduction="mean", label_smoothing=0.0,
grad=False, grad_scale=None, out=None, inplace=False, check_targets=True, config=None)``. The
kernels and their choice are in ``spec.py``, the call in ``op.py``, the float64 reference in
``reference.py``."""

from __future__ import annotations

from .op import check_options, cross_entropy, scale_gradient
from .spec import (
    Kernels,
    ReduceSpec,
    ScaleSpec,
    TargetsSpec,
    XentConfig,
    XentSpec,
    all_configs,
    candidates,
    choose,
    heuristic,
    kernels,
    parse_config,
    scale_spec,
)

__all__ = ["cross_entropy", "scale_gradient", "check_options", "XentConfig", "XentSpec",
           "TargetsSpec", "ReduceSpec", "ScaleSpec", "Kernels", "all_configs", "candidates",
           "choose", "heuristic", "kernels", "parse_config", "scale_spec"]

from ...runtime.registry import register  # noqa: E402 - the op above is what it registers
from .registration import CROSS_ENTROPY  # noqa: E402

register(CROSS_ENTROPY)
