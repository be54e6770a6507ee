"""Hugging Face transformers' attention on ge2jit's kernels: an attention function for its
``AttentionInterface`` (``register_hf_attention()``, then ``attn_implementation="ge2jit"``).
Imported by ``ge2jit.torch``; transformers is imported only when registering."""

from __future__ import annotations

import inspect
import sys

from torch import Tensor

from .torch_ops import attention, scaled_dot_product_attention


def hf_attention_forward(module, query: Tensor, key: Tensor, value: Tensor,
                         attention_mask: Tensor | None, dropout: float = 0.0,
                         scaling: float | None = None, sliding_window: int | None = None,
                         softcap: float | None = None, is_causal: bool | None = None,
                         **kwargs) -> tuple[Tensor, None]:
    """An attention function as transformers' ``AttentionInterface`` calls it: query (B, H,
    S_q, D), key and value (B, H_kv, S_k, D) (grouped-query heads read natively), the mask
    transformers made (None for a causal batch without padding: then ``is_causal``, as its
    SDPA integration decides it), ``scaling``, ``dropout``, a model's ``sliding_window`` and
    ``softcap``. Returns (the output as (B, S_q, H, D), None: no attention weights). What
    the kernels do not do (a padding mask, dropout) runs PyTorch's SDPA, through
    ``scaled_dot_product_attention``'s fallback and its one-time warning."""
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    if attention_mask is None and not dropout and (sliding_window or softcap) and \
            query.shape[2] == key.shape[2]:
        # a model's sliding window (Mistral: the W - 1 keys before a token and itself) or
        # soft-capped scores (Gemma 2): the kernels' own options
        out = attention(query, key, value, causal=causal, scale=scaling, softcap=softcap,
                        window=(sliding_window - 1, 0 if causal else -1) if sliding_window
                        else None, layout="bhsd")
    else:
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                           dropout_p=dropout, is_causal=causal, scale=scaling,
                                           enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register_hf_attention(name: str = "ge2jit") -> str:
    """Registers :func:`hf_attention_forward` with transformers' ``AttentionInterface`` under
    ``name`` (and transformers' SDPA masks under it, so that a causal batch without padding
    passes no mask): then ``AutoModelForCausalLM.from_config(config,
    attn_implementation="ge2jit")`` or ``model.set_attn_implementation("ge2jit")`` runs
    ge2jit's attention. Returns ``name``. ``import ge2jit.torch`` registers it when
    transformers is already imported."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, hf_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:   # transformers before its mask interface: its default masks
        return name
    AttentionMaskInterface.register(name, _causal_or_sdpa_mask)
    from transformers.masking_utils import sdpa_mask

    _mask_signature(sdpa_mask)   # made before any trace reads it
    return name


def _causal_or_sdpa_mask(*args, **kwargs):
    """transformers' SDPA mask, except that a causal batch without padding whose queries
    cover every key passes no mask (then ``is_causal``) while compiling too: transformers
    skips the mask only outside tracing (before PyTorch 2.14), and a mask sends the call to
    PyTorch's SDPA. The decision reads only sizes and the mask function, never tensor
    values."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    try:
        bound = _mask_signature(sdpa_mask).bind(*args, **kwargs).arguments
    except TypeError:
        return sdpa_mask(*args, **kwargs)
    position = bound.get("cache_position")
    q_length = bound.get("q_length", None if position is None else position.shape[0])
    offsets = (bound.get("kv_offset", 0), bound.get("q_offset", 0))
    if bound.get("mask_function", causal_mask_function) is causal_mask_function and \
            bound.get("attention_mask") is None and bound.get("local_size") is None and \
            bound.get("allow_is_causal_skip", True) and q_length == bound.get("kv_length") and \
            all(isinstance(o, int) and o == 0 for o in offsets):
        return None
    return sdpa_mask(*args, **kwargs)


#: (transformers' sdpa_mask, its signature): made once, the mask function runs at every
#: forward (a plain pair: TorchDynamo warns at every compile about an ``lru_cache``)
_signature: list = [None, None]


def _mask_signature(fn) -> inspect.Signature:
    if _signature[0] is not fn:
        _signature[:] = [fn, inspect.signature(fn)]
    return _signature[1]


def _register_if_imported() -> None:
    if "transformers" in sys.modules:
        try:
            register_hf_attention()
        except ImportError:   # a transformers without AttentionInterface
            pass
