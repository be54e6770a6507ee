"""ge2jit.torch: the custom ops and layers against PyTorch's nn.Linear + activation + autograd
(in float64 on the same values), opcheck, torch.compile without graph breaks, CUDA-graph
capture, autocast."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ..torch_helpers import close as _close  # noqa: E402 - after the skips above
from ..torch_helpers import warm_up_on_a_side_stream  # noqa: E402, I001

ACTS = ("none", "relu", "leaky_relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu")
F = torch.nn.functional
_REF = {"none": lambda z: z, "relu": F.relu, "leaky_relu": lambda z: F.leaky_relu(z, 0.2),
        "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
        "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu}
# (dtype, precision, relative tolerance of outputs and gradients)
KINDS = {"f32": (torch.float32, "highest", 2e-5), "f32-high": (torch.float32, "high", 2e-5),
         "f32-medium": (torch.float32, "medium", 5e-3), "bf16": (torch.bfloat16, None, 3e-2),
         "f16": (torch.float16, None, 5e-3)}


def _reference_grads(x, params, fn, gy):
    """fn's output and the gradients of x and params, in float64 on the same values."""
    x64 = x.detach().double().requires_grad_(True)
    p64 = [None if p is None else p.detach().double().requires_grad_(True) for p in params]
    y = fn(x64, p64)
    y.backward(gy.double())
    return y.detach(), x64.grad, [None if p is None else p.grad for p in p64]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", KINDS)
def test_linear_matches_nn_linear(gt, matmul_precision, kind, act, bias):
    dtype, precision, rtol = KINDS[kind]
    if precision:
        matmul_precision(precision)
    torch.manual_seed(0)
    layer = gt.Linear(96, 72, bias, act, leaky_slope=0.2, device="cuda", dtype=dtype)
    x = torch.randn(3, 40, 96, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(3, 40, 72, device="cuda", dtype=dtype)
    y = layer(x)
    y.backward(gy)
    assert y.dtype == dtype and y.shape == (3, 40, 72)

    def ref(x64, p):
        return _REF[act](F.linear(x64, p[0], p[1]))

    y64, gx64, (gw64, gb64) = _reference_grads(x, [layer.weight, layer.bias], ref, gy)
    _close(y, y64, rtol, "y")
    _close(x.grad, gx64, rtol, "dx")
    _close(layer.weight.grad, gw64, rtol, "dW")
    assert layer.weight.grad.is_contiguous()   # the parameter's layout (out, in)
    if bias:
        _close(layer.bias.grad, gb64, rtol, "db")


@pytest.mark.parametrize("acts", [("gelu_tanh", "none"), ("relu", "silu", "none"),
                                  ("gelu", "tanh", "sigmoid")])
@pytest.mark.parametrize("kind", ["f32", "f32-high", "bf16"])
def test_mlp_chained_backward_matches_autograd(gt, matmul_precision, kind, acts):
    dtype, precision, rtol = KINDS[kind]
    if precision:
        matmul_precision(precision)
    torch.manual_seed(1)
    sizes = [64, 192, 128, 80][:len(acts) + 1]
    block = gt.MLP(sizes, act=acts[0], device="cuda", dtype=dtype)
    block.acts = list(acts)   # a different act per layer
    x = torch.randn(200, sizes[0], device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(200, sizes[-1], device="cuda", dtype=dtype)
    y = block(x)
    y.backward(gy)
    params = [p for m in block.layers for p in (m.weight, m.bias)]

    def ref(x64, p):
        h = x64
        for i, act in enumerate(acts):
            h = _REF[act](F.linear(h, p[2 * i], p[2 * i + 1]))
        return h

    y64, gx64, grads64 = _reference_grads(x, params, ref, gy)
    _close(y, y64, rtol, "y")
    _close(x.grad, gx64, rtol, "dx")
    for i, (p, g64) in enumerate(zip(params, grads64)):
        _close(p.grad, g64, rtol, f"param {i}")


@pytest.mark.parametrize("acts", [("gelu_tanh", "none"), ("relu", "silu", "none"),
                                  ("gelu", "tanh", "sigmoid", "leaky_relu")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_cached_stack_is_one_program_with_the_python_paths_bits(gt, acts, dtype,
                                                                   monkeypatch):
    """From its second call an MLP's forward is one compiled program (every layer's GEMM,
    the outputs allocated in C) and gives the Python path's bits, in the forward, the
    gradients and without a gradient; a layer without a bias among them."""
    from ge2jit.jit.fastlaunch import MISS
    from ge2jit.ops.gemm import chain

    torch.manual_seed(3)
    sizes = [64, 192, 128, 80, 96][:len(acts) + 1]
    block = gt.MLP(sizes, act=acts[0], device="cuda", dtype=dtype)
    block.acts = list(acts)
    block.layers[1].bias = None
    x = torch.randn(300, sizes[0], device="cuda", dtype=dtype)
    gy = torch.randn(300, sizes[-1], device="cuda", dtype=dtype)
    table = chain._table(len(acts), len(acts) - 1)

    def step():
        xx = x.clone().requires_grad_(True)
        for p in block.parameters():
            p.grad = None
        y = block(xx)
        y.backward(gy)
        with torch.no_grad():
            y_infer = block(x)
        return [y.detach(), y_infer, xx.grad, *(p.grad for p in block.parameters())]

    step()                                  # the Python path, which stores the programs
    hits = table.stats()["hits"]
    got = step()
    assert table.stats()["hits"] == hits + 2, "the stack's calls did not take their programs"
    monkeypatch.setattr(chain, "call", lambda *args: MISS)
    want = step()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.stride() == w.stride(), i
        assert torch.equal(g, w), i


def test_mlp_without_bias_and_without_input_grad(gt):
    torch.manual_seed(2)
    block = gt.MLP([32, 64, 48], act="relu", bias=False, device="cuda")
    x = torch.randn(50, 32, device="cuda")
    block(x).sum().backward()
    assert all(m.bias is None for m in block.layers)
    ref = F.linear(F.relu(F.linear(x.double(), block.layers[0].weight.double())),
                   block.layers[1].weight.double())
    _close(block(x).detach(), ref, 2e-5, "y")
    assert block.layers[0].weight.grad is not None


def test_opcheck_each_custom_op(gt):
    torch.manual_seed(3)
    a = torch.randn(64, 48, device="cuda", requires_grad=True)
    w = torch.randn(80, 48, device="cuda", requires_grad=True)
    bias = torch.randn(80, device="cuda", requires_grad=True)
    ops = torch.ops.ge2jit
    torch.library.opcheck(ops.gemm_bias_act.default,
                          (a, w.t(), bias, None, "gelu", 1.0, 0.0, 0.01, "ieee", True))
    torch.library.opcheck(ops.gemm_bias_act.default,
                          (a, w.t(), None, None, "relu", 1.0, 0.0, 0.01, "ieee", False))
    gy = torch.randn(64, 80, device="cuda")
    z = torch.randn(64, 80, device="cuda")
    torch.library.opcheck(ops.gemm_bias_act_backward.default,
                          (gy, a.detach(), w.detach().t(), bias.detach(), None, z, None,
                           "gelu", 1.0, 0.0, 0.01, "ieee", [True, True, True, False]))
    w2 = torch.randn(16, 80, device="cuda", requires_grad=True)
    for save in (True, False):   # without save, the backward recomputes the layers
        torch.library.opcheck(ops.mlp.default, (a, [w, w2], [bias], [True, False],
                                                "gelu_tanh,none", 0.01, "ieee", save))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_functions_and_the_custom_ops_give_the_same_bits(gt, dtype):
    """Eager calls run the ops' implementations through torch.autograd.Function classes (no
    custom-op layers); torch.ops.ge2jit.* run the same implementations: outputs and
    gradients equal bit for bit, with and without a gradient wanted."""
    torch.manual_seed(6)
    x = torch.randn(96, 64, device="cuda", dtype=dtype, requires_grad=True)
    w1 = torch.randn(128, 64, device="cuda", dtype=dtype, requires_grad=True)
    b1 = torch.randn(128, device="cuda", dtype=dtype, requires_grad=True)
    w2 = torch.randn(32, 128, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(96, 32, device="cuda", dtype=dtype)
    leaves = (x, w1, b1, w2)

    def grads_of(y):
        for t in leaves:
            t.grad = None
        y.backward(gy)
        return [t.grad.clone() for t in leaves]

    y = gt.mlp(x, [w1, w2], [b1, None], ["gelu_tanh", "none"])
    assert type(y.grad_fn).__name__ == "_MLPFunctionBackward"
    eager = grads_of(y)
    precision = gt.precision_for(dtype, None)   # what the functions pass
    y_op = torch.ops.ge2jit.mlp(x, [w1, w2], [b1], [True, False], "gelu_tanh,none", 0.01,
                                precision, True)[0]
    assert "ge2jit" in type(y_op.grad_fn).__name__
    assert torch.equal(y, y_op)
    for g, g_op in zip(eager, grads_of(y_op)):
        assert torch.equal(g, g_op)
    with torch.no_grad():
        assert torch.equal(gt.mlp(x, [w1, w2], [b1, None], ["gelu_tanh", "none"]), y)

    h = gt.gemm_bias_act(x, w1.t(), b1, act="silu")
    assert type(h.grad_fn).__name__ == "_GemmFunctionBackward"
    loss_grads = grads_of(h @ w2.t())
    h_op = torch.ops.ge2jit.gemm_bias_act(x, w1.t(), b1, None, "silu", 1.0, 0.0, 0.01,
                                          precision, True)[0]
    assert torch.equal(h, h_op)
    for g, g_op in zip(loss_grads[:3], grads_of(h_op @ w2.t())[:3]):
        assert torch.equal(g, g_op)


def test_torch_compile_fullgraph_same_results(gt):
    torch.manual_seed(4)
    model = torch.nn.Sequential(gt.Linear(64, 128, act="gelu_tanh"), gt.MLP([128, 256, 64]),
                                torch.nn.LayerNorm(64)).cuda()
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    eager = model(x)
    eager.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    x.grad = None
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-5)


def test_cuda_graph_capture_of_a_training_step(gt):
    torch.manual_seed(5)
    block = gt.MLP([128, 512, 128], act="gelu_tanh", device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.SGD(block.parameters(), lr=0.0)   # lr 0: the weights stay put
    x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        opt.zero_grad(set_to_none=False)
        y = block(x)
        y.backward(gy)
        return y

    warm_up_on_a_side_stream(step)
    eager_y = step().detach().clone()
    eager_g = [p.grad.clone() for p in block.parameters()]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    for p in block.parameters():
        p.grad.fill_(float("nan"))
    x.copy_(x)   # same input: the kernels are deterministic, so bitwise the same results
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, eager_y)
    for p, g in zip(block.parameters(), eager_g):
        assert torch.equal(p.grad, g)
    # new inputs through the same graph
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    _close(static_y.detach(), block(x).detach(), 1e-6, "replay with new input")


def test_autocast_casts_inputs_and_keeps_float32_grads(gt):
    torch.manual_seed(6)
    layer = gt.Linear(64, 96, act="silu", device="cuda")
    x = torch.randn(40, 64, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    ref = F.silu(F.linear(x.double(), layer.weight.double(), layer.bias.double()))
    _close(y.detach(), ref, 3e-2, "y")


def test_precision_follows_torch_setting(gt, matmul_precision):
    assert gt.precision_for(torch.bfloat16, None) is None
    for setting, expected in gt.FLOAT32_PRECISION.items():
        matmul_precision(setting)
        assert gt.precision_for(torch.float32, None) == expected
    assert gt.precision_for(torch.float32, "ieee") == "ieee"
