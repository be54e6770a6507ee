"""Hugging Face transformers' attention on ge2jit's kernels: an attention function for its
``AttentionInterface`` (``register_hf_attention()``, then ``attn_implementation="ge2jit"``).
Imported by ``ge2jit.torch``; transformers is imported only when registering."""

from __future__ import annotations

import inspect
import sys

import torch
from torch import Tensor

from .spec import HEAD_DIMS
from .torch_ops import attention, scaled_dot_product_attention

_HALF = (torch.float16, torch.bfloat16)


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


#: the keywords of a GPT-2 attention call the direct path reads or may ignore (others, such
#: as packed sequences' lengths, send the call to the module's own forward); the cache is
#: ``cache`` from transformers 5.2x, ``past_key_values`` before
_GPT2_KEYWORDS = frozenset({"cache", "past_key_values", "attention_mask", "encoder_hidden_states",
                            "encoder_attention_mask", "output_attentions", "use_cache",
                            "cache_position", "position_ids"})


def gpt2_attention_forward(self, hidden_states: Tensor, *args, **kwargs):
    """Hugging Face's ``GPT2Attention.forward`` (self-attention, as ``patch`` installs it) on
    ge2jit's kernel without the module's reshuffles: ``c_attn``'s output (B, S, 3 · H · D) is
    read by strides as q, k and v (B, S, H, D), the kernel writes (B, S, H, D), which is
    ``c_proj``'s input as it is; no transpose, split or copy, and one call's host time instead
    of a dozen. The same values as the module's own forward under ``attn_implementation=
    "ge2jit"``. A call that path does not serve runs the module's own forward: a mask (padding,
    packed sequences), cross-attention, attention weights asked for, dropout in training, a
    cache other than an empty ``DynamicCache`` (generation past its first step), another
    attention implementation, a head dim or dtype the kernels lack, arguments by position or
    unknown keywords. An empty ``DynamicCache`` (what the model makes when ``use_cache`` is on,
    training too) is filled as the module fills it. Returns ``(output, None)``."""
    get = kwargs.get
    cache = get("cache", get("past_key_values"))
    ok = (not args and all(key in _GPT2_KEYWORDS for key in kwargs)
          and not ("cache" in kwargs and "past_key_values" in kwargs)
          and get("attention_mask") is None and get("encoder_hidden_states") is None
          and not get("output_attentions") and not (self.training and self.attn_dropout.p)
          and getattr(self.config, "_attn_implementation", None) == "ge2jit"
          and self.head_dim in HEAD_DIMS and hidden_states.is_cuda
          and (hidden_states.dtype in _HALF or torch.is_autocast_enabled("cuda"))
          and (cache is None or (type(cache).__name__ == "DynamicCache"
                                 and cache.get_seq_length(self.layer_idx) == 0)))
    if not ok:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    b, s, e = hidden_states.shape
    q, k, v = self.c_attn(hidden_states).view(b, s, 3, -1, self.head_dim).unbind(2)
    if cache is not None:   # what the module's forward stores (heads first)
        cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
    out = attention(q, k, v, causal=True, scale=self.scaling)
    return self.resid_dropout(self.c_proj(out.reshape(b, s, e))), None


def is_gpt2_self_attention(module) -> bool:
    """Whether ``module`` is Hugging Face's GPT-2 self-attention (``GPT2Attention``, not
    cross-attention), whose forward :func:`gpt2_attention_forward` can stand in for."""
    return (type(module).__name__ == "GPT2Attention" and not getattr(
        module, "is_cross_attention", True) and hasattr(module, "c_attn")
        and hasattr(module, "c_proj") and hasattr(module, "config"))


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
