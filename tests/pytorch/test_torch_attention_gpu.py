"""ge2jit.torch's attention: ``scaled_dot_product_attention`` against PyTorch's (values and
gradients, float64 on the same values), its fallback with a one-time warning for what the
kernels do not do, ``attention`` with packed sequences, opcheck of the custom ops,
torch.compile(fullgraph=True), CUDA-graph capture, and a Hugging Face LLaMA with
``attn_implementation="ge2jit"`` against its own SDPA attention."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

import ge2jit  # noqa: E402 - after the skips above
import ge2jit.torch as gt  # noqa: E402

F = torch.nn.functional


def _qkv(b=2, h=4, h_kv=2, s_q=96, s_k=96, d=64, dtype=torch.bfloat16, grad=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, s_q, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, h_kv, s_k, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, h_kv, s_k, d, device="cuda", dtype=dtype, generator=g)
    return [x.requires_grad_(grad) for x in (q, k, v)]


def _reference(q, k, v, causal=False, scale=None):
    """PyTorch's SDPA in float64 on the same values, with GQA's heads repeated."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(qd, kd.repeat_interleave(group, 1),
                                         vd.repeat_interleave(group, 1), is_causal=causal,
                                         scale=scale)
    return out, (qd, kd, vd)


def _close(got, want, rel):
    err = (got.double() - want).abs().max().item()
    assert err <= rel * max(want.abs().max().item(), 1e-6), (err, want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_values_and_gradients_match_pytorch(dtype, causal, d):
    q, k, v = _qkv(d=d, dtype=dtype)
    out = gt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    ref, leaves = _reference(q, k, v, causal)
    _close(out, ref, 2e-2)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g.double())
    for x, want in zip((q, k, v), leaves):
        _close(x.grad, want.grad, 4e-2)


def test_deterministic_algorithms_give_the_same_gradients_every_run():
    """Under ``torch.use_deterministic_algorithms`` the backward takes its two-kernel form
    (no atomics): dq too is the same bits on every run, and it matches the default's."""
    def grads(seed=0):
        q, k, v = _qkv(s_q=300, s_k=300, d=128, seed=seed)
        out = gt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(torch.randn(out.shape, device="cuda", dtype=out.dtype,
                                 generator=torch.Generator(device="cuda").manual_seed(1)))
        return [x.grad for x in (q, k, v)]

    default = grads()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, again = grads(), grads()
    finally:
        torch.use_deterministic_algorithms(was)
    for a, b, c in zip(first, again, default):
        assert torch.equal(a, b)
        _close(a, c.double(), 1e-2)


def test_what_the_kernels_do_not_do_goes_to_pytorch_with_one_warning():
    q, k, v = _qkv(h_kv=4, grad=False)
    mask = torch.ones(96, 96, dtype=torch.bool, device="cuda").tril()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            out = gt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert [str(w.message) for w in seen if "attn_mask" in str(w.message)][:1] and \
        len([w for w in seen if "attn_mask" in str(w.message)]) == 1
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    q32 = q.float()
    with pytest.warns(UserWarning, match="dtype torch.float32"):
        gt.scaled_dot_product_attention(q32, q32, q32)
    with pytest.warns(UserWarning, match="is_causal with seq_q != seq_k"):
        gt.scaled_dot_product_attention(q, k[:, :, :50], v[:, :, :50], is_causal=True)


def test_packed_sequences_and_their_gradients():
    lengths = [17, 0, 64, 33]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    total = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(total, 4, 64, device="cuda", dtype=torch.float16, generator=g)
               .requires_grad_() for _ in range(3))
    out = gt.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                       max_seqlen_q=64, max_seqlen_k=64)
    out.backward(torch.ones_like(out))
    for start, n in zip(cu.tolist(), lengths):
        if not n:
            continue
        sl = slice(start, start + n)
        qs, ks, vs = (x.detach()[sl].transpose(0, 1)[None] for x in (q, k, v))
        ref, leaves = _reference(qs, ks, vs, causal=True)
        _close(out[sl].transpose(0, 1)[None], ref, 2e-2)
        ref.backward(torch.ones_like(ref))
        _close(q.grad[sl].transpose(0, 1)[None], leaves[0].grad, 4e-2)
        _close(v.grad[sl].transpose(0, 1)[None], leaves[2].grad, 4e-2)


def test_opcheck():
    q, k, v = _qkv(b=1, s_q=40, s_k=40, grad=True)
    args = (q, k, v, None, None, None, 0, 0, True, 0.125, -1, -1, 0.0, True)
    torch.library.opcheck(torch.ops.ge2jit.attention.default, args)
    o, lse = torch.ops.ge2jit.attention(*args)
    do = torch.randn_like(o)
    torch.library.opcheck(torch.ops.ge2jit.attention_backward.default,
                          (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, None, None,
                           None, 0, 0, True, 0.125, -1, -1, 0.0, True))


def _kernels(fn) -> list[str]:
    """The names of the CUDA kernels ``fn()`` launches (after a first call that compiles)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_call_that_records_no_gradient_runs_the_kernel_without_lse(compiled):
    """Only the backward reads the log-sum-exp: under no_grad, inference_mode or on tensors
    that need no gradient, the forward kernel that writes none runs (the op
    ``attention_inference`` when compiled), with the bits of the training call's output."""
    q, k, v = _qkv(s_q=256, s_k=256)

    def f(q, k, v):
        return gt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    fn = torch.compile(f, fullgraph=True) if compiled else f
    trained = fn(q, k, v)
    assert trained.requires_grad
    names = _kernels(lambda: fn(q, k, v))
    assert any(n.startswith("attn_fwd") and n.endswith("_lse") for n in names), names
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            out = fn(q, k, v)
            names = _kernels(lambda: fn(q, k, v))
        assert not out.requires_grad and torch.equal(out, trained.detach())
        forward = [n for n in names if n.startswith("attn_fwd")]
        assert len(forward) == 1 and not forward[0].endswith("_lse"), names
    detached = [x.detach() for x in (q, k, v)]
    assert torch.equal(fn(*detached), trained.detach())
    o, lse = gt.attention(*(x.detach().transpose(1, 2) for x in (q, k, v)), causal=True,
                          return_lse=True)   # asked for: written, also without a gradient
    assert lse.shape == (2, 4, 256) and torch.isfinite(lse).all()
    torch.library.opcheck(torch.ops.ge2jit.attention_inference.default,
                          (*detached, None, None, None, 0, 0, True, 0.125, -1, -1, 0.0, True))


def test_compiled_without_graph_breaks_matches_eager():
    q, k, v = _qkv()

    def f(q, k, v):
        return gt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    g = torch.randn(2, 4, 96, 64, device="cuda", dtype=torch.bfloat16)
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        out = fn(q, k, v)
        out.backward(g)
        results.append([out.detach(), *(x.grad for x in (q, k, v))])
        for x in (q, k, v):
            x.grad = None
    for eager, compiled in zip(*results):   # the same kernels: the same bits
        assert torch.equal(eager, compiled)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_inside_autocast_float32_inputs_take_the_kernels_as_pytorchs_would(compiled):
    """PyTorch's SDPA casts float32 inputs to the autocast type: so does ge2jit's, which
    then runs its own kernels (the bits of a call on bfloat16 inputs, not the fallback's),
    eagerly and compiled, the leaves' float32 gradients matching PyTorch's under the same
    autocast."""
    q, k, v = _qkv(dtype=torch.float32)
    results = []
    for sdpa in (gt.scaled_dot_product_attention, F.scaled_dot_product_attention):
        def f(q, k, v, sdpa=sdpa):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return sdpa(q, k, v, is_causal=True, enable_gqa=True)

        fn = torch.compile(f, fullgraph=True) if compiled else f
        out = fn(q, k, v)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
        results.append([out.detach().double(), *(x.grad.double() for x in (q, k, v))])
        for x in (q, k, v):
            assert x.grad.dtype == torch.float32
            x.grad = None
    ours, theirs = results
    for got, want in zip(ours, theirs):
        _close(got, want, 2e-2)
    with torch.no_grad():
        direct = gt.scaled_dot_product_attention(*(x.to(torch.bfloat16) for x in (q, k, v)),
                                                 is_causal=True, enable_gqa=True)
    assert torch.equal(ours[0], direct.double())   # ge2jit's kernels ran


def _segment_reference(q, k, v, ids):
    """(B, H, S, D) causal attention within each row's runs of equal ``ids``, float64."""
    mask = (ids[:, :, None] == ids[:, None, :]) & torch.ones(
        ids.shape[1], ids.shape[1], dtype=torch.bool, device=ids.device).tril()
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1),
        attn_mask=mask[:, None])


def test_opcheck_with_sequence_bounds():
    q, k, v = _qkv(b=2, s_q=40, s_k=40, grad=True)
    ids = torch.tensor([[0] * 7 + [1] * 20 + [2] * 13, [3] * 40], device="cuda")
    bounds = gt.sequence_bounds(ids)
    args = (q, k, v, None, None, bounds, 0, 0, True, 0.125, -1, -1, 0.0, True)
    torch.library.opcheck(torch.ops.ge2jit.attention.default, args)
    o, lse = torch.ops.ge2jit.attention(*args)
    _close(o, _segment_reference(q.detach(), k.detach(), v.detach(), ids), 2e-2)
    torch.library.opcheck(torch.ops.ge2jit.attention_backward.default,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(),
                           lse, None, None, bounds, 0, 0, True, 0.125, -1, -1, 0.0, True))
    torch.library.opcheck(torch.ops.ge2jit.attention_inference.default,
                          (q.detach(), k.detach(), v.detach(), *args[3:]))


def test_capture_and_replay_with_sequence_bounds():
    """The bounds made inside the captured graph from the ids: a replay on new ids and new
    values attends within the new sequences."""
    q, k, v = _qkv(grad=False)
    ids = torch.zeros(2, 96, dtype=torch.long, device="cuda")

    def step():
        return gt.attention(q, k, v, causal=True, layout="bhsd",
                            seq_bounds=gt.sequence_bounds(ids))

    step()   # prepared
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for x, y in zip((q, k, v), _qkv(grad=False, seed=7)):
        x.copy_(y)
    ids.copy_(torch.tensor([[0] * 30 + [1] * 66, [0] * 5 + [1] * 5 + [2] * 86], device="cuda"))
    graph.replay()
    _close(out, _segment_reference(q, k, v, ids), 2e-2)


def test_capture_and_replay():
    q, k, v = _qkv(grad=False)
    gt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)   # prepared
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    q2, k2, v2 = _qkv(grad=False, seed=5)
    for x, y in ((q, q2), (k, k2), (v, v2)):
        x.copy_(y)
    graph.replay()
    ref, _ = _reference(q, k, v, causal=True)
    _close(out, ref, 2e-2)


def test_a_hugging_face_llama_with_attn_implementation_ge2jit():
    transformers = pytest.importorskip("transformers")
    assert gt.register_hf_attention() == "ge2jit"
    config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1024,
                                      num_attention_heads=8, num_key_value_heads=2,
                                      num_hidden_layers=2, vocab_size=1000,
                                      max_position_embeddings=256)
    ids = torch.randint(0, 1000, (2, 128), device="cuda")

    def run(implementation):
        torch.manual_seed(0)
        config._attn_implementation = implementation
        model = transformers.LlamaForCausalLM(config).cuda().to(torch.bfloat16)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), model.model.layers[0].self_attn.q_proj.weight.grad

    calls = []
    real = gt.hf_attention_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    transformers.AttentionInterface.register("ge2jit-counted", counted)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionMaskInterface.register("ge2jit-counted", sdpa_mask)
    except ImportError:
        pass
    theirs = run("sdpa")
    ours = run("ge2jit-counted")
    assert calls, "the registered attention never ran"
    assert abs(ours[0].item() - theirs[0].item()) < 2e-2 * abs(theirs[0].item())
    _close(ours[1], theirs[1].double(), 0.1)
    assert ge2jit.attention is not None
