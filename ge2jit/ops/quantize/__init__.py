"""Quantization to 8-bit floats (e4m3, e5m2) with per-tensor or per-row scales, dynamic
(amax / largest) or given, and the amax for delayed scaling:
``quantize_fp8(x, *, fmt, scale=None, per_row=False, amax_out=None, out=None, config=None)``.
The kernels and their choice are in ``spec.py``, the call in ``op.py``."""

from __future__ import annotations

from .op import quantize_fp8
from .spec import QuantConfig, QuantSpec, all_configs, candidates, heuristic, parse_config

__all__ = ["quantize_fp8", "QuantConfig", "QuantSpec", "all_configs", "candidates",
           "heuristic", "parse_config"]

from ...runtime.registry import register  # noqa: E402 - the op above is what it registers
from .registration import QUANTIZE_FP8  # noqa: E402

register(QUANTIZE_FP8)
