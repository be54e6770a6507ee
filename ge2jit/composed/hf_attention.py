"""Hugging Face attention modules' forwards on ge2jit's ``rope`` and ``attention`` read in place:
``ge2jit.torch.patch`` puts them on GPT-2's self-attention and on LLaMA's, Mistral's and
Qwen2's attention modules (``direct_forward``). The projections' outputs are read by strides
as (B, S, H, D), rotated in one launch for q and k, and the kernel writes the output
projection's input as it is: none of the modules' transposes, splits, contiguous copies and
rotary chains of elementwise ops (an eager step is host-bound; each of these is a launch and
an autograd node, forward and backward). The calls this path does not serve run the module's
own forward, unchanged (then ``attn_implementation="ge2jit"``'s function or another). A batch
with padding or of packed sequences, whose mask ge2jit's mask function read as
variable-length sequences (``mask_varlen``), runs the kernels on those sequences
(``varlen_attention``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ops.attention.hf import mask_varlen, mask_window, varlen_attention
from ..ops.attention.spec import HEAD_DIMS
from ..ops.attention.torch_ops import attention
from ..ops.rope.torch_ops import rope

_HALF = (torch.float16, torch.bfloat16)
_TABLES = (torch.float16, torch.bfloat16, torch.float32)
#: the keywords of an attention module's call the direct path reads or may ignore (others,
#: such as packed sequences' lengths, send the call to the module's own forward); the cache
#: is ``cache`` from transformers 5.2x, ``past_key_values`` before
_COMMON = frozenset({"cache", "past_key_values", "attention_mask", "output_attentions",
                     "use_cache", "cache_position", "position_ids"})
_GPT2_KEYWORDS = _COMMON | {"encoder_hidden_states", "encoder_attention_mask"}
_ROTARY_KEYWORDS = _COMMON | {"position_embeddings"}
#: LLaMA-like attention classes -> where their sliding window is read: None (none), "config"
#: (``config.sliding_window``, Mistral's), "module" (``module.sliding_window``, Qwen2's: set
#: only on its sliding layers)
_ROTARY = {"LlamaAttention": None, "MistralAttention": "config", "Qwen2Attention": "module"}


def _cache(kwargs) -> object:
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _served(module, hidden: Tensor, args, kwargs, keywords, dropout: float,
            window: int | None = None) -> bool:
    """Whether the direct path serves this call of ``module`` (what it shares across the
    model families): keywords only, all known, no mask (or, with the module's sliding
    ``window``, a mask that is exactly that window: ``mask_window``; or a mask of
    variable-length sequences in that window or none: ``mask_varlen``), no attention weights
    asked for, no dropout while training, ``attn_implementation="ge2jit"``, a head dim and a
    dtype the kernels have (or autocast), and no cache or an empty ``DynamicCache`` (what the
    model makes when ``use_cache`` is on, training too; generation past its first token runs
    the module's own forward)."""
    cache = _cache(kwargs)
    return (not args and kwargs.keys() <= keywords
            and not ("cache" in kwargs and "past_key_values" in kwargs)
            and _no_mask(kwargs.get("attention_mask"), window)
            and not kwargs.get("output_attentions")
            and not (module.training and dropout)
            and getattr(module.config, "_attn_implementation", None) == "ge2jit"
            and module.head_dim in HEAD_DIMS and _kernel_input(hidden)
            and (cache is None or (type(cache).__name__ == "DynamicCache"
                                   and cache.get_seq_length(module.layer_idx) == 0)))


def _no_mask(mask, window: int | None) -> bool:
    """Whether the kernels need no mask: None, one that is exactly the module's causal
    sliding ``window``, or one of variable-length sequences (``mask_varlen``) in that window
    (None: causal)."""
    if mask is None or (window is not None and mask_window(mask) == window):
        return True
    varlen = mask_varlen(mask)
    return varlen is not None and varlen.window == window


def _attend(q: Tensor, k: Tensor, v: Tensor, mask, scale: float, window: int | None) -> Tensor:
    """The kernels' causal attention of q, k and v (B, S, H, D) in the module's sliding
    ``window`` (None: none), over the batch's variable-length sequences where the mask was
    read as those (``mask_varlen``)."""
    varlen = mask_varlen(mask)
    if varlen is not None:
        return varlen_attention(q, k, v, varlen, scale=scale)
    return attention(q, k, v, causal=True, scale=scale,
                     window=None if window is None else (window - 1, 0))


def _kernel_input(hidden) -> bool:
    """Whether the kernels take hidden states ``hidden`` (B, S, E): on a CUDA device, half
    precision or under CUDA autocast."""
    return (isinstance(hidden, Tensor) and hidden.is_cuda and hidden.dim() == 3
            and (hidden.dtype in _HALF or torch.is_autocast_enabled("cuda")))


def _fill(cache, k: Tensor, v: Tensor, layer: int) -> None:
    """What the module's forward stores in its cache: k and v heads first."""
    if cache is not None:
        cache.update(k.transpose(1, 2), v.transpose(1, 2), layer)


# --- GPT-2 --------------------------------------------------------------------------------

def gpt2_attention_forward(self, hidden_states: Tensor, *args, **kwargs):
    """Hugging Face's ``GPT2Attention.forward`` (self-attention) on ge2jit's kernel:
    ``c_attn``'s output (B, S, 3 · H · D) is read by strides as q, k and v (B, S, H, D), the
    kernel writes (B, S, H, D), which is ``c_proj``'s input as it is. The same values as the
    module's own forward under ``attn_implementation="ge2jit"``; the calls ``_served`` refuses
    (and cross-attention) run the module's own forward. Returns ``(output, None)``."""
    if not (_served(self, hidden_states, args, kwargs, _GPT2_KEYWORDS, self.attn_dropout.p)
            and kwargs.get("encoder_hidden_states") is None):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    b, s, e = hidden_states.shape
    q, k, v = self.c_attn(hidden_states).view(b, s, 3, -1, self.head_dim).unbind(2)
    _fill(_cache(kwargs), k, v, self.layer_idx)
    out = _attend(q, k, v, kwargs.get("attention_mask"), self.scaling, None)
    return self.resid_dropout(self.c_proj(out.reshape(b, s, e))), None


def is_gpt2_self_attention(module) -> bool:
    """Whether ``module`` is Hugging Face's GPT-2 self-attention (``GPT2Attention``, not
    cross-attention)."""
    return (type(module).__name__ == "GPT2Attention" and not getattr(
        module, "is_cross_attention", True) and hasattr(module, "c_attn")
        and hasattr(module, "c_proj") and hasattr(module, "config"))


# --- LLaMA, Mistral, Qwen2 -----------------------------------------------------------------

def _window(module) -> int | None:
    where = _ROTARY[type(module).__name__]
    if where == "config":
        return getattr(module.config, "sliding_window", None)
    return getattr(module, "sliding_window", None) if where == "module" else None


def rotary_attention_forward(self, hidden_states: Tensor, *args, **kwargs):
    """Hugging Face's ``LlamaAttention.forward`` (and Mistral's and Qwen2's: grouped-query
    heads, Qwen2's projection biases, a sliding window) on ge2jit's kernels: the projections'
    outputs (B, S, H · D) read as (B, S, H, D), q and k rotated by ``rope`` in one launch (the
    rotary embedding's cos and sin, whose halves repeat, read as their first halves), the
    attention kernel reading those and v's projection in place and writing (B, S, H, D), which
    is ``o_proj``'s input as it is. A sliding window (Mistral's; Qwen2's sliding layers) is
    the kernel's, with no mask or the mask transformers made for it (``mask_window``). The
    calls ``_served`` refuses, and rotary tables that are not the model's usual (B or 1, S,
    head_dim), run the module's own forward. Returns ``(output, None)``."""
    tables, window = kwargs.get("position_embeddings"), _window(self)
    if not (_served(self, hidden_states, args, kwargs, _ROTARY_KEYWORDS,
                    self.attention_dropout, window) and _usual_tables(tables, hidden_states,
                                                                        self.head_dim)):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    b, s, _ = hidden_states.shape
    d = self.head_dim
    q = self.q_proj(hidden_states).view(b, s, -1, d)
    k = self.k_proj(hidden_states).view(b, s, -1, d)
    v = self.v_proj(hidden_states).view(b, s, -1, d)
    cos, sin = tables
    q, k = rope(q, k, cos[..., : d // 2], sin[..., : d // 2])
    _fill(_cache(kwargs), k, v, self.layer_idx)
    out = _attend(q, k, v, kwargs.get("attention_mask"), self.scaling, window)
    return self.o_proj(out.reshape(b, s, -1)), None


def _usual_tables(tables, hidden: Tensor, head_dim: int) -> bool:
    """Whether ``position_embeddings`` are the (cos, sin) a LLaMA-like model makes: each
    (B or 1, S, head_dim), on the hidden states' device, of a type rope takes."""
    if not (isinstance(tables, tuple | list) and len(tables) == 2):
        return False
    b, s = hidden.shape[:2]
    return all(isinstance(t, Tensor) and t.dim() == 3 and t.shape[0] in (1, b)
               and t.shape[1:] == (s, head_dim) and t.dtype in _TABLES
               and t.device == hidden.device and not t.requires_grad for t in tables)


def is_rotary_attention(module) -> bool:
    """Whether ``module`` is Hugging Face's LLaMA, Mistral or Qwen2 attention (q, k, v and o
    projections as Linears, a head dim, a layer index; Qwen2's with its layer's
    ``sliding_window``, which transformers before its layer types computed in the forward)."""
    name = type(module).__name__
    return (name in _ROTARY and all(
        isinstance(getattr(module, n, None), nn.Linear)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        and all(hasattr(module, n) for n in ("config", "head_dim", "layer_idx", "scaling",
                                               "attention_dropout"))
        and (_ROTARY[name] != "module" or hasattr(module, "sliding_window")))


def direct_forward(module):
    """(the direct forward for ``module``, what it replaces) or None: the forwards above for
    the modules they stand in for."""
    if is_gpt2_self_attention(module):
        return (gpt2_attention_forward, "GPT2Attention (split, transposes, copies)",
                "ge2jit attention reading c_attn's output by strides")
    if is_rotary_attention(module):
        return (rotary_attention_forward,
                f"{type(module).__name__} (transposes, rotary ops, copies)",
                "ge2jit rope + attention reading the projections by strides")
    return None
