"""Hugging Face causal LMs' head and loss under ``patch`` and ``compile``, without a GPU (models
on the meta device): a LLaMA and a GPT-2 trained on labels return the loss of
``linear_cross_entropy`` (its fake: a float32 scalar with ge2jit's backward) and no logits,
with the base model's other outputs kept; evaluation and calls without labels run the model's
own forward; what is left, and why (a head with a bias, a config that changes the logits, a
head already replaced); ``gt.compile`` replaces the head and switches the attention, leaving
the layers to the graph passes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import ge2jit.torch as gt  # noqa: E402

HEAD = ("lm_head", "Linear + cross-entropy (training on labels)",
        "ge2jit linear_cross_entropy, no logits")


def _llama(**config):
    with torch.device("meta"):
        return tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, **config))


def _gpt2():
    with torch.device("meta"):
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=100, n_embd=64, n_layer=1,
                                                n_head=2, n_positions=64))


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_training_on_labels_makes_no_logits(make):
    model = make()
    report = gt.patch(model, attention=False)
    assert HEAD in report.replaced, str(report)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    model.train()
    out = model(input_ids=ids, labels=ids)
    assert out.logits is None and out.loss.shape == () and out.loss.dtype == torch.float32
    assert "linear_cross_entropy" in type(out.loss.grad_fn).__name__
    model.eval()                                    # the model's own forward
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 16, 100) and out.loss is not None
    model.train()
    assert model(input_ids=ids).logits.shape == (2, 16, 100)   # no labels: its own forward


def test_what_is_left_and_why():
    model = _llama(final_logit_softcapping=30.0)
    report = gt.patch(model, attention=False, norms=False)
    assert ("lm_head", "config.final_logit_softcapping changes the logits after the head") \
        in report.left, str(report)
    model = _llama()
    model.lm_head = nn.Linear(64, 100, bias=True, device="meta")
    assert ("lm_head", "a head with a bias") in gt.patch(model, attention=False).left
    model = _llama()
    gt.patch(model, attention=False)
    again = gt.patch(model, attention=False)
    assert ("lm_head", "its head and loss are ge2jit's already") in again.left
    assert not any(p == "lm_head" for p, _, _ in again.replaced)


def test_compile_replaces_the_head_and_leaves_the_layers_to_the_passes():
    model = _llama()
    gt.compile(model)          # lazy: nothing traced until the first call
    assert getattr(model, "_ge2jit_forward", None) is not None
    assert model.config._attn_implementation == "ge2jit"
    assert type(model.model.norm).__name__ == "LlamaRMSNorm"      # the norm pattern's
    plain = _llama()
    gt.compile(plain, hf=False)
    assert getattr(plain, "_ge2jit_forward", None) is None
