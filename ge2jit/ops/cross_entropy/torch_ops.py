"""cross_entropy as a PyTorch custom op (``torch.ops.ge2jit.cross_entropy``): the forward
returns the loss and, when autograd will want one, the gradient with respect to the logits,
computed by the same kernel; the backward only scales that saved gradient by the loss's
upstream gradient. It has a fake implementation (shapes and types, for ``torch.compile`` and
meta tensors) and autograd through ``register_autograd``; the function users call
(``cross_entropy``) runs the same implementation through a ``torch.autograd.Function`` in
eager mode (less host time, and the saved gradient scaled in place) and the custom op where
the call is traced. Imported by ``ge2jit.torch``.
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
from .op import cross_entropy as _xent
from .op import scale_gradient

#: the arguments after the logits that take no gradient
NO_GRADS = (None,) * 6


def _cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str,
                   label_smoothing: float, compute_grad: bool,
                   check_targets: bool) -> tuple[Tensor, Tensor]:
    """``(loss, d loss / d logits)`` of ``ge2jit.cross_entropy`` (the gradient empty without
    ``compute_grad``)."""
    if compute_grad:
        return _xent(logits, targets, ignore_index=ignore_index, reduction=reduction,
                     label_smoothing=label_smoothing, grad=True, check_targets=check_targets)
    loss = _xent(logits, targets, ignore_index=ignore_index, reduction=reduction,
                 label_smoothing=label_smoothing, check_targets=check_targets)
    return loss, absent(loss)


cross_entropy_op = define_op("cross_entropy", _cross_entropy)


@register_fake(cross_entropy_op)
def _(logits, targets, ignore_index, reduction, label_smoothing, compute_grad, check_targets):
    torch._check(logits.dim() == 2, lambda: f"logits: expected (rows, classes), got "
                                            f"{tuple(logits.shape)}")
    torch._check(targets.dim() == 1 and targets.shape[0] == logits.shape[0],
                 lambda: f"targets: expected ({logits.shape[0]},), got {tuple(targets.shape)}")
    shape = (logits.shape[0],) if reduction == "none" else ()
    loss = logits.new_empty(shape, dtype=torch.float32)
    return loss, (logits.new_empty(logits.shape) if compute_grad else absent(loss))


def _setup(ctx, inputs, output):
    reduction, compute_grad = inputs[3], inputs[5]
    loss, grad = output
    ctx.mark_non_differentiable(grad)
    ctx.set_materialize_grads(False)   # the gradient output has no gradient: no zeros made
    ctx.reduction, ctx.computed = reduction, compute_grad
    ctx.scaled = False
    ctx.save_for_backward(grad)


def _saved_gradient(ctx) -> Tensor:
    if not ctx.computed:
        raise RuntimeError("ge2jit::cross_entropy: called with compute_grad=False, so its "
                           "forward made no gradient; call it with compute_grad=True")
    return ctx.saved_tensors[0]


def _factor(ctx, gloss: Tensor) -> Tensor:
    """The upstream gradient as the saved gradient's rows take it: a scalar, or one per row."""
    return gloss if ctx.reduction != "none" else gloss.unsqueeze(1)


def _grads_of_op(ctx, gloss, ggrad):
    """The custom op's backward (traced: out of place, as functional graphs want)."""
    if gloss is None:
        return (None, *NO_GRADS)
    grad = _saved_gradient(ctx)
    return (grad * _factor(ctx, gloss).to(grad.dtype), *NO_GRADS)


register_autograd(cross_entropy_op, _grads_of_op, setup_context=_setup)


# --- eager mode ----------------------------------------------------------------------------
# The same implementation and gradient as the custom op, as a torch.autograd.Function: no
# dispatcher layers, and the backward scales the saved gradient in place (one kernel that
# leaves the rows whose factor is exactly 1, the usual upstream gradient of a loss, untouched:
# no memory traffic and no synchronization), so the gradient costs no memory beyond itself.

def _eager_backward(ctx, gloss, ggrad):
    if gloss is None:
        return (None, *NO_GRADS)
    if ctx.scaled:
        raise RuntimeError(
            "ge2jit.torch.cross_entropy: this graph's backward ran already (the gradient "
            "its forward saved was scaled in place); compute the loss again for another "
            "backward")
    grad = _saved_gradient(ctx)
    ctx.scaled = True
    factor = gloss.detach()
    if factor.dtype != torch.float32:
        factor = factor.float()
    return (scale_gradient(grad, factor), *NO_GRADS)


_CrossEntropyFunction = eager_function("_CrossEntropyFunction", _cross_entropy, _setup,
                                       _eager_backward)


# --- the function users call ---------------------------------------------------------------

def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, *,
                  check_targets: bool = True) -> Tensor:
    """``torch.nn.functional.cross_entropy(logits, targets, ignore_index=..., reduction=...,
    label_smoothing=...)`` for (rows, classes) logits of float32, float16 or bfloat16 and
    (rows,) int32 or int64 class indices, differentiable with respect to the logits, as a
    custom op (``torch.ops.ge2jit.cross_entropy``; in eager mode an autograd.Function over
    the same implementation). When a gradient is wanted, the forward's kernel writes d loss /
    d logits as it computes the loss (the logits are read twice, the gradient written once)
    and keeps it; the backward multiplies it, in place in eager mode, by the upstream
    gradient, so the whole step allocates one gradient-sized tensor (PyTorch's eager
    cross-entropy keeps the log-softmax and makes the gradient in the backward: two). The
    loss is float32 (PyTorch's is the logits' type), computed in float32 with float64 sums.

    ``check_targets`` (default True) raises on a class outside [0, classes) that is not
    ``ignore_index`` (PyTorch asserts on the device) at the cost of one synchronization per
    call; pass False inside CUDA graph captures (such rows then get a NaN loss). In eager mode
    the backward may run once per forward (its gradient is scaled in place: a second backward
    through the same graph raises).
    """
    compute = needs_grad(logits)
    args = (logits, targets, int(ignore_index), reduction, float(label_smoothing), compute,
            bool(check_targets))
    if traced(logits, targets, names=("logits", "targets")):
        return cross_entropy_op(*args)[0]
    if compute:
        return _CrossEntropyFunction.fast_apply(*args)[0]
    return _cross_entropy(*args)[0]
