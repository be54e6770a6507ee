"""The compiler backend's head + loss pattern (``ge2jit.runtime.torchpasses``): a Linear without
bias whose output goes only to ``F.cross_entropy`` (through casts to float32 and reshapes that
flatten its leading axes, as a language model's loss writes it) becomes one
``ge2jit.torch.linear_cross_entropy``: the (tokens, V) logits are never made, the gradients of
the input and the weight are made in the forward's chunks. Left alone, with the reason: logits
with another user (a model that returns them: ``ge2jit.torch.patch(model)`` makes Hugging
Face's causal LMs skip them in training), a bias, class weights, soft targets, tensors not on
a CUDA device, autocast's mixed types."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..runtime.torchpasses import Fusion, Pattern, Skip, argument, register_pattern, tensor_of
from .torch_ops import linear_cross_entropy

NAME = "linear_cross_entropy"
_LINEAR = {torch._C._nn.linear, F.linear}
_CROSS_ENTROPY = {F.cross_entropy}
#: what may sit between the Linear and the loss: casts to float32 and reshapes
_METHODS = {"float", "view", "reshape", "flatten", "contiguous", "to"}
_FUNCTIONS = {torch.reshape, torch.flatten}
_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def head_loss(x, weight, targets, ignore_index: int, reduction: str, smoothing: float,
              dtype: torch.dtype):
    """``F.cross_entropy(F.linear(x, weight).flatten(0, -2), targets.flatten())`` by ge2jit
    (the loss in ``dtype``, the type PyTorch's would have)."""
    loss = linear_cross_entropy(x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1),
                                ignore_index, reduction, smoothing, check_targets=False)
    return loss if loss.dtype == dtype else loss.to(dtype)


def _between(node) -> bool:
    """Whether ``node`` is a cast to float32 or a reshape the pattern may look through."""
    if node.op == "call_method" and node.target in _METHODS:
        if node.target == "to":
            return len(node.args) == 2 and node.args[1] is torch.float32 and not node.kwargs
        return True
    return node.op == "call_function" and node.target in _FUNCTIONS


def _shape_answer(node):
    """The answer of a graph node that asks a tensor's size (``x.size()``, ``x.size(-1)``,
    ``x.shape``) as plain ints (static shapes): as recorded, else from the asked tensor's
    recorded shape (a shape propagation may record no value for an int); None for any other
    node, or a shape that is not static."""
    asks = (node.op == "call_method" and node.target == "size") or (
        node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",))
    if not asks:
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    if value is None and not node.kwargs:
        t = tensor_of(node.args[0])
        shape = None if t is None else tuple(t.shape)
        if shape is not None and len(node.args) == 1:
            value = shape
        elif shape is not None and len(node.args) == 2 and type(node.args[1]) is int and \
                -len(shape) <= node.args[1] < len(shape):
            value = shape[node.args[1]]
    static = isinstance(value, int) or (isinstance(value, tuple) and all(
        isinstance(v, int) for v in value))
    return value if static else None


def _static_shape_query(node) -> bool:
    """Whether ``node`` asks a tensor's size and the answer is plain ints (``_shape_answer``):
    it can become that constant."""
    return _shape_answer(node) is not None


def _users(node) -> list:
    """``node``'s users other than static shape queries."""
    return [u for u in node.users if not _static_shape_query(u)]


def _fold_shape_queries(graph, nodes) -> None:
    """Each static shape query of ``nodes`` replaced by its recorded value, then erased."""
    for n in nodes:
        for q in [u for u in n.users if _static_shape_query(u)]:
            value = _shape_answer(q)

            def constant(a, q=q, value=value):
                return value if a is q else a

            for user in list(q.users):
                user.args = fx.node.map_aggregate(user.args, constant)
                user.kwargs = fx.node.map_aggregate(user.kwargs, constant)
            graph.erase_node(q)


def match(node):
    if node.op != "call_function" or node.target not in _CROSS_ENTROPY:
        return None
    chain, src = [], argument(node, 0, "input")
    while hasattr(src, "op") and src.op != "placeholder" and _between(src) and \
            len(_users(src)) == 1:
        chain.append(src)
        src = src.args[0]
    if not (hasattr(src, "op") and src.op == "call_function" and src.target in _LINEAR):
        return None
    linear = src
    x, weight, bias = (argument(linear, 0, "input"), argument(linear, 1, "weight"),
                       argument(linear, 2, "bias"))
    targets = argument(node, 1, "target")
    tx, tw, ty, tt = tensor_of(x), tensor_of(weight), tensor_of(linear), tensor_of(targets)
    logits, loss = tensor_of(argument(node, 0, "input")), tensor_of(node)
    options = {"weight": argument(node, 2, "weight"), "size_average": argument(
        node, 3, "size_average"), "reduce": argument(node, 5, "reduce")}
    ignore_index = argument(node, 4, "ignore_index", -100)
    reduction = argument(node, 6, "reduction", "mean")
    smoothing = argument(node, 7, "label_smoothing", 0.0)
    why = None
    if len(_users(linear)) != 1:
        why = "the logits have another user (a model that returns them)"
    elif bias is not None:
        why = "a Linear with a bias (not fused yet)"
    elif any(v is not None for v in options.values()):
        why = "class weights or the legacy size_average/reduce arguments"
    elif not (isinstance(ignore_index, int) and isinstance(reduction, str) and
              reduction in ("mean", "sum", "none") and isinstance(smoothing, (int, float))):
        why = "options that are graph values"
    elif None in (tx, tw, ty, tt, logits, loss):
        why = "no recorded tensors for its inputs"
    elif not (tx.is_cuda and tw.is_cuda):
        why = "tensors not on a CUDA device"
    elif ty.dtype != tx.dtype or tw.dtype != tx.dtype or tx.dtype not in _TYPES:
        why = f"types {tx.dtype} (x), {tw.dtype} (weight) -> {ty.dtype} (autocast or mixed)"
    elif logits.dim() != 2 or tt.dim() != 1 or tt.is_floating_point() or \
            logits.shape[0] != tx.numel() // tx.shape[-1] or tw.dim() != 2:
        why = "logits that are not the Linear's rows, or soft (probability) targets"
    if why is not None:
        return Skip(NAME, node.name, why)

    def build(graph):
        _fold_shape_queries(graph, [linear, *chain])
        return graph.call_function(head_loss, (x, weight, targets, ignore_index, reduction,
                                               float(smoothing), loss.dtype))

    return Fusion(NAME, [linear, *reversed(chain), node], "linear_cross_entropy", build)


register_pattern(Pattern(NAME, "linear_cross_entropy", match))
