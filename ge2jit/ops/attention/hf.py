"""Hugging Face transformers' attention on ge2jit's kernels: an attention function for its
``AttentionInterface`` (``register_hf_attention()``, then ``attn_implementation="ge2jit"``).
Imported by ``ge2jit.torch``; transformers is imported only when registering."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from .torch_ops import attention, scaled_dot_product_attention, sequence_bounds


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
    ``scaled_dot_product_attention``'s fallback and its one-time warning. A mask that is
    exactly a causal sliding window (``mask_window``) runs the kernels' window instead, and a
    mask of padding or packed sequences that ge2jit's mask function read as variable-length
    sequences (``mask_varlen``) runs the kernels on those (``varlen_attention``)."""
    varlen = mask_varlen(attention_mask)
    if varlen is not None and not dropout and query.shape[2] == key.shape[2]:
        return varlen_attention(query, key, value, varlen, scale=scaling, softcap=softcap,
                                layout="bhsd"), None
    window = mask_window(attention_mask)
    if window is not None and not dropout and query.shape[2] == key.shape[2]:
        # the mask is exactly a causal sliding window (ge2jit's mask function tagged it):
        # the kernels' window, the mask unread
        attention_mask, sliding_window, is_causal = None, window, True
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
        if attention_mask is None and causal and sliding_window and \
                query.shape[2] == key.shape[2] > sliding_window:
            # dropout with a window no mask was made for (the kernels have no dropout):
            # PyTorch's SDPA takes the window as a mask
            attention_mask, causal = _window_mask(key.shape[2], sliding_window,
                                                  query.device), False
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                           dropout_p=dropout, is_causal=causal, scale=scaling,
                                           enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _window_mask(length: int, window: int, device) -> Tensor:
    """The (length, length) boolean mask of a causal sliding window of ``window`` keys (each
    query sees itself and the window - 1 keys before it)."""
    i = torch.arange(length, device=device)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)


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

    _mask_signature(sdpa_mask)   # made before any trace reads them
    _mask_codes()
    return name


#: the attribute ge2jit's mask function sets on a mask that is exactly a causal sliding window
#: of W keys (each query sees itself and the W - 1 keys before it): W
WINDOW_TAG = "_ge2jit_window"


def mask_window(mask) -> int | None:
    """The window W of a mask ge2jit's mask function made and found to be exactly a causal
    sliding window of W keys (transformers' ``sliding_window_causal_mask_function(W)``, no
    padding, no packed sequences, queries covering the keys: the kernels' ``window=(W - 1,
    0)``), or None (any other mask, None, a slice of one)."""
    return getattr(mask, WINDOW_TAG, None) if isinstance(mask, Tensor) else None


def _causal_or_sdpa_mask(*args, **kwargs):
    """transformers' SDPA mask, except that a causal batch without padding whose queries
    cover every key passes no mask (then ``is_causal``) while compiling too: transformers
    skips the mask only outside tracing (before PyTorch 2.14), and a mask sends the call to
    PyTorch's SDPA. Outside tracing, a sliding-window mask of such a batch (Mistral's, Qwen2's
    sliding layers) is made and tagged with its window (``mask_window``), so that the
    attention runs the kernels' window on it; while tracing, Mistral's and Qwen2's
    (``_WINDOWED``) is not made (their modules pass the window). The decisions read only
    sizes, the config's model type and window, and the mask function (its closures, for the
    window), never tensor values; outside tracing, a mask of a batch with padding or of packed
    sequences whose every sequence is causal (or a causal sliding window) is tagged with the
    batch as variable-length sequences (``mask_varlen``: that reads the padding mask; packed
    sequences' bounds are made on the GPU from their ids). While compiling, the mask of
    packed sequences without padding (transformers makes it for every batch without a cache,
    unable to rule them out while tracing) of the model types of ``_PACKED`` is tagged with
    each token's sequence bounds, made in the graph from the mask function itself
    (``_traced_varlen``)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    try:
        bound = _mask_signature(sdpa_mask).bind(*args, **kwargs).arguments
    except TypeError:
        return sdpa_mask(*args, **kwargs)
    position = bound.get("cache_position")
    q_length = bound.get("q_length", None if position is None else position.shape[0])
    offsets = (bound.get("kv_offset", 0), bound.get("q_offset", 0))
    plain = (bound.get("attention_mask") is None and bound.get("allow_is_causal_skip", True)
             and q_length == bound.get("kv_length")
             and all(isinstance(o, int) and o == 0 for o in offsets))
    function, local = bound.get("mask_function", causal_mask_function), bound.get("local_size")
    if plain and function is causal_mask_function and local is None:
        return None
    if plain and isinstance(local, int) and torch.compiler.is_compiling():
        # while tracing the mask function cannot be inspected: the model types whose masks
        # with a local size are only their causal sliding window, and whose attention
        # modules pass that window on, pass no mask
        config = (bound.get("kwargs") or {}).get("config")
        if getattr(config, "model_type", None) in _WINDOWED and \
                local == getattr(config, "sliding_window", None):
            return None
    mask = sdpa_mask(*args, **kwargs)
    if not isinstance(mask, Tensor):
        return mask
    if torch.compiler.is_compiling():
        square = q_length == bound.get("kv_length") and all(
            type(o) is int and o == 0 for o in offsets)
        varlen = _traced_varlen(function, bound, local, q_length) if square else None
        if varlen is not None:
            setattr(mask, VARLEN_TAG, varlen)
        return mask
    if plain and isinstance(local, int) and _sliding_window(function) == local:
        setattr(mask, WINDOW_TAG, local)
    elif q_length == bound.get("kv_length") and all(type(o) is int and o == 0 for o in offsets):
        varlen = _varlen(function, bound.get("attention_mask"), q_length, local,
                         bound.get("batch_size"))
        if varlen is not None:
            setattr(mask, VARLEN_TAG, varlen)
    return mask


#: the attribute ge2jit's mask function sets on a mask of a batch that the kernels take as
#: variable-length sequences (padding, packed sequences): its ``Varlen``
VARLEN_TAG = "_ge2jit_varlen"


@dataclass(frozen=True)
class Varlen:
    """A batch of B rows of S tokens as the kernels' variable-length sequences: the tokens
    kept (``indices`` into the B · S tokens in order, int64; None: every token, as packed
    sequences keep them), their sequences' ``cu_seqlens`` (int32, FlashAttention's
    convention) and ``max_seqlen`` (a batch with padding); or, every token kept, each token's
    sequence ``bounds`` in its row (int32 (B, S, 2), the kernels' ``seq_bounds``, made on the
    GPU from packed sequences' ids with nothing read: then ``cu_seqlens`` is None); each
    sequence causal, within a sliding ``window`` of W keys (each token sees itself and the
    W - 1 before it) or not (None)."""

    cu_seqlens: Tensor | None
    max_seqlen: int
    indices: Tensor | None
    window: int | None
    bounds: Tensor | None = None


def mask_varlen(mask) -> Varlen | None:
    """The ``Varlen`` of a mask ge2jit's mask function made and read as variable-length
    sequences (a batch with padding, or packed sequences, every sequence causal or a causal
    sliding window, queries covering the keys), or None (any other mask, None, a slice)."""
    return getattr(mask, VARLEN_TAG, None) if isinstance(mask, Tensor) else None


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, varlen: Varlen, *, scale: float | None,
                     softcap: float | None = None, layout: str | None = None) -> Tensor:
    """Causal attention of q (B, S, H, D), k and v (B, S, H_kv, D) (``layout="bhsd"``: heads
    first) over the batch's sequences ``varlen`` (``mask_varlen``): the B · S tokens read as
    one packed batch (the kept ones gathered where there is padding), the kernels' variable
    lengths, each sequence causal (in its ``window``). Returns (B, S, H, D); a token that is
    not kept (padding) gets zeros, as transformers' FlashAttention integration gives it."""
    if layout == "bhsd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    window = None if varlen.window is None else (varlen.window - 1, 0)
    if varlen.bounds is not None:   # the dense batch, each row's sequences kept apart
        return attention(q, k, v, causal=True, scale=scale, softcap=softcap, window=window,
                         seq_bounds=varlen.bounds)
    b, s = q.shape[:2]
    flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v)]
    if varlen.indices is not None:
        flat = [x.index_select(0, varlen.indices) for x in flat]
    if varlen.max_seqlen == 0:   # nothing kept: every token padding
        return q.new_zeros(b, s, *q.shape[2:])
    out = attention(*flat, causal=True, scale=scale, softcap=softcap, window=window,
                    cu_seqlens_q=varlen.cu_seqlens, cu_seqlens_k=varlen.cu_seqlens,
                    max_seqlen_q=varlen.max_seqlen, max_seqlen_k=varlen.max_seqlen)
    if varlen.indices is not None:
        out = out.new_zeros(b * s, *out.shape[1:]).index_copy(0, varlen.indices, out)
    return out.view(b, s, *out.shape[1:])


def _varlen(function, padding, length: int, local, batch=None) -> Varlen | None:
    """The ``Varlen`` of a square mask (``length`` queries and keys, no offsets, ``batch``
    rows) made with transformers' ``function`` and 2-D ``padding`` mask (or None), or None:
    the mask function must be the causal one or its sliding window of ``local`` keys, alone
    with a padding mask, or within transformers' packed sequences (``_packed``; their ids of
    one row or of ``batch``) without one. Reads the padding mask's values (outside tracing
    only); packed sequences give each token's sequence bounds, made on the GPU from their ids
    with nothing read."""
    from transformers.masking_utils import causal_mask_function

    base, packed = _packed(function)
    window = None
    if base is not causal_mask_function:
        window = _sliding_window(base)
        if window is None or window != local:
            return None
    if packed is not None:   # each token's sequence bounds, made on the GPU: nothing read
        rows = packed.shape[0] if batch is None else batch
        if padding is not None or packed.shape[1] < length or packed.shape[0] not in (1, rows):
            return None
        ids = packed[:, :length].expand(rows, length)
        return Varlen(None, length, None, window, sequence_bounds(ids))
    if not isinstance(padding, Tensor) or padding.dim() != 2 or padding.shape[1] < length:
        return None
    return _padding_varlen(padding[:, :length].bool(), window)


def _traced_varlen(function, bound: dict, local, length: int) -> Varlen | None:
    """While compiling: the ``Varlen`` (each token's sequence ``bounds``) of transformers'
    mask of packed sequences without padding, or None. A mask function's closures cannot be
    read while tracing (TorchDynamo before PyTorch 2.14): the model types of ``_PACKED`` make
    no other ``and_masks`` function without a padding mask than their causal mask (or its
    sliding window) within packed sequences, and a token starts a sequence where it does not
    see the token before it (``_sequence_starts``); the window is Mistral's or Qwen2's, as
    ``_WINDOWED``. Nothing is read on the host: the bounds are made in the graph."""
    codes = _mask_codes()
    config = (bound.get("kwargs") or {}).get("config")
    kind = getattr(config, "model_type", None)
    if codes is None or getattr(function, "__code__", None) is not codes["joined"] or \
            bound.get("attention_mask") is not None or kind not in _PACKED or length < 1:
        return None
    if local is not None and not (kind in _WINDOWED
                                  and local == getattr(config, "sliding_window", None)):
        return None
    device = (bound.get("kwargs") or {}).get("device", bound.get("device"))
    starts = _sequence_starts(function, bound.get("batch_size"), length, device)
    return Varlen(None, length, None, local, sequence_bounds(starts))


def _sequence_starts(function, batch: int, length: int, device) -> Tensor:
    """(B, S) bool: the tokens that start a sequence of a causal mask within sequences (or a
    sliding window of at least 2 keys: a token then sees the one before it in its sequence):
    a row's first, and each that does not see the token before it, the mask ``function``
    evaluated on those pairs alone (traceable, no size read from a tensor)."""
    at = torch.arange(1, length, device=device)[None]
    sees = function(torch.arange(batch, device=device)[:, None],
                    torch.zeros(1, 1, dtype=torch.long, device=device), at, at - 1)
    starts = (~sees.to(torch.bool)).expand(batch, length - 1)
    return torch.cat([starts.new_ones(batch, 1), starts], 1)


def _packed(function) -> tuple:
    """(the mask function within transformers' packed sequences, their (B, S) sequence
    indices) when ``function`` is its ``and_masks`` of that function (remapped to the
    sequences' positions by ``remap_positions_for_packed_sequence`` where transformers has it)
    and ``packed_sequence_mask_function``; else (``function``, None)."""
    codes = _mask_codes()
    masks = _closure(function).get("mask_functions")
    if codes is None or codes["packed"] is None or \
            getattr(function, "__code__", None) is not codes["joined"] or not (
            isinstance(masks, tuple) and len(masks) == 2
            and getattr(masks[1], "__code__", None) is codes["packed"]):
        return function, None
    ids, base = _closure(masks[1]).get("packed_sequence_mask"), masks[0]
    if codes["remap"] is not None and getattr(base, "__code__", None) is codes["remap"]:
        # positions rise by one within a sequence: its causal (window) mask on them is the
        # one on the tokens' indices
        base = _closure(base).get("mask_function")
    if not (isinstance(ids, Tensor) and ids.dim() == 2):
        return function, None
    return base, ids


def _padding_varlen(padding: Tensor, window: int | None) -> Varlen | None:
    """A padded batch's ``Varlen`` (its (B, S) boolean mask of the tokens kept): each row's
    kept tokens one sequence, or None with a window where a row's kept tokens are not
    contiguous (the window would count the padding between them)."""
    b, s = padding.shape
    counts = padding.sum(1)
    holes = torch.zeros((), dtype=torch.bool, device=padding.device)
    if window is not None:
        at = torch.arange(s, device=padding.device)
        first = torch.where(padding, at, s).amin(1)
        last = torch.where(padding, at, -1).amax(1)
        holes = ((last - first + 1 != counts) & (counts > 0)).any()
    longest, holes = torch.stack([counts.max(), holes.long()]).tolist()
    if holes:
        return None
    cu = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    return Varlen(cu, int(longest), padding.flatten().nonzero().squeeze(1), window)


#: Hugging Face model types whose masks without padding made with transformers' ``and_masks``
#: are only their causal mask (or sliding window) within packed sequences (while compiling:
#: ``_traced_varlen``)
_PACKED = ("llama", "mistral", "qwen2", "gpt2")
#: Hugging Face model types (``config.model_type``) whose masks with a local size are only
#: their causal sliding window of ``config.sliding_window`` keys and whose attention modules
#: pass that window to the attention function (Mistral's, Qwen2's sliding layers): while
#: compiling, their plain sliding-window masks are not made
_WINDOWED = ("mistral", "qwen2")


def _closure(fn) -> dict:
    """A function's free variables by name (its closure's cells)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    return dict(zip(code.co_freevars, (c.cell_contents for c in cells))) if code else {}


def _sliding_window(function) -> int | None:
    """W when ``function`` is transformers' ``sliding_window_causal_mask_function(W)`` (its
    ``and_masks`` of ``sliding_window_overlay(W)`` and ``causal_mask_function``, recognized by
    their code and closures), else None: any other function, combined or not."""
    codes = _mask_codes()
    if codes is None or codes["overlay"] is None or \
            getattr(function, "__code__", None) is not codes["joined"]:
        return None
    masks = _closure(function).get("mask_functions")
    if not (isinstance(masks, tuple) and len(masks) == 2 and masks[1] is codes["causal"]
            and getattr(masks[0], "__code__", None) is codes["overlay"]):
        return None
    window = _closure(masks[0]).get("sliding_window")
    return window if type(window) is int and window > 0 else None


#: transformers' causal mask function and the code objects of its mask functions that
#: ``_traced_varlen``, ``_packed`` and ``_sliding_window`` recognize (``and_masks``',
#: ``packed_sequence_mask_function``'s, ``remap_positions_for_packed_sequence``'s,
#: ``sliding_window_overlay``'s; None where this transformers has no such function): made once,
#: outside tracing (``_mask_codes``; an import of transformers' lazy module inside a trace
#: breaks the graph, and a forward need not make them again), {} before
_codes: dict = {}


def _mask_codes() -> dict | None:
    """``_codes``, made at the first call (None: a transformers without ``and_masks``)."""
    if not _codes:
        from transformers import masking_utils as mu

        causal, and_masks = (getattr(mu, n, None) for n in ("causal_mask_function",
                                                            "and_masks"))

        def code(make, *args):
            try:
                return make(*args).__code__
            except (AttributeError, TypeError, RuntimeError):   # not in this transformers
                return None

        ids = torch.zeros(1, 1, dtype=torch.long)
        _codes.update(
            causal=causal, joined=code(and_masks, causal, causal),
            packed=code(getattr(mu, "packed_sequence_mask_function", None), ids),
            remap=code(getattr(mu, "remap_positions_for_packed_sequence", None), causal, ids),
            overlay=code(getattr(mu, "sliding_window_overlay", None), 1))
        if causal is None or _codes["joined"] is None:
            _codes["none"] = True
    return None if "none" in _codes else _codes


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
