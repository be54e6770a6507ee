"""softmax as PyTorch custom ops (``torch.ops.ge2jit.softmax`` and ``softmax_backward``): the
forward's backward is ge2jit's fused softmax backward, from the saved output. Each has a fake
implementation (shapes and types, for ``torch.compile`` and meta tensors); the function users
call (``softmax``) runs the same implementations through a ``torch.autograd.Function`` in eager
mode (less host time) and the custom ops where the call is traced. Imported by
``ge2jit.torch``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.torchlib import (
    define_op,
    eager_function,
    needs_grad,
    register_autograd,
    register_fake,
    traced,
)
from .op import softmax as _forward
from .op import softmax_backward as _backward


def _softmax(x: Tensor, dim: int) -> Tensor:
    """``ge2jit.softmax(x, dim)``: a new contiguous tensor of x's type."""
    return _forward(x, dim)


def _softmax_backward(dy: Tensor, y: Tensor, dim: int) -> Tensor:
    """``ge2jit.softmax_backward(dy, y, dim)``: a new contiguous tensor of dy's type."""
    return _backward(dy, y, dim)


softmax_op = define_op("softmax", _softmax)
softmax_backward_op = define_op("softmax_backward", _softmax_backward)


@register_fake(softmax_op)
def _(x, dim):
    return x.new_empty(x.shape)


@register_fake(softmax_backward_op)
def _(dy, y, dim):
    torch._check(dy.shape == y.shape, lambda: f"y: expected dy's shape {tuple(dy.shape)}, "
                                              f"got {tuple(y.shape)}")
    return dy.new_empty(dy.shape)


def _setup(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(output)


def _grads(ctx, gy, backward):
    """The gradient of ``_softmax``'s input by ``backward`` (the backward op, or in eager
    mode its implementation)."""
    (y,) = ctx.saved_tensors
    if gy.dtype != y.dtype:
        gy = gy.to(y.dtype)
    return backward(gy, y, ctx.dim), None


def _softmax_autograd(ctx, gy):
    return _grads(ctx, gy, torch.ops.ge2jit.softmax_backward)


register_autograd(softmax_op, _softmax_autograd, setup_context=_setup)


_SoftmaxFunction = eager_function("_SoftmaxFunction", _softmax, _setup,
                                  lambda ctx, gy: _grads(ctx, gy, _softmax_backward))


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax(x, dim)`` on ge2jit's kernels, differentiable (the backward is
    ``softmax_backward``: ``y * (dy - sum(dy * y))`` in one fused pass from the saved output),
    as custom ops (``torch.ops.ge2jit.softmax``; in eager mode an autograd.Function over the
    same implementations); float32, float16 and bfloat16, float32 math, any dim."""
    dim = int(dim)
    if traced(x, names=("x",)):
        return softmax_op(x, dim)
    if needs_grad(x):
        return _SoftmaxFunction.fast_apply(x, dim)
    return _softmax(x, dim)
