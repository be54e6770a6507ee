"""``ge2jit.torch.patch(model)`` on the GPU: a patched Hugging Face-like decoder (norms, a GPT-2
MLP, a Linear + SiLU in a Sequential) gives the untouched model's outputs and gradients (both
against a float64 copy: the patched error at most 1.5x the untouched bfloat16 error plus a
bfloat16 unit), and an optimizer step moves the shared parameters."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

import ge2jit.torch as gt  # noqa: E402

from .grads import relative_errors, run_backward  # noqa: E402
from .hf_modules import TinyDecoder  # noqa: E402


def test_a_patched_decoder_matches_the_untouched_one():
    torch.manual_seed(0)
    model = TinyDecoder(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        model.input_layernorm.weight.uniform_(0.5, 1.5)
    ref = TinyDecoder(device="cuda", dtype=torch.float64)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(4, 100, 64, device="cuda")
    want = run_backward(ref, x.double())
    eager = relative_errors(run_backward(model, x.bfloat16()), want)
    model.zero_grad(set_to_none=True)
    report = gt.patch(model, attention=False)
    assert len(report.replaced) == 4, str(report)
    got = relative_errors(run_backward(model, x.bfloat16()), want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    before = model.ln_f.weight.detach().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model.ln_f.weight, before)
