"""``ge2jit.torch.patch(model)`` on the GPU: a patched Hugging Face-like decoder (norms, a GPT-2
MLP, a Linear + SiLU in a Sequential) gives the untouched model's outputs and gradients (both
against a float64 copy: the patched error at most 1.5x the untouched bfloat16 error plus a
bfloat16 unit), and an optimizer step moves the shared parameters."""

from __future__ import annotations

import warnings

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


def _hf_models(kind: str, vocab: int = 1000, **extra):
    """A tiny Hugging Face causal LM of ``kind`` in bfloat16 and its float64 copy (Qwen2's
    projection biases made nonzero)."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind in ("llama", "mistral", "qwen2"):
        config, make = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
                        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM)}[kind]
        config = config(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=64, max_position_embeddings=256, **extra)
    else:
        config = tf.GPT2Config(vocab_size=vocab, n_embd=128, n_layer=2, n_head=2,
                               n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0,
                               attn_pdrop=0.0)
        make = tf.GPT2LMHeadModel
    model = make(config).cuda().bfloat16().train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and kind == "qwen2":
                p.uniform_(-0.5, 0.5)
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


def _direct_calls(monkeypatch):
    """The calls of the direct paths' kernel (``composed.hf_attention.attention``): q's shape
    and the window, counted."""
    from ge2jit.composed import hf_attention

    calls = []
    real = hf_attention.attention

    def counted(*args, **kwargs):
        calls.append((args[0].shape, kwargs.get("window")))
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_attention, "attention", counted)
    return calls


ATTENTION = ("GPT2Attention", "LlamaAttention", "MistralAttention", "Qwen2Attention")


def _own_forward_twin(model):
    """A copy of a patched model whose attention modules run their own forward (the module's
    split and transposes, then ``attn_implementation="ge2jit"``'s function)."""
    import copy

    twin = copy.deepcopy(model)
    for m in twin.modules():
        if "forward" in vars(m) and type(m).__name__ in ATTENTION:
            del m.forward
    return twin


def _untouched_errors(kind: str, **extra):
    """A tiny bfloat16 model of ``kind`` (``_hf_models``), 2 x 96 tokens and their labels, the
    float64 copy's loss and gradients, and the untouched model's errors against those."""
    model, ref = _hf_models(kind, **extra)
    ids = torch.randint(0, 1000, (2, 96), device="cuda")
    labels = ids.clone()
    _, want = _loss_and_grads(ref, ids, labels)
    _, untouched = _loss_and_grads(model, ids, labels)
    return model, ids, labels, want, relative_errors(untouched, want)


LAYERS = {"gpt2": ["transformer.h.0.attn", "transformer.h.1.attn"],
          "llama": ["model.layers.0.self_attn", "model.layers.1.self_attn"]}


@pytest.mark.parametrize("kind,extra", [
    ("gpt2", {}), ("llama", {}), ("mistral", {}), ("qwen2", {}),
    ("mistral", {"sliding_window": 40}),
    ("qwen2", {"sliding_window": 40, "use_sliding_window": True, "max_window_layers": 1})],
    ids=["gpt2", "llama", "mistral", "qwen2", "mistral-window", "qwen2-window"])
def test_the_attention_reads_the_projections_in_place_and_matches(kind, extra, monkeypatch):
    """patch gives GPT-2's self-attention and LLaMA's, Mistral's and Qwen2's (projection
    biases) attention the direct path (q, k, v read from
    the projections' outputs by strides, q and k rotated by rope, the output projection's
    input written): loss and every gradient within 1.5x the untouched bfloat16 model's error
    of float64, the cache filled as the module fills it, the next token on the module's own
    forward. A window of 40 keys over 96 queries: transformers' mask for it, tagged by
    ge2jit's mask function, is the kernel's window (39, 0)."""
    model, ids, labels, want, eager = _untouched_errors(kind, **extra)
    report = gt.patch(model)
    direct = [p for p, what, _ in report.replaced if what.startswith(ATTENTION)]
    assert direct == LAYERS["gpt2" if kind == "gpt2" else "llama"], str(report)
    calls = _direct_calls(monkeypatch)
    _, grads = _loss_and_grads(model, ids, labels)
    assert [c[0] for c in calls] == [(2, 96, 2, 64)] * 2      # both layers, q as (B, S, H, D)
    window = {"mistral-window": [(39, 0)] * 2, "qwen2-window": [None, (39, 0)],
              "mistral": [(4095, 0)] * 2}
    assert [c[1] for c in calls] == window.get(
        f"{kind}-window" if extra else kind, [None, None])
    got = relative_errors(grads, want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    # the cache a forward with use_cache fills (what generation starts from): the module's
    twin = _own_forward_twin(model)
    model.eval(), twin.eval()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        out_twin = twin(input_ids=ids, use_cache=True)
        assert len(calls) == 4
        for layer in range(2):
            for a, b in zip((out.past_key_values.layers[layer].keys,
                             out.past_key_values.layers[layer].values),
                            (out_twin.past_key_values.layers[layer].keys,
                             out_twin.past_key_values.layers[layer].values)):
                # (a sliding layer keeps its window's last keys)
                assert a.shape == b.shape and a.shape[:2] == (2, 2 if kind == "gpt2" else 1)
                # values exact; keys rotated by rope in float32 (the module's: products
                # rounded to bfloat16, then summed): a bfloat16 unit of the largest key
                tol = 0 if kind == "gpt2" else 2 ** -7 * b.abs().max().item()
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)
        torch.testing.assert_close(out.logits, out_twin.logits, rtol=2 ** -7, atol=2 ** -7)
        # the next token reads the cache: the module's own forward (no direct call)
        nxt = ids[:, :1]
        step = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        step_twin = twin(input_ids=nxt, past_key_values=out_twin.past_key_values, use_cache=True)
        assert len(calls) == 4
        torch.testing.assert_close(step.logits, step_twin.logits, rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.parametrize("kind,extra", [
    ("mistral", {"sliding_window": 40}),
    ("qwen2", {"sliding_window": 40, "use_sliding_window": True, "max_window_layers": 1})],
    ids=["mistral-window", "qwen2-window"])
def test_a_compiled_sliding_window_runs_the_kernels_window(kind, extra, monkeypatch):
    """gt.compile: a window of 40 keys over 96 queries passes no mask while tracing (Mistral's
    and Qwen2's modules pass their window), the kernel runs (39, 0); loss and every gradient
    within 1.5x the untouched bfloat16 model's error of float64."""
    model, ids, labels, want, eager = _untouched_errors(kind, **extra)
    calls = _direct_calls(monkeypatch)
    torch._dynamo.reset()
    compiled = gt.compile(model)
    _, grads = _loss_and_grads(compiled, ids, labels)
    assert [c[1] for c in calls] == ([(39, 0)] * 2 if kind == "mistral" else [None, (39, 0)])
    got = relative_errors(grads, want)
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    torch._dynamo.reset()


def test_gpt2s_attention_leaves_what_the_direct_path_does_not_serve(monkeypatch):
    """A padding mask, attention dropout in training and a float32 model without autocast
    run the module's own forward, with its results."""
    model, _ = _hf_models("gpt2")
    gt.patch(model)
    twin = _own_forward_twin(model)
    calls = _direct_calls(monkeypatch)
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :10] = 0                                  # left padding
    model.eval(), twin.eval()
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits
        b = twin(input_ids=ids, attention_mask=mask).logits
    assert calls == [] and torch.equal(a, b)
    model.config.attn_pdrop = 0.5
    for m in model.modules():
        if type(m).__name__ == "GPT2Attention":
            m.attn_dropout.p = 0.5
    model.train()
    with warnings.catch_warnings():                   # PyTorch's SDPA's (a one-time warning)
        warnings.simplefilter("ignore")
        model(input_ids=ids)
        assert calls == []
        model.float().eval()                          # float32, no autocast: the module's own
        with torch.no_grad():
            model(input_ids=ids)
    assert calls == []
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        model(input_ids=ids)
    assert calls == [((2, 64, 2, 64), None)] * 2


def _varlen_batch(how: str):
    """2 x 96 tokens with padding (the first row's last 17, the second's first 9; their labels
    ignored) or packed (the first row sequences of 37 and 59 tokens, no cache): the keywords
    of the call, the labels' mask, and what the kernels get: the padded batch's cu_seqlens,
    the packed one's sequences' first tokens a row (each token's bounds)."""
    ids = torch.randint(0, 1000, (2, 96), device="cuda")
    if how == "padded":
        mask = torch.ones_like(ids)
        mask[0, 79:] = 0
        mask[1, :9] = 0
        return ids, ids.masked_fill(mask == 0, -100), {"attention_mask": mask}, [0, 79, 166]
    positions = torch.stack([torch.cat([torch.arange(37), torch.arange(59)]),
                             torch.arange(96)]).cuda()
    return ids, ids, {"position_ids": positions, "use_cache": False}, [[0, 37], [0]]


@pytest.mark.parametrize("how", ["padded", "packed"])
@pytest.mark.parametrize("kind,extra", [("gpt2", {}), ("llama", {}),
                                        ("mistral", {"sliding_window": 40})],
                         ids=["gpt2", "llama", "mistral-window"])
@pytest.mark.parametrize("direct", [True, False], ids=["patch", "by-name"])
def test_padded_and_packed_batches_run_the_kernels_on_their_sequences(kind, extra, how,
                                                                       direct, monkeypatch):
    """A batch with padding or of packed sequences: ge2jit's mask function reads
    transformers' mask as variable-length sequences and the kernels run on those (the
    patched model's direct forwards, or the attention function by name), Mistral's in its
    window of 40 keys; loss and every gradient within 1.5x the untouched bfloat16 model's
    error of float64."""
    from ge2jit.ops.attention import hf

    model, ref = _hf_models(kind, **extra)
    ids, labels, kwargs, cu = _varlen_batch(how)

    def loss_and_grads(m):
        m.zero_grad(set_to_none=True)
        out = m(input_ids=ids, labels=labels, **kwargs)
        out.loss.backward()
        return [out.loss.detach().double()] + [p.grad.double() for p in m.parameters()
                                               if p.grad is not None]

    want = loss_and_grads(ref)
    eager = relative_errors(loss_and_grads(model), want)
    if direct:
        gt.patch(model)
    else:
        model.set_attn_implementation(gt.register_hf_attention())
    calls, real = [], hf.attention

    def counted(*args, **kw):
        if kw.get("seq_bounds") is not None:   # packed: the dense batch, each token's bounds
            calls.append(([sorted(set(row[:, 0].tolist())) for row in kw["seq_bounds"]],
                          None, kw["window"]))
        else:
            calls.append((kw["cu_seqlens_q"].tolist(), kw["max_seqlen_q"], kw["window"]))
        return real(*args, **kw)

    monkeypatch.setattr(hf, "attention", counted)
    got = relative_errors(loss_and_grads(model), want)
    window = (39, 0) if extra else None
    longest = max(b - a for a, b in zip(cu, cu[1:])) if how == "padded" else None
    assert calls == [(cu, longest, window)] * 2
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)


@pytest.mark.parametrize("how", ["packed", "plain"])
@pytest.mark.parametrize("kind,extra", [("gpt2", {}), ("llama", {}),
                                        ("mistral", {"sliding_window": 40})],
                         ids=["gpt2", "llama", "mistral-window"])
def test_a_compiled_step_without_a_cache_runs_the_kernels_on_its_sequences(kind, extra, how,
                                                                            monkeypatch):
    """gt.compile with use_cache=False (transformers then masks every batch for packed
    sequences while tracing, packed or not): the kernels run on the dense batch with each
    token's sequence bounds (made in the graph: no break, no read on the host), not
    PyTorch's SDPA on the mask; loss and every gradient within 1.5x the untouched bfloat16
    model's error of float64."""
    from ge2jit.ops.attention import hf

    model, ref = _hf_models(kind, **extra)
    ids = torch.randint(0, 1000, (2, 96), device="cuda")
    positions = (torch.stack([torch.cat([torch.arange(37), torch.arange(59)]),
                              torch.arange(96)]) if how == "packed"
                 else torch.arange(96)[None].expand(2, 96)).cuda()

    def loss_and_grads(m):
        m.zero_grad(set_to_none=True)
        out = m(input_ids=ids, labels=ids, position_ids=positions, use_cache=False)
        out.loss.backward()
        return [out.loss.detach().double()] + [p.grad.double() for p in m.parameters()
                                               if p.grad is not None]

    want = loss_and_grads(ref)
    eager = relative_errors(loss_and_grads(model), want)
    calls, real = [], hf.attention

    def counted(*args, **kw):
        calls.append((kw.get("seq_bounds") is not None, kw.get("window")))
        return real(*args, **kw)

    monkeypatch.setattr(hf, "attention", counted)
    torch._dynamo.reset()
    compiled = gt.compile(model)
    got = relative_errors(loss_and_grads(compiled), want)
    assert calls == [(True, (39, 0) if extra else None)] * 2
    for g, e in zip(got, eager):
        assert g <= 1.5 * e + 2 ** -8, (got, eager)
    monkeypatch.setattr(hf, "attention", real)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids, position_ids=positions,
                                             use_cache=False)
    assert explained.graph_break_count == 0, explained.break_reasons
    report = gt.explain(model, input_ids=ids, labels=ids, position_ids=positions,
                        use_cache=False)   # (traced on fake tensors: no value read)
    assert report.modules is not None
    torch._dynamo.reset()
