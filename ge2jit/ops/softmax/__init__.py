"""Row-wise softmax (float32 math; float32, float16 and bfloat16 in and out), forward only:
``softmax(x, axis=-1, *, out=None, config=None)``. The kernels and their choice are in
``spec.py``, the call in ``op.py``."""

from __future__ import annotations

from .op import softmax
from .spec import (
    Choice,
    SoftmaxConfig,
    SoftmaxSpec,
    all_configs,
    candidates,
    choose,
    heuristic,
    make_spec,
    parse_config,
)

__all__ = ["softmax", "SoftmaxSpec", "SoftmaxConfig", "Choice", "all_configs", "candidates",
           "choose", "heuristic", "make_spec", "parse_config"]

from ...runtime.registry import register  # noqa: E402 - the op above is what it registers
from .registration import SOFTMAX  # noqa: E402

register(SOFTMAX)
