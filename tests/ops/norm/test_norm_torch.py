"""ge2jit.torch's RMSNorm and LayerNorm (custom ops, autograd, modules) on the GPU: outputs
and gradients of x, the weight, the bias and the residual against PyTorch's
``torch.nn.functional.rms_norm`` / ``layer_norm`` computed in float64 on the same values;
opcheck of each custom op; the eager autograd.Function and the custom ops giving the same
bits; torch.compile(fullgraph=True); CUDA-graph capture of a training step; the modules
against ``nn.RMSNorm`` / ``nn.LayerNorm`` (parameters, state dicts, gradients). Skipped
without PyTorch or a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ...torch_helpers import close as _close  # noqa: E402 - after the skips above

F = torch.nn.functional

#: relative tolerance (of the largest reference value) of outputs and gradients
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
EPS = {"rms": 1e-6, "layer": 1e-5}


def _reference(kind, x, weight, bias, residual, eps):
    """y (and h) by PyTorch's own functional ops in float64."""
    h = x if residual is None else x + residual
    n = (x.shape[-1],)
    if kind == "rms":
        return F.rms_norm(h, n, weight, eps=eps), h
    return F.layer_norm(h, n, weight, bias, eps=eps), h


def _leaf(t, dtype):
    return None if t is None else t.to(dtype).detach().requires_grad_()


@pytest.mark.parametrize("shape", [(3, 33), (2, 5, 1000), (4, 4097), (2, 20000)])
@pytest.mark.parametrize("residual", [None, "same", "float32"])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_outputs_and_gradients_match_torch(gt, kind, dtype, affine, residual, shape):
    torch.manual_seed(1)
    n = shape[-1]
    x = _leaf(torch.randn(shape, device="cuda") * 2 + 0.5, dtype)
    w = _leaf(torch.randn(n, device="cuda"), dtype) if affine else None
    b = _leaf(torch.randn(n, device="cuda"), dtype) if affine and kind == "layer" else None
    r_dtype = {None: None, "same": dtype, "float32": torch.float32}[residual]
    r = _leaf(torch.randn(shape, device="cuda"), r_dtype) if residual else None
    fn = gt.rms_norm if kind == "rms" else gt.layer_norm
    args = (x, w) if kind == "rms" else (x, w, b)
    out = fn(*args, eps=EPS[kind], residual=r)
    y, h = out if r is not None else (out, None)
    assert y.dtype == dtype and y.shape == x.shape
    if r is not None:
        assert h.dtype == r_dtype
    gy = torch.randn_like(y)
    gh = torch.randn_like(h) if h is not None else None
    loss = (y.float() * gy.float()).sum() + (0 if h is None else (h.float() * gh.float()).sum())
    loss.backward()
    leaves = [t for t in (x, w, b, r) if t is not None]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(leaves64)
    x64, w64 = next(it), next(it) if w is not None else None
    b64 = next(it) if b is not None else None
    r64 = next(it) if r is not None else None
    y64, h64 = _reference(kind, x64, w64, b64, r64, EPS[kind])
    loss64 = (y64 * gy.double()).sum() + (0 if h is None else (h64 * gh.double()).sum())
    loss64.backward()
    tol = TOL[dtype]
    _close(y, y64, tol, "y")
    if h is not None:
        _close(h, h64, TOL[r_dtype], "h")
    for name, t, t64 in zip(("x", "weight", "bias", "residual"),
                            [x, w, b, r], [x64, w64, b64, r64]):
        if t is None:
            continue
        assert t.grad is not None and t.grad.dtype == t.dtype, name
        _close(t.grad, t64.grad, tol * 2, f"grad of {name}")


def test_gradient_through_h_alone(gt):
    """Only h is used downstream: its gradient reaches x and the residual unchanged."""
    x = torch.randn(8, 256, device="cuda", requires_grad=True)
    r = torch.randn(8, 256, device="cuda", requires_grad=True)
    _, h = gt.rms_norm(x, None, residual=r)
    g = torch.randn_like(h)
    h.backward(g)
    assert torch.equal(x.grad, g) and torch.equal(r.grad, g)


def test_opcheck_each_custom_op(gt):
    torch.manual_seed(3)
    ops = torch.ops.ge2jit
    x = torch.randn(16, 300, device="cuda", requires_grad=True)
    r = torch.randn(16, 300, device="cuda", requires_grad=True)
    w = torch.randn(300, device="cuda", requires_grad=True)
    b = torch.randn(300, device="cuda", requires_grad=True)
    torch.library.opcheck(ops.rms_norm.default, (x, w, r, 1e-6))
    torch.library.opcheck(ops.rms_norm.default, (x, None, None, 1e-6))
    torch.library.opcheck(ops.layer_norm.default, (x, w, b, r, 1e-5))
    torch.library.opcheck(ops.layer_norm.default, (x.to(torch.bfloat16), w, None, None, 1e-5))
    dy = torch.randn(16, 300, device="cuda")
    h = x.detach() + r.detach()
    y, _, rstd = ops.rms_norm(h, w.detach(), None, 1e-6)
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, h, w.detach(), rstd, dy))
    torch.library.opcheck(ops.rms_norm_backward.default, (dy, h, None, rstd, None))
    _, _, mean, rstd = ops.layer_norm(h, w.detach(), b.detach(), None, 1e-5)
    torch.library.opcheck(ops.layer_norm_backward.default,
                          (dy, h, w.detach(), b.detach(), mean, rstd, None))
    torch.library.opcheck(ops.layer_norm_backward.default,
                          (dy, h, None, None, mean, rstd, dy))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_functions_and_the_custom_ops_give_the_same_bits(gt, dtype):
    """Eager calls run the implementations through torch.autograd.Function classes; the
    custom ops run the same implementations: outputs and gradients equal bit for bit."""
    torch.manual_seed(6)
    x = torch.randn(96, 640, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(96, 640, device="cuda", dtype=torch.float32, requires_grad=True)
    w = torch.randn(640, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(640, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(96, 640, device="cuda", dtype=dtype)
    gh = torch.randn(96, 640, device="cuda", dtype=torch.float32)
    leaves = (x, r, w, b)

    def grads_of(y, h):
        for t in leaves:
            t.grad = None
        torch.autograd.backward([y, h], [gy, gh])
        return [None if t.grad is None else t.grad.clone() for t in leaves]

    y, h = gt.layer_norm(x, w, b, residual=r)
    assert type(y.grad_fn).__name__ == "_LayerNormFunctionBackward"
    eager = grads_of(y, h)
    y_op, h_op, _, _ = torch.ops.ge2jit.layer_norm(x, w, b, r, 1e-5)
    assert "ge2jit" in type(y_op.grad_fn).__name__
    assert torch.equal(y, y_op) and torch.equal(h, h_op)
    for g, g_op in zip(eager, grads_of(y_op, h_op)):
        assert torch.equal(g, g_op)
    y, h = gt.rms_norm(x, w, residual=r)
    assert type(y.grad_fn).__name__ == "_RMSNormFunctionBackward"
    eager = grads_of(y, h)
    y_op, h_op, _ = torch.ops.ge2jit.rms_norm(x, w, r, 1e-6)
    assert torch.equal(y, y_op)
    for g, g_op in zip(eager[:3], grads_of(y_op, h_op)[:3]):
        assert torch.equal(g, g_op)
    with torch.no_grad():
        assert torch.equal(gt.rms_norm(x, w, residual=r)[0], y)


def test_modules_match_pytorchs(gt):
    torch.manual_seed(8)
    x = torch.randn(4, 7, 512, device="cuda", requires_grad=True)
    for ours, theirs in ((gt.RMSNorm(512, eps=1e-6, device="cuda"),
                          torch.nn.RMSNorm(512, eps=1e-6, device="cuda")),
                         (gt.LayerNorm(512, device="cuda"), torch.nn.LayerNorm(512, device="cuda")),
                         (gt.LayerNorm(512, bias=False, device="cuda"),
                          torch.nn.LayerNorm(512, bias=False, device="cuda")),
                         (gt.LayerNorm(512, elementwise_affine=False, device="cuda"),
                          torch.nn.LayerNorm(512, elementwise_affine=False, device="cuda"))):
        assert set(ours.state_dict()) == set(theirs.state_dict())
        with torch.no_grad():
            for p in theirs.parameters():
                p.uniform_(-2, 2)
        ours.load_state_dict(theirs.state_dict())
        theirs.load_state_dict(ours.state_dict())
        y, ref = ours(x), theirs(x)
        _close(y, ref, 2e-5, type(ours).__name__)
        g = torch.randn_like(y)
        grads = torch.autograd.grad(y, [x, *ours.parameters()], g)
        ref_grads = torch.autograd.grad(ref, [x, *theirs.parameters()], g)
        for a, c in zip(grads, ref_grads):
            _close(a, c, 5e-5, f"{type(ours).__name__} gradient")
    norm = gt.RMSNorm(512, device="cuda", dtype=torch.bfloat16)
    assert norm.weight.dtype == torch.bfloat16 and (norm.weight == 1).all()
    y, h = norm(x.detach().to(torch.bfloat16), torch.randn(4, 7, 512, device="cuda"))
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
    with pytest.raises(ValueError, match="input: expected a last dimension of 512"):
        norm(torch.randn(3, 500, device="cuda"))


def test_torch_compile_fullgraph_same_results(gt):
    torch.manual_seed(4)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = gt.RMSNorm(256, device="cuda"), gt.LayerNorm(256, device="cuda")
            self.fc = torch.nn.Linear(256, 256, device="cuda")

        def forward(self, x, r):
            y, h = self.n1(x, r)
            y, h = self.n2(self.fc(y), h)
            return y + h

    model = Block()
    x = torch.randn(32, 256, device="cuda", requires_grad=True)
    r = torch.randn(32, 256, device="cuda", requires_grad=True)
    eager = model(x, r)
    eager.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone(), r.grad.clone()]
    model.zero_grad()
    x.grad = r.grad = None
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, r)
    out.sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for g, t in zip(grads, [*model.parameters(), x, r]):
        torch.testing.assert_close(t.grad, g, rtol=1e-5, atol=1e-5)


def test_cuda_graph_capture_of_a_training_step(gt):
    torch.manual_seed(5)
    norm = gt.LayerNorm(1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(512, 1024, device="cuda", requires_grad=True)
    gy = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)

    def step():
        for t in (x, r, *norm.parameters()):
            t.grad = None
        y, h = norm(x, r)
        torch.autograd.backward([y, h], [gy, torch.ones_like(h)])
        return y

    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):     # warm-up on a side stream, as advised
        [step() for _ in range(3)]
    torch.cuda.synchronize()
    eager_y = step().detach().clone()
    eager_g = [t.grad.clone() for t in (x, r, *norm.parameters())]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, eager_y)     # deterministic: the same bits
    for t, g in zip((x, r, *norm.parameters()), eager_g):
        assert torch.equal(t.grad, g)
