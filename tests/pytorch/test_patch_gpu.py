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
    assert len(report.replaced) == 4, str(report)   # with the gated MLP (ln_f left)
    assert model.mlp.forward.__func__.__name__ == "_gated_forward"
    got = relative_errors(run_backward(model, x.bfloat16()), want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    before = model.ln_f.weight.detach().clone()
    gate_before = model.mlp.gate_proj.weight.detach().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model.ln_f.weight, before)
    # the paired weights step in place: still one storage, each by its own gradient
    mlp = model.mlp
    assert mlp.gate_proj.weight.stride() == (128, 1)
    want = gate_before.float() - 0.1 * mlp.gate_proj.weight.grad.float()
    torch.testing.assert_close(mlp.gate_proj.weight.float(), want, rtol=2 ** -7, atol=1e-6)


def _hf_models(kind: str, vocab: int = 1000):
    """A tiny Hugging Face causal LM of ``kind`` in bfloat16 and its float64 copy."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "llama":
        config = tf.LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1, max_position_embeddings=256)
        make = tf.LlamaForCausalLM
    else:
        config = tf.GPT2Config(vocab_size=vocab, n_embd=128, n_layer=2, n_head=2,
                               n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0,
                               attn_pdrop=0.0)
        make = tf.GPT2LMHeadModel
    model = make(config).cuda().bfloat16().train()
    ref = make(config).cuda().double().train()
    ref.load_state_dict(model.state_dict())
    return model, ref


def _loss_and_grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out, [out.loss.detach().double()] + [
        p.grad.double() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("how", ["patch", "compile"])
def test_a_causal_lm_trains_without_logits_and_matches_the_untouched_one(kind, how):
    model, ref = _hf_models(kind)
    ids = torch.randint(0, 1000, (2, 96), device="cuda")
    labels = ids.clone()
    labels[0, 50:] = -100                  # padding: ignored
    _, want = _loss_and_grads(ref, ids, labels)
    untouched_out, untouched = _loss_and_grads(model, ids, labels)
    assert untouched_out.logits is not None
    eager = relative_errors(untouched, want)
    if how == "patch":
        report = gt.patch(model, attention=False)
        runnable = model
    else:
        report = None
        torch._dynamo.reset()
        runnable = gt.compile(model)
    out, grads = _loss_and_grads(runnable, ids, labels)
    assert out.logits is None                       # never made
    got = relative_errors(grads, want)
    assert len(got) == len(eager)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    if report is not None:
        assert ("lm_head", "Linear + cross-entropy (training on labels)",
                "ge2jit linear_cross_entropy, no logits") in report.replaced
    model.eval()                                    # evaluation: the model's own forward
    with torch.no_grad():
        assert runnable(input_ids=ids, labels=labels).logits.shape == (2, 96, 1000)
