"""``nn.Module`` layers on ge2jit's normalization custom ops: ``RMSNorm`` and ``LayerNorm``,
whose ``forward(x, residual=None)`` fuses a pre-norm block's residual add. Imported by
``ge2jit.torch``."""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.torchlib import check_layer_input
from .torch_ops import layer_norm, rms_norm


def _parameter(module: nn.Module, name: str, present: bool, hidden: int, kw: dict) -> None:
    """``module.<name>``: a (hidden,) parameter (its values set by ``reset_parameters``), or
    None registered in its place, as PyTorch's norm layers do."""
    if present:
        setattr(module, name, nn.Parameter(torch.empty(hidden, **kw)))
    else:
        module.register_parameter(name, None)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension (``hidden`` elements) by ge2jit's kernels
    (``torch.ops.ge2jit.rms_norm``): ``y = h / sqrt(mean(h**2) + eps) * weight``, float32
    statistics, y in the input's dtype.

    ``forward(x)`` returns y; ``forward(x, residual)`` computes ``h = x + residual`` in the
    same pass and returns ``(y, h)``, h in the residual's dtype (the pre-norm block: h goes on
    as the next residual). Its backward is one pass for dx (the gradient of h, which x and the
    residual share, plus any gradient arriving at h) and the weight's gradient summed in a
    fixed order (the same inputs give the same bits).

    The parameter is ``nn.RMSNorm``'s (``weight`` of (hidden,), ones; none without
    ``elementwise_affine``), so state dicts load either way; the default ``eps`` is 1e-6
    (``nn.RMSNorm``'s default is the dtype's machine epsilon).
    """

    def __init__(self, hidden: int, eps: float = 1e-6, elementwise_affine: bool = True, *,
                 device=None, dtype=None):
        super().__init__()
        self.hidden, self.eps = int(hidden), float(eps)
        _parameter(self, "weight", elementwise_affine, self.hidden,
                   {"device": device, "dtype": dtype})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        check_layer_input(self, x, self.hidden, self.weight)
        return rms_norm(x, self.weight, eps=self.eps, residual=residual)

    def extra_repr(self) -> str:
        return (f"{self.hidden}, eps={self.eps}, "
                f"elementwise_affine={self.weight is not None}")


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension by ge2jit's kernels (``torch.ops.ge2jit.layer_norm``):
    ``y = (h - mean) / sqrt(var + eps) * weight + bias`` (the biased variance, float32
    statistics), with ``forward(x, residual=None)`` as ``RMSNorm``'s; the backward also sums
    the bias' gradient.

    The parameters are ``nn.LayerNorm``'s (``weight`` ones and ``bias`` zeros of (hidden,);
    none without ``elementwise_affine``, no bias with ``bias=False``), so state dicts load
    either way.
    """

    def __init__(self, hidden: int, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, device=None, dtype=None):
        super().__init__()
        self.hidden, self.eps = int(hidden), float(eps)
        kw = {"device": device, "dtype": dtype}
        _parameter(self, "weight", elementwise_affine, self.hidden, kw)
        _parameter(self, "bias", elementwise_affine and bias, self.hidden, kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        check_layer_input(self, x, self.hidden, self.weight)
        return layer_norm(x, self.weight, self.bias, eps=self.eps, residual=residual)

    def extra_repr(self) -> str:
        return (f"{self.hidden}, eps={self.eps}, "
                f"elementwise_affine={self.weight is not None}, bias={self.bias is not None}")
