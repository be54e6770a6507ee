"""ge2jit.torch.linear_cross_entropy against PyTorch's ``F.cross_entropy(F.linear(x, w))``:
loss and gradients in float64 on the same values (ge2jit's error at most 1.5 times PyTorch's
own 16-bit error plus a unit of bfloat16), every reduction (the per-row losses with an
upstream gradient per row), ignored rows and label smoothing, (B, S, d) inputs, float32
master weights of bfloat16 inputs, opcheck, torch.compile without a graph break, and the
memory a 128k-vocabulary head's step takes against PyTorch's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ..torch_helpers import warm_up_on_a_side_stream  # noqa: E402 - after the skips above

F = torch.nn.functional


def _inputs(shape, d, classes, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(*shape, d, device="cuda", generator=g) / d ** 0.5 * 4).to(dtype)
    w = torch.randn(classes, d, device="cuda", generator=g).to(dtype)
    t = torch.randint(0, classes, shape, device="cuda", generator=g)
    t.view(-1)[::7] = -100
    return x, w, t


def _run(fn, x, w, t, up, **kw):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    loss = fn(x, w, t, **kw)
    loss.backward(up)
    return [loss.detach().double(), x.grad.double(), w.grad.double()]


def _torch(x, w, t, **kw):
    return F.cross_entropy(F.linear(x, w).flatten(0, -2).float(), t.flatten(), **kw)


def _errors(got, want):
    return [((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
            for g, r in zip(got, want)]


@pytest.mark.parametrize("chunk", [None, 96])
@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.1), ("none", 0.0)])
def test_matches_pytorch(gt, reduction, smoothing, chunk):
    x, w, t = _inputs((3, 100), 64, 3001)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    up = torch.rand(300 if reduction == "none" else (), device="cuda") + 0.5
    want = _run(_torch, x.double(), w.double(), t, up.double(), **kw)
    theirs = _errors(_run(_torch, x, w, t, up, **kw), want)
    got = _run(gt.linear_cross_entropy, x, w, t, up, chunk_rows=chunk, **kw)
    ours = _errors(got, want)
    for o, p in zip(ours, theirs):
        assert o <= 1.5 * p + 2 ** -8, (ours, theirs)


def test_master_weights_get_float32_gradients(gt):
    x, w, t = _inputs((256,), 128, 1000)
    w32 = w.float().requires_grad_()
    loss = gt.linear_cross_entropy(x, w32, t)
    loss.backward()
    assert w32.grad.dtype == torch.float32
    want = _run(_torch, x.double(), w.double(), t, torch.ones((), device="cuda",
                                                              dtype=torch.float64))
    assert _errors([w32.grad.double()], want[2:])[0] < 2 ** -6


def test_opcheck_and_compile_without_a_break(gt):
    x, w, t = _inputs((200,), 64, 515)
    op = torch.ops.ge2jit.linear_cross_entropy.default
    for reduction in ("mean", "none"):
        torch.library.opcheck(op, (x.requires_grad_(), w.requires_grad_(), t, -100, reduction,
                                   0.0, True, True, 64),
                              test_utils=("test_schema", "test_faketensor",
                                          "test_autograd_registration"))
    torch._dynamo.reset()

    def head(x, w, t):
        return gt.linear_cross_entropy(x, w, t, check_targets=False)

    compiled = torch.compile(head, fullgraph=True)
    up = torch.ones((), device="cuda")
    got = _run(compiled, x, w, t, up)
    eager = _run(head, x, w, t, up)
    for g, e in zip(got, eager):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_a_128k_head_takes_less_than_half_the_memory_of_pytorchs(gt):
    tokens, d, classes = 4096, 1024, 128256
    x, w, t = _inputs((tokens,), d, classes)

    def peak(fn):
        xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(xs, ws, t).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    theirs = peak(_torch)
    ours = peak(gt.linear_cross_entropy)
    logits = tokens * classes * 2
    assert ours < 0.5 * theirs, (ours / 2**20, theirs / 2**20)
    assert ours < 1.5 * logits, (ours / 2**20, logits / 2**20)


@pytest.mark.parametrize("chunk", [None, 64])
def test_captured_as_a_cuda_graph(gt, chunk):
    """Forward and backward in a ``torch.cuda.graph`` capture (over several chunks too: the
    count and the factor are PyTorch's own arithmetic, in its allocator), replayed on new
    values: the eager step's results."""
    x, w, t = _inputs((200,), 64, 515)
    xs, ws = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()

    def step():
        xs.grad = ws.grad = None
        loss = gt.linear_cross_entropy(xs, ws, t, chunk_rows=chunk, check_targets=False)
        loss.backward()
        return loss

    warm_up_on_a_side_stream(step, times=2)
    graph = torch.cuda.CUDAGraph()
    xs.grad = ws.grad = None
    with torch.cuda.graph(graph):
        loss = gt.linear_cross_entropy(xs, ws, t, chunk_rows=chunk, check_targets=False)
        loss.backward()
    x2, w2, t2 = _inputs((200,), 64, 515, seed=5)
    with torch.no_grad():
        xs.copy_(x2)
        ws.copy_(w2)
        t.copy_(t2)
    graph.replay()
    want = _run(lambda a, b, c: gt.linear_cross_entropy(a, b, c, chunk_rows=chunk), x2, w2,
                t2, torch.ones((), device="cuda"))
    got = [loss.detach().double(), xs.grad.double(), ws.grad.double()]
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
