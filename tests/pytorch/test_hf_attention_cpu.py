"""The direct attention forwards ``patch`` puts on Hugging Face's GPT-2, LLaMA, Mistral and Qwen2
attention modules (``ge2jit.composed.hf_attention``), without a GPU: which modules take them
and what the report says; their plumbing (the projections read as (B, S, H, D), the rotary
tables' halves, grouped-query heads, Qwen2's biases, the scale, Mistral's window, the cache
they fill, the output projection's input) against the untouched model in float64 on the CPU,
with ``rope`` and ``attention`` standing in as PyTorch references (the kernels themselves are
checked on the GPU, ``test_patch_gpu.py``); and the calls they leave to the module's own
forward."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

import ge2jit.torch as gt  # noqa: E402
from ge2jit.composed import hf_attention  # noqa: E402
from ge2jit.runtime.torchlib import BoundForward  # noqa: E402


def _config(kind: str, **extra):
    common = dict(vocab_size=50, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=64)
    if kind == "gpt2":
        return tf.GPT2LMHeadModel, tf.GPT2Config(
            vocab_size=50, n_embd=128, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, **extra)
    if kind == "llama":
        return tf.LlamaForCausalLM, tf.LlamaConfig(**common, **extra)
    if kind == "mistral":
        return tf.MistralForCausalLM, tf.MistralConfig(**common, **extra)
    return tf.Qwen2ForCausalLM, tf.Qwen2Config(**common, **extra)


KINDS = ["gpt2", "llama", "mistral", "qwen2"]
NAMES = {"gpt2": "GPT2Attention", "llama": "LlamaAttention", "mistral": "MistralAttention",
         "qwen2": "Qwen2Attention"}


@pytest.mark.parametrize("kind", KINDS)
def test_patch_gives_each_attention_module_its_direct_forward(kind):
    make, config = _config(kind)
    with torch.device("meta"):
        model = make(config)
    report = gt.patch(model)
    direct = [(p, old, new) for p, old, new in report.replaced if old.startswith(NAMES[kind])]
    modules = [(p, m) for p, m in model.named_modules() if type(m).__name__ == NAMES[kind]]
    assert [p for p, _, _ in direct] == [p for p, _ in modules] and len(modules) == 2
    want = (hf_attention.gpt2_attention_forward if kind == "gpt2"
            else hf_attention.rotary_attention_forward)
    for _, m in modules:
        assert isinstance(m.forward, BoundForward) and m.forward.__func__ is want
        assert m.forward.__self__ is m
    assert model.config._attn_implementation == "ge2jit"
    untouched = make(config)   # on the CPU: left, with the reason
    report = gt.patch(untouched)
    assert not any(old.startswith(NAMES[kind]) for _, old, _ in report.replaced)
    assert "forward" not in vars(untouched.get_submodule(modules[0][0]))


def test_a_qwen2_module_without_its_layers_window_is_left():
    """A Qwen2 attention module without ``sliding_window`` (transformers before its layer
    types computed the window in the forward) is not taken: its window would be unknown."""
    make, config = _config("qwen2")
    with torch.device("meta"):
        model = make(config)
    attn = model.model.layers[0].self_attn
    assert hf_attention.is_rotary_attention(attn)
    del attn.sliding_window
    assert not hf_attention.is_rotary_attention(attn)
    assert hf_attention.direct_forward(attn) is None


def test_attention_false_leaves_the_modules_forwards():
    make, config = _config("llama")
    with torch.device("meta"):
        model = make(config)
    gt.patch(model, attention=False)
    assert not any("forward" in vars(layer.self_attn) for layer in model.model.layers)


def _reference_rope(q, k, cos, sin):
    """(q, k) of (B, S, H, D) rotated as Hugging Face rotates them, from tables of the first
    halves."""
    def rotate(x):
        c, s = cos[:, :, None].to(x.dtype), sin[:, :, None].to(x.dtype)
        x1, x2 = x.chunk(2, -1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    return rotate(q), rotate(k)


def _reference_attention(calls):
    """ge2jit.attention's contract in PyTorch (q, k, v as (B, S, H, D), grouped-query heads,
    a causal window (left, 0)), each call's arguments recorded."""
    def attention(q, k, v, *, causal, scale, window=None):
        calls.append((tuple(q.shape), tuple(k.shape), causal, scale, window))
        s = q.shape[1]
        i = torch.arange(s)
        keep = i[None, :] <= i[:, None]
        if window is not None:
            keep &= i[None, :] >= i[:, None] - window[0]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep,
            scale=scale, enable_gqa=True)
        return out.transpose(1, 2).contiguous()
    return attention


@pytest.fixture
def references(monkeypatch):
    """The direct forwards on the CPU in float64: their input checks pass (hidden states and
    rotary tables), rope and attention are the references; the attention calls, recorded."""
    calls = []
    monkeypatch.setattr(hf_attention, "_kernel_input", lambda hidden: hidden.dim() == 3)
    monkeypatch.setattr(hf_attention, "_TABLES", (torch.float64,))
    monkeypatch.setattr(hf_attention, "rope", _reference_rope)
    monkeypatch.setattr(hf_attention, "attention", _reference_attention(calls))
    return calls


def _twins(kind: str, **extra):
    """A model of ``kind`` in float64 on the CPU with the direct forwards and ge2jit's
    attention by name, and its untouched twin (PyTorch's SDPA), with the same weights (Qwen2's
    projection biases made nonzero)."""
    torch.manual_seed(0)
    make, config = _config(kind, **extra)
    ours = make(config).double().eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    theirs = copy.deepcopy(ours)
    theirs.set_attn_implementation("sdpa")
    ours.set_attn_implementation(gt.register_hf_attention())
    for m in ours.modules():   # as patch installs them (which leaves modules on the CPU)
        direct = hf_attention.direct_forward(m)
        if direct is not None:
            m.forward = BoundForward(direct[0], m)
    return ours, theirs


def _keys_values(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize("kind", KINDS)
def test_the_direct_forward_computes_the_modules_values(kind, references):
    ours, theirs = _twins(kind)
    ids = torch.randint(0, 50, (2, 24))
    with torch.no_grad():
        got = ours(input_ids=ids, use_cache=True)
        want = theirs(input_ids=ids, use_cache=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-10, atol=1e-10)
    for (k, v), (wk, wv) in zip(_keys_values(got.past_key_values),
                                _keys_values(want.past_key_values)):
        torch.testing.assert_close(k, wk, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(v, wv, rtol=1e-10, atol=1e-10)
    heads, kv_heads = (2, 2) if kind == "gpt2" else (4, 2)
    assert [c[:2] for c in references] == [((2, 24, heads, 64), (2, 24, kv_heads, 64))] * 2
    window = (4095, 0) if kind == "mistral" else None   # Mistral's default window, 4096
    assert all(c[2] is True and c[3] == pytest.approx(64 ** -0.5) and c[4] == window
               for c in references)


def test_the_direct_forward_trains_as_the_module():
    """The gradients through the direct path (references standing in) are the module's."""
    # (the fixture's patches applied by hand: the twins need the same seed)
    mp = pytest.MonkeyPatch()
    calls = []
    mp.setattr(hf_attention, "_kernel_input", lambda hidden: hidden.dim() == 3)
    mp.setattr(hf_attention, "_TABLES", (torch.float64,))
    mp.setattr(hf_attention, "rope", _reference_rope)
    mp.setattr(hf_attention, "attention", _reference_attention(calls))
    try:
        ours, theirs = _twins("qwen2")
        ours.train(), theirs.train()
        ids = torch.randint(0, 50, (2, 16))
        for model in (ours, theirs):
            model(input_ids=ids, labels=ids).loss.backward()
        assert len(calls) == 2
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)
    finally:
        mp.undo()


def test_mistrals_window_is_the_kernels(references):
    """Mistral's sliding window goes to the kernel as (W - 1, 0) keys; a Qwen2 layer that is
    not a sliding one passes none."""
    ours, _ = _twins("mistral", sliding_window=32)
    with torch.no_grad():
        ours(input_ids=torch.randint(0, 50, (1, 16)))
    assert [c[4] for c in references] == [(31, 0)] * 2
    references.clear()
    ours, _ = _twins("qwen2", sliding_window=8, use_sliding_window=False)
    with torch.no_grad():
        ours(input_ids=torch.randint(0, 50, (1, 16)))
    assert [c[4] for c in references] == [None] * 2


def test_what_the_direct_forward_leaves_to_the_module(references):
    """A mask of the caller's own (4-D: not read as a window or as sequences), attention
    weights asked for, a filled cache (the next token), another attention implementation and
    dropout in training run the module's own forward, with its values."""
    ours, theirs = _twins("llama")
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()
    mask[1, :, 5:, 2] = False
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        want = theirs(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        assert references == []
        first = ours(input_ids=ids, use_cache=True)
        assert len(references) == 2
        step = ours(input_ids=ids[:, :1], past_key_values=first.past_key_values,
                    use_cache=True)
        want_first = theirs(input_ids=ids, use_cache=True)
        want_step = theirs(input_ids=ids[:, :1], past_key_values=want_first.past_key_values,
                           use_cache=True)
        torch.testing.assert_close(step.logits, want_step.logits, rtol=1e-10, atol=1e-10)
        assert len(references) == 2
        ours.set_attn_implementation("sdpa")
        ours(input_ids=ids)
        assert len(references) == 2
    ours.set_attn_implementation("ge2jit")
    for m in ours.modules():
        if type(m).__name__ == "LlamaAttention":
            m.attention_dropout = 0.1
    ours.train()
    ours(input_ids=ids)
    assert len(references) == 2


def test_unusual_rotary_tables_run_the_modules_forward(references):
    """Rotary tables of another shape than (B or 1, S, head_dim) (a partial rotary
    dimension, a model's own layout) are the module's to apply."""
    ours, _ = _twins("llama")
    attn = ours.model.layers[0].self_attn
    hidden = torch.randn(1, 8, 256, dtype=torch.float64)
    cos, sin = torch.ones(1, 8, 32, dtype=torch.float64), torch.zeros(1, 8, 32,
                                                                      dtype=torch.float64)
    with pytest.raises(RuntimeError):   # the module's own forward: HF's rotation fails on it
        attn(hidden_states=hidden, position_embeddings=(cos, sin), attention_mask=None)
    assert references == []
    cos, sin = torch.ones(1, 8, 64, dtype=torch.float64), torch.zeros(1, 8, 64,
                                                                      dtype=torch.float64)
    out, weights = attn(hidden_states=hidden, position_embeddings=(cos, sin),
                        attention_mask=None)
    assert out.shape == (1, 8, 256) and weights is None and len(references) == 1


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_direct_forward_traces_whole(kind, references):
    """TorchDynamo traces the direct forwards (their checks of the call, the cache, the
    tables) without a graph break: ``fullgraph=True`` compiles the model, with its values."""
    ours, theirs = _twins(kind)
    for model in (ours, theirs):   # transformers' own warning about the default breaks a graph
        model.loss_type = "ForCausalLM"
    ids = torch.randint(0, 50, (2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="eager", fullgraph=True)   # a break would raise
    with torch.no_grad():   # (use_cache=False would have transformers mask for packed sequences)
        got = compiled(input_ids=ids, labels=ids)
        want = theirs(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-10, atol=1e-10)
    assert len(references) == 2
    torch._dynamo.reset()


def _mask_calls(monkeypatch):
    """The masks ge2jit's attention function receives (``hf.attention``'s calls: a reference
    standing in; ``scaled_dot_product_attention``'s: recorded, then PyTorch's)."""
    from ge2jit.ops.attention import hf

    seen = []
    reference = _reference_attention(seen)

    def kernel(q, k, v, *, causal, scale, softcap=None, window=None, layout=None,
               cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
               seq_bounds=None):
        assert not softcap
        if seq_bounds is not None:   # (B, S, H, D), each row's sequences apart: each alone
            assert causal and layout is None and cu_seqlens_q is None
            assert seq_bounds.dtype == torch.int32 and seq_bounds.shape == (*q.shape[:2], 2)
            starts = [sorted(set(row[:, 0].tolist())) for row in seq_bounds]
            seen.append(("bounds", starts, window))
            out = torch.empty_like(q)
            for r, row in enumerate(starts):
                for a, b in zip(row, row[1:] + [q.shape[1]]):
                    assert (seq_bounds[r, a:b] == torch.tensor([a, b], dtype=torch.int32)).all()
                    out[r, a:b] = _reference_attention([])(
                        q[r:r + 1, a:b], k[r:r + 1, a:b], v[r:r + 1, a:b], causal=True,
                        scale=scale, window=window)[0]
            return out
        if cu_seqlens_q is not None:   # (total, H, D): each sequence as a batch of one
            assert cu_seqlens_k is cu_seqlens_q and max_seqlen_k == max_seqlen_q
            assert causal and layout is None and cu_seqlens_q.dtype == torch.int32
            cu = cu_seqlens_q.tolist()
            assert max_seqlen_q == max(b - a for a, b in zip(cu, cu[1:]))
            seen.append(("varlen", cu, window))
            return torch.cat([_reference_attention([])(
                q[None, a:b], k[None, a:b], v[None, a:b], causal=True, scale=scale,
                window=window)[0] for a, b in zip(cu, cu[1:])])
        assert layout == "bhsd"
        return reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         causal=causal, scale=scale, window=window).transpose(1, 2)

    real = hf.scaled_dot_product_attention

    def sdpa(*args, attn_mask=None, **kwargs):
        seen.append(("sdpa", None if attn_mask is None else tuple(attn_mask.shape)))
        return real(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(hf, "attention", kernel)
    monkeypatch.setattr(hf, "scaled_dot_product_attention", sdpa)
    return seen


def _sliding_twins(direct: bool):
    """(ours, theirs, each layer's expected window) for Mistral with a window of 8 and Qwen2
    with its second layer sliding (``_twins``); ``direct`` False: ours without the direct
    forwards (the attention function by name)."""
    for kind, extra, windows in (
            ("mistral", dict(sliding_window=8), [(7, 0), (7, 0)]),
            ("qwen2", dict(sliding_window=8, use_sliding_window=True, max_window_layers=1),
             [None, (7, 0)])):
        ours, theirs = _twins(kind, **extra)
        if not direct:
            for m in ours.modules():
                vars(m).pop("forward", None)
        yield ours, theirs, windows


def _windows(calls) -> list:
    """Each recorded call's window: the kernels' (W - 1, 0); None: is_causal (the kernel or,
    by name, scaled_dot_product_attention, whose own checks then take it); "mask"."""
    return [c[4] if len(c) == 5 else "mask" if c[1] else None for c in calls]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "by-name"])
def test_a_sliding_window_longer_sequence_runs_the_kernels_window(direct, references,
                                                                  monkeypatch):
    """A sequence longer than Mistral's window (transformers makes a mask for it): the mask
    ge2jit's mask function made is tagged with the window, and the direct forward (or
    the attention function by name) runs the kernels' window (W - 1, 0) on it, with the
    untouched model's values; Qwen2's full layers get no mask and no window."""
    from transformers.masking_utils import AttentionMaskInterface

    from ge2jit.ops.attention import hf

    seen = _mask_calls(monkeypatch)
    real, masks = hf._causal_or_sdpa_mask, []

    def made(*args, **kwargs):
        masks.append(real(*args, **kwargs))
        return masks[-1]

    for ours, theirs, windows in _sliding_twins(direct):
        masks.clear()
        AttentionMaskInterface.register("ge2jit", made)   # (_twins registered ge2jit's)
        ids = torch.randint(0, 50, (2, 24))
        with torch.no_grad():
            got = ours(input_ids=ids).logits
            want = theirs(input_ids=ids).logits
        AttentionMaskInterface.register("ge2jit", real)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        assert [hf.mask_window(m) for m in masks if m is not None] == [8]
        assert _windows(references if direct else seen) == windows
        references.clear(), seen.clear()


def test_only_a_plain_sliding_window_mask_is_tagged(monkeypatch):
    """The window tag goes only on transformers' plain sliding-window causal mask of a batch
    without padding whose queries cover the keys, outside tracing: not with padding, not on
    a chunked, bidirectional or combined mask function, not while compiling."""
    from transformers import masking_utils as mu

    from ge2jit.ops.attention import hf

    gt.register_hf_attention()

    def mask(function=None, **changes):
        args = dict(batch_size=2, q_length=16, kv_length=16, q_offset=0, kv_offset=0,
                    mask_function=function or mu.sliding_window_causal_mask_function(4),
                    attention_mask=None, allow_is_causal_skip=True, local_size=4,
                    dtype=torch.float32, device=torch.device("cpu"))
        args.update(changes)
        return hf._causal_or_sdpa_mask(**args)

    plain = mask()
    assert hf.mask_window(plain) == 4 and plain.shape[-2:] == (16, 16)
    i = torch.arange(16)
    assert torch.equal(plain[0, 0], (i[None] <= i[:, None]) & (i[None] > i[:, None] - 4))
    assert hf.mask_window(mask(local_size=None, mask_function=mu.causal_mask_function)) is None
    padding = torch.ones(2, 16, dtype=torch.bool)
    padding[1, :3] = False
    assert hf.mask_window(mask(attention_mask=padding)) is None
    assert hf.mask_window(mask(allow_is_causal_skip=False)) is None
    assert hf.mask_window(mask(q_length=1, q_offset=15)) is None
    assert hf.mask_window(mask(function=mu.and_masks(
        mu.sliding_window_causal_mask_function(4), mu.causal_mask_function))) is None
    assert hf.mask_window(mask(function=mu.sliding_window_causal_mask_function(5))) is None
    if hasattr(mu, "chunked_causal_mask_function"):
        import inspect

        chunked = mu.chunked_causal_mask_function
        n = len(inspect.signature(chunked).parameters)
        function = chunked(4, torch.zeros(2, dtype=torch.long)) if n == 2 else chunked(4)
        assert hf.mask_window(mask(function=function)) is None
    if hasattr(mu, "sliding_window_bidirectional_mask_function"):
        function = mu.sliding_window_bidirectional_mask_function(4)
        assert hf.mask_window(mask(function=function)) is None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert hf.mask_window(mask()) is None
    assert hf.mask_window(plain[:, :, :, :8]) is None and hf.mask_window(None) is None


def test_a_tagged_mask_with_dropout_goes_to_pytorch_with_the_mask(monkeypatch):
    """Dropout while training: the kernels have none, so PyTorch's SDPA runs with the
    window's mask (not is_causal alone)."""
    from ge2jit.ops.attention import hf

    seen = _mask_calls(monkeypatch)
    q = torch.randn(1, 2, 16, 64, dtype=torch.float64)
    m = torch.ones(1, 1, 16, 16, dtype=torch.bool).tril()
    setattr(m, hf.WINDOW_TAG, 16)
    module = torch.nn.Module()
    module.is_causal = True
    hf.hf_attention_forward(module, q, q, q, m, dropout=0.1)
    assert seen == [("sdpa", (1, 1, 16, 16))]
    seen.clear()
    hf.hf_attention_forward(module, q, q, q, m, dropout=0.0)
    assert seen == [((1, 16, 2, 64), (1, 16, 2, 64), True, None, (15, 0))]


def test_dropout_with_a_window_and_no_mask_goes_to_pytorch_with_the_windows_mask(monkeypatch):
    """No mask (a window while compiling, or one transformers skipped) and dropout: PyTorch's
    SDPA takes the window as a mask (is_causal alone would let a query see every key before
    it), with the values of the window's mask."""
    from ge2jit.ops.attention import hf

    masks = []
    real = hf.scaled_dot_product_attention

    def sdpa(*args, attn_mask=None, is_causal=False, **kwargs):
        masks.append((attn_mask, is_causal))
        return real(*args, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(hf, "scaled_dot_product_attention", sdpa)
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(1)
    got, _ = hf.hf_attention_forward(module, q, k, v, None, dropout=0.25, sliding_window=4)
    (mask, causal), = masks
    i = torch.arange(16)
    assert not causal and torch.equal(mask, (i[None] <= i[:, None]) & (i[None] > i[:, None] - 4))
    torch.manual_seed(1)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.25)
    torch.testing.assert_close(got, want.transpose(1, 2))
    masks.clear()                     # a window as long as the sequence: is_causal
    hf.hf_attention_forward(module, q, k, v, None, dropout=0.25, sliding_window=16)
    assert masks == [(None, True)]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "by-name"])
def test_a_sliding_window_runs_the_kernels_window_while_compiling(direct, references,
                                                                   monkeypatch):
    """Compiled (whole, fullgraph), Mistral's and Qwen2's sliding layers pass no mask for a
    window shorter than the sequence: their modules' window is the kernels', with the
    untouched model's values."""
    seen = _mask_calls(monkeypatch)
    for ours, theirs, windows in _sliding_twins(direct):
        for model in (ours, theirs):
            model.loss_type = "ForCausalLM"
        ids = torch.randint(0, 50, (2, 24))
        torch._dynamo.reset()
        compiled = torch.compile(ours, backend="eager", fullgraph=True)
        with torch.no_grad():
            got = compiled(input_ids=ids, labels=ids).logits
            want = theirs(input_ids=ids, labels=ids).logits
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        assert _windows(references if direct else seen) == windows
        references.clear(), seen.clear()
    torch._dynamo.reset()


VARLEN_KINDS = [("gpt2", {}, None), ("llama", {}, None), ("mistral", {"sliding_window": 8}, 8),
                ("qwen2", {}, None)]


def _padded(n: int = 24):
    """Two rows of ``n`` tokens, the first right-padded by 5, the second left-padded by 3:
    their mask, and the ``cu_seqlens`` and kept tokens' indices the kernels get."""
    mask = torch.ones(2, n, dtype=torch.long)
    mask[0, n - 5:] = 0
    mask[1, :3] = 0
    kept = torch.cat([torch.arange(n - 5), torch.arange(n + 3, 2 * n)])
    return mask, [0, n - 5, 2 * n - 8], kept


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "by-name"])
@pytest.mark.parametrize("kind,extra,window", VARLEN_KINDS, ids=[k[0] for k in VARLEN_KINDS])
def test_a_padded_batch_runs_the_kernels_on_its_sequences(kind, extra, window, direct,
                                                          references, monkeypatch):
    """A batch with padding (right and left): ge2jit's mask function reads it as
    variable-length sequences, and the direct forward (or the attention function by name)
    runs the kernels' variable lengths on the kept tokens, each sequence causal (Mistral's in
    its window of 8 keys); the kept tokens' logits are the untouched model's."""
    from ge2jit.ops.attention import hf

    seen = _mask_calls(monkeypatch)
    ours, theirs = _twins(kind, **extra)
    if not direct:
        for m in ours.modules():
            vars(m).pop("forward", None)
    mask, cu, kept = _padded()
    ids = torch.randint(0, 50, (2, 24))
    real, masks = hf._causal_or_sdpa_mask, []

    def made(*args, **kwargs):
        masks.append(real(*args, **kwargs))
        return masks[-1]

    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register("ge2jit", made)
    try:
        with torch.no_grad():
            got = ours(input_ids=ids, attention_mask=mask).logits
            want = theirs(input_ids=ids, attention_mask=mask).logits
    finally:
        AttentionMaskInterface.register("ge2jit", real)
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-10, atol=1e-10)
    assert seen == [("varlen", cu, None if window is None else (window - 1, 0))] * 2
    assert references == []
    varlen, = [hf.mask_varlen(m) for m in masks if m is not None]
    assert torch.equal(varlen.indices, kept) and varlen.window == window


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "by-name"])
@pytest.mark.parametrize("kind,extra,window", VARLEN_KINDS, ids=[k[0] for k in VARLEN_KINDS])
def test_packed_sequences_run_the_kernels_on_their_sequences(kind, extra, window, direct,
                                                             references, monkeypatch):
    """Packed sequences (position ids that start again within a row, no padding mask, no
    cache: transformers then masks each sequence apart): the kernels on the dense batch with
    each token's sequence bounds (made on the GPU from the sequences' ids, nothing read),
    with the untouched model's logits."""
    seen = _mask_calls(monkeypatch)
    ours, theirs = _twins(kind, **extra)
    if not direct:
        for m in ours.modules():
            vars(m).pop("forward", None)
    ids = torch.randint(0, 50, (2, 24))
    positions = torch.stack([torch.cat([torch.arange(10), torch.arange(14)]),
                             torch.arange(24)])
    with torch.no_grad():
        got = ours(input_ids=ids, position_ids=positions, use_cache=False).logits
        want = theirs(input_ids=ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert seen == [("bounds", [[0, 10], [0]], None if window is None
                     else (window - 1, 0))] * 2
    assert references == []


def test_a_padded_batch_trains_as_the_module(monkeypatch):
    """Gradients through the kernels' variable lengths (references standing in) are the
    module's, the padding's labels ignored."""
    mp = pytest.MonkeyPatch()
    try:
        seen = _mask_calls(mp)
        mp.setattr(hf_attention, "_kernel_input", lambda hidden: hidden.dim() == 3)
        mp.setattr(hf_attention, "_TABLES", (torch.float64,))
        mp.setattr(hf_attention, "rope", _reference_rope)
        ours, theirs = _twins("llama")
        ours.train(), theirs.train()
        mask, cu, _ = _padded(16)
        ids = torch.randint(0, 50, (2, 16))
        labels = ids.masked_fill(mask == 0, -100)
        for model in (ours, theirs):
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        assert seen == [("varlen", cu, None)] * 2
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)
    finally:
        mp.undo()


def test_which_masks_are_read_as_variable_length_sequences(monkeypatch):
    """The tag goes on a square mask with padding whose function is the causal one (padding
    between kept tokens too) or a causal sliding window whose rows' kept tokens are
    contiguous, or packed sequences (each a sequence), outside tracing; not on a window with
    padding between kept tokens, a chunked or combined function, queries that do not cover
    the keys, or while compiling. A row of padding only is an empty sequence."""
    from transformers import masking_utils as mu

    from ge2jit.ops.attention import hf

    gt.register_hf_attention()

    def varlen(padding, function=None, **changes):
        args = dict(batch_size=3, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
                    mask_function=function or mu.causal_mask_function,
                    attention_mask=padding, allow_is_causal_skip=True, local_size=None,
                    dtype=torch.float32, device=torch.device("cpu"))
        args.update(changes)
        return hf.mask_varlen(hf._causal_or_sdpa_mask(**args))

    padding = torch.ones(3, 8, dtype=torch.bool)
    padding[0, 6:] = False
    padding[1, 2:4] = False                  # padding between kept tokens
    padding[2] = False                       # nothing kept
    got = varlen(padding)
    assert got.cu_seqlens.tolist() == [0, 6, 12, 12] and got.max_seqlen == 6
    assert got.indices.tolist() == [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 14, 15]
    assert got.window is None
    window = mu.sliding_window_causal_mask_function(4)
    assert varlen(padding, window, local_size=4) is None      # the window would count holes
    padding[1, 2:4] = True
    got = varlen(padding, window, local_size=4)
    assert got.window == 4 and got.cu_seqlens.tolist() == [0, 6, 14, 14]
    assert varlen(padding, window, local_size=5) is None
    assert varlen(padding, mu.and_masks(window, mu.causal_mask_function), local_size=4) is None
    assert varlen(padding, q_length=1, q_offset=7) is None
    assert varlen(padding[:, :6]) is None
    assert varlen(torch.ones(3, 8, dtype=torch.bool)) is None   # no mask made: is_causal
    packed = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(
        torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]] * 3)))
    got = varlen(None, packed, allow_is_causal_skip=False)
    assert got.bounds.tolist() == [[[0, 2]] * 2 + [[2, 5]] * 3 + [[5, 8]] * 3] * 3
    assert got.cu_seqlens is None and got.indices is None
    one_row = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(
        torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]])))   # ids of one row: every row's
    assert hf._varlen(one_row, None, 8, None, 3).bounds.tolist() == got.bounds.tolist()
    two_rows = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(
        torch.zeros(2, 8, dtype=torch.long)))
    assert hf._varlen(two_rows, None, 8, None, 3) is None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    # (reading the padding while tracing would break the graph and wait for the GPU; packed
    # sequences while tracing: only for the model types whose masks are known)
    assert varlen(padding) is None
    assert varlen(None, packed, allow_is_causal_skip=False) is None


def test_a_batch_of_padding_only_gives_zeros():
    """Nothing kept: zeros of q's shape, no kernel call."""
    from ge2jit.ops.attention import hf

    q = torch.randn(2, 4, 3, 64, dtype=torch.float64)
    none = hf.Varlen(torch.zeros(3, dtype=torch.int32), 0, torch.zeros(0, dtype=torch.long),
                     None)
    out = hf.varlen_attention(q, q, q, none, scale=0.125)
    assert out.shape == (2, 4, 3, 64) and not out.any()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "by-name"])
@pytest.mark.parametrize("kind,extra,window", VARLEN_KINDS, ids=[k[0] for k in VARLEN_KINDS])
def test_packed_sequences_run_the_kernels_while_compiling(kind, extra, window, direct,
                                                          references, monkeypatch):
    """Compiled without a cache, transformers masks every batch for packed sequences (it
    cannot rule them out while tracing): ge2jit's mask function tags the mask with each
    token's sequence bounds, made in the graph from the mask function (no graph break, no
    read on the host), and the kernels run on the dense batch with those bounds (the mask
    is not read); packed rows and plain ones give the untouched model's logits."""
    seen = _mask_calls(monkeypatch)
    ours, theirs = _twins(kind, **extra)
    if not direct:
        for m in ours.modules():
            vars(m).pop("forward", None)
    for model in (ours, theirs):
        model.loss_type = "ForCausalLM"
    ids = torch.randint(0, 50, (2, 24))
    packed = torch.stack([torch.cat([torch.arange(10), torch.arange(14)]), torch.arange(24)])
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="eager")
    for positions, starts in ((packed, [[0, 10], [0]]),
                              (torch.arange(24)[None].expand(2, 24), [[0], [0]])):
        seen.clear()
        with torch.no_grad():
            got = compiled(input_ids=ids, position_ids=positions, use_cache=False).logits
            want = theirs(input_ids=ids, position_ids=positions, use_cache=False).logits
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        assert seen == [("bounds", starts, None if window is None else (window - 1, 0))] * 2
    assert references == []
    torch._dynamo.reset()


def test_while_compiling_a_packed_mask_of_a_known_model_is_tagged_with_its_bounds(monkeypatch):
    """While compiling, the mask function's closures are not read: transformers' packed mask
    of LLaMA, Mistral, Qwen2 or GPT-2 (an ``and_masks`` function, no padding) is tagged with
    each token's sequence bounds (a token starts a sequence where it does not see the one
    before it); not another model type's, not with padding, not another combination, not a
    window other than the model's."""
    from types import SimpleNamespace

    from transformers import masking_utils as mu

    from ge2jit.ops.attention import hf

    gt.register_hf_attention()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    packed = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0] * 8])

    def tagged(function, kind="llama", window=None, **changes):
        args = dict(batch_size=2, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
                    mask_function=function, attention_mask=None, allow_is_causal_skip=False,
                    local_size=window, dtype=torch.float32, device=torch.device("cpu"),
                    config=SimpleNamespace(model_type=kind, sliding_window=window))
        args.update(changes)
        return hf.mask_varlen(hf._causal_or_sdpa_mask(**args))

    bounds = [[[0, 3]] * 3 + [[3, 5]] * 2 + [[5, 8]] * 3, [[0, 8]] * 8]
    function = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(packed))
    for kind in ("llama", "gpt2"):
        got = tagged(function, kind)
        assert got.bounds.tolist() == bounds and got.bounds.dtype == torch.int32
        assert got.window is None and got.indices is None and got.cu_seqlens is None
    sliding = mu.and_masks(mu.sliding_window_causal_mask_function(3),
                           mu.packed_sequence_mask_function(packed))
    got = tagged(sliding, "mistral", 3)
    assert got.bounds.tolist() == bounds and got.window == 3
    assert tagged(sliding, "llama", 3) is None                   # not a windowed model type
    assert tagged(function, "bert") is None
    assert tagged(function, attention_mask=torch.ones(2, 8, dtype=torch.bool)) is None
    assert tagged(mu.or_masks(mu.causal_mask_function,
                              mu.packed_sequence_mask_function(packed))) is None
    assert tagged(function, q_length=1, q_offset=7) is None


def test_sequence_bounds_of_ids_and_of_starts():
    """``sequence_bounds``: runs of equal ids along a row (or the tokens that start one), each
    token's first and one past its last, a row's first token always a start."""
    ids = torch.tensor([[4, 4, 7, 7, 7, 4], [1, 1, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5]])
    want = [[[0, 2]] * 2 + [[2, 5]] * 3 + [[5, 6]], [[0, 6]] * 6,
            [[t, t + 1] for t in range(6)]]
    got = gt.sequence_bounds(ids)
    assert got.dtype == torch.int32 and got.is_contiguous() and got.tolist() == want
    starts = torch.tensor([[False, False, True, False, False, True], [True] + [False] * 5,
                           [True] * 6])
    assert gt.sequence_bounds(starts).tolist() == want
    assert gt.sequence_bounds(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 2)
    compiled = torch.compile(gt.sequence_bounds, backend="eager", fullgraph=True)
    assert compiled(ids).tolist() == want
    with pytest.raises(ValueError, match="^ids: expected a \\(batch, seq\\) tensor, got shape "
                       "\\(6,\\)$"):
        gt.sequence_bounds(ids[0])
    with pytest.raises(TypeError, match="^ids: expected a \\(batch, seq\\) tensor, got list$"):
        gt.sequence_bounds([[0, 1]])


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "by-name"])
def test_sliding_layers_of_packed_sequences_while_compiling(direct, references, monkeypatch):
    """Compiled without a cache, packed rows longer than the window: Mistral's layers and
    Qwen2's sliding one run the kernels with each token's bounds in the window (W - 1, 0),
    Qwen2's full layer with the bounds and no window; the untouched model's logits."""
    seen = _mask_calls(monkeypatch)
    positions = torch.stack([torch.cat([torch.arange(10), torch.arange(14)]), torch.arange(24)])
    for ours, theirs, windows in _sliding_twins(direct):
        for model in (ours, theirs):
            model.loss_type = "ForCausalLM"
        ids = torch.randint(0, 50, (2, 24))
        torch._dynamo.reset()
        compiled = torch.compile(ours, backend="eager")
        seen.clear()
        with torch.no_grad():
            got = compiled(input_ids=ids, position_ids=positions, use_cache=False).logits
            want = theirs(input_ids=ids, position_ids=positions, use_cache=False).logits
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        assert seen == [("bounds", [[0, 10], [0]], w) for w in windows]
        assert references == []
    torch._dynamo.reset()


def test_the_bounds_of_a_packed_mask_trace_whole():
    """transformers' mask function for a packed batch, ge2jit's tagging and the bounds it
    makes, traced with ``fullgraph=True`` (a graph break would raise): the bounds of the
    eager call's sequences."""
    from types import SimpleNamespace

    from transformers import masking_utils as mu

    from ge2jit.ops.attention import hf

    gt.register_hf_attention()
    config = SimpleNamespace(model_type="llama", sliding_window=None)

    def bounds(positions):
        ids = mu.find_packed_sequence_indices(positions)
        function = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids))
        mask = hf._causal_or_sdpa_mask(
            batch_size=2, q_length=8, kv_length=8, q_offset=0, kv_offset=0,
            mask_function=function, attention_mask=None, allow_is_causal_skip=False,
            local_size=None, dtype=torch.float32, device=torch.device("cpu"), config=config)
        return hf.mask_varlen(mask).bounds

    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
    torch._dynamo.reset()
    got = torch.compile(bounds, backend="eager", fullgraph=True)(positions)
    assert got.tolist() == [[[0, 3]] * 3 + [[3, 5]] * 2 + [[5, 8]] * 3, [[0, 8]] * 8]
    torch._dynamo.reset()
