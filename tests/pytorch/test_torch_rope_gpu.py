"""ge2jit.torch.rope and apply_rotary_pos_emb against PyTorch written out (values and
gradients, float64 on the same values), Hugging Face's LLaMA function where transformers is
installed, opcheck of the custom ops, torch.compile(fullgraph=True), and CUDA-graph
capture."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

import ge2jit  # noqa: E402 - after the skips above
import ge2jit.torch as gt  # noqa: E402


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _reference(q, k, cos, sin, interleaved=False):
    """q, k (batch, seq, heads, d); cos, sin (seq, half): float64 rotation."""
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]

    def one(x):
        x = x.double()
        half = c.shape[-1]
        if interleaved:
            x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
            out = x.clone()
            out[..., 0:2 * half:2] = x1 * c - x2 * s
            out[..., 1:2 * half:2] = x2 * c + x1 * s
            return out
        cc, ss = torch.cat((c, c), -1), torch.cat((s, s), -1)
        rot = x[..., :2 * half]
        return torch.cat((rot * cc + _rotate_half(rot) * ss, x[..., 2 * half:]), -1)

    return one(q), one(k)


def _inputs(dtype=torch.bfloat16, b=2, s=16, hq=4, hk=2, d=64, half=32, grad=True):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", generator=g).to(dtype).requires_grad_(grad)
    k = torch.randn(b, s, hk, d, device="cuda", generator=g).to(dtype).requires_grad_(grad)
    ang = torch.rand(s, half, device="cuda", generator=g) * 6.28
    return q, k, ang.cos().to(dtype), ang.sin().to(dtype)


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("half", [32, 24])
def test_values_and_gradients_match_pytorch(dtype, interleaved, half):
    q, k, cos, sin = _inputs(dtype, half=half)
    qo, ko = gt.rope(q, k, cos, sin, interleaved=interleaved)
    rq, rk = _reference(q, k, cos, sin, interleaved)
    tol = TOL[dtype]
    assert torch.allclose(qo.double(), rq, atol=tol * 4, rtol=tol)
    assert torch.allclose(ko.double(), rk, atol=tol * 4, rtol=tol)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = _reference(qd, kd, cos, sin, interleaved)
    rdq, rdk = torch.autograd.grad((rq, rk), (qd, kd), (gq.double(), gk.double()))
    assert torch.allclose(dq.double(), rdq, atol=tol * 4, rtol=tol)
    assert torch.allclose(dk.double(), rdk, atol=tol * 4, rtol=tol)
    assert type(qo.grad_fn).__name__ == "_RopeFunctionBackward"


def test_gradcheck_and_opcheck():
    q, k, cos, sin = _inputs(torch.float32, s=5, hq=2, hk=1, d=8, half=4)
    # the op computes in float32: gradcheck in float32 with loose tolerances
    assert torch.autograd.gradcheck(lambda a, b: gt.rope(a, b, cos, sin),
                                    (q.detach().requires_grad_(), k.detach().requires_grad_()),
                                    eps=1e-2, atol=1e-2, rtol=1e-2)
    torch.library.opcheck(torch.ops.ge2jit.rope.default, (q, k, cos, sin, False, None))
    torch.library.opcheck(torch.ops.ge2jit.rope.default, (q, None, cos, sin, True, None))
    pos = torch.tensor([4, 3, 2, 1, 0], device="cuda")
    torch.library.opcheck(torch.ops.ge2jit.rope_backward.default,
                          (q.detach(), k.detach(), cos, sin, False, pos))


def test_compiled_without_graph_breaks_matches_eager():
    q, k, cos, sin = _inputs()

    def f(q, k):
        qo, ko = gt.rope(q, k, cos, sin)
        return (qo.float() ** 2).sum() + (ko.float() ** 2).sum()

    compiled = torch.compile(f, fullgraph=True)
    loss = compiled(q, k)
    dq, dk = torch.autograd.grad(loss, (q, k))
    loss_e = f(q, k)
    eq, ek = torch.autograd.grad(loss_e, (q, k))
    assert torch.allclose(loss, loss_e, rtol=1e-3)
    assert torch.allclose(dq.float(), eq.float(), atol=5e-2, rtol=2e-2)
    assert torch.allclose(dk.float(), ek.float(), atol=5e-2, rtol=2e-2)


def test_hugging_face_llama_function():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    b, h, kv, s, d = 2, 4, 2, 16, 64
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    freqs = torch.arange(s, device="cuda").float()[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)[None].expand(b, -1, -1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    ours = gt.apply_rotary_pos_emb(q, k, cos, sin)
    theirs = llama.apply_rotary_pos_emb(q, k, cos, sin)
    for a, r in zip(ours, theirs):
        assert a.shape == r.shape and a.is_contiguous()
        assert torch.allclose(a.float(), r.float(), atol=3e-2, rtol=2e-2)
    g = [torch.randn_like(x) for x in theirs]
    ga = torch.autograd.grad(ours, (q, k), g)
    gr = torch.autograd.grad(theirs, (q, k), g)
    for a, r in zip(ga, gr):
        assert torch.allclose(a.float(), r.float(), atol=3e-2, rtol=2e-2)


def test_capture_and_replay():
    q, k, cos, sin = _inputs(grad=False)
    gt.rope(q, k, cos, sin)   # compiled and prepared before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qo, ko = gt.rope(q, k, cos, sin)
    q2, k2, _, _ = _inputs(grad=False, s=16)
    q.copy_(q2 * 0.5)
    k.copy_(k2 * 0.5)
    graph.replay()
    rq, rk = _reference(q, k, cos, sin)
    assert torch.allclose(qo.double(), rq, atol=8e-2, rtol=2e-2)
    assert torch.allclose(ko.double(), rk, atol=8e-2, rtol=2e-2)


def test_tables_that_need_a_gradient_are_refused():
    q, k, cos, sin = _inputs()
    with pytest.raises(ge2jit.ArgumentValueError, match="cos, sin: expected tables "
                       "without gradient"):
        gt.rope(q, k, cos.requires_grad_(), sin)



def test_a_hugging_face_llama_runs_on_it(monkeypatch):
    """A small LlamaModel's loss and gradients with its rotary embedding replaced by ge2jit's
    (the module function its attention calls) match the model's own."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=2, vocab_size=1000,
                                      max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).cuda().to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 96), device="cuda")

    def run():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()

    theirs = run()
    calls = []

    def ours(*args, **kwargs):
        calls.append(1)
        return gt.apply_rotary_pos_emb(*args, **kwargs)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", ours)
    mine = run()
    assert len(calls) == config.num_hidden_layers
    assert torch.allclose(mine[0], theirs[0], rtol=1e-2)
    assert torch.allclose(mine[1].float(), theirs[1].float(), atol=2e-2, rtol=5e-2)
