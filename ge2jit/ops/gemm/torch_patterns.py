"""The compiler backend's GEMM patterns (``ge2jit.torch.compiler``): a Linear whose only user
is an activation ge2jit's epilogue has (relu, leaky_relu, gelu, gelu with tanh, silu, sigmoid,
tanh) becomes one ``ge2jit.torch.gemm_bias_act``: the bias and the activation applied in the
GEMM's epilogue, forward and backward. A Linear whose output has another user, an activation
ge2jit lacks, an input not on a CUDA device or of another type, or a Linear inside autocast is
left alone, and the report says why.

The activation may also be GELU's tanh form written out, as Hugging Face's GPT-2 writes it
(``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``), and the Linear may be
``torch.addmm(bias, x, weight)`` with ``weight`` of (in, out), as GPT-2's ``Conv1D`` writes it
(with its reshape of the rows back to the input's leading dimensions).

A gated MLP, ``down(act(gate(x)) * up(x))`` with three Linears without bias (LLaMA's, Mistral's,
Qwen2's: silu; Gemma's: gelu with tanh), becomes one ``ge2jit.torch.gated_mlp_pair``: the gated
GEMM and its chained backward. Left alone, with the reason: biases, an intermediate with
another user, an activation the gated GEMM lacks, the types or devices above."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from ...runtime.torchpasses import (
    ADD,
    MUL,
    Fusion,
    Pattern,
    Skip,
    argument,
    binary_args,
    is_call,
    register_pattern,
    tensor_of,
)
from .gated import GATED_ACTS
from .torch_ops import gated_mlp_pair, gemm_bias_act

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


def addmm_act(bias, x, weight, act: str, leaky_slope: float):
    """``act(torch.addmm(bias, x, weight))`` as one ge2jit GEMM (x of rows, weight of (in,
    out): Hugging Face's ``Conv1D``)."""
    return gemm_bias_act(x, weight, bias, act=act, leaky_slope=leaky_slope)


def _const(value, want: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isclose(
        value, want, rel_tol=1e-6)


def _with_constant(node, functions, want: float):
    """x when ``node`` is ``want op x`` or ``x op want`` (``functions``: ADD or MUL; want a
    constant), else None."""
    args = binary_args(node, functions)
    if args is None:
        return None
    a, b = args
    if _const(a, want) and isinstance(b, fx.Node):
        return b
    if _const(b, want) and isinstance(a, fx.Node):
        return a
    return None


def _written_gelu_tanh(node):
    """(x, the chain's nodes, the final one last) when ``node`` is GELU's tanh form written
    out, ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`` (the products and
    sums in either order), else None."""
    args = binary_args(node, MUL)
    if args is None:
        return None
    for half, rest in (args, args[::-1]):
        x = _with_constant(half, MUL, 0.5)
        th = _with_constant(rest, ADD, 1.0)
        if x is None or th is None or not (is_call(th, (torch.tanh,), ("tanh",))
                                            and len(th.args) == 1):
            continue
        inner = _with_constant(th.args[0], MUL, math.sqrt(2.0 / math.pi))
        sums = binary_args(inner, ADD) if inner is not None else None
        if sums is None:
            continue
        for xa, cube_term in (sums, sums[::-1]):
            cube = _with_constant(cube_term, MUL, 0.044715)
            if xa is not x or cube is None:
                continue
            if not (is_call(cube, (torch.pow, operator.pow), ("pow",)) and len(cube.args) == 2
                    and cube.args[0] is x and _const(cube.args[1], 3.0)):
                continue
            return x, [half, cube, cube_term, inner, th.args[0], th, rest, node]
    return None


def _activation(node):
    """(act, its input node, leaky slope) of an activation call, else None."""
    if not is_call(node, _FUNCTIONS, _METHODS):
        return None
    if node.op == "call_method" and len(node.args) == 1:
        return _METHODS[node.target], node.args[0], 0.01
    if node.op != "call_function":
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


def _linear_of(node):
    """(x, weight, bias) of a Linear call, else None."""
    if not is_call(node, _LINEAR):
        return None
    return argument(node, 0, "input"), argument(node, 1, "weight"), argument(node, 2, "bias")


def _product_of(node):
    """(its nodes, what it is, x, weight, bias, ``make(graph, act, slope)`` of the fused
    call) of a Linear call, or of ``torch.addmm(bias, x, weight)`` (beta and alpha 1) alone
    or reshaped (``view``, ``reshape``), else None."""
    parts = _linear_of(node)
    if parts is not None:
        x, weight, bias = parts
        return ([node], "the Linear's", x, weight, bias,
                lambda graph, act, slope: graph.call_function(
                    linear_act, (x, weight, bias, act, slope)))
    shaped = None
    if is_call(node, (torch.reshape,), ("view", "reshape")) and node.args:
        shaped, node = node, node.args[0]
    if not is_call(node, (torch.addmm,)) or len(node.args) != 3:
        return None
    if any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or set(node.kwargs) - {
            "beta", "alpha"}:
        return None
    addmm = node
    bias, x, weight = addmm.args

    def make(graph, act, slope):
        y = graph.call_function(addmm_act, (bias, x, weight, act, slope))
        if shaped is None:
            return y
        y.meta.update({k: v for k, v in addmm.meta.items() if k in ("example_value", "val")})
        return graph.create_node(shaped.op, shaped.target, (y, *shaped.args[1:]),
                                 dict(shaped.kwargs))

    return ([addmm] + ([shaped] if shaped is not None else []), "the product's", x, weight,
            bias, make)


def _why_not(nodes, chain, what, x, weight, bias) -> str | None:
    """Why the product ``nodes`` (``what`` it is, for the message) and its activation
    ``chain`` cannot be one ge2jit GEMM, or None."""
    inside = set(nodes) | set(chain)
    tx, tw, tb, ty = tensor_of(x), tensor_of(weight), tensor_of(bias), tensor_of(nodes[0])
    if any(not set(n.users) <= inside for n in nodes):
        return f"{what} output has another user"
    if tx is None or tw is None or ty is None or (bias is not None and tb is None):
        return "no recorded tensors for its inputs"
    if not (tx.is_cuda and tw.is_cuda and (tb is None or tb.is_cuda)):
        return "tensors not on a CUDA device"
    if ty.dtype != tx.dtype or tw.dtype != tx.dtype:
        return (f"types {tx.dtype} (x), {tw.dtype} (weight) -> {ty.dtype} (inside autocast, or "
                "mixed: not fused yet)")
    if tx.dtype not in _TYPES or (tb is not None and tb.dtype not in (tx.dtype, torch.float32)):
        return f"dtype {tx.dtype} (ge2jit's GEMM takes float16, bfloat16 and float32)"
    if tx.dim() < 2 or tw.dim() != 2:
        return f"a {tx.dim()}-D input (ge2jit's GEMM takes rows)"
    if tb is not None and (tb.dim() != 1 or tb.shape[0] != ty.shape[-1]):
        return f"a bias of shape {tuple(tb.shape)} (ge2jit's epilogue adds one per column)"
    return None


def match(node):
    found = _activation(node)
    chain = [node]
    if found is None:
        written = _written_gelu_tanh(node)
        if written is None:
            return None
        found = ("gelu_tanh", written[0], 0.01)
        chain = written[1]
        if any(not set(n.users) <= set(chain) for n in chain[:-1]):
            return Skip(NAME, node.name, "an intermediate of the activation has another user")
    act, source, slope = found
    product = _product_of(source)
    if product is None:
        return None
    nodes, what, x, weight, bias, make = product
    why = _why_not(nodes, chain, what, x, weight, bias)
    if why is not None:
        return Skip(NAME, node.name, why)
    return Fusion(NAME, [*nodes, *chain], f"gemm_bias_act(act={act!r})",
                  lambda graph: make(graph, act, slope))


register_pattern(Pattern(NAME, "gemm_bias_act", match))


GATED = "gated_mlp"


def match_gated(node):
    down = _linear_of(node)
    if down is None:
        return None
    h, w_down, down_bias = down
    factors = binary_args(h, MUL)
    if factors is None:
        return None
    for act_node, up_node in (factors, factors[::-1]):
        found = _activation(act_node)
        up = _linear_of(up_node)
        if found is None or up is None:
            continue
        act, gate_node, _ = found
        gate = _linear_of(gate_node)
        if gate is None or gate[0] is not up[0]:
            continue
        return _gated_found(node, h, act_node, gate_node, up_node, act, gate, up, w_down,
                            down_bias)
    return None


def _gated_found(node, h, act_node, gate_node, up_node, act, gate, up, w_down, down_bias):
    (x, w_gate, gate_bias), (_, w_up, up_bias) = gate, up
    nodes = [gate_node, act_node, up_node, h, node]
    tx, ty = tensor_of(x), tensor_of(node)
    weights = [tensor_of(w) for w in (w_gate, w_up, w_down)]
    why = None
    if act not in GATED_ACTS:
        why = f"activation {act} (the gated GEMM takes {', '.join(GATED_ACTS)})"
    elif any(b is not None for b in (gate_bias, up_bias, down_bias)):
        why = "biases (not fused yet)"
    elif any(len(n.users) != 1 for n in nodes[:-1]):
        why = "a part of the MLP has another user"
    elif tx is None or ty is None or any(w is None for w in weights):
        why = "no recorded tensors for its inputs"
    elif not (tx.is_cuda and all(w.is_cuda for w in weights)):
        why = "tensors not on a CUDA device"
    elif ty.dtype != tx.dtype or any(w.dtype != tx.dtype for w in weights):
        why = (f"types {tx.dtype} (x), {weights[0].dtype} (weights) -> {ty.dtype} (inside "
               "autocast, or mixed: not fused yet)")
    elif tx.dtype not in _TYPES:
        why = f"dtype {tx.dtype} (ge2jit's GEMM takes float16, bfloat16 and float32)"
    elif tx.dim() < 2 or weights[0].shape != weights[1].shape or \
            weights[2].shape[1] != weights[0].shape[0]:
        why = "shapes that are no gated MLP's"
    if why is not None:
        return Skip(GATED, node.name, why)

    def build(graph):
        return graph.call_function(gated_mlp_pair, (x, w_gate, w_up, w_down, act))

    return Fusion(GATED, nodes, f"gated_mlp(act={act!r})", build)


# before the Linear + activation pattern, which would take the gate's Linear alone
register_pattern(Pattern(GATED, "gated_mlp", match_gated, priority=90))
