"""``ge2jit.torch.patch(model)`` without a GPU, on models whose parameters are on the meta
device (a model to be materialized later) or the CPU: what it replaces by structure, that every
replacement holds the same Parameter objects under the same names (state dict, parameters and
their order unchanged), what it leaves and why."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import ge2jit  # noqa: E402
import ge2jit.torch as gt  # noqa: E402
from ge2jit.torch.patch import _GemmAct  # noqa: E402

from .hf_modules import TinyDecoder  # noqa: E402


def _snapshot(model):
    return list(model.state_dict()), [(n, id(p)) for n, p in model.named_parameters()]


@pytest.fixture
def hf_registered(monkeypatch):
    """register_hf_attention without transformers: the names it was called with."""
    from ge2jit.ops.attention import hf

    calls = []
    monkeypatch.setattr(hf, "register_hf_attention", lambda: calls.append("ge2jit"))
    return calls


def test_a_decoder_is_patched_with_its_parameters_shared(hf_registered):
    model = TinyDecoder(device="meta")
    before = _snapshot(model)
    report = gt.patch(model)
    assert _snapshot(model) == before
    assert isinstance(model.input_layernorm, gt.RMSNorm) and model.input_layernorm.eps == 1e-5
    assert type(model.ln_f) is nn.LayerNorm   # PyTorch's LayerNorm left (layer_norms=False)
    assert isinstance(model.gpt2_mlp.c_fc, _GemmAct) and model.gpt2_mlp.c_fc.act == "gelu_tanh"
    assert isinstance(model.gpt2_mlp.act, nn.Identity)
    head = model.head
    assert isinstance(head[0], gt.Linear) and head[0].act == "silu"
    assert isinstance(head[1], nn.Identity)
    assert type(head[2]) is nn.Linear and isinstance(head[3], nn.ELU)   # ELU: not ge2jit's
    assert model.config._attn_implementation == "ge2jit" and hf_registered == ["ge2jit"]
    assert sorted(p for p, _, _ in report.replaced) == [
        "", "gpt2_mlp.c_fc", "head.0", "input_layernorm", "mlp"]
    assert report.left == [("ln_f", "nn.LayerNorm: PyTorch's, one kernel each way, with no "
                                    "residual add to fuse (layer_norms=True replaces it)")]
    assert str(report).startswith("replaced 5, left 1")
    # the gated MLP: its Linears kept, gate's and up's weights one storage, rows alternating
    mlp = model.mlp
    assert type(mlp.gate_proj) is nn.Linear and mlp.forward.__func__.__name__ == "_gated_forward"
    assert mlp._ge2jit_act == "silu"
    assert mlp.gate_proj.weight.stride() == (2 * 64, 1)
    assert mlp.up_proj.weight.storage_offset() == mlp.gate_proj.weight.storage_offset() + 64


def test_an_optimizer_built_before_still_steps_the_parameters():
    model = TinyDecoder(device="meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gt.patch(model, attention=False)
    assert [id(p) for g in opt.param_groups for p in g["params"]] == [
        id(p) for p in model.parameters()]


def test_cpu_parameters_are_left_with_the_reason():
    model = TinyDecoder()
    report = gt.patch(model, attention=False)
    assert [p for p, _, _ in report.replaced] == []
    assert {why for _, why in report.left} >= {
        "parameters on cpu (ge2jit's layers run on CUDA devices)"}
    assert type(model.input_layernorm).__name__ == "LlamaRMSNorm"
    assert model.config._attn_implementation == "sdpa"


def test_the_kinds_can_be_chosen():
    model = TinyDecoder(device="meta")
    report = gt.patch(model, linears=False, attention=False, layer_norms=True)
    assert sorted(p for p, _, _ in report.replaced) == ["input_layernorm", "ln_f"]
    assert isinstance(model.ln_f, gt.LayerNorm) and model.ln_f.weight is not None
    assert type(model.head[0]) is nn.Linear
    model = TinyDecoder(device="meta")
    report = gt.patch(model, norms=False, layer_norms=True, attention=False)   # norms: none
    assert type(model.ln_f) is nn.LayerNorm and type(model.input_layernorm) is not gt.RMSNorm
    for bad in ("norms", "layer_norms", "head"):
        with pytest.raises(ge2jit.ArgumentTypeError, match=f"^{bad}: expected a bool, got 1$"):
            gt.patch(TinyDecoder(device="meta"), **{bad: 1})


def test_nn_rmsnorm_takes_the_dtypes_epsilon_and_leaky_relu_its_slope():
    model = nn.Sequential(nn.Linear(8, 8), nn.LeakyReLU(0.2), nn.RMSNorm(8)).to(
        device="meta", dtype=torch.bfloat16)
    gt.patch(model)
    assert model[0].act == "leaky_relu" and model[0].leaky_slope == 0.2
    assert model[2].eps == torch.finfo(torch.bfloat16).eps
    inplace = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)).to("meta")
    assert gt.patch(inplace).replaced == [] and type(inplace[0]) is nn.Linear


def test_without_transformers_the_attention_is_left(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)   # import fails
    model = TinyDecoder(device="meta")
    report = gt.patch(model)
    assert report.left[-1][0] == "" and report.left[-1][1].startswith(
        "attention: transformers is not importable")
    assert model.config._attn_implementation == "sdpa"


def test_a_gated_mlp_with_biases_is_left_with_the_reason():
    from .hf_modules import LlamaMLP

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = LlamaMLP(16, 32, device="meta")
            self.mlp.gate_proj = nn.Linear(16, 32, device="meta")   # Qwen-style mlp_bias

    model = Block()
    report = gt.patch(model, attention=False)
    assert report.left == [("mlp", "a gated MLP with biases (not fused yet)")]
    assert "forward" not in vars(model.mlp)
