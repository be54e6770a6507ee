"""Row-wise softmax and its backward (float32 math; float32, float16 and bfloat16 in and out):
``softmax(x, axis=-1, *, out=None, config=None)`` and ``softmax_backward(dy, y, axis=-1, *,
out=None, config=None)``. The kernels and their choice are in ``spec.py``, the calls in
``op.py``."""

from __future__ import annotations

from .op import softmax, softmax_backward
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

__all__ = ["softmax", "softmax_backward", "SoftmaxSpec", "SoftmaxConfig", "Choice",
           "all_configs", "candidates", "choose", "heuristic", "make_spec", "parse_config"]

from ...runtime.registry import register  # noqa: E402 - the ops above are what it registers
from .registration import SOFTMAX, SOFTMAX_BACKWARD  # noqa: E402

register(SOFTMAX)
register(SOFTMAX_BACKWARD)
