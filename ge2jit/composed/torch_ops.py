"""linear_cross_entropy as a PyTorch custom op (``torch.ops.ge2jit.linear_cross_entropy`` and
its ``_backward``), made by ``runtime.torchlib.Differentiable``, and the function users call.
Imported by ``ge2jit.torch``."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ArgumentValueError
from ..ops.cross_entropy import scale_gradient
from ..runtime.torchlib import (
    Differentiable,
    absent,
    autocast_dtype,
    needs_grad,
    not_a_cuda_tensor,
)
from .linear_cross_entropy import linear_cross_entropy as _linear_xent_impl
from .linear_cross_entropy import linear_cross_entropy_rows as _linear_xent_rows

# --- linear_cross_entropy --------------------------------------------------------------------
# The forward makes the loss and, when autograd will want them, the gradients of x and of the
# weight for an upstream gradient of 1 ("mean" and "sum"); the backward scales them by the
# loss's upstream gradient (in eager mode in place: nothing when it is exactly 1). With
# reduction "none" the upstream gradient is one number per row, which the weight's gradient
# cannot take afterwards: the forward makes the losses alone and the backward goes through the
# chunks again with each row's gradient scaled before its GEMMs.

def _linear_xent(x: Tensor, weight: Tensor, targets: Tensor, ignore_index: int,
                 reduction: str, label_smoothing: float, compute_grad: bool,
                 check_targets: bool, chunk_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(loss, d loss / d x, d loss / d weight)`` of ``ge2jit.linear_cross_entropy`` (the
    gradients empty without ``compute_grad`` or with reduction "none")."""
    grad = compute_grad and reduction != "none"
    out = _linear_xent_impl(x, weight, targets, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, grad=grad,
                            check_targets=check_targets, chunk_rows=chunk_rows or None)
    if grad:
        return out
    return out, absent(out), absent(out)


def _linear_xent_backward(gloss: Tensor, x: Tensor, weight: Tensor, targets: Tensor,
                          ignore_index: int, label_smoothing: float,
                          chunk_rows: int) -> tuple[Tensor, Tensor]:
    """The gradients of reduction "none"'s losses for upstream gradients ``gloss`` (rows,):
    the chunks again, each row's gradient of the logits times its ``gloss``."""
    return _linear_xent_rows(x, weight, targets, gloss.float(), ignore_index=ignore_index,
                             label_smoothing=label_smoothing, chunk_rows=chunk_rows or None)


def _linear_xent_fake(x, weight, targets, ignore_index, reduction, label_smoothing,
                      compute_grad, check_targets, chunk_rows):
    torch._check(x.dim() == 2 and weight.dim() == 2 and weight.shape[1] == x.shape[1],
                 lambda: f"weight: expected (V, {x.shape[-1]}), got {tuple(weight.shape)}")
    torch._check(targets.dim() == 1 and targets.shape[0] == x.shape[0],
                 lambda: f"targets: expected ({x.shape[0]},), got {tuple(targets.shape)}")
    loss = x.new_empty((x.shape[0],) if reduction == "none" else (), dtype=torch.float32)
    if compute_grad and reduction != "none":
        return loss, x.new_empty(x.shape), weight.new_empty(weight.shape)
    return loss, absent(loss), absent(loss)


def _linear_xent_backward_fake(gloss, x, weight, targets, ignore_index, label_smoothing,
                               chunk_rows):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _linear_xent_setup(ctx, inputs, output):
    x, weight, targets, ignore_index, reduction, smoothing, compute, _, chunk_rows = inputs
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.per_row, ctx.computed, ctx.scaled = reduction == "none", compute, False
    ctx.options = (ignore_index, smoothing, chunk_rows)
    if ctx.per_row:
        ctx.save_for_backward(x, weight, targets)
    else:
        ctx.save_for_backward(output[1], output[2])


_NO_GRADS_LXE = (None,) * 7


def _linear_xent_grads(ctx, gloss, gdx, gdw, *, backward):
    if gloss is None:
        return (None, None, *_NO_GRADS_LXE)
    if not ctx.computed:
        raise RuntimeError("ge2jit::linear_cross_entropy: called with compute_grad=False, so "
                           "its forward made no gradient; call it with compute_grad=True")
    if ctx.per_row:
        x, weight, targets = ctx.saved_tensors
        dx, dw = backward(gloss, x, weight, targets, *ctx.options)
        return (dx, dw, *_NO_GRADS_LXE)
    dx, dw = ctx.saved_tensors
    if backward is _linear_xent_backward:        # eager: scaled in place, once
        if ctx.scaled:
            raise RuntimeError(
                "ge2jit.torch.linear_cross_entropy: this graph's backward ran already (the "
                "gradients its forward saved were scaled in place); compute the loss again "
                "for another backward")
        ctx.scaled = True
        factor = gloss.detach().float()
        return (scale_gradient(dx, factor), scale_gradient(dw, factor), *_NO_GRADS_LXE)
    return (dx * gloss.to(dx.dtype), dw * gloss.to(dw.dtype), *_NO_GRADS_LXE)


_LINEAR_XENT = Differentiable(
    "linear_cross_entropy", _linear_xent, fake=_linear_xent_fake, setup=_linear_xent_setup,
    grads=_linear_xent_grads, backward=_linear_xent_backward,
    backward_fake=_linear_xent_backward_fake)
linear_cross_entropy_op = _LINEAR_XENT.op


def linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, *,
                         chunk_rows: int | None = None, check_targets: bool = True) -> Tensor:
    """``F.cross_entropy(F.linear(x, weight).flatten(0, -2), targets.flatten(), ...)``, a
    language model's head and loss, without the (tokens, V) logits in memory
    (``ge2jit.linear_cross_entropy``: chunks of rows, each three GEMMs and the loss kernel on
    one reused buffer). ``x``: (..., d) of float32, float16 or bfloat16; ``weight``: (V, d),
    of x's type or float32 master weights of a 16-bit x (cast as autocast casts them);
    ``targets``: (...) int32 or int64. Differentiable with respect to x and weight: for "mean"
    and "sum" the forward makes both gradients on the way (no logits kept), and the backward
    only scales them by the loss's upstream gradient; for "none" the backward goes through
    the chunks again. Other arguments as ``ge2jit.torch.cross_entropy``."""
    names = ("x", "weight", "targets")
    for name, t in zip(names, (x, weight, targets)):
        if not isinstance(t, Tensor):
            raise not_a_cuda_tensor(t, name)
    if x.dim() < 1 or targets.shape != x.shape[:-1]:
        raise ArgumentValueError(f"targets: expected shape {tuple(x.shape[:-1])} (x's without "
                                 f"its last axis), got {tuple(targets.shape)}")
    low = autocast_dtype()
    if low is not None:                      # inside autocast: F.linear's casts
        x, weight = x.to(low), weight.to(low)
    elif weight.dtype != x.dtype and weight.dtype == torch.float32 and x.dtype in (
            torch.float16, torch.bfloat16):
        weight = weight.to(x.dtype)          # master weights: the cast autocast makes
    chunk = 0 if chunk_rows is None else int(chunk_rows)
    args = (x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1), int(ignore_index),
            reduction, float(label_smoothing), needs_grad(x, weight), bool(check_targets),
            chunk)
    return _LINEAR_XENT(*args)[0]
