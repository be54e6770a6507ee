"""The compiler backend's norm patterns (``ge2jit.runtime.torchpasses``): an RMSNorm or a
LayerNorm over the last axis becomes ``ge2jit.torch.rms_norm`` / ``layer_norm``, and when its
input is the sum of two tensors (a transformer's residual stream, ``h = x + residual``), the
sum is made by the norm's kernel too (``rms_norm(x, w, residual=r) -> (y, h)``): one pass over
the rows where there were two. RMSNorm is found as ``torch.rms_norm`` (``nn.RMSNorm``) and as
the float32 sequence Hugging Face's models write (``h.to(float32)``, ``pow(2).mean(-1,
keepdim=True)``, ``rsqrt(... + eps)``, the product cast back and times the weight).

Where Inductor compiles the graph (``torch.compile(backend="ge2jit")``'s default), both
patterns are left to it unless ``only`` names them: its kernel for the same fusion is as fast
(``LEFT``). They apply with ``inductor=False`` and in ``ge2jit.torch.patch``'s eager models."""

from __future__ import annotations

import operator

import torch
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
from .torch_ops import layer_norm, rms_norm

_TYPES = (torch.float16, torch.bfloat16, torch.float32)
_RMS = {torch.rms_norm, getattr(F, "rms_norm", torch.rms_norm)}
_LN = {F.layer_norm, torch.layer_norm}


def _single_use(nodes, last) -> bool:
    """Every node of the chain but ``last`` used only inside the chain."""
    inside = set(nodes)
    return all(set(n.users) <= inside for n in nodes if n is not last)


def _float32_of(node):
    """The node that ``node`` casts to float32 (``.to(torch.float32)``, ``.float()``), or
    ``node`` itself (already float32), or None."""
    if is_call(node, methods=("float",)) and len(node.args) == 1:
        return node.args[0]
    if is_call(node, methods=("to", "type")) and len(node.args) == 2 and \
            node.args[1] is torch.float32:
        return node.args[0]
    t = tensor_of(node)
    return node if t is not None and t.dtype == torch.float32 else None


def _hf_rms_norm(final):
    """(chain nodes in order, x, weight, eps) of Hugging Face's RMSNorm ending at ``final``
    (``weight * normed.to(dtype)``), else None."""
    if not is_call(final, MUL) or len(final.args) != 2:
        return None
    for weight, rest in (final.args, final.args[::-1]):
        cast, dtype_of = rest, None
        if is_call(rest, methods=("to",)) and len(rest.args) == 2:   # back to the input's type
            if is_call(rest.args[1], (getattr,)) and rest.args[1].args[1:] == ("dtype",):
                dtype_of = rest.args[1]   # x.dtype read in the graph (FX's trace)
            elif not isinstance(rest.args[1], torch.dtype):
                continue
            rest = rest.args[0]
        if not is_call(rest, MUL) or len(rest.args) != 2:
            continue
        for h32, r in (rest.args, rest.args[::-1]):
            if not (is_call(r, (torch.rsqrt,), ("rsqrt",)) and len(r.args) == 1):
                continue
            add = r.args[0]
            if not (is_call(add, ADD) and len(add.args) == 2 and isinstance(add.args[1], float)):
                continue
            mean = add.args[0]
            if not (is_call(mean, (torch.mean,), ("mean",)) and
                    argument(mean, 1, "dim") in (-1, [-1], (-1,)) and
                    mean.kwargs.get("keepdim", len(mean.args) > 2 and mean.args[2]) is True):
                continue
            power = mean.args[0]
            if not (is_call(power, (torch.pow, operator.pow), ("pow",)) and
                    power.args[1:] == (2,) and power.args[0] is h32):
                continue
            x = _float32_of(h32)
            if x is None or not isinstance(weight, torch.fx.Node):
                continue
            chain = [n for n in (h32 if h32 is not x else None, power, mean, add, r, rest,
                                 dtype_of, cast if cast is not rest else None, final)
                     if n is not None]
            return chain, x, weight, add.args[1]
    return None


def _residual(x):
    """(a, b) when ``x`` is ``a + b`` of two tensors of x's shape and type, else None."""
    args = binary_args(x, ADD)
    if args is None:
        return None
    a, b = args
    ta, tb, tx = tensor_of(a), tensor_of(b), tensor_of(x)
    if ta is None or tb is None or tx is None:
        return None
    if ta.shape != tx.shape or tb.shape != tx.shape or not ta.dtype == tb.dtype == tx.dtype:
        return None
    return a, b


def _why_not(name, x, weight, out) -> str | None:
    tx, tw, ty = tensor_of(x), tensor_of(weight), tensor_of(out)
    if tx is None or ty is None or (weight is not None and tw is None):
        return "no recorded tensors for its inputs"
    if not tx.is_cuda:
        return "tensors not on a CUDA device"
    if tx.dtype not in _TYPES or ty.dtype != tx.dtype:
        return (f"types {tx.dtype} in, {ty.dtype} out (ge2jit's {name} keeps float16, "
                "bfloat16 or float32)")
    if tw is not None and (tw.dim() != 1 or tw.shape[0] != tx.shape[-1]):
        return f"a weight of shape {tuple(tw.shape)} (ge2jit's {name} takes one per column)"
    return None


def _fusion(name, chain, x, build_args, fn):
    """The norm of ``x`` (the chain's last node its value), with x's sum made in the kernel
    when x is a residual add."""
    pair = _residual(x)
    if pair is None:
        def build(graph):
            return graph.call_function(fn, (x, *build_args[0]), build_args[1])
        return Fusion(name, chain, name, build)
    a, b = pair

    def build_residual(graph):
        return graph.call_function(fn, (a, *build_args[0]), {**build_args[1], "residual": b})

    return Fusion(name, [x, *chain], f"{name}(residual)", build_residual,
                  outputs=[(chain[-1], 0), (x, 1)], after=x)


def match_rms(node):
    if is_call(node, _RMS):
        x, shape = argument(node, 0, "input"), argument(node, 1, "normalized_shape")
        weight, eps = argument(node, 2, "weight"), argument(node, 3, "eps")
        chain = [node]
    else:
        found = _hf_rms_norm(node)
        if found is None:
            return None
        chain, x, weight, eps = found
        shape = None
    tx = tensor_of(x)
    if shape is not None and (tx is None or tuple(shape) != (tx.shape[-1],)):
        return Skip("rms_norm", node.name, "a norm over more than the last axis")
    if not _single_use(chain, node):
        return Skip("rms_norm", node.name, "an intermediate of the norm has another user")
    why = _why_not("rms_norm", x, weight, node)
    if why is not None:
        return Skip("rms_norm", node.name, why)
    if eps is None:   # torch.rms_norm's default
        eps = torch.finfo(tx.dtype).eps
    return _fusion("rms_norm", chain, x, ((weight,), {"eps": float(eps)}), rms_norm)


def match_ln(node):
    if not is_call(node, _LN):
        return None
    x, shape = argument(node, 0, "input"), argument(node, 1, "normalized_shape")
    weight, bias = argument(node, 2, "weight"), argument(node, 3, "bias")
    eps = argument(node, 4, "eps", 1e-5)
    tx = tensor_of(x)
    if tx is None or tuple(shape) != (tx.shape[-1],):
        return Skip("layer_norm", node.name, "a norm over more than the last axis")
    why = _why_not("layer_norm", x, weight, node)
    if why is None and bias is not None and tensor_of(bias) is None:
        why = "no recorded tensor for its bias"
    if why is not None:
        return Skip("layer_norm", node.name, why)
    return _fusion("layer_norm", [node], x, ((weight, bias), {"eps": float(eps)}), layer_norm)


#: Inductor makes a norm and the residual add before it one Triton kernel as fast as ge2jit's
#: and fuses its neighbours into it as well; a custom op's launch costs more host time
#: (H200, kernel time a step: GPT-2 8 x 512 tokens 8.38 ms with ge2jit's LayerNorms, 8.18
#: without; the LLaMA of bench_models 11.34 and 11.35)
LEFT = ("left to Inductor, whose kernel for a norm and its residual add is as fast "
        "(name the pattern in only= to take ge2jit's)")
register_pattern(Pattern("rms_norm", "rms_norm", match_rms, priority=50, left_to_inductor=LEFT))
register_pattern(Pattern("layer_norm", "layer_norm", match_ln, priority=50,
                         left_to_inductor=LEFT))
