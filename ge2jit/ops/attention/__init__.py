"""Fused attention (FlashAttention's semantics and conventions): ``attention(q, k, v, *,
causal=False, scale=None, window=None, softcap=None, cu_seqlens_q=None, cu_seqlens_k=None,
max_seqlen_q=None, max_seqlen_k=None, return_lse=False, out=None, layout=None, config=None)``
and ``attention_backward(do, q, k, v, o, lse, ...)``. The float64 reference is in
``reference.py``, the kernels' specs and tilings in ``spec.py``, the calls in ``op.py`` and
``backward.py``."""

from __future__ import annotations

from .backward import attention_backward
from .op import attention
from .spec import (
    BWD_CONFIGS,
    CONFIGS,
    AttentionBwdConfig,
    AttentionBwdSpec,
    AttentionConfig,
    AttentionFwdSpec,
    make_bwd_specs,
    make_spec,
)

__all__ = ["attention", "attention_backward", "AttentionConfig", "AttentionFwdSpec", "CONFIGS",
           "make_spec", "AttentionBwdConfig", "AttentionBwdSpec", "BWD_CONFIGS",
           "make_bwd_specs"]

from ...runtime.registry import register  # noqa: E402 - the op above is what it registers
from .registration import ATTENTION, ATTENTION_BACKWARD  # noqa: E402

register(ATTENTION)
register(ATTENTION_BACKWARD)
