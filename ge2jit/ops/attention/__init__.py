"""Fused attention (FlashAttention's semantics and conventions): ``attention(q, k, v, *,
causal=False, scale=None, window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_k=None,
max_seqlen_q=None, max_seqlen_k=None, return_lse=False, out=None, layout=None, config=None)``.
The float64 reference is in ``reference.py``, the kernel's spec and tilings in ``spec.py``,
the call in ``op.py``."""

from __future__ import annotations

from .op import attention
from .spec import CONFIGS, AttentionConfig, AttentionFwdSpec, make_spec

__all__ = ["attention", "AttentionConfig", "AttentionFwdSpec", "CONFIGS", "make_spec"]

from ...runtime.registry import register  # noqa: E402 - the op above is what it registers
from .registration import ATTENTION  # noqa: E402

register(ATTENTION)
