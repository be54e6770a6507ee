"""attention as PyTorch custom ops (``torch.ops.ge2jit.attention``, ``attention_backward``, and
``attention_inference``: the forward without the lse, for a call that records no gradient),
made by ``runtime.torchlib.Differentiable``, and the functions ``ge2jit.torch`` gives on them:
``attention`` (FlashAttention's interface: (B, S, H, D) or packed sequences) and
``scaled_dot_product_attention`` (PyTorch's, which falls back to PyTorch's own for what the
kernels do not do, with a one-time warning naming why). Imported by ``ge2jit.torch``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...errors import ArgumentTypeError, ArgumentValueError
from ...runtime.torchlib import Differentiable, autocast_dtype, cast, needs_grad, warn_once
from . import backward as _backward
from . import op as _op
from .spec import HEAD_DIMS

_TYPES = (torch.float16, torch.bfloat16)


def _keywords(cu_q, cu_k, bounds, max_q, max_k, causal, scale, left, right, softcap,
              bhsd) -> dict:
    """The keywords of ``ge2jit.attention`` for the ops' flat arguments."""
    kw = dict(causal=causal, scale=scale, window=None if left == -1 and right == -1
              else (left, right), softcap=softcap or None,
              layout="bhsd" if bhsd else None, seq_bounds=bounds)
    if cu_q is not None:
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                  max_seqlen_k=max_k)
    return kw


def _forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor | None,
             cu_seqlens_k: Tensor | None, seq_bounds: Tensor | None, max_seqlen_q: int,
             max_seqlen_k: int, causal: bool, scale: float, window_left: int,
             window_right: int, softcap: float, bhsd: bool) -> tuple[Tensor, Tensor]:
    """``ge2jit.attention`` with its lse: (o, lse)."""
    return _op.attention(q, k, v, return_lse=True, **_keywords(
        cu_seqlens_q, cu_seqlens_k, seq_bounds, max_seqlen_q, max_seqlen_k, causal, scale,
        window_left, window_right, softcap, bhsd))


def _inference(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor | None,
               cu_seqlens_k: Tensor | None, seq_bounds: Tensor | None, max_seqlen_q: int,
               max_seqlen_k: int, causal: bool, scale: float, window_left: int,
               window_right: int, softcap: float, bhsd: bool) -> Tensor:
    """``ge2jit.attention`` without its lse (which only the backward reads): a call that
    records no gradient."""
    return _op.attention(q, k, v, **_keywords(
        cu_seqlens_q, cu_seqlens_k, seq_bounds, max_seqlen_q, max_seqlen_k, causal, scale,
        window_left, window_right, softcap, bhsd))


def _backward_impl(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                   cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
                   seq_bounds: Tensor | None, max_seqlen_q: int, max_seqlen_k: int,
                   causal: bool, scale: float, window_left: int, window_right: int,
                   softcap: float, bhsd: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``ge2jit.attention_backward``: (dq, dk, dv); its two-kernel form without atomics
    while ``torch.use_deterministic_algorithms`` is on."""
    return _backward.attention_backward(_ready(do), q, k, v, o, lse, **_keywords(
        cu_seqlens_q, cu_seqlens_k, seq_bounds, max_seqlen_q, max_seqlen_k, causal, scale,
        window_left, window_right, softcap, bhsd),
        deterministic=torch.are_deterministic_algorithms_enabled())


def _ready(x: Tensor) -> Tensor:
    """A gradient as the kernels read it (unit stride along head_dim, 16-byte aligned, other
    strides multiples of 8 elements), else a contiguous copy: autograd may hand an expanded
    or sliced one."""
    ok = (x.stride(-1) == 1 and x.data_ptr() % 16 == 0
          and all(n == 1 or st % 8 == 0 for n, st in zip(x.shape[:-1], x.stride()[:-1])))
    return x if ok else x.contiguous()


def _lse_shape(q: Tensor, cu_q: Tensor | None, bhsd: bool) -> tuple[int, ...]:
    if cu_q is not None:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[1], q.shape[2]) if bhsd else (q.shape[0], q.shape[2],
                                                              q.shape[1])


def _fake(q, k, v, cu_q, cu_k, bounds, max_q, max_k, causal, scale, left, right, softcap,
          bhsd):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, cu_q, bhsd), dtype=torch.float32)


def _inference_fake(q, *args):
    return q.new_empty(q.shape)


def _backward_fake(do, q, k, v, o, lse, *args):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, bounds, *flags = inputs
    o, lse = output
    ctx.flags = tuple(flags)
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, bounds)


def _grads(ctx, do, dlse, *, backward):
    # lse is returned detached by every function here: no gradient reaches it
    q, k, v, o, lse, cu_q, cu_k, bounds = ctx.saved_tensors
    dq, dk, dv = backward(do.to(q.dtype), q, k, v, o, lse, cu_q, cu_k, bounds, *ctx.flags)
    return (dq, dk, dv) + (None,) * 11


def _autocast(*tensors):
    """The tensors as autocast casts a matrix product's inputs in the current region (CUDA
    floating tensors other than float64 to the region's type), else unchanged."""
    dtype = autocast_dtype("cuda")
    return tuple(cast(x, dtype) if isinstance(x, Tensor) and x.is_cuda
                 and x.dtype != torch.float64 else x for x in tensors)


_ATTENTION = Differentiable("attention", _forward, fake=_fake, setup=_setup, grads=_grads,
                            backward=_backward_impl, backward_fake=_backward_fake,
                            inference=_inference, inference_fake=_inference_fake)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: float | None = None, window: tuple[int, int] | None = None,
              softcap: float | None = None, cu_seqlens_q: Tensor | None = None,
              cu_seqlens_k: Tensor | None = None, max_seqlen_q: int | None = None,
              max_seqlen_k: int | None = None, seq_bounds: Tensor | None = None,
              return_lse: bool = False, layout: str | None = None):
    """``ge2jit.attention`` on tensors, differentiable in q, k and v (the backward is
    ``ge2jit.attention_backward``; deterministic under ``torch.use_deterministic_algorithms``):
    FlashAttention's interface, q (B, S_q, H, D) and k, v (B, S_k, H_kv, D)
    (``layout="bhsd"``: heads first), or packed (total, H, D)
    with ``cu_seqlens_q``, ``cu_seqlens_k`` (int32) and the longest lengths; several sequences
    a row of a dense batch with ``seq_bounds`` (int32 (B, S, 2), :func:`sequence_bounds`
    makes them from sequence ids, on the GPU, with no wait). Returns the output
    (with ``return_lse``, also the log-sum-exp, which carries no gradient; without it, a call
    that records no gradient runs the kernel that writes none). As custom ops
    under ``torch.compile`` (``torch.ops.ge2jit.attention``), an autograd.Function eagerly.
    Inside ``torch.autocast``, float32 q, k and v are cast to the region's type first."""
    q, k, v = _autocast(q, k, v)
    d = q.shape[-1] if q.dim() else 0
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0   # (a head_dim of 0 is refused by the op)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seq_bounds,
            int(max_seqlen_q or 0) if varlen else 0,
            int(max_seqlen_k or 0) if varlen else 0, bool(causal), float(scale), left, right,
            float(softcap or 0.0), layout == "bhsd")
    if not return_lse and not needs_grad(q, k, v):   # no backward: the kernel without lse
        return _ATTENTION.infer(*args)
    o, lse = _ATTENTION(*args)
    return (o, lse.detach()) if return_lse else o


def sequence_bounds(ids: Tensor) -> Tensor:
    """The ``seq_bounds`` of :func:`attention` for a dense batch of B rows of S tokens whose
    sequences are given by ``ids`` ((B, S) integers: a sequence is a run of equal ids along a
    row; a new one starts where the id changes, as a data collator that packs documents
    numbers them) or by a (B, S) bool of the tokens that start one (True: this token starts a
    sequence; the first of a row always does): int32 (B, S, 2), each token's sequence's
    first token and one past its last within its row. Made on the ids' device by a scan along
    the rows, nothing read on the host: traceable by ``torch.compile``, capturable in a CUDA
    graph."""
    if not isinstance(ids, Tensor):
        raise ArgumentTypeError(f"ids: expected a (batch, seq) tensor, got "
                                f"{type(ids).__name__}")
    if ids.dim() != 2:
        raise ArgumentValueError(f"ids: expected a (batch, seq) tensor, got shape "
                                 f"{tuple(ids.shape)}")
    b, s = ids.shape
    if ids.dtype == torch.bool:
        starts = ids.clone()
    else:
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    if s:
        starts[:, 0] = True
    at = torch.arange(s, device=ids.device, dtype=torch.int32).expand(b, s)
    first = torch.where(starts, at, 0).cummax(1).values
    # one past the last: the next token that starts a sequence (s past the row's last)
    following = torch.full_like(at, s)
    following[:, :-1] = torch.where(starts[:, 1:], at[:, 1:], s)
    end = following.flip(1).cummin(1).values.flip(1)
    return torch.stack([first, end], 2)   # (int32, as ``at``)


# --- PyTorch's scaled_dot_product_attention -----------------------------------------------

def _why_not(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why a call of scaled_dot_product_attention goes to PyTorch's own, or None."""
    if attn_mask is not None:
        return "an attn_mask (ge2jit takes is_causal and no other mask)"
    if dropout_p:
        return "dropout_p > 0 (ge2jit's kernels have no dropout)"
    tensors = (q, k, v)
    if not all(isinstance(x, torch.Tensor) and x.is_cuda for x in tensors):
        return "tensors not on a CUDA device"
    if any(x.dtype not in _TYPES or x.dtype != q.dtype for x in tensors):
        return f"dtype {q.dtype} (ge2jit's kernels take float16 and bfloat16)"
    if any(x.dim() != 4 for x in tensors):
        return "inputs that are not 4-D (batch, heads, seq, head_dim)"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head_dim {q.shape[-1]} / {v.shape[-1]} (ge2jit's kernels take " \
               f"{', '.join(map(str, HEAD_DIMS))}, one for q, k and v)"
    h, h_kv = q.shape[1], k.shape[1]
    if h != h_kv and not (enable_gqa and h_kv and h % h_kv == 0):
        return "different head counts without enable_gqa"
    if is_causal and q.shape[2] != k.shape[2]:
        return ("is_causal with seq_q != seq_k (PyTorch aligns that mask to the top left, "
                "ge2jit to the bottom right)")
    return None


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` with PyTorch's signature and
    semantics on ge2jit's kernels: query (B, H, S_q, D), key and value (B, H_kv, S_k, D),
    float16 or bfloat16, head_dim 64, 128 or 256, ``is_causal``, ``scale``, ``enable_gqa``
    (H_kv dividing H). What they do not do (an ``attn_mask``, dropout, other types or head
    dims, ``is_causal`` with S_q != S_k, which PyTorch aligns top-left) goes to PyTorch's
    own function, with a warning naming the reason once per reason. Inside ``torch.autocast``
    float32 inputs are cast to the region's type first, as PyTorch's function does.
    Differentiable; under ``torch.compile`` the custom ops ``torch.ops.ge2jit.attention`` and
    its backward."""
    if attn_mask is None:   # inside torch.autocast, as PyTorch's: float32 in, the region's type
        query, key, value = _autocast(query, key, value)
    why = _why_not(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if why is not None:
        warn_once(f"ge2jit.torch.scaled_dot_product_attention: {why}; this call runs "
                  "torch.nn.functional.scaled_dot_product_attention")
        kw = {"enable_gqa": enable_gqa} if enable_gqa else {}
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, **kw)
    return attention(query, key, value, causal=bool(is_causal), scale=scale, layout="bhsd")
