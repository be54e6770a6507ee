"""ge2jit.torch's FP8 pieces (Hopper): ``quantize_fp8`` (eager and compiled, against the
float32 host reference bit for bit), ``linear_fp8`` against the float64 product of its
dequantized operands, ``Linear(fp8=...)`` against the layer's own bfloat16 forward and
backward, per-token and per-tensor activations, both formats, torch.compile without graph
breaks, CUDA-graph capture, the inference weight cache and autocast master weights."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

from ..torch_helpers import check_replay, warm_up_on_a_side_stream  # noqa: E402
from ..torch_helpers import close as _close  # noqa: E402, I001

ACTS = ("none", "relu", "gelu", "silu", "tanh")
FMTS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
#: Y of an FP8 layer against the bfloat16 layer: the inputs' rounding, 2^-4 (e4m3) or 2^-3
#: (e5m2) relative per element, averaged over K
TOL = {"e4m3": 4e-2, "e5m2": 8e-2}


@pytest.fixture(autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FP8 GEMMs run on Hopper (sm_90)")


def _rel(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("per_row", [False, True])
def test_quantize_matches_the_reference_eager_and_compiled(gt, fmt, per_row):
    from ge2jit.ops.quantize import reference as ref

    x = torch.randn(200, 3000, device="cuda", dtype=torch.bfloat16) * 5
    q, s = gt.quantize_fp8(x, fmt, per_row=per_row)
    assert q.dtype == FMTS[fmt] and s.dtype == torch.float32
    assert s.shape == ((200,) if per_row else ())
    h = x.float().cpu().numpy()
    want_q, want_s = ref.quantize_fp8(h, fmt, per_row=per_row)
    np.testing.assert_array_equal(s.cpu().numpy(), want_s)
    np.testing.assert_array_equal(q.float().cpu().numpy(), want_q.astype(np.float32))
    fn = torch.compile(lambda t: gt.quantize_fp8(t, fmt, per_row=per_row), fullgraph=True)
    q2, s2 = fn(x)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)


@pytest.mark.parametrize("fmt", list(FMTS))
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("act", ACTS)
def test_linear_fp8_is_the_product_of_its_quantized_operands(gt, act, per_token, fmt):
    m, k, n = 300, 512, 264
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = gt.linear_fp8(x, w.t(), bias, act=act, fmt=fmt, per_token=per_token)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    qx, sx = gt.quantize_fp8(x, fmt, per_row=per_token)
    qw, sw = gt.quantize_fp8(w, fmt, per_row=True)
    dx = qx.double() * (sx.double()[:, None] if per_token else sx.double())
    z = dx @ (qw.double() * sw.double()[:, None]).t() + bias.double()
    f = {"none": lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
         "silu": torch.nn.functional.silu, "tanh": torch.tanh}[act]
    assert _rel(y, f(z)) < 1e-2
    exact = f(x.double() @ w.double().t() + bias.double())
    assert _rel(y, exact) < TOL[fmt]


@pytest.mark.parametrize("fp8_activations", ["token", "tensor"])
@pytest.mark.parametrize("act", ACTS)
def test_fp8_linear_forward_and_backward_against_bf16(gt, act, fp8_activations):
    torch.manual_seed(0)
    base = gt.Linear(256, 384, act=act, device="cuda", dtype=torch.bfloat16)
    layer = gt.Linear(256, 384, act=act, fp8="e4m3", fp8_activations=fp8_activations,
                      device="cuda", dtype=torch.bfloat16)
    layer.load_state_dict(base.state_dict())
    assert "fp8='e4m3'" in repr(layer)
    x = torch.randn(4, 50, 256, device="cuda", dtype=torch.bfloat16)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_ref, y = base(x1), layer(x2)
    assert y.shape == (4, 50, 384) and y.dtype == torch.bfloat16
    assert _rel(y, y_ref) < TOL["e4m3"]
    gy = torch.randn_like(y)
    y_ref.backward(gy)
    y.backward(gy)
    pairs = [(x2.grad, x1.grad), (layer.weight.grad, base.weight.grad),
             (layer.bias.grad, base.bias.grad)]
    for got, want in pairs:
        assert got.dtype == want.dtype and got.shape == want.shape
        if act == "none":      # act' is 1: the backward is the bf16 layer's, bit for bit
            assert torch.equal(got, want)
    # against float64 from the FP8 forward's own pre-activation (act' there)
    with torch.no_grad():
        _, z = gt.linear_fp8(x.reshape(-1, 256), layer.weight.t(), layer.bias, act=act,
                             per_token=fp8_activations == "token", save_preact=True)
    z64 = z.double().requires_grad_(True)
    f = {"none": lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
         "silu": torch.nn.functional.silu, "tanh": torch.tanh}[act]
    f(z64).backward(gy.reshape(-1, 384).double())
    dz = z64.grad
    x64, w64 = x.reshape(-1, 256).double(), layer.weight.double()
    _close(x2.grad.reshape(-1, 256), dz @ w64, 2e-2, "dx")
    _close(layer.weight.grad, dz.t() @ x64, 2e-2, "dw")
    _close(layer.bias.grad, dz.sum(0), 2e-2, "dbias")


def test_fp8_linear_compiles_without_graph_breaks_and_captures(gt):
    torch.manual_seed(1)
    layer = gt.Linear(128, 192, act="gelu", fp8="e4m3", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    want = (y.detach().clone(), x.grad.clone(), layer.weight.grad.clone())
    compiled = torch.compile(layer, fullgraph=True)
    x.grad = layer.weight.grad = layer.bias.grad = None
    yc = compiled(x)
    yc.sum().backward()
    assert torch.equal(yc, want[0]) and torch.equal(x.grad, want[1])
    assert torch.equal(layer.weight.grad, want[2])
    # the capture: a layer and input of their own (no autograd node of the calls above, made
    # on the default stream, kept alive into it)
    fresh = gt.Linear(128, 192, act="gelu", fp8="e4m3", device="cuda", dtype=torch.bfloat16)
    fresh.load_state_dict(layer.state_dict())
    layer, x = fresh, x.detach().clone().requires_grad_(True)

    def step():
        for p in (x, layer.weight, layer.bias):
            p.grad = None if p.grad is None else p.grad.zero_()
        out = layer(x)
        out.sum().backward()
        return out

    warm_up_on_a_side_stream(step)
    check_replay(step, [x, layer.weight], want[0], [want[1], want[2]])


def test_inference_keeps_the_quantized_weight_until_it_changes(gt):
    layer = gt.Linear(64, 96, fp8="e5m2", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y1 = layer(x)
        kept = layer._weight_fp8
        y2 = layer(x)
        assert layer._weight_fp8 is kept and torch.equal(y1, y2)
        layer.weight.mul_(2)
        y3 = layer(x)
        assert layer._weight_fp8 is not kept
        assert _rel(y3 - layer.bias, 2 * (y1 - layer.bias)) < 1e-2
    y4 = layer(x.requires_grad_(True))          # training: quantized per call
    assert torch.equal(y4.detach(), y3)


def test_autocast_master_weights(gt):
    layer = gt.Linear(128, 64, act="silu", fp8="e4m3", device="cuda")     # float32
    x = torch.randn(40, 128, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    ref = torch.nn.functional.silu(x.double() @ layer.weight.double().t() + layer.bias.double())
    assert _rel(y, ref) < TOL["e4m3"]


def test_bad_fp8_settings_are_refused(gt):
    with pytest.raises(ValueError, match="fp8: expected None or one of e4m3, e5m2"):
        gt.Linear(8, 8, fp8="e4m3fnuz")
    with pytest.raises(ValueError, match="fp8_activations: expected 'token' or 'tensor'"):
        gt.Linear(8, 8, fp8="e4m3", fp8_activations="row")
