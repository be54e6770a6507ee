"""rms_norm and layer_norm as PyTorch custom ops (``torch.ops.ge2jit.*``): each forward (with
the residual add of a pre-norm block fused in) and its backward, with fake implementations
(shapes and types, for ``torch.compile`` and meta tensors), each pair made by
``runtime.torchlib.Differentiable``: the forwards' gradients come from the backward ops, the
functions users call (``rms_norm``, ``layer_norm``) run the same implementations through
``torch.autograd.Function`` classes in eager mode (less host time) and the custom ops where the
call is traced. Imported by ``ge2jit.torch``.

The forwards always write the per-row statistics the backward reads (a float32 per row,
against the rows' own n elements: nothing to save by leaving them out).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.torchlib import Differentiable, absent
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


def _rms_fake(x, weight, residual, eps):
    y = _like(x)
    return y, absent(y) if residual is None else _like(residual), _stats_like(x)


def _rms_setup(ctx, inputs, output):
    x, weight, residual, eps = inputs
    _setup(ctx, x, weight, None, residual, output)


def _rms_grads(ctx, gy, gh, grstd, *, backward):
    """The gradients of (x, weight, residual, eps), by ``backward`` (the backward op, or in
    eager mode its implementation)."""
    def run(dy, h, w, b, stats, dh):
        dx, dw = backward(dy, h, w, stats[0], dh)
        return dx, dw if w is not None else None, None

    n = ctx.needs_input_grad
    gx, gw, _, gr = _grads(ctx, gy, gh, (n[0], n[1], False, n[2]), run)
    return gx, gw, gr, None


def _rms_backward(dy: Tensor, h: Tensor, weight: Tensor | None, rstd: Tensor,
                  dh: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(dx, dweight)`` of ``ge2jit.rms_norm_backward`` (dweight empty without a weight)."""
    g = _rms_norm_backward(dy, h, weight, rstd, dh=dh)
    return g.dx, absent(g.dx) if g.dweight is None else g.dweight


def _rms_backward_fake(dy, h, weight, rstd, dh):
    dx = _like(h)
    return dx, absent(dx) if weight is None else _like(weight)


_RMS = Differentiable("rms_norm", _rms, fake=_rms_fake, setup=_rms_setup, grads=_rms_grads,
                      backward=_rms_backward, backward_fake=_rms_backward_fake,
                      function_name="_RMSNormFunction")
rms_norm_op, rms_norm_backward_op = _RMS.op, _RMS.backward_op


# --- LayerNorm -------------------------------------------------------------------------------

def _ln(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
        eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(y, h, mean, rstd)`` of ``ge2jit.layer_norm`` (h empty without a residual)."""
    y, h, mean, rstd = _layer_norm(x, weight, bias, eps=eps, residual=residual,
                                   save_stats=True)
    return y, absent(y) if h is None else h, mean, rstd


def _ln_fake(x, weight, bias, residual, eps):
    y = _like(x)
    return (y, absent(y) if residual is None else _like(residual), _stats_like(x),
            _stats_like(x))


def _ln_setup(ctx, inputs, output):
    x, weight, bias, residual, eps = inputs
    _setup(ctx, x, weight, bias, residual, output)


def _ln_grads(ctx, gy, gh, gmean, grstd, *, backward):
    """The gradients of (x, weight, bias, residual, eps)."""
    def run(dy, h, w, b, stats, dh):
        dx, dw, db = backward(dy, h, w, b, stats[0], stats[1], dh)
        return dx, dw if w is not None else None, db if b is not None else None

    return (*_grads(ctx, gy, gh, ctx.needs_input_grad[:4], run), None)


def _ln_backward(dy: Tensor, h: Tensor, weight: Tensor | None, bias: Tensor | None,
                 mean: Tensor, rstd: Tensor, dh: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` of ``ge2jit.layer_norm_backward`` (empty where there is no
    weight or bias; the bias is read for its type only)."""
    g = _layer_norm_backward(dy, h, weight, mean, rstd, bias=bias, dh=dh)
    return (g.dx, absent(g.dx) if g.dweight is None else g.dweight,
            absent(g.dx) if g.dbias is None else g.dbias)


def _ln_backward_fake(dy, h, weight, bias, mean, rstd, dh):
    dx = _like(h)
    return (dx, absent(dx) if weight is None else _like(weight),
            absent(dx) if bias is None else _like(bias))


_LN = Differentiable("layer_norm", _ln, fake=_ln_fake, setup=_ln_setup, grads=_ln_grads,
                     backward=_ln_backward, backward_fake=_ln_backward_fake,
                     function_name="_LayerNormFunction")
layer_norm_op, layer_norm_backward_op = _LN.op, _LN.backward_op


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
    y, h, _ = _RMS(x, weight, residual, float(eps))
    return y if residual is None else (y, h)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, *,
               eps: float = 1e-5, residual: Tensor | None = None):
    """``ge2jit.layer_norm`` on PyTorch tensors as a differentiable custom op
    (``torch.ops.ge2jit.layer_norm``): ``y = (h - mean) / sqrt(var + eps) * weight + bias``
    over the last axis (the biased variance, as ``torch.nn.functional.layer_norm``), ``h`` as
    in ``rms_norm``. Returns y, or ``(y, h)`` with a residual; gradients as ``rms_norm``'s,
    with dbias."""
    y, h, _, _ = _LN(x, weight, bias, residual, float(eps))
    return y if residual is None else (y, h)
