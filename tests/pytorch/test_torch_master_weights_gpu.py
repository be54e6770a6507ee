"""float32 master weights of a 16-bit computation (``torch.autocast``, or float32 weights given
with 16-bit activations): the ops cast them inside and write their gradients in float32 from
the weight-gradient GEMMs' accumulators, with no cast of the gradient after. Checked against
float64 on the 16-bit-rounded values, against PyTorch's autocast, through opcheck, eager
against the custom ops bit for bit, torch.compile and CUDA-graph capture."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ge2jit import ArgumentValueError  # noqa: E402 - after the skips above

from ..torch_helpers import check_replay, close, warm_up_on_a_side_stream  # noqa: E402

F = torch.nn.functional
HALF = {"bf16": (torch.bfloat16, 1.5e-2), "f16": (torch.float16, 4e-3)}


def _unrounded(g: torch.Tensor, dtype) -> float:
    """The fraction of ``g``'s values that are not numbers of ``dtype``: a gradient rounded to
    16 bits (and cast back) has none."""
    return (g.to(dtype).float() != g).float().mean().item()


def _fresh_grads(leaves):
    for t in leaves:
        t.grad = None


def _swiglu64(x, gate_up, gate_up_bias, down, down_bias):
    z = F.linear(x, gate_up, gate_up_bias)
    return F.linear(F.silu(z[:, 0::2]) * z[:, 1::2], down, down_bias)


@pytest.mark.parametrize("kind", HALF)
@pytest.mark.parametrize("layer", ["linear", "gated_mlp", "mlp", "gemm_gated"])
def test_float32_gradients_from_the_gemms(gt, kind, layer):
    """Under autocast each layer's float32 weights get float32 gradients that were never
    rounded to 16 bits, equal to the float64 gradient of the 16-bit computation (the
    weights and inputs rounded as autocast rounds them) within the 16-bit dZ's error, and to
    PyTorch's autocast gradients within a 16-bit rounding."""
    dtype, tol = HALF[kind]
    torch.manual_seed(11)
    x = torch.randn(203, 96, device="cuda", requires_grad=True)   # float32, autocast casts it
    if layer == "linear":
        mod = gt.Linear(96, 136, act="silu", device="cuda")
        weights = [mod.weight, mod.bias]

        def ref(x, w, b):
            return F.silu(F.linear(x, w, b))
    elif layer == "gated_mlp":
        mod = gt.GatedMLP(96, 72, bias=True, device="cuda")
        weights = [mod.gate_up, mod.gate_up_bias, mod.down, mod.down_bias]
        ref = _swiglu64
    elif layer == "mlp":
        mod = gt.MLP([96, 160, 48], act="gelu_tanh", device="cuda")
        weights = list(mod.parameters())

        def ref(x, w1, b1, w2, b2):
            return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
    else:
        w = torch.nn.Parameter(torch.randn(144, 96, device="cuda") / 10)
        weights = [w]

        def mod(x):
            return gt.gemm_gated(x, w.t(), act="silu")

        def ref(x, w):
            z = x @ w.t()
            return F.silu(z[:, 0::2]) * z[:, 1::2]
    assert all(p.dtype == torch.float32 for p in weights)
    with torch.autocast("cuda", dtype=dtype):
        y = mod(x)
    assert y.dtype == dtype
    gy = torch.randn_like(y)
    y.backward(gy)
    # float64 on what the 16-bit computation reads (biases: the epilogue reads float32 ones)
    x64 = x.detach().to(dtype).double().requires_grad_()
    p64 = [(p.detach().to(dtype) if p.dim() == 2 else p.detach()).double().requires_grad_()
           for p in weights]
    y64 = ref(x64, *p64)
    y64.backward(gy.double())
    close(y.detach(), y64, tol, "y")
    close(x.grad, x64.grad, tol, "dx")
    for p, p_ref in zip(weights, p64):
        assert p.grad.dtype == torch.float32 and p.grad.stride() == p.stride()
        close(p.grad, p_ref.grad, tol, f"d{tuple(p.shape)}")
        if p.dim() == 2:
            assert _unrounded(p.grad, dtype) > 0.5, "the weight gradient came from 16 bits"
    # PyTorch's autocast on the same function: within a 16-bit rounding of dW
    x2 = x.detach().requires_grad_()
    p2 = [p.detach().requires_grad_() for p in weights]
    with torch.autocast("cuda", dtype=dtype):
        y2 = ref(x2, *p2)
    y2.backward(gy)
    for p, q in zip(weights, p2):
        close(p.grad, q.grad, 2 * tol, f"d{tuple(p.shape)} vs PyTorch's autocast")


def test_outside_autocast_and_without_a_gradient(gt):
    """float32 weights given with 16-bit inputs are master weights too; weights that need no
    gradient (no_grad, inference) are cast before the op, as autocast casts them."""
    torch.manual_seed(12)
    x = torch.randn(64, 48, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(80, 48, device="cuda", requires_grad=True)
    y = gt.gemm_bias_act(x, w.t(), act="relu")
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and _unrounded(w.grad, torch.bfloat16) > 0.5
    want = F.relu(x.double() @ w.detach().bfloat16().double().t())
    close(y, want, 1e-2, "y")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        close(gt.gemm_bias_act(x.float(), w.t(), act="relu"), want, 1e-2, "y (no_grad)")
    with pytest.raises(ArgumentValueError, match="b: expected dtype float32"):   # 16-bit B
        # with float32 A: refused
        gt.gemm_bias_act(x.float(), w.detach().bfloat16().t())


def test_opcheck_with_master_weights(gt):
    """The custom ops with float32 weights and 16-bit activations: fake shapes, types and
    strides (the kept cast, the float32 gradients), autograd registration."""
    torch.manual_seed(13)
    ops = torch.ops.ge2jit
    a = torch.randn(64, 48, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(80, 48, device="cuda", requires_grad=True)
    w2 = torch.randn(16, 80, device="cuda", requires_grad=True)
    bias = torch.randn(80, device="cuda", requires_grad=True)
    for save in (True, False):
        torch.library.opcheck(ops.gemm_bias_act.default,
                              (a, w.t(), bias, None, "gelu", 1.0, 0.0, 0.01, None, save))
        torch.library.opcheck(ops.gemm_gated.default,
                              (a, w.t(), bias, "silu", 1.0, 0.01, None, save))
        torch.library.opcheck(ops.mlp.default, (a, [w, w2], [bias], [True, False],
                                                "gelu_tanh,none", 0.01, None, save))
        gate_up = torch.randn(96, 48, device="cuda", requires_grad=True)
        down = torch.randn(48, 48, device="cuda", requires_grad=True)
        torch.library.opcheck(ops.gated_mlp.default,
                              (a, gate_up, None, down, None, "silu", None, save))
    gy = torch.randn(64, 80, device="cuda", dtype=torch.bfloat16)
    z = torch.randn(64, 80, device="cuda", dtype=torch.bfloat16)
    low = w.detach().t().bfloat16()
    for kept in (low, None):   # the forward's cast, or cast again
        torch.library.opcheck(ops.gemm_bias_act_backward.default,
                              (gy, a.detach(), w.detach().t(), bias.detach(), None, z, None,
                               "gelu", 1.0, 0.0, 0.01, None, [True, True, True, False], kept))


def test_eager_and_custom_ops_give_the_same_bits(gt):
    torch.manual_seed(14)
    x = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gate_up = torch.randn(192, 64, device="cuda", requires_grad=True)
    down = torch.randn(64, 96, device="cuda", requires_grad=True)
    w = torch.randn(128, 64, device="cuda", requires_grad=True)
    gy = torch.randn(96, 64, device="cuda", dtype=torch.bfloat16)
    leaves = (x, gate_up, down, w)

    def grads_of(y):
        _fresh_grads(leaves)
        y.backward(gy)
        return [None if t.grad is None else t.grad.clone() for t in leaves]

    def swiglu_then_gated(mlp, gated):
        return mlp(x) + gated(x)[:, :64]

    eager = swiglu_then_gated(
        lambda x: gt.gated_mlp(x, gate_up, None, down, None),
        lambda x: torch.cat([gt.gemm_gated(x, w.t()), gt.gemm_bias_act(x, w.t())[:, :64]],
                            1))
    ops = torch.ops.ge2jit
    op = swiglu_then_gated(
        lambda x: ops.gated_mlp(x, gate_up, None, down, None, "silu", None, True)[0],
        lambda x: torch.cat([ops.gemm_gated(x, w.t(), None, "silu", 1.0, 0.01, None, True)[0],
                             ops.gemm_bias_act(x, w.t(), None, None, "none", 1.0, 0.0, 0.01,
                                               None, False)[0][:, :64]], 1))
    assert torch.equal(eager, op)
    for g, g_op in zip(grads_of(eager), grads_of(op)):
        assert g.dtype == g_op.dtype and torch.equal(g, g_op)


def test_torch_compile_and_graph_capture_of_an_autocast_step(gt):
    """A GatedMLP with float32 weights under autocast: compiled (fullgraph) and captured
    steps give eager's output and float32 gradients bit for bit."""
    torch.manual_seed(15)
    block = gt.GatedMLP(64, 96, device="cuda")
    x = torch.randn(128, 64, device="cuda")
    gy = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)

    def step(fn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn(x)
        y.backward(gy)
        return y

    _fresh_grads(block.parameters())
    eager_y = step(block).detach()
    eager_g = [p.grad.clone() for p in block.parameters()]
    assert all(g.dtype == torch.float32 for g in eager_g)
    _fresh_grads(block.parameters())
    # (detached: a kept autograd graph would keep its AccumulateGrad nodes, made on this
    # stream, into the capture below)
    compiled_y = step(torch.compile(block, fullgraph=True)).detach()
    torch.testing.assert_close(compiled_y, eager_y, rtol=0, atol=0)
    for p, g in zip(block.parameters(), eager_g):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)

    def captured():
        for p in block.parameters():
            p.grad = None   # each step's gradients made anew, in the graph's pool
        return step(block)

    warm_up_on_a_side_stream(captured)
    check_replay(captured, list(block.parameters()), eager_y, eager_g)
