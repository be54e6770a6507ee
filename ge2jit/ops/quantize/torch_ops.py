"""quantize_fp8 as a PyTorch custom op (``torch.ops.ge2jit.quantize_fp8``), with a fake
implementation (shapes and types, for ``torch.compile`` and meta tensors). It has no gradient:
quantization is a cast. Imported by ``ge2jit.torch``."""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.dtypes import as_fp8
from ...runtime.torchlib import (
    define_op,
    register_fake,
    traced,
)
from .op import quantize_fp8 as _forward


def torch_format(fmt) -> torch.dtype:
    """PyTorch's float8 dtype of an 8-bit format given by any of its names."""
    return getattr(torch, as_fp8(fmt).numpy_name)


def _quantize(x: Tensor, fmt: str, per_row: bool) -> tuple[Tensor, Tensor]:
    """``ge2jit.quantize_fp8(x, fmt=fmt, per_row=per_row)`` with a dynamic scale."""
    return _forward(x, fmt=fmt, per_row=per_row)


quantize_fp8_op = define_op("quantize_fp8", _quantize)


@register_fake(quantize_fp8_op)
def _(x, fmt, per_row):
    q = torch.empty(x.shape, dtype=torch_format(fmt), device=x.device)
    return q, x.new_empty(tuple(x.shape[:-1]) if per_row else (), dtype=torch.float32)


def quantize_fp8(x: Tensor, fmt="e4m3", per_row: bool = False) -> tuple[Tensor, Tensor]:
    """``(q, scale)``: ``x`` (float32, float16 or bfloat16) quantized to ``fmt`` ("e4m3" or
    "e5m2", or PyTorch's float8 dtypes) with a dynamic scale, ``amax / largest`` per tensor
    (a 0-d float32 tensor) or per row (``per_row``: of shape ``x.shape[:-1]``), so that
    ``scale * q`` approximates x, as ``torch._scaled_mm`` and ``ge2jit.gemm_bias_act`` read
    scales. A custom op (no graph break under ``torch.compile``); no gradient."""
    name = as_fp8(fmt).value
    if traced(x, names=("x",)):
        return quantize_fp8_op(x, name, bool(per_row))
    return _quantize(x, name, bool(per_row))
