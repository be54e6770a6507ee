"""ge2jit.torch.softmax and ge2jit.torch.cross_entropy against PyTorch's own (forward and
gradients, in float64 on the same values), opcheck of the custom ops, the eager
autograd.Function and the custom op giving the same bits, torch.compile without graph breaks,
CUDA-graph capture, and the one gradient-sized tensor a cross-entropy step allocates."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ..torch_helpers import close as _close  # noqa: E402 - after the skips above
from ..torch_helpers import warm_up_on_a_side_stream  # noqa: E402, I001

F = torch.nn.functional
DTYPES = {"f32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 1e-2),
          "f16": (torch.float16, 2e-3)}
CLASSES = [1, 33, 4097, 32000, 128256]


def _inputs(rows, n, dtype, ignored=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, n, device="cuda", generator=g) * 3).to(dtype)
    targets = torch.randint(0, n, (rows,), device="cuda", generator=g)
    if ignored and rows > 2:
        targets[1] = -100
    return logits, targets


# ---- cross_entropy

@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("n", CLASSES)
@pytest.mark.parametrize("kind", DTYPES)
def test_cross_entropy_matches_pytorch(gt, kind, n, reduction, smoothing):
    dtype, rtol = DTYPES[kind]
    logits, targets = _inputs(37, n, dtype)
    x = logits.clone().requires_grad_(True)
    loss = gt.cross_entropy(x, targets, reduction=reduction, label_smoothing=smoothing)
    assert loss.dtype == torch.float32
    assert type(loss.grad_fn).__name__ == "_CrossEntropyFunctionBackward"
    up = torch.rand_like(loss) + 0.5                   # an upstream gradient other than 1
    loss.backward(up)
    x64 = logits.double().requires_grad_(True)
    ref = F.cross_entropy(x64, targets, reduction=reduction, label_smoothing=smoothing)
    ref.backward(up.double())
    _close(loss.detach(), ref.detach(), 1e-5, "loss")
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    _close(x.grad, x64.grad, rtol, "grad")
    assert torch.equal(logits, x.detach())             # the logits are left alone


def test_cross_entropy_every_row_ignored_and_ignore_index(gt):
    logits, _ = _inputs(6, 1000, torch.float32)
    x = logits.clone().requires_grad_(True)
    targets = torch.full((6,), -100, device="cuda")
    loss = gt.cross_entropy(x, targets)
    ref = F.cross_entropy(logits, targets)
    assert torch.isnan(loss) and torch.isnan(ref)
    loss.backward()
    assert not x.grad.any()
    targets = torch.tensor([3, 7, 7, 0, 999, 7], device="cuda")
    x.grad = None
    loss = gt.cross_entropy(x, targets, ignore_index=7, label_smoothing=0.2)
    loss.backward()
    x64 = logits.double().requires_grad_(True)
    ref = F.cross_entropy(x64, targets, ignore_index=7, label_smoothing=0.2)
    ref.backward()
    _close(loss.detach(), ref.detach(), 1e-5, "loss")
    _close(x.grad, x64.grad, 1e-5, "grad")


def test_cross_entropy_bad_targets(gt):
    import ge2jit

    logits, targets = _inputs(4, 100, torch.float32, ignored=False)
    targets[2] = 100
    with pytest.raises(ge2jit.ArgumentValueError, match="targets: row 2 holds 100"):
        gt.cross_entropy(logits.requires_grad_(True), targets)
    loss = gt.cross_entropy(logits, targets, reduction="none", check_targets=False)
    assert torch.isnan(loss[2]) and torch.isfinite(loss[[0, 1, 3]]).all()


def test_cross_entropy_backward_twice_is_refused_in_eager_mode(gt):
    logits, targets = _inputs(8, 500, torch.float32)
    x = logits.clone().requires_grad_(True)
    loss = gt.cross_entropy(x, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran already"):
        loss.backward()


def test_cross_entropy_opcheck_and_the_same_bits(gt):
    logits, targets = _inputs(16, 3000, torch.float32)
    op = torch.ops.ge2jit.cross_entropy.default
    x = logits.clone().requires_grad_(True)
    for reduction in ("mean", "sum", "none"):
        torch.library.opcheck(op, (x, targets, -100, reduction, 0.1, True, True))
        torch.library.opcheck(op, (x.detach(), targets, -100, reduction, 0.0, False, False))
    # eager (autograd.Function, scaled in place) and the custom op (scaled out of place)
    for reduction in ("mean", "none"):
        a = logits.clone().requires_grad_(True)
        la = gt.cross_entropy(a, targets, reduction=reduction)
        b = logits.clone().requires_grad_(True)
        lb = op(b, targets, -100, reduction, 0.0, True, True)[0]
        assert "ge2jit" in type(lb.grad_fn).__name__ and torch.equal(la, lb)
        up = torch.full_like(la, 2.0)
        la.backward(up)
        lb.backward(up)
        assert torch.equal(a.grad, b.grad)
    with torch.no_grad():                # the loss alone: the same bits as with the gradient
        plain = gt.cross_entropy(logits, targets)
    with_grad = gt.cross_entropy(logits.clone().requires_grad_(True), targets)
    assert torch.equal(plain, with_grad.detach())


def test_cross_entropy_under_torch_compile(gt):
    logits, targets = _inputs(64, 4097, torch.bfloat16)
    w = torch.randn(4097, 4097, device="cuda", dtype=torch.bfloat16) * 0.02

    def step(x, w):
        return gt.cross_entropy(x @ w, targets, label_smoothing=0.1)

    x = logits.clone().requires_grad_(True)
    eager = step(x, w)
    eager.backward()
    gx = x.grad.clone()
    x.grad = None
    compiled = torch.compile(step, fullgraph=True)
    out = compiled(x, w)
    out.backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, gx, rtol=1e-2, atol=1e-4)


def test_cross_entropy_in_a_cuda_graph(gt):
    logits, targets = _inputs(128, 32000, torch.bfloat16)
    x = logits.clone().requires_grad_(True)

    def step():
        x.grad = None
        loss = gt.cross_entropy(x, targets, check_targets=False)
        loss.backward()
        return loss

    warm_up_on_a_side_stream(step)
    eager = step().detach().clone()
    eager_grad = x.grad.clone()
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        static_loss = gt.cross_entropy(x, targets, check_targets=False)
        static_loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_loss, eager) and torch.equal(x.grad, eager_grad)


def test_cross_entropy_step_memory(gt):
    """A forward and backward allocates the gradient once (PyTorch's eager path keeps the
    log-softmax as well)."""
    logits, targets = _inputs(2048, 32000, torch.bfloat16)
    x = logits.clone().requires_grad_(True)
    nbytes = x.numel() * x.element_size()
    gt.cross_entropy(x, targets).backward()             # warm up: kernels loaded
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    gt.cross_entropy(x, targets).backward()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= nbytes * 1.05 + 2**20, (peak, nbytes)


# ---- softmax

@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("kind", DTYPES)
def test_softmax_matches_pytorch(gt, kind, dim):
    dtype, rtol = DTYPES[kind]
    torch.manual_seed(2)
    for shape in [(7, 33), (64, 1000), (5, 20000), (3, 70001)]:
        xs = (torch.randn(*shape, device="cuda") * 3).to(dtype)
        x = xs.clone().requires_grad_(True)
        y = gt.softmax(x, dim)
        assert type(y.grad_fn).__name__ == "_SoftmaxFunctionBackward"
        gy = torch.randn_like(y)
        y.backward(gy)
        x64 = xs.double().requires_grad_(True)
        y64 = torch.softmax(x64, dim)
        y64.backward(gy.double())
        _close(y.detach(), y64.detach(), rtol, "y")
        _close(x.grad, x64.grad, rtol * 10 if dtype != torch.float32 else 1e-5, "dx")
    x = torch.randn(40, 500, device="cuda", requires_grad=True)
    gt.softmax(x).sum().backward()                     # an expanded (stride 0) gradient
    torch.testing.assert_close(x.grad, torch.zeros_like(x), rtol=0, atol=1e-6)


def test_softmax_opcheck_compile_and_the_same_bits(gt):
    x = torch.randn(32, 777, device="cuda", requires_grad=True)
    torch.library.opcheck(torch.ops.ge2jit.softmax.default, (x, -1))
    y = gt.softmax(x.detach(), -1)
    torch.library.opcheck(torch.ops.ge2jit.softmax_backward.default,
                          (torch.randn_like(y), y, -1))
    a = gt.softmax(x, 1)
    b = torch.ops.ge2jit.softmax(x, 1)
    assert torch.equal(a, b)
    gy = torch.randn_like(a)
    ga, = torch.autograd.grad(a, x, gy)
    gb, = torch.autograd.grad(b, x, gy)
    assert torch.equal(ga, gb)

    def f(x):
        return gt.softmax(x * 2, -1).square().sum()

    eager = f(x)
    (g_eager,) = torch.autograd.grad(eager, x)
    compiled = torch.compile(f, fullgraph=True)
    out = compiled(x)
    (g_comp,) = torch.autograd.grad(out, x)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_comp, g_eager, rtol=1e-5, atol=1e-7)
