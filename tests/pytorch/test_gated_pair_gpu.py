"""A gated MLP on a model's own gate and up weights on the GPU: ``gated_mlp_pair`` eagerly
(weights paired by ``pair_gate_up_``: no copy; apart: a copy) and the compiler's gated MLP
pattern under ``torch.compile(fullgraph=True)``, outputs and every gradient against a float64
copy (ge2jit's error at most PyTorch's bfloat16 error times 1.5 plus a bfloat16 unit)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

import torch.nn.functional as F  # noqa: E402 - after the skips above

import ge2jit.torch as gt  # noqa: E402
from ge2jit.ops.gemm.torch_ops import gate_up_view  # noqa: E402

from .grads import relative_errors, run_backward  # noqa: E402
from .hf_modules import LlamaMLP  # noqa: E402

D, HIDDEN = 256, 688


class PairMLP(LlamaMLP):
    """LLaMA's MLP by ``gt.gated_mlp_pair`` on its own Linears' weights."""

    def forward(self, x):
        y = gt.gated_mlp_pair(x.reshape(-1, D), self.gate_proj.weight, self.up_proj.weight,
                              self.down_proj.weight)
        return y.reshape(*x.shape[:-1], D)


def _models(cls, dtype=torch.bfloat16, paired=True):
    torch.manual_seed(0)
    model = cls(D, HIDDEN, device="cuda", dtype=dtype)
    ref = LlamaMLP(D, HIDDEN, device="cuda", dtype=torch.float64)
    ref.load_state_dict(model.state_dict())
    if paired:
        assert gt.pair_gate_up_(model.gate_proj.weight, model.up_proj.weight)
        assert gate_up_view(model.gate_proj.weight, model.up_proj.weight) is not None
    return model, ref


def _check(model, ref, x, run=None):
    want = run_backward(ref, x.double())
    plain = LlamaMLP(D, HIDDEN, device="cuda", dtype=x.dtype)
    plain.load_state_dict(ref.state_dict())
    eager = relative_errors(run_backward(plain, x), want)
    got = relative_errors(run_backward(model if run is None else run, x), want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    # each weight's gradient is its own, contiguous, of its shape
    for p in model.parameters():
        assert p.grad.shape == p.shape and p.grad.is_contiguous()


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "apart"])
def test_eager_matches_the_float64_model(paired):
    model, ref = _models(PairMLP, paired=paired)
    _check(model, ref, torch.randn(3, 77, D, device="cuda").bfloat16())


def test_master_weights_under_autocast():
    model, ref = _models(PairMLP, dtype=torch.float32)
    x = torch.randn(2, 50, D, device="cuda")
    want = run_backward(ref, x.double())
    with torch.autocast("cuda", torch.bfloat16):
        got = run_backward(model, x)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    errors = relative_errors(got, want)
    assert max(errors) <= 2 ** -6, errors


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "apart"])
def test_the_compiled_pattern_matches_the_float64_model(paired):
    model, ref = _models(LlamaMLP, paired=paired)
    torch._dynamo.reset()
    compiled = gt.compile(model, fullgraph=True)
    _check(model, ref, torch.randn(2, 100, D, device="cuda").bfloat16(), compiled)
    fused = [op for _, _, op in gt.compiler.reports[-1].fused]
    assert fused == ["gated_mlp(act='silu')"], gt.compiler.reports[-1]


def test_no_grad_and_a_second_call_reuse_the_pairing():
    model, _ = _models(PairMLP)
    x = torch.randn(4, 33, D, device="cuda").bfloat16()
    with torch.no_grad():
        y1 = model(x)
        y2 = F.linear(F.silu(model.gate_proj(x)) * model.up_proj(x), model.down_proj.weight)
    assert (y1 - y2).abs().max() <= 2 ** -6 * y2.abs().max()


@pytest.mark.parametrize("save", [True, False], ids=["saved", "recomputed"])
@pytest.mark.parametrize("paired", [True, False], ids=["paired", "apart"])
def test_opcheck(save, paired):
    torch.manual_seed(4)
    x = torch.randn(40, 32, device="cuda", requires_grad=True)
    gate, up = (torch.nn.Parameter(torch.randn(48, 32, device="cuda")) for _ in range(2))
    if paired:
        gt.pair_gate_up_(gate, up)
    down = torch.randn(32, 48, device="cuda", requires_grad=True)
    ops = torch.ops.ge2jit
    torch.library.opcheck(ops.gated_mlp_pair.default, (x, gate, up, down, "silu", "ieee", save))
    y, h, z, low_gu, low_down = ops.gated_mlp_pair(x, gate, up, down, "gelu", "ieee", True)
    gy = torch.randn_like(y)
    torch.library.opcheck(ops.gated_mlp_pair_backward.default,
                          (gy, x.detach(), gate.detach(), up.detach(), down.detach(), h, z,
                           "gelu", "ieee", True, low_gu, low_down))
