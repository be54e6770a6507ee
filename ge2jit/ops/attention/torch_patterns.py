"""The compiler backend's attention pattern (``ge2jit.torch.compiler``): a call of
``torch.nn.functional.scaled_dot_product_attention`` that ge2jit's kernels take becomes
``ge2jit.torch.scaled_dot_product_attention`` (the custom ops ``attention`` and its backward);
one they do not take (a mask, dropout, another type or head dim) is left for PyTorch, and the
report says why."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime.torchpasses import Fusion, Pattern, Skip, argument, register_pattern, tensor_of
from .torch_ops import _why_not, scaled_dot_product_attention

_TARGETS = {torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention}
NAME = "scaled_dot_product_attention"


def match(node):
    if node.op != "call_function" or node.target not in _TARGETS:
        return None
    q, k, v = (argument(node, i, n) for i, n in enumerate(("query", "key", "value")))
    mask = argument(node, 3, "attn_mask")
    dropout = argument(node, 4, "dropout_p", 0.0)
    causal = argument(node, 5, "is_causal", False)
    scale = node.kwargs.get("scale")
    gqa = node.kwargs.get("enable_gqa", False)
    if not all(isinstance(x, (bool, float, int, type(None))) for x in (dropout, causal, scale,
                                                                      gqa)):
        return Skip(NAME, node.name, "dropout_p, is_causal, scale or enable_gqa computed in "
                                     "the graph")
    why = _why_not(tensor_of(q), tensor_of(k), tensor_of(v), mask, dropout, causal, gqa)
    if why is not None:
        return Skip(NAME, node.name, why)

    def build(graph):
        return graph.call_function(scaled_dot_product_attention, (q, k, v),
                                   {"is_causal": bool(causal), "scale": scale,
                                    "enable_gqa": bool(gqa)})

    return Fusion(NAME, [node], "attention", build)


register_pattern(Pattern(NAME, "attention", match))
