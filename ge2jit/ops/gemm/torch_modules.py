"""``nn.Module`` layers on ge2jit's GEMM custom ops: ``Linear`` (one fused GEMM, bias and
activation), ``MLP`` (a stack whose backward is chained) and ``GatedMLP`` (a gated linear
unit's MLP: gate and up in one gated GEMM, then the down projection). Imported by
``ge2jit.torch``."""

from __future__ import annotations

import math
import operator

import torch
from torch import nn

from ...errors import ArgumentValueError
from ...runtime.torchlib import check_layer_input
from .epilogue import ACT_NAMES
from .torch_ops import gated_mlp, gemm_bias_act, mlp

#: the 8-bit formats of Linear's FP8 mode
FP8_FORMATS = ("e4m3", "e5m2")


def _check_act(act, name: str = "act") -> str:
    if not isinstance(act, str) or act not in ACT_NAMES:
        raise ArgumentValueError(f"{name}: expected one of {', '.join(ACT_NAMES)}, got {act!r}")
    return act


def _check_sizes(names: str, sizes, least: int = 0) -> list[int]:
    """``sizes`` as ints, each a whole number (an int, a NumPy integer) >= ``least``, else one
    line naming them."""
    def whole(s) -> int | None:
        try:
            return None if isinstance(s, bool) else operator.index(s)
        except TypeError:
            return None

    out = [whole(s) for s in sizes]
    if any(s is None or s < least for s in out):
        raise ArgumentValueError(f"{names}: expected whole numbers >= {least}, got "
                                 f"{', '.join(map(repr, sizes))}")
    return out


def _flat(layer: nn.Module, x: torch.Tensor, features: int, parameter) -> torch.Tensor:
    """``x`` as the 2-D input of a layer's op: itself where it is 2-D, else its leading
    dimensions flattened."""
    check_layer_input(layer, x, features, parameter)
    return x if x.dim() == 2 else x.reshape(-1, features)


def _shaped(y: torch.Tensor, x: torch.Tensor, features: int) -> torch.Tensor:
    """A layer's 2-D output ``y`` in the input ``x``'s leading shape."""
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], features)


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

    FP8 mode (Hopper): ``fp8="e4m3"`` (or "e5m2") quantizes the weight per output channel
    and the input per token (``fp8_activations="token"``: a scale per row of the flattened
    input) or per tensor (``"tensor"``), with dynamic scales (amax / largest), and runs the
    FP8 GEMM with both scales, the bias and the activation in its epilogue
    (``ge2jit.torch.linear_fp8``); Y keeps the input's type. The backward stays in the
    layer's own precision (FP8 in the forward only). Where no gradient is recorded
    (inference) the quantized weight is kept and made again only when the weight changes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 act: str = "none", *, leaky_slope: float = 0.01, precision: str | None = None,
                 fp8: str | None = None, fp8_activations: str = "token", device=None,
                 dtype=None):
        super().__init__()
        self.in_features, self.out_features = _check_sizes("in_features, out_features",
                                                           (in_features, out_features))
        self.act = _check_act(act)
        self.leaky_slope, self.precision = float(leaky_slope), precision
        if fp8 is not None and fp8 not in FP8_FORMATS:
            raise ArgumentValueError(f"fp8: expected None or one of {', '.join(FP8_FORMATS)}, "
                                     f"got {fp8!r}")
        if fp8_activations not in ("token", "tensor"):
            raise ArgumentValueError(f"fp8_activations: expected 'token' or 'tensor', got "
                                     f"{fp8_activations!r}")
        self.fp8, self.fp8_activations = fp8, fp8_activations
        self._weight_fp8 = None     # (key, (q, scale)): the weight quantized, for inference
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
        if self.fp8 is not None:
            return self._forward_fp8(x)
        w = self.weight
        y = gemm_bias_act(_flat(self, x, self.in_features, w), w.t(), self.bias, act=self.act,
                          leaky_slope=self.leaky_slope, precision=self.precision)
        return _shaped(y, x, self.out_features)

    def _forward_fp8(self, x: torch.Tensor) -> torch.Tensor:
        from ...torch.fp8 import linear_fp8, quantized_weight

        w, cached = self.weight, None
        if not (torch.compiler.is_compiling() or (torch.is_grad_enabled() and w.requires_grad)):
            key = (w.data_ptr(), w._version, w.dtype, w.device, self.fp8)
            if self._weight_fp8 is None or self._weight_fp8[0] != key:
                self._weight_fp8 = (key, quantized_weight(w, self.fp8))
            cached = self._weight_fp8[1]
        y = linear_fp8(_flat(self, x, self.in_features, w), w.t(), self.bias, act=self.act,
                       fmt=self.fp8, per_token=self.fp8_activations == "token",
                       leaky_slope=self.leaky_slope, weight_fp8=cached)
        return _shaped(y, x, self.out_features)

    def extra_repr(self) -> str:
        fp8 = (f", fp8={self.fp8!r}, fp8_activations={self.fp8_activations!r}"
               if self.fp8 else "")
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, act={self.act!r}{fp8}")


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
        sizes = _check_sizes("sizes", list(sizes), 1)
        if len(sizes) < 2:
            raise ArgumentValueError(f"sizes: expected at least two sizes, got {sizes}")
        _check_act(act)
        _check_act(final_act, "final_act")
        self.acts = [act] * (len(sizes) - 2) + [final_act]
        self.leaky_slope, self.precision = float(leaky_slope), precision
        self.layers = nn.ModuleList(
            Linear(i, o, bias, a, leaky_slope=leaky_slope, precision=precision, device=device,
                   dtype=dtype) for i, o, a in zip(sizes[:-1], sizes[1:], self.acts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, biases = [], []
        for m in self.layers:
            weights.append(m.weight)
            biases.append(m.bias)
        first = weights[0]
        y = mlp(_flat(self, x, first.shape[1], first), weights, biases, self.acts,
                leaky_slope=self.leaky_slope, precision=self.precision)
        return _shaped(y, x, weights[-1].shape[0])


class GatedMLP(nn.Module):
    """The MLP of LLaMA-style blocks: ``down(act(x @ W_gate.T) * (x @ W_up.T))`` (SwiGLU with
    ``act="silu"``; GeGLU with "gelu" or "gelu_tanh"), the gate and up projections as one
    ``gemm_gated`` (one GEMM whose epilogue writes the (…, hidden) product once, nothing
    2 x hidden wide in memory but the pre-activations the backward keeps) and the down
    projection as a ``gemm_bias_act``, as one op (``ge2jit.torch.gated_mlp``) whose backward
    is chained: the down projection's dX GEMM writes the gated unit's dZ in its epilogue (no
    pass forms it); in eager mode, under ``torch.compile`` and in CUDA-graph capture.

    Parameters: ``gate_up`` of (2 * hidden, d_model), its rows alternating the gate's and the
    up projection's (row 2j: the gate's row j, 2j + 1: up's row j; ``split_gate_up`` of its
    transpose gives the two (d_model, hidden) halves as views), ``gate_up_bias`` (2 * hidden,)
    interleaved alike when ``bias``, ``down`` of (d_model, hidden) and ``down_bias``; each
    initialized as ``nn.Linear``'s. ``from_linears(gate, up, down)`` builds one from three
    ``nn.Linear`` layers (a Hugging Face LLaMA MLP's ``gate_proj``, ``up_proj``, ``down_proj``).
    Precision and autocast as in ``Linear``.
    """

    def __init__(self, d_model: int, hidden: int, act: str = "silu", bias: bool = False, *,
                 precision: str | None = None, device=None, dtype=None):
        super().__init__()
        self.d_model, self.hidden = _check_sizes("d_model, hidden", (d_model, hidden), 1)
        self.act, self.precision = _check_act(act), precision
        kw = {"device": device, "dtype": dtype}
        self.gate_up = nn.Parameter(torch.empty((2 * self.hidden, self.d_model), **kw))
        self.gate_up_bias = (nn.Parameter(torch.empty(2 * self.hidden, **kw)) if bias
                             else None)
        self.down = nn.Parameter(torch.empty((self.d_model, self.hidden), **kw))
        self.down_bias = nn.Parameter(torch.empty(self.d_model, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialization of each projection (gate and up: fan-in d_model)."""
        for w, b, fan_in in ((self.gate_up, self.gate_up_bias, self.d_model),
                             (self.down, self.down_bias, self.hidden)):
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            if b is not None:
                bound = 1 / math.sqrt(fan_in)
                nn.init.uniform_(b, -bound, bound)

    @classmethod
    def from_linears(cls, gate: nn.Linear, up: nn.Linear, down: nn.Linear,
                     act: str = "silu", **kw) -> GatedMLP:
        """A GatedMLP computing ``down(act(gate(x)) * up(x))`` with copies of these layers'
        parameters (the gate's and up's rows interleaved)."""
        if gate.weight.shape != up.weight.shape or down.weight.shape[::-1] != \
                gate.weight.shape or (gate.bias is None) != (up.bias is None) or \
                (gate.bias is None) != (down.bias is None):
            raise ArgumentValueError("gate, up, down: expected Linear(d, h), Linear(d, h) and "
                                     "Linear(h, d), all with biases or all without")
        hidden, d_model = gate.weight.shape
        w = gate.weight
        out = cls(d_model, hidden, act, gate.bias is not None, device=w.device, dtype=w.dtype,
                  **kw)
        with torch.no_grad():
            out.gate_up[0::2].copy_(gate.weight)
            out.gate_up[1::2].copy_(up.weight)
            out.down.copy_(down.weight)
            if gate.bias is not None:
                out.gate_up_bias[0::2].copy_(gate.bias)
                out.gate_up_bias[1::2].copy_(up.bias)
                out.down_bias.copy_(down.bias)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up
        y = gated_mlp(_flat(self, x, self.d_model, gate_up), gate_up, self.gate_up_bias,
                      self.down, self.down_bias, self.act, precision=self.precision)
        return _shaped(y, x, self.d_model)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, hidden={self.hidden}, act={self.act!r}, "
                f"bias={self.down_bias is not None}")
