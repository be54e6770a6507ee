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


class NewGELUActivation(torch.nn.Module):
    """Hugging Face's GPT-2 activation (the tanh approximation of GELU)."""

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class Conv1D(torch.nn.Module):
    """Hugging Face's GPT-2 layer: a Linear whose weight is (in, out)."""

    def __init__(self, nf, nx, **kw):
        super().__init__()
        self.nf = nf
        self.weight = torch.nn.Parameter(torch.randn(nx, nf, **kw) * 0.02)
        self.bias = torch.nn.Parameter(torch.zeros(nf, **kw))

    def forward(self, x):
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.reshape(*x.shape[:-1], self.nf)


class GPT2MLP(torch.nn.Module):
    def __init__(self, d, hidden, **kw):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(hidden, d, **kw), Conv1D(d, hidden, **kw)
        self.act = NewGELUActivation()

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class LlamaMLP(torch.nn.Module):
    def __init__(self, d, hidden, **kw):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, hidden, bias=False, **kw)
        self.up_proj = torch.nn.Linear(d, hidden, bias=False, **kw)
        self.down_proj = torch.nn.Linear(hidden, d, bias=False, **kw)
        self.act_fn = torch.nn.SiLU()   # transformers' ACT2FN["silu"]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Config:
    _attn_implementation = "sdpa"


class LlamaRMSNorm(HfRMSNorm):
    pass


class TinyDecoder(torch.nn.Module):
    """A Hugging Face-like decoder: norms by their class names, a gated MLP, a GPT-2 MLP, a
    config naming the attention."""

    def __init__(self, d=64, **kw):
        super().__init__()
        self.config = Config()
        self.input_layernorm = LlamaRMSNorm(d, 1e-5, **kw)
        self.mlp = LlamaMLP(d, 2 * d, **kw)
        self.gpt2_mlp = GPT2MLP(d, 4 * d, **kw)
        self.ln_f = torch.nn.LayerNorm(d, **kw)
        self.head = torch.nn.Sequential(torch.nn.Linear(d, d, **kw), torch.nn.SiLU(),
                                        torch.nn.Linear(d, d, **kw), torch.nn.ELU())

    def forward(self, x):
        h = x + self.mlp(self.input_layernorm(x))
        h = h + self.gpt2_mlp(h)
        return self.head(self.ln_f(h))
