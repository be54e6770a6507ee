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


FALLBACK = ("ge2jit.torch.scaled_dot_product_attention: tensors not on a CUDA device; this "
            "call runs torch.nn.functional.scaled_dot_product_attention")


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_attention_by_name_compiles_whole_and_matches(model_type):
    # ge2jit's attention by name on CPU tensors (PyTorch's SDPA, with the one-time warning):
    # the model compiles as one graph (a warnings.warn in traced code split GPT-2's, whose
    # layer loop then ran eagerly), no Dynamo warning, the output and the gradients of the
    # untouched SDPA model
    import copy
    import warnings

    from ge2jit.runtime import torchlib

    torch.manual_seed(0)
    if model_type == "gpt2":
        config = tf.GPT2Config(vocab_size=50, n_embd=64, n_layer=2, n_head=2, n_positions=32,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        make = tf.GPT2LMHeadModel
    else:
        config = tf.LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1)
        make = tf.LlamaForCausalLM
    ours, theirs = (make(copy.deepcopy(config)) for _ in range(2))   # a config each
    for model in (ours, theirs):   # transformers' own warning about the default breaks a graph
        model.loss_type = "ForCausalLM"
    theirs.load_state_dict(ours.state_dict())
    ours.set_attn_implementation(gt.register_hf_attention())
    theirs.set_attn_implementation("sdpa")
    ids = torch.randint(0, 50, (2, 12))
    torchlib._warned.discard(FALLBACK)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="eager", fullgraph=True)   # a break would raise
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loss = compiled(input_ids=ids, labels=ids).loss
    loss.backward()
    expected = theirs(input_ids=ids, labels=ids).loss
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    messages = [str(w.message) for w in seen]
    assert FALLBACK in messages and not [m for m in messages if "ynamo" in m], messages
    torch._dynamo.reset()


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_a_patched_model_saved_whole_loads_with_its_forwards(make):
    """The forwards ``patch`` puts on modules (the head and loss, the gated MLP, the direct
    attention) pickle: ``torch.save(model)`` then ``torch.load`` gives them back, bound to
    the loaded modules (a bound method pickles as a getattr of its name, which they are
    not)."""
    import inspect
    import io

    model = make()
    gt.patch(model)
    replaced = {name: m.forward.__func__ for name, m in model.named_modules()
                if "forward" in vars(m)}
    # the head and loss, the attention, and LLaMA's gated MLP
    assert len(replaced) == (3 if make is _llama else 2), replaced
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    again = {name: m.forward for name, m in loaded.named_modules() if "forward" in vars(m)}
    assert {n: f.__func__ for n, f in again.items()} == replaced
    assert all(f.__self__ is loaded.get_submodule(n) for n, f in again.items())
    assert "labels" in inspect.signature(loaded.forward).parameters   # the function's, less self
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    loaded.train()
    assert loaded(input_ids=ids, labels=ids).logits is None


def test_explain_reports_what_compile_does_to_the_modules():
    """``explain`` makes a Hugging Face model's module-level replacements as ``compile`` does
    (the head and loss, the direct attention, the paired gate and up weights) and reports
    them beside the graphs' patterns; a second ``explain`` finds them made."""
    model = _llama()
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    report = gt.explain(model, input_ids=ids, use_cache=False)
    assert report.modules is not None
    assert [p for p, _, _ in report.modules.replaced] == [
        "lm_head", "", "model.layers.0.self_attn",
        "model.layers.0.mlp"], str(report.modules)
    assert "modules, before tracing: replaced 4, left 0" in str(report)
    assert {name for name, _, _ in report.fused} | {s.pattern for s in report.skipped} >= {
        "rms_norm", "gated_mlp"}
    again = gt.explain(model, input_ids=ids, use_cache=False).modules
    assert again.left == [("lm_head", "its head and loss are ge2jit's already"),
                          ("model.layers.0.self_attn", "its forward is ge2jit's already")]
    plain = _llama()
    assert gt.explain(plain, input_ids=ids, use_cache=False, hf=False).modules is None
    assert "forward" not in vars(plain.model.layers[0].self_attn)
