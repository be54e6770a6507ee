"""The compiler backend's GEMM pattern (``ge2jit.torch.compiler``): a Linear whose only user
is an activation ge2jit's epilogue has (relu, leaky_relu, gelu, gelu with tanh, silu, sigmoid,
tanh) becomes one ``ge2jit.torch.gemm_bias_act``: the bias and the activation applied in the
GEMM's epilogue, forward and backward. A Linear whose output has another user, an activation
ge2jit lacks, an input not on a CUDA device or of another type, or a Linear inside autocast is
left alone, and the report says why."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime.torchpasses import Fusion, Pattern, Skip, argument, register_pattern, tensor_of
from .torch_ops import gemm_bias_act

NAME = "linear_activation"
_LINEAR = {torch._C._nn.linear, F.linear}
#: call_function targets -> activation (gelu's "approximate" and leaky_relu's slope read apart)
_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", torch._C._nn.gelu: "gelu", F.gelu: "gelu",
              F.silu: "silu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
              torch.tanh: "tanh", F.tanh: "tanh", F.leaky_relu: "leaky_relu",
              torch._C._nn.leaky_relu: "leaky_relu"}
_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def linear_act(x, weight, bias, act: str, leaky_slope: float):
    """``act(F.linear(x, weight, bias))`` as one ge2jit GEMM (x of any leading dimensions)."""
    y = gemm_bias_act(x.reshape(-1, x.shape[-1]), weight.t(), bias, act=act,
                      leaky_slope=leaky_slope)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _activation(node):
    """(act, its input node, leaky slope) of an activation call, else None."""
    if node.op == "call_method" and node.target in _METHODS and len(node.args) == 1:
        return _METHODS[node.target], node.args[0], 0.01
    if node.op != "call_function" or node.target not in _FUNCTIONS:
        return None
    act = _FUNCTIONS[node.target]
    if act in ("relu", "silu") and argument(node, 1, "inplace", False):
        return None
    if act == "gelu":
        approximate = argument(node, 1, "approximate", "none")
        if approximate not in ("none", "tanh"):
            return None
        act = "gelu_tanh" if approximate == "tanh" else "gelu"
    slope = 0.01
    if act == "leaky_relu":
        slope = argument(node, 1, "negative_slope", 0.01)
        if not isinstance(slope, (int, float)) or argument(node, 2, "inplace", False):
            return None
    return act, node.args[0] if node.args else node.kwargs.get("input"), float(slope)


def match(node):
    found = _activation(node)
    if found is None:
        return None
    act, linear, slope = found
    if not (hasattr(linear, "op") and linear.op == "call_function" and linear.target in _LINEAR):
        return None
    x, weight = argument(linear, 0, "input"), argument(linear, 1, "weight")
    bias = argument(linear, 2, "bias")
    tx, tw, tb, ty = tensor_of(x), tensor_of(weight), tensor_of(bias), tensor_of(linear)
    why = None
    if len(linear.users) != 1:
        why = "the Linear's output has another user"
    elif tx is None or tw is None or ty is None or (bias is not None and tb is None):
        why = "no recorded tensors for its inputs"
    elif not (tx.is_cuda and tw.is_cuda):
        why = "tensors not on a CUDA device"
    elif ty.dtype != tx.dtype or tw.dtype != tx.dtype:
        why = (f"types {tx.dtype} (x), {tw.dtype} (weight) -> {ty.dtype} (inside autocast, or "
               "mixed: not fused yet)")
    elif tx.dtype not in _TYPES or (tb is not None and tb.dtype not in (tx.dtype,
                                                                        torch.float32)):
        why = f"dtype {tx.dtype} (ge2jit's GEMM takes float16, bfloat16 and float32)"
    elif tx.dim() < 2 or tw.dim() != 2:
        why = f"a {tx.dim()}-D input (ge2jit's GEMM takes rows)"
    if why is not None:
        return Skip(NAME, node.name, why)

    def build(graph):
        return graph.call_function(linear_act, (x, weight, bias, act, slope))

    return Fusion(NAME, [linear, node], f"gemm_bias_act(act={act!r})", build)


register_pattern(Pattern(NAME, "gemm_bias_act", match))
