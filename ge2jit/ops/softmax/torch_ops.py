"""softmax as PyTorch custom ops (``torch.ops.ge2jit.softmax`` and ``softmax_backward``), made
by ``runtime.torchlib.Differentiable``: the forward's backward is ge2jit's fused softmax
backward, from the saved output. Imported by ``ge2jit.torch``."""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.torchlib import Differentiable
from .op import softmax as _forward
from .op import softmax_backward as _backward


def _softmax(x: Tensor, dim: int) -> Tensor:
    """``ge2jit.softmax(x, dim)``: a new contiguous tensor of x's type."""
    return _forward(x, dim)


def _softmax_backward(dy: Tensor, y: Tensor, dim: int) -> Tensor:
    """``ge2jit.softmax_backward(dy, y, dim)``: a new contiguous tensor of dy's type."""
    return _backward(dy, y, dim)


def _backward_fake(dy, y, dim):
    torch._check(dy.shape == y.shape, lambda: f"y: expected dy's shape {tuple(dy.shape)}, "
                                              f"got {tuple(y.shape)}")
    return dy.new_empty(dy.shape)


def _setup(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(output)


def _grads(ctx, gy, *, backward):
    (y,) = ctx.saved_tensors
    return backward(gy if gy.dtype == y.dtype else gy.to(y.dtype), y, ctx.dim), None


_SOFTMAX = Differentiable("softmax", _softmax, fake=lambda x, dim: x.new_empty(x.shape),
                          setup=_setup, grads=_grads, backward=_softmax_backward,
                          backward_fake=_backward_fake)
softmax_op, softmax_backward_op = _SOFTMAX.op, _SOFTMAX.backward_op
_SoftmaxFunction = _SOFTMAX.function


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax(x, dim)`` on ge2jit's kernels, differentiable (the backward is
    ``softmax_backward``: ``y * (dy - sum(dy * y))`` in one fused pass from the saved output),
    as custom ops (``torch.ops.ge2jit.softmax``; in eager mode an autograd.Function over the
    same implementations); float32, float16 and bfloat16, float32 math, any dim."""
    return _SOFTMAX(x, int(dim))
