"""ge2jit.torch's gemm_gated and GatedMLP against PyTorch's SwiGLU (two Linear layers, silu,
mul, the down Linear) and autograd in float64 on the same values; opcheck; the eager functions
against the custom ops bit for bit; torch.compile without graph breaks; CUDA-graph capture;
autocast."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ..torch_helpers import check_replay, warm_up_on_a_side_stream  # noqa: E402, I001
from ..torch_helpers import close as _close  # noqa: E402 - after the skips above
from .test_torch_gpu import KINDS, _reference_grads  # noqa: E402

F = torch.nn.functional
_GATES = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
          "relu": F.relu, "sigmoid": torch.sigmoid}


def _swiglu(x, w, b, act):
    """The unit in PyTorch: w (2N, K) with rows alternating gate and up."""
    z = F.linear(x, w, b)
    return _GATES[act](z[:, 0::2]) * z[:, 1::2]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("act", list(_GATES))
@pytest.mark.parametrize("kind", ["f32", "f32-high", "bf16", "f16"])
def test_gemm_gated_matches_pytorch(gt, matmul_precision, kind, act, bias):
    dtype, precision, rtol = KINDS[kind]
    if precision is not None:
        matmul_precision(precision)
    torch.manual_seed(1)
    m, k, n = 77, 96, 40
    x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
    w = (torch.randn(2 * n, k, device="cuda", dtype=dtype) * 0.2).requires_grad_(True)
    b = torch.randn(2 * n, device="cuda", dtype=dtype, requires_grad=True) if bias else None
    gy = torch.randn(m, n, device="cuda", dtype=dtype)
    y = gt.gemm_gated(x, w.t(), b, act=act)
    y.backward(gy)
    ref, gx, (gw, gb) = _reference_grads(x, [w, b], lambda x_, p: _swiglu(x_, p[0], p[1], act),
                                         gy)
    tol = max(rtol, 2e-2) if dtype != torch.float32 else rtol
    _close(y.detach(), ref, tol, "y")
    _close(x.grad, gx, tol, "dx")
    _close(w.grad, gw, tol, "dw")
    assert w.grad.stride() == w.stride()   # the gradient in the weight's own layout
    if bias:
        _close(b.grad, gb, tol, "db")


def test_gated_mlp_matches_its_linears(gt):
    torch.manual_seed(2)
    d, h = 64, 96
    lin = [torch.nn.Linear(d, h, bias=True, device="cuda"),
           torch.nn.Linear(d, h, bias=True, device="cuda"),
           torch.nn.Linear(h, d, bias=True, device="cuda")]
    block = gt.GatedMLP.from_linears(*lin, precision="ieee")
    assert (block.gate_up.shape, block.down.shape) == ((2 * h, d), (d, h))
    x = torch.randn(3, 50, d, device="cuda", requires_grad=True)
    gy = torch.randn(3, 50, d, device="cuda")
    y = block(x)
    y.backward(gy)
    xr = x.detach().clone().requires_grad_(True)
    ref = lin[2](F.silu(lin[0](xr)) * lin[1](xr))
    ref.backward(gy)
    _close(y.detach(), ref.detach(), 2e-5, "y")
    _close(x.grad, xr.grad, 2e-5, "dx")
    gate, up = gt.split_gate_up(block.gate_up.grad.t())
    _close(gate.t(), lin[0].weight.grad, 2e-5, "d gate")
    _close(up.t(), lin[1].weight.grad, 2e-5, "d up")
    _close(block.down.grad, lin[2].weight.grad, 2e-5, "d down")
    gb, ub = gt.split_gate_up(block.gate_up_bias.grad)
    _close(gb, lin[0].bias.grad, 2e-5, "d gate bias")
    _close(ub, lin[1].bias.grad, 2e-5, "d up bias")


def test_opcheck(gt):
    torch.manual_seed(3)
    a = torch.randn(64, 48, device="cuda", requires_grad=True)
    w = torch.randn(80, 48, device="cuda", requires_grad=True)
    bias = torch.randn(80, device="cuda", requires_grad=True)
    ops = torch.ops.ge2jit
    torch.library.opcheck(ops.gemm_gated.default, (a, w.t(), bias, "silu", 1.0, 0.01, "ieee",
                                                   True))
    torch.library.opcheck(ops.gemm_gated.default, (a, w.t(), None, "gelu", 1.0, 0.01, "ieee",
                                                   False))
    gy = torch.randn(64, 40, device="cuda")
    z = torch.randn(64, 80, device="cuda")
    torch.library.opcheck(ops.gemm_gated_backward.default,
                          (gy, a.detach(), w.detach().t(), bias.detach(), z, "silu", 1.0, 0.01,
                           "ieee", [True, True, True]))


@pytest.mark.parametrize("save", [True, False], ids=["saved", "recomputed"])
def test_gated_mlp_opcheck(gt, save):
    """Without ``save`` the op keeps only Y and its backward recomputes H and Z."""
    torch.manual_seed(4)
    x = torch.randn(40, 32, device="cuda", requires_grad=True)
    gate_up = torch.randn(96, 32, device="cuda", requires_grad=True)
    gate_up_bias = torch.randn(96, device="cuda", requires_grad=True)
    down = torch.randn(32, 48, device="cuda", requires_grad=True)
    down_bias = torch.randn(32, device="cuda", requires_grad=True)
    ops = torch.ops.ge2jit
    torch.library.opcheck(ops.gated_mlp.default,
                          (x, gate_up, gate_up_bias, down, down_bias, "silu", "ieee", save))
    torch.library.opcheck(ops.gated_mlp.default,
                          (x, gate_up, None, down, None, "gelu", "ieee", save))
    gy = torch.randn(40, 32, device="cuda")
    h, z, _ = ops.gemm_gated(x.detach(), gate_up.detach().t(), gate_up_bias.detach(), "silu",
                             1.0, 0.01, "ieee", True)
    torch.library.opcheck(ops.gated_mlp_backward.default,
                          (gy, x.detach(), gate_up.detach(), gate_up_bias.detach(),
                           down.detach(), down_bias.detach(), h, z, "silu", "ieee", True))


def test_gated_mlp_recomputes_what_it_did_not_save(gt):
    """The op called without ``save`` gives the gradients of the op called with it."""
    torch.manual_seed(5)
    args = [torch.randn(s, device="cuda", requires_grad=True)
            for s in ((40, 32), (96, 32), (96,), (32, 48), (32,))]
    gy = torch.randn(40, 32, device="cuda")
    grads = []
    for save in (True, False):
        y = torch.ops.ge2jit.gated_mlp(*args, "silu", "ieee", save)[0]
        grads.append(torch.autograd.grad(y, args, gy))
    for g0, g1 in zip(*grads):
        assert torch.equal(g0, g1)


def test_gated_mlp_eager_and_custom_op_give_the_same_bits(gt):
    torch.manual_seed(9)
    block = gt.GatedMLP(64, 96, bias=True, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(50, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(50, 64, device="cuda", dtype=torch.bfloat16)
    leaves = [x, *block.parameters()]

    def grads_of(y):
        for t in leaves:
            t.grad = None
        y.backward(gy)
        return [t.grad.clone() for t in leaves]

    y = gt.gated_mlp(x, block.gate_up, block.gate_up_bias, block.down, block.down_bias)
    assert type(y.grad_fn).__name__ == "_GatedMLPFunctionBackward"
    eager = grads_of(y)
    y_op = torch.ops.ge2jit.gated_mlp(x, block.gate_up, block.gate_up_bias, block.down,
                                      block.down_bias, "silu",
                                      gt.precision_for(torch.bfloat16, None), True)[0]
    assert torch.equal(y, y_op)
    for g, g_op in zip(eager, grads_of(y_op)):
        assert torch.equal(g, g_op)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_function_and_the_custom_op_give_the_same_bits(gt, dtype):
    torch.manual_seed(6)
    x = torch.randn(96, 64, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(128, 64, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(128, device="cuda", dtype=dtype, requires_grad=True)
    gy = torch.randn(96, 64, device="cuda", dtype=dtype)

    def grads_of(y):
        for t in (x, w, b):
            t.grad = None
        y.backward(gy)
        return [t.grad.clone() for t in (x, w, b)]

    y = gt.gemm_gated(x, w.t(), b)
    assert type(y.grad_fn).__name__ == "_GatedFunctionBackward"
    eager = grads_of(y)
    y_op = torch.ops.ge2jit.gemm_gated(x, w.t(), b, "silu", 1.0, 0.01,
                                       gt.precision_for(dtype, None), True)[0]
    assert torch.equal(y, y_op)
    for g, g_op in zip(eager, grads_of(y_op)):
        assert torch.equal(g, g_op)


def test_torch_compile_fullgraph(gt):
    torch.manual_seed(4)
    block = gt.GatedMLP(64, 96, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = block(x)
    eager.float().sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    out = torch.compile(block, fullgraph=True)(x)
    out.float().sum().backward()
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    for g, p in zip(grads, block.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


def test_cuda_graph_capture_of_a_training_step(gt):
    torch.manual_seed(5)
    block = gt.GatedMLP(64, 96, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.SGD(block.parameters(), lr=0.0)   # lr 0: the weights stay put

    def step():
        opt.zero_grad(set_to_none=False)
        y = block(x)
        y.backward(gy)
        return y

    warm_up_on_a_side_stream(step)
    eager_y = step().detach().clone()
    eager_g = [p.grad.clone() for p in block.parameters()]
    check_replay(step, list(block.parameters()), eager_y, eager_g)


def test_autocast(gt):
    torch.manual_seed(7)
    block = gt.GatedMLP(64, 96, device="cuda")
    x = torch.randn(32, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = block(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert block.gate_up.grad.dtype == torch.float32
