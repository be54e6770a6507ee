"""The compiler backend's rotary pattern (``ge2jit.runtime.torchpasses``): Hugging Face's
``apply_rotary_pos_emb`` as a graph writes it, ``x * cos + rotate_half(x) * sin`` with
``rotate_half(x) = cat((-x[..., h:], x[..., :h]), -1)``, becomes one ``ge2jit.torch.rope``
of x (GPT-NeoX's half-split rotation, forward and backward in one launch each), where five
or six elementwise kernels and their backward were.

ge2jit's kernel takes one angle per pair of columns; Hugging Face's cos and sin repeat their
``h`` columns twice. The pattern fuses only where the graph proves it: the tables are made in
the same graph as ``cos`` / ``sin`` of ``cat((freqs, freqs), -1)`` (the rotary module's
``emb``), through casts and products by a constant. Left alone, with the reason: tables the
graph does not make so (given as inputs, learned), a result of another type than x (mixed
types promote), x not 4-D or not on a CUDA device, an intermediate with another user."""

from __future__ import annotations

import operator

import torch

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
from .torch_ops import rope

NAME = "rotary"
_NEG = {operator.neg, torch.neg}
_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def rotate(x, cos, sin, unsqueeze_dim: int):
    """``x * cos + rotate_half(x) * sin`` (cos and sin of (batch or 1, seq, head_dim),
    unsqueezed at ``unsqueeze_dim`` against x; each repeats its first half) by ge2jit's rope:
    x (batch, heads, seq, head_dim) with ``unsqueeze_dim`` 1, (batch, seq, heads, head_dim)
    with 2."""
    half = x.shape[-1] // 2
    swap = unsqueeze_dim == 1
    y, _ = rope(x.transpose(1, 2) if swap else x, None, cos[..., :half], sin[..., :half])
    return y.transpose(1, 2) if swap else y


def _slice_of(node, x, half: int, first: bool) -> bool:
    """Whether ``node`` is ``x[..., :half]`` (``first``) or ``x[..., half:]``."""
    if not (is_call(node, functions=(operator.getitem,)) and node.args[0] is x):
        return False
    index = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis
            and isinstance(index[1], slice) and index[1].step in (None, 1)):
        return False
    s = index[1]
    return ((s.start in (None, 0) and s.stop == half) if first
            else (s.start == half and s.stop is None))


def _rotated_half(node, x, half: int):
    """The chain of ``cat((-x[..., half:], x[..., :half]), -1)`` at ``node``: [x2, neg, x1,
    cat], else None."""
    if not is_call(node, functions=(torch.cat,)):
        return None
    parts, dim = argument(node, 0, "tensors"), argument(node, 1, "dim", 0)
    if dim not in (-1, 3) or not isinstance(parts, (tuple, list)) or len(parts) != 2:
        return None
    neg, x1 = parts
    if not (is_call(neg, functions=_NEG, methods=("neg",)) and len(neg.args) == 1):
        return None
    x2 = neg.args[0]
    if not (_slice_of(x2, x, half, False) and _slice_of(x1, x, half, True)):
        return None
    return [x2, neg, x1, node]


def _a_dtype(a) -> bool:
    """Whether a cast's argument is a type: a constant, or a tensor's ``.dtype`` read in the
    graph (FX's trace)."""
    return isinstance(a, torch.dtype) or (is_call(a, functions=(getattr,))
                                           and a.args[1:] == ("dtype",))


def _table(node, kind: str):
    """(the table before its unsqueeze, the unsqueeze's dim, the angles node) when ``node`` is
    ``unsqueeze(t, dim)`` and ``t`` is ``cos(emb)`` / ``sin(emb)`` (``kind``) through casts
    and products by constants, with ``emb = cat((f, f), -1)``; else None."""
    if not is_call(node, functions=(torch.unsqueeze,), methods=("unsqueeze",)):
        return None
    table, dim = node.args[0], argument(node, 1, "dim")
    if dim not in (1, 2):
        return None
    t = table
    while True:
        if is_call(t, methods=("to",)) and len(t.args) <= 2 and set(t.kwargs) <= {"dtype"} \
                and all(_a_dtype(a) for a in (*t.args[1:], *t.kwargs.values())):
            t = t.args[0]
        elif is_call(t, methods=("float",)) and len(t.args) == 1:
            t = t.args[0]
        elif binary_args(t, MUL) is not None and any(isinstance(a, (int, float)) for a in t.args):
            t = next(a for a in t.args if not isinstance(a, (int, float)))
        else:
            break
    if not (is_call(t, functions=(getattr(torch, kind),), methods=(kind,)) and len(t.args) == 1):
        return None
    emb = t.args[0]
    if not is_call(emb, functions=(torch.cat,)):
        return None
    parts, cat_dim = argument(emb, 0, "tensors"), argument(emb, 1, "dim", 0)
    if not (isinstance(parts, (tuple, list)) and len(parts) == 2 and parts[0] is parts[1]):
        return None
    te = tensor_of(emb)
    if cat_dim != -1 and not (te is not None and cat_dim == te.dim() - 1):
        return None
    return table, dim, emb


def match(node):
    args = binary_args(node, ADD)
    if args is None:
        return None
    for direct, rotated in (args, args[::-1]):
        d, r = binary_args(direct, MUL), binary_args(rotated, MUL)
        if d is None or r is None:
            continue
        for x, c in (d, d[::-1]):
            tx = tensor_of(x)
            if tx is None or tx.dim() != 4 or tx.shape[-1] % 2:
                continue
            half = tx.shape[-1] // 2
            for cat, s in (r, r[::-1]):
                chain = _rotated_half(cat, x, half)
                if chain is not None:
                    return _found(node, x, c, s, direct, rotated, chain)
    return None


def _found(node, x, c, s, direct, rotated, chain):
    cos, sin = _table(c, "cos"), _table(s, "sin")
    if cos is None or sin is None:
        why = ("cos and sin not made in this graph as cos / sin of cat((freqs, freqs), -1) "
               "(ge2jit's rope takes one angle per pair)")
        return Skip(NAME, node.name, why)
    (cos_t, dim_c, emb_c), (sin_t, dim_s, emb_s) = cos, sin
    nodes = [*chain, direct, rotated, node]
    tx, ty = tensor_of(x), tensor_of(node)
    tc, ts = tensor_of(cos_t), tensor_of(sin_t)
    why = None
    if dim_c != dim_s or emb_c is not emb_s:
        why = "cos and sin unsqueezed differently or of other angles"
    elif any(set(n.users) - set(nodes) for n in nodes[:-1]):
        why = "a part of the rotation has another user"
    elif ty is None or tc is None or ts is None:
        why = "no recorded tensors for its inputs"
    elif not tx.is_cuda:
        why = "tensors not on a CUDA device"
    elif tx.dtype not in _TYPES or ty.dtype != tx.dtype:
        why = (f"types {tx.dtype} (x) -> {ty.dtype} (the tables' type promotes the result; "
               "ge2jit's rope keeps x's)")
    elif tc.requires_grad or ts.requires_grad:
        why = "cos and sin need gradients (ge2jit's rope gives them none)"
    elif tc.dim() != 3 or tc.shape[-1] != tx.shape[-1] or ts.shape != tc.shape:
        why = f"tables of shape {tuple(tc.shape)} (expected (batch or 1, seq, head_dim))"
    elif tx.stride(-1) != 1:
        why = "x without unit stride along head_dim"
    if why is not None:
        return Skip(NAME, node.name, why)

    def build(graph):
        return graph.call_function(rotate, (x, cos_t, sin_t, dim_c))

    return Fusion(NAME, nodes, "rope", build)


register_pattern(Pattern(NAME, "rope", match))
