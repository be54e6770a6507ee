"""``nn.Module`` layers on ge2jit's GEMM custom ops: ``Linear`` (one fused GEMM, bias and
activation) and ``MLP`` (a stack whose backward is chained). Imported by ``ge2jit.torch``."""

from __future__ import annotations

import math

import torch
from torch import nn

from .epilogue import ACT_NAMES
from .torch_ops import gemm_bias_act, mlp


def _check_act(act, name: str = "act") -> str:
    if not isinstance(act, str) or act not in ACT_NAMES:
        raise ValueError(f"{name}: expected one of {', '.join(ACT_NAMES)}, got {act!r}")
    return act


def _flat(x: torch.Tensor, features: int) -> torch.Tensor:
    if x.dim() < 1 or x.shape[-1] != features:
        raise ValueError(f"input: expected a last dimension of {features}, got shape "
                         f"{tuple(x.shape)}")
    return x.reshape(-1, features)


class Linear(nn.Module):
    """``act(x @ weight.T + bias)`` in one ge2jit GEMM whose epilogue adds the bias and applies
    the activation (``torch.ops.ge2jit.gemm_bias_act``); its backward is ge2jit's fused
    backward (dX, dW and dBias in one call).

    The parameters are those of ``nn.Linear`` (``weight`` of (out_features, in_features),
    ``bias`` of (out_features,), the same initialization), so state dicts load either way; the
    weight is read transposed without a copy and its gradient comes in its own layout. Inputs
    of any leading shape (..., in_features). ``act``: "none", "relu", "leaky_relu" (with
    ``leaky_slope``), "gelu", "gelu_tanh", "sigmoid", "tanh" or "silu". For backward the
    forward keeps the input and, for gelu, gelu_tanh and silu, the pre-activation (the others
    take their derivative from the output).

    float32 runs at ``precision`` if given, else at ``torch.get_float32_matmul_precision()``:
    "highest" exact float32, "high" 3xTF32 (float32 accuracy on the tensor cores), "medium"
    TF32. bfloat16 and float16 run on the tensor cores; inside ``torch.autocast`` the input
    and weight are cast to the region's type (a float32 bias is read as it is).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 act: str = "none", *, leaky_slope: float = 0.01, precision: str | None = None,
                 device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.act = _check_act(act)
        self.leaky_slope, self.precision = float(leaky_slope), precision
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialization."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = gemm_bias_act(_flat(x, self.in_features), self.weight.t(), self.bias, act=self.act,
                          leaky_slope=self.leaky_slope, precision=self.precision)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, act={self.act!r}")


class MLP(nn.Module):
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` with ``act`` after each but
    the last (``final_act`` there, "none" by default), as one op (``ge2jit.torch.mlp``: the
    custom op ``torch.ops.ge2jit.mlp`` where traced) whose backward is chained: each layer's
    dX GEMM multiplies by the previous layer's act' in its epilogue and sums that layer's
    bias gradient there, so the backward of the block is its GEMMs and nearly nothing else.
    A GPT block's MLP is ``MLP([d, 4 * d, d], act="gelu_tanh")``.

    The layers are ``Linear`` modules (``layers.0.weight``, ...), with their parameters,
    initialization, precision and autocast rules.
    """

    def __init__(self, sizes, act: str = "gelu_tanh", bias: bool = True, *,
                 final_act: str = "none", leaky_slope: float = 0.01,
                 precision: str | None = None, device=None, dtype=None):
        super().__init__()
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"sizes: expected at least two positive sizes, got {sizes}")
        _check_act(act)
        _check_act(final_act, "final_act")
        self.acts = [act] * (len(sizes) - 2) + [final_act]
        self.leaky_slope, self.precision = float(leaky_slope), precision
        self.layers = nn.ModuleList(
            Linear(i, o, bias, a, leaky_slope=leaky_slope, precision=precision, device=device,
                   dtype=dtype) for i, o, a in zip(sizes[:-1], sizes[1:], self.acts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, last = self.layers[0], self.layers[-1]
        y = mlp(_flat(x, first.in_features), [m.weight for m in self.layers],
                [m.bias for m in self.layers], self.acts, leaky_slope=self.leaky_slope,
                precision=self.precision)
        return y.reshape(*x.shape[:-1], last.out_features)
