"""rms_norm and layer_norm as PyTorch custom ops (``torch.ops.ge2jit.*``): each forward (with
the residual add of a pre-norm block fused in) and its backward, with fake implementations
(shapes and types, for ``torch.compile`` and meta tensors); the forwards are differentiable
through ``register_autograd``, their backwards being the backward ops. The functions users
call (``rms_norm``, ``layer_norm``) run the same implementations through
``torch.autograd.Function`` classes in eager mode (less host time) and the custom ops where the
call is traced. Imported by ``ge2jit.torch``.

The forwards always write the per-row statistics the backward reads (a float32 per row,
against the rows' own n elements: nothing to save by leaving them out).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.torchlib import (
    absent,
    define_op,
    eager_function,
    needs_grad,
    register_autograd,
    register_fake,
    traced,
)
from .op import layer_norm as _layer_norm
from .op import layer_norm_backward as _layer_norm_backward
from .op import rms_norm as _rms_norm
from .op import rms_norm_backward as _rms_norm_backward


def _like(x: Tensor) -> Tensor:
    """A new contiguous tensor of ``x``'s shape and type (what the ops allocate)."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _stats_like(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


def _setup(ctx, x, weight, bias, residual, output) -> None:
    """What both forwards keep for their backward: h (x without a residual), the weight, the
    bias' presence, the statistics, and the input types the gradients go back in."""
    y, h, *stats = output
    ctx.mark_non_differentiable(*stats)
    if residual is None:
        ctx.mark_non_differentiable(h)
    ctx.set_materialize_grads(False)   # y or h may get no gradient: no zeros made for it
    ctx.types = (x.dtype, None if residual is None else residual.dtype)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x if residual is None else h, weight, bias, *stats)


def _grads(ctx, gy, gh, needs, backward):
    """(dx, dweight, dbias, dresidual) of a forward by ``backward(dy, h, weight, bias,
    stats, dh) -> (dx, dweight, dbias)`` (the backward op, or in eager mode its
    implementation); ``needs``: whether x, the weight, the bias and the residual want theirs.
    dx is the gradient of h, which h = x + residual passes to both."""
    h, weight, bias, *stats = ctx.saved_tensors
    x_type, r_type = ctx.types
    if gy is None:   # y got no gradient: h's reaches x and the residual unchanged
        dx, dw, db = gh, None, None
    else:   # (a gradient of a sum comes expanded: made contiguous by PyTorch's allocator)
        dx, dw, db = backward(gy.contiguous(), h, weight, bias if ctx.has_bias else None, stats,
                              None if gh is None else gh.contiguous())
    gx = dx.to(x_type) if needs[0] and dx is not None else None
    gr = dx.to(r_type) if r_type is not None and needs[3] and dx is not None else None
    gw = dw if needs[1] and weight is not None else None
    gb = db if needs[2] and ctx.has_bias else None
    return gx, gw, gb, gr


# --- RMSNorm ---------------------------------------------------------------------------------

def _rms(x: Tensor, weight: Tensor | None, residual: Tensor | None,
         eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, h, rstd)`` of ``ge2jit.rms_norm`` (h empty without a residual)."""
    y, h, _, rstd = _rms_norm(x, weight, eps=eps, residual=residual, save_stats=True)
    return y, absent(y) if h is None else h, rstd


rms_norm_op = define_op("rms_norm", _rms)


@register_fake(rms_norm_op)
def _(x, weight, residual, eps):
    y = _like(x)
    return y, absent(y) if residual is None else _like(residual), _stats_like(x)


def _rms_setup(ctx, inputs, output):
    x, weight, residual, eps = inputs
    _setup(ctx, x, weight, None, residual, output)


def _rms_grads(ctx, gy, gh, backward):
    """The gradients of (x, weight, residual, eps)."""
    n = ctx.needs_input_grad
    gx, gw, _, gr = _grads(ctx, gy, gh, (n[0], n[1], False, n[2]),
                           lambda dy, h, w, b, stats, dh: (*backward(dy, h, w, stats[0], dh),
                                                           None))
    return gx, gw, gr, None


def _rms_autograd(ctx, gy, gh, grstd):
    return _rms_grads(ctx, gy, gh, _rms_backward_op_outputs)


def _rms_backward_op_outputs(dy, h, weight, rstd, dh):
    dx, dw = torch.ops.ge2jit.rms_norm_backward(dy, h, weight, rstd, dh)
    return dx, dw if weight is not None else None


register_autograd(rms_norm_op, _rms_autograd, setup_context=_rms_setup)


def _rms_backward(dy: Tensor, h: Tensor, weight: Tensor | None, rstd: Tensor,
                  dh: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(dx, dweight)`` of ``ge2jit.rms_norm_backward`` (dweight empty without a weight)."""
    g = _rms_norm_backward(dy, h, weight, rstd, dh=dh)
    return g.dx, absent(g.dx) if g.dweight is None else g.dweight


rms_norm_backward_op = define_op("rms_norm_backward", _rms_backward)


@register_fake(rms_norm_backward_op)
def _(dy, h, weight, rstd, dh):
    dx = _like(h)
    return dx, absent(dx) if weight is None else _like(weight)


def _rms_backward_eager(dy, h, weight, rstd, dh):
    dx, dw = _rms_backward(dy, h, weight, rstd, dh)
    return dx, dw if weight is not None else None


# --- LayerNorm -------------------------------------------------------------------------------

def _ln(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
        eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(y, h, mean, rstd)`` of ``ge2jit.layer_norm`` (h empty without a residual)."""
    y, h, mean, rstd = _layer_norm(x, weight, bias, eps=eps, residual=residual,
                                   save_stats=True)
    return y, absent(y) if h is None else h, mean, rstd


layer_norm_op = define_op("layer_norm", _ln)


@register_fake(layer_norm_op)
def _(x, weight, bias, residual, eps):
    y = _like(x)
    return (y, absent(y) if residual is None else _like(residual), _stats_like(x),
            _stats_like(x))


def _ln_setup(ctx, inputs, output):
    x, weight, bias, residual, eps = inputs
    _setup(ctx, x, weight, bias, residual, output)


def _ln_grads(ctx, gy, gh, backward):
    """The gradients of (x, weight, bias, residual, eps)."""
    return (*_grads(ctx, gy, gh, ctx.needs_input_grad[:4],
                    lambda dy, h, w, b, stats, dh: backward(dy, h, w, b, stats[0], stats[1],
                                                            dh)), None)


def _ln_autograd(ctx, gy, gh, gmean, grstd):
    return _ln_grads(ctx, gy, gh, _ln_backward_op_outputs)


def _ln_backward_op_outputs(dy, h, weight, bias, mean, rstd, dh):
    dx, dw, db = torch.ops.ge2jit.layer_norm_backward(dy, h, weight, bias, mean, rstd, dh)
    return dx, dw if weight is not None else None, db if bias is not None else None


register_autograd(layer_norm_op, _ln_autograd, setup_context=_ln_setup)


def _ln_backward(dy: Tensor, h: Tensor, weight: Tensor | None, bias: Tensor | None,
                 mean: Tensor, rstd: Tensor, dh: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` of ``ge2jit.layer_norm_backward`` (empty where there is no
    weight or bias; the bias is read for its type only)."""
    g = _layer_norm_backward(dy, h, weight, mean, rstd, bias=bias, dh=dh)
    return (g.dx, absent(g.dx) if g.dweight is None else g.dweight,
            absent(g.dx) if g.dbias is None else g.dbias)


layer_norm_backward_op = define_op("layer_norm_backward", _ln_backward)


@register_fake(layer_norm_backward_op)
def _(dy, h, weight, bias, mean, rstd, dh):
    dx = _like(h)
    return (dx, absent(dx) if weight is None else _like(weight),
            absent(dx) if bias is None else _like(bias))


def _ln_backward_eager(dy, h, weight, bias, mean, rstd, dh):
    dx, dw, db = _ln_backward(dy, h, weight, bias, mean, rstd, dh)
    return dx, dw if weight is not None else None, db if bias is not None else None


# --- eager mode ------------------------------------------------------------------------------
# The same implementations and autograd formulas as the custom ops, as torch.autograd.Function
# classes: in eager mode a call pays for neither the dispatcher's custom-op layers nor the
# generated autograd wrapper around them. Traced code (torch.compile, fake or other tensor
# subclasses) takes the custom ops.

_RMSNormFunction = eager_function(
    "_RMSNormFunction", _rms, _rms_setup,
    lambda ctx, gy, gh, grstd: _rms_grads(ctx, gy, gh, _rms_backward_eager))

_LayerNormFunction = eager_function(
    "_LayerNormFunction", _ln, _ln_setup,
    lambda ctx, gy, gh, gmean, grstd: _ln_grads(ctx, gy, gh, _ln_backward_eager))


# --- the functions users call ----------------------------------------------------------------

def rms_norm(x: Tensor, weight: Tensor | None = None, *, eps: float = 1e-6,
             residual: Tensor | None = None):
    """``ge2jit.rms_norm`` on PyTorch tensors as a differentiable custom op
    (``torch.ops.ge2jit.rms_norm``): ``y = h / sqrt(mean(h**2) + eps) * weight`` over the last
    axis, with ``h = x`` or, given ``residual``, ``h = x + residual`` added in the same pass.
    Returns y, or ``(y, h)`` with a residual (h in the residual's dtype: a float32 residual
    stream stays float32). Gradients reach x, the weight and the residual through ge2jit's
    backward (dx, and dweight summed in a fixed order: the same inputs give the same bits);
    a gradient arriving at h is added to dx in the same pass. It works in eager mode
    (through an autograd.Function over the same implementation), under ``torch.compile``
    (the op, no graph break) and inside CUDA-graph capture. Statistics are float32; y has
    x's dtype."""
    args = (x, weight, residual, float(eps))
    if traced(x, weight, residual, names=("x", "weight", "residual")):
        y, h, _ = rms_norm_op(*args)
    elif needs_grad(x, weight, residual):
        y, h, _ = _RMSNormFunction.fast_apply(*args)
    else:
        y, h, _ = _rms(*args)
    return y if residual is None else (y, h)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, *,
               eps: float = 1e-5, residual: Tensor | None = None):
    """``ge2jit.layer_norm`` on PyTorch tensors as a differentiable custom op
    (``torch.ops.ge2jit.layer_norm``): ``y = (h - mean) / sqrt(var + eps) * weight + bias``
    over the last axis (the biased variance, as ``torch.nn.functional.layer_norm``), ``h`` as
    in ``rms_norm``. Returns y, or ``(y, h)`` with a residual; gradients as ``rms_norm``'s,
    with dbias."""
    args = (x, weight, bias, residual, float(eps))
    if traced(x, weight, bias, residual, names=("x", "weight", "bias", "residual")):
        y, h, _, _ = layer_norm_op(*args)
    elif needs_grad(x, weight, bias, residual):
        y, h, _, _ = _LayerNormFunction.fast_apply(*args)
    else:
        y, h, _, _ = _ln(*args)
    return y if residual is None else (y, h)
