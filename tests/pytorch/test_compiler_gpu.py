"""The compiler backend on the GPU: a model of Linear + activation layers and attention
compiled with ``backend="ge2jit"`` fuses them into ge2jit's ops, and its outputs and every
gradient match the untouched model's (both against a float64 copy: ge2jit's error at most
PyTorch's bfloat16 error times 1.5 plus a bfloat16 unit); no graph break; a new shape
recompiles; ``inductor=False`` and ``explain`` on the GPU."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

import torch.nn.functional as F  # noqa: E402 - after the skips above

import ge2jit.torch as gt  # noqa: E402

from .grads import relative_errors, run_backward  # noqa: E402
from .hf_modules import HfRMSNorm  # noqa: E402

D, HEADS, HEAD_DIM = 256, 4, 64


class Block(torch.nn.Module):
    """x -> Linear + GELU (tanh) -> Linear -> causal attention over 4 heads -> Linear + SiLU."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(D, 2 * D)
        self.qkv = torch.nn.Linear(2 * D, 3 * D, bias=False)
        self.out = torch.nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        h = F.gelu(self.up(x), approximate="tanh")
        q, k, v = self.qkv(h).view(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.silu(self.out(o.transpose(1, 2).reshape(b, s, D)))


def _models(dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = Block().cuda().to(dtype)
    ref = Block().cuda().double()
    ref.load_state_dict(model.state_dict())
    return model, ref


@pytest.mark.parametrize("inductor", [True, False], ids=["inductor", "eager"])
def test_a_block_fuses_and_matches_the_untouched_model(inductor):
    model, ref = _models()
    x = torch.randn(2, 128, D, device="cuda")
    want = run_backward(ref, x.double())
    eager = relative_errors(run_backward(model, x.bfloat16()), want)
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled = gt.compile(model, inductor=inductor, fullgraph=True)
    got = relative_errors(run_backward(compiled, x.bfloat16()), want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    report = gt.compiler.reports[-1]
    assert sorted(op.split("(")[0] for _, _, op in report.fused) == [
        "attention", "gemm_bias_act", "gemm_bias_act"], str(report)
    assert report.skipped == [], str(report)


class Gpt2Mlp(torch.nn.Module):
    """Hugging Face's GPT-2 MLP as it is written: Conv1D layers (addmm, weights of (in, out))
    and GELU's tanh form written out (``NewGELUActivation``)."""

    def __init__(self):
        super().__init__()
        self.w_fc = torch.nn.Parameter(torch.randn(D, 4 * D) * D ** -0.5)
        self.b_fc = torch.nn.Parameter(torch.randn(4 * D) * 0.1)
        self.w_proj = torch.nn.Parameter(torch.randn(4 * D, D) * (4 * D) ** -0.5)
        self.b_proj = torch.nn.Parameter(torch.randn(D) * 0.1)

    def forward(self, x):
        h = torch.addmm(self.b_fc, x.view(-1, x.size(-1)), self.w_fc)
        h = h.view(x.size()[:-1] + (4 * D,))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                        * (h + 0.044715 * torch.pow(h, 3.0))))
        y = torch.addmm(self.b_proj, h.view(-1, h.size(-1)), self.w_proj)
        return y.view(x.size())


def _compiled_matches(make, batch: int, prepare=None, **options) -> None:
    """``make()``'s model in bfloat16, compiled by ge2jit (``options``), against its float64
    copy: output and every gradient no further off than the eager bfloat16 model's errors
    times 1.5 plus a bfloat16 unit. ``prepare(model)``: changes made before the copy."""
    torch.manual_seed(0)
    model = make().cuda().bfloat16()
    if prepare is not None:
        prepare(model)
    ref = make().cuda().double()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(batch, 100, D, device="cuda")
    want = run_backward(ref, x.double())
    eager = relative_errors(run_backward(model, x.bfloat16()), want)
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    got = relative_errors(run_backward(gt.compile(model, fullgraph=True, **options),
                                       x.bfloat16()), want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)


def test_gpt2s_mlp_fuses_its_written_out_gelu_and_matches():
    _compiled_matches(Gpt2Mlp, 2)
    report = gt.compiler.reports[-1]
    assert [op for _, _, op in report.fused] == ["gemm_bias_act(act='gelu_tanh')"], str(report)


def test_a_new_shape_recompiles_and_explain_reports():
    model, _ = _models()
    compiled = gt.compile(model)
    for tokens in (64, 192):
        x = torch.randn(3, tokens, D, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x), model(x), atol=3e-2, rtol=3e-2)
    report = gt.explain(model, torch.randn(1, 64, D, device="cuda", dtype=torch.bfloat16))
    assert len(report.fused) == 3 and "-> ge2jit.attention" in str(report)


def test_float32_layers_fuse_and_float32_attention_is_left_to_pytorch():
    model, ref = _models(torch.float32)
    x = torch.randn(2, 64, D, device="cuda")
    report = gt.explain(model, x)
    assert [p for p, _, _ in report.fused] == ["linear_activation"] * 2
    assert [s.reason.split(" (")[0] for s in report.skipped] == ["dtype torch.float32"]
    torch._dynamo.reset()
    got = gt.compile(model)(x)
    torch.testing.assert_close(got.double(), ref(x.double()), atol=1e-4, rtol=1e-4)


class PreNorm(torch.nn.Module):
    """Two pre-norm residual steps: h = x + f(norm1(x)); out = norm2(h + g(h))."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = HfRMSNorm(D), torch.nn.LayerNorm(D)
        self.f, self.g = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

    def forward(self, x):
        h = x + F.relu(self.f(self.norm1(x)))
        return self.norm2(h + F.gelu(self.g(h)))


def test_norms_take_their_residual_adds():
    def weights(model):
        with torch.no_grad():
            model.norm1.weight.uniform_(0.5, 1.5)
    only = ["rms_norm", "layer_norm", "linear_activation"]   # the norms: left to Inductor else
    _compiled_matches(PreNorm, 4, weights, only=only)
    ops = sorted(op for _, _, op in gt.compiler.reports[-1].fused)
    assert ops == ["gemm_bias_act(act='gelu')", "gemm_bias_act(act='relu')", "layer_norm(residual)",
                   "rms_norm"], ops


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


class Rotary(torch.nn.Module):
    """q and k projections rotated as Hugging Face's LLaMA does (the angle table made in the
    graph: ``cat((freqs, freqs), -1)``, its cos and sin cast to x's type), then mixed."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(D, D, bias=False), torch.nn.Linear(D, D // 2)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(b, s, HEADS // 2, HEAD_DIM).transpose(1, 2)
        inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, device=x.device,
                                           dtype=torch.float32) / HEAD_DIM)
        freqs = (torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * inv)[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q * k.repeat_interleave(2, dim=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_rotary_embedding_becomes_ge2jits_rope(dtype):
    torch.manual_seed(0)
    model = Rotary().cuda().to(dtype)
    ref = Rotary().cuda().double()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 77, D, device="cuda")
    want = run_backward(ref, x.double())
    eager = relative_errors(run_backward(model, x.to(dtype)), want)
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    got = relative_errors(run_backward(gt.compile(model, fullgraph=True), x.to(dtype)), want)
    unit = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -20
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + unit, (got, eager)
    fused = [(p, op) for p, _, op in gt.compiler.reports[-1].fused]
    assert fused.count(("rotary", "rope")) == 2, gt.compiler.reports[-1]
