"""rope as PyTorch custom ops (``torch.ops.ge2jit.rope`` and ``rope_backward``), made by
``runtime.torchlib.Differentiable``. Imported by ``ge2jit.torch``."""

from __future__ import annotations

from torch import Tensor

from ...errors import ArgumentValueError
from ...runtime.torchlib import Differentiable, absent, needs_grad
from . import op


def _like(x: Tensor) -> Tensor:
    """A new output for ``x`` as the op makes it (``op.swapped``): the transposed view of a
    contiguous (batch, heads, seq, head_dim) tensor gets one laid out so, anything else a
    contiguous one."""
    if (x.dim() >= 3 and x.shape[-3] > 1 and x.shape[-2] > 1 and x.numel()
            and x.transpose(-3, -2).is_contiguous()):
        return x.new_empty(x.transpose(-3, -2).shape).transpose(-3, -2)
    return x.new_empty(x.shape)


def _run(core, q, k, cos, sin, interleaved, positions):
    qo, ko = core(q, k, cos, sin, interleaved=interleaved, positions=positions)
    return qo, absent(qo) if ko is None else ko


def _rope(q: Tensor, k: Tensor | None, cos: Tensor, sin: Tensor, interleaved: bool,
          positions: Tensor | None) -> tuple[Tensor, Tensor]:
    """``ge2jit.rope`` into outputs laid out as q and k (k's empty when k is None)."""
    return _run(op.rope, q, k, cos, sin, interleaved, positions)


def _rope_backward(gq: Tensor, gk: Tensor | None, cos: Tensor, sin: Tensor, interleaved: bool,
                   positions: Tensor | None) -> tuple[Tensor, Tensor]:
    """``ge2jit.rope_backward``: the gradients of q and k (k's empty when gk is None)."""
    return _run(op.rope_backward, gq, gk, cos, sin, interleaved, positions)


def _fake(q, k, cos, sin, interleaved, positions):
    return _like(q), absent(q) if k is None else _like(k)


def _setup(ctx, inputs, output):
    q, k, cos, sin, interleaved, positions = inputs
    ctx.interleaved, ctx.has_k, ctx.types = interleaved, k is not None, (
        q.dtype, None if k is None else k.dtype)
    ctx.save_for_backward(cos, sin, positions)


def _dense(g: Tensor, dtype) -> Tensor:
    """A gradient as the op takes it: its input's type, unit stride along head_dim (the
    gradient of a sum comes as an expanded view)."""
    g = g.to(dtype)
    return g if g.stride(-1) == 1 or g.shape[-1] == 1 else g.contiguous()


def _grads(ctx, gq, gk, *, backward):
    cos, sin, positions = ctx.saved_tensors
    gq = _dense(gq, ctx.types[0])
    gk = _dense(gk, ctx.types[1]) if ctx.has_k else None
    dq, dk = backward(gq, gk, cos, sin, ctx.interleaved, positions)
    return dq, dk if ctx.has_k else None, None, None, None, None


_ROPE = Differentiable("rope", _rope, fake=_fake, setup=_setup, grads=_grads,
                       backward=_rope_backward, backward_fake=_fake)


def rope(q: Tensor, k: Tensor | None, cos: Tensor, sin: Tensor, *, interleaved: bool = False,
         positions: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """``ge2jit.rope`` on tensors, differentiable in q and k (the backward rotates the
    gradients back, in one launch for both): ``(q_rotated, k_rotated)``, laid out as q and k
    (``k_rotated`` None when k is None). q, k: (batch, seq, heads, head_dim) with unit stride
    along head_dim (a (batch, heads, seq, head_dim) tensor as its ``transpose(1, 2)``); cos
    and sin: (rows, half) or (batch or 1, rows, half) tables, which get no gradient;
    positions: None or int32/int64 (batch, seq) or (seq,). As custom ops under
    ``torch.compile`` (``torch.ops.ge2jit.rope``), an autograd.Function eagerly."""
    if needs_grad(cos, sin):
        raise ArgumentValueError("cos, sin: expected tables without gradient (none flows to "
                                 "them); pass cos.detach() and sin.detach()")
    qo, ko = _ROPE(q, k, cos, sin, bool(interleaved), positions)
    return qo, None if k is None else ko

