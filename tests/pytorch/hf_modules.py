"""Modules written as Hugging Face's models write them, for the compiler backend's tests
(no transformers needed)."""

from __future__ import annotations

import torch


class HfRMSNorm(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm: float32 statistics, the normed rows cast back to the
    input's type, then times the weight."""

    def __init__(self, d, eps=1e-6, **kw):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d, **kw))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
