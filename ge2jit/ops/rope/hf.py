"""A drop-in for Hugging Face's ``apply_rotary_pos_emb`` on ge2jit's rope (``torch_ops.rope``):
``modeling_llama.apply_rotary_pos_emb = ge2jit.torch.apply_rotary_pos_emb``. Imported by
``ge2jit.torch``."""

from __future__ import annotations

from torch import Tensor

from ...errors import ArgumentValueError
from ...runtime.torchlib import not_a_cuda_tensor
from .torch_ops import rope


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids=None,
                         unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Hugging Face's ``apply_rotary_pos_emb`` (LLaMA, Mistral, Qwen2) on ge2jit's kernel:
    q (batch, heads, seq, head_dim) with ``unsqueeze_dim=1`` or (batch, seq, heads,
    head_dim) with 2, k likewise, cos and sin (batch or 1, seq, head_dim) holding each
    angle twice (``cat((freqs, freqs), -1)``, as the rotary embedding modules make them).
    ``position_ids`` is ignored, as by Hugging Face's. Returns (q_embed, k_embed) of q's and
    k's shapes and memory orders."""
    if unsqueeze_dim not in (1, 2):
        raise ArgumentValueError(f"unsqueeze_dim: expected 1 (q as batch, heads, seq, "
                                 f"head_dim) or 2 (batch, seq, heads, head_dim), got "
                                 f"{unsqueeze_dim!r}")
    for name, x, dims in (("q", q, (4,)), ("k", k, (4,)), ("cos", cos, (2, 3)),
                          ("sin", sin, (2, 3))):
        if not isinstance(x, Tensor):
            raise not_a_cuda_tensor(x, name)
        if x.dim() not in dims:
            raise ArgumentValueError(f"{name}: expected {' or '.join(map(str, dims))} "
                                     f"dimensions, got shape {tuple(x.shape)}")
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    half = q.shape[-1] // 2
    swap = unsqueeze_dim == 1
    qo, ko = rope(q.transpose(1, 2) if swap else q, k.transpose(1, 2) if swap else k,
                  cos[..., :half], sin[..., :half])
    return (qo.transpose(1, 2), ko.transpose(1, 2)) if swap else (qo, ko)
