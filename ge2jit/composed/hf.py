"""Hugging Face causal LMs' head and loss on ``linear_cross_entropy``: the model's forward, when
it trains on labels, runs its base model, then the head and the loss as one op, and returns
the loss without logits (their (tokens, V) values are what a large vocabulary's step spends its
memory on; a training loop reads only the loss). Evaluation, generation and calls without
labels run the model's own forward. ``ge2jit.torch.patch(model)`` installs it
(``install_head_loss``)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.torchlib import BoundForward
from .torch_ops import linear_cross_entropy

#: config attributes that change the logits after the head (a model that has one is left)
_LOGIT_CHANGES = ("final_logit_softcapping", "logit_scale", "logits_scaling",
                  "output_multiplier_scale")
IGNORE_INDEX = -100


def head_loss_refusal(model) -> str | None:
    """Why ``model``'s head and loss cannot be fused (None: they can): not a Hugging Face causal
    LM with a Linear head without bias over its base model's last hidden state."""
    head = getattr(model, "lm_head", None)
    prefix = getattr(model, "base_model_prefix", None)
    if not isinstance(head, nn.Linear) or not prefix or \
            not isinstance(getattr(model, prefix, None), nn.Module) or \
            not hasattr(model, "loss_function"):
        return "not a Hugging Face causal LM (lm_head, base model, loss_function)"
    if head.bias is not None:
        return "a head with a bias"
    config = getattr(model, "config", None)
    for name in _LOGIT_CHANGES:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return f"config.{name} changes the logits after the head"
    if getattr(model, "_ge2jit_forward", None) is not None:
        return "its head and loss are ge2jit's already"
    return None


def install_head_loss(model) -> None:
    """Make ``model`` (``head_loss_refusal`` None) train with ``linear_cross_entropy``; its own
    forward stays for everything else (``model._ge2jit_forward``)."""
    model._ge2jit_forward = model.forward
    model.forward = BoundForward(_forward, model)


def _forward(self, *args, labels=None, **kwargs):
    """The causal LM's forward, with the loss by ``linear_cross_entropy`` when training on
    labels (and no logits returned then)."""
    if labels is None or not self.training or len(args) > 1 or \
            kwargs.get("return_dict") is False:
        return self._ge2jit_forward(*args, labels=labels, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    items = kwargs.pop("num_items_in_batch", None)
    shifted = kwargs.pop("shift_labels", None)
    kwargs.pop("logits_to_keep", None)
    out = getattr(self, self.base_model_prefix)(*args, **kwargs)
    hidden = out[0]
    if shifted is None:     # the next token of each position; the last one has none
        shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    loss = linear_cross_entropy(hidden, self.lm_head.weight, shifted.to(hidden.device),
                                IGNORE_INDEX, "mean" if items is None else "sum",
                                check_targets=False)
    if items is not None:
        if isinstance(items, torch.Tensor):
            items = items.to(loss.device)
        loss = loss / items
    # the base model's other outputs (its cache, hidden states, attentions) under the names
    # this transformers gives them, read as set keys (no deprecated attribute touched)
    kept = {f.name: out[f.name] for f in dataclasses.fields(CausalLMOutputWithPast)
            if f.name not in ("loss", "logits") and hasattr(out, "keys") and f.name in out}
    return CausalLMOutputWithPast(loss=loss, logits=None, **kept)
