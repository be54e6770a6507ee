"""Ops on PyTorch tensors and ``__cuda_array_interface__`` objects: read without a copy,
outputs from the caller's framework, launched on the caller's current stream; mixed inputs
refused. Against float64 NumPy references on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.gemm.reference import gemm_bias_act_ref

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

_gen = torch.Generator(device="cpu").manual_seed(5)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen).to(device="cuda", dtype=dtype)


def f64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def check_gemm(y, a, b, bias, act, rtol):
    ref = gemm_bias_act_ref(f64(a), f64(b), None if bias is None else f64(bias), act=act)[0]
    got = f64(y)
    scale = np.abs(ref).max() + 1e-30
    assert np.abs(got - ref).max() <= rtol * scale, np.abs(got - ref).max() / scale


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2),
                                        (torch.float16, 3e-3)])
def test_forward_on_tensors_returns_tensors_from_torch(dtype, rtol):
    a, b, bias = randn(96, 80, dtype=dtype), randn(80, 72, dtype=dtype), randn(72, dtype=dtype)
    before = torch.cuda.memory_allocated()
    for _ in range(3):   # the first call, then the cached path, on fresh values each time
        a.copy_(randn(96, 80, dtype=dtype))
        y = ge2jit.gemm_bias_act(a, b, bias, act="gelu")
        assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == (96, 72)
        assert y.device == a.device
        assert torch.cuda.memory_allocated() > before   # from PyTorch's caching allocator
        check_gemm(y, a, b, bias, "gelu", rtol)


def test_forward_out_and_preact_tensors_and_views():
    a = randn(64, 48)
    out = torch.full((64, 64), float("nan"), device="cuda")
    z = torch.full((64, 64), float("nan"), device="cuda")
    for _ in range(2):
        b = randn(48, 64)
        y, zz = ge2jit.gemm_bias_act(a, b, act="relu", save_preact=True, out=out,
                                     preact_out=z)
        assert y is out and zz is z
        check_gemm(y, a, b, None, "relu", 1e-5)
        check_gemm(zz, a, b, None, "none", 1e-5)
    for _ in range(2):
        w = randn(32, 48)
        y = ge2jit.gemm_bias_act(a, w.T, act="none")   # w.T: a column-major view, no copy
        check_gemm(y, a, w.T, None, "none", 1e-5)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps a"):
        ge2jit.gemm_bias_act(a[:, :48], randn(48, 48), out=a[:, :48])


def test_parameters_and_tensors_that_require_grad():
    a = torch.nn.Parameter(randn(40, 24))
    b = randn(24, 16).requires_grad_(True)
    for _ in range(2):
        y = ge2jit.gemm_bias_act(a, b, act="tanh")
        check_gemm(y, a, b, None, "tanh", 1e-5)


def test_cuda_array_interface_objects_give_cupy_outputs():
    class Interface:   # what Numba and others hand over: only the interface
        def __init__(self, x):
            self._x = x
            self.__cuda_array_interface__ = x.__cuda_array_interface__

    rng = cp.random.default_rng(2)
    a = rng.standard_normal((50, 30), dtype=cp.float32)
    b = rng.standard_normal((30, 20), dtype=cp.float32)
    for _ in range(2):
        y = ge2jit.gemm_bias_act(Interface(a), Interface(b), act="sigmoid")
        assert isinstance(y, cp.ndarray)
        ref = gemm_bias_act_ref(cp.asnumpy(a).astype(np.float64),
                                cp.asnumpy(b).astype(np.float64), act="sigmoid")[0]
        np.testing.assert_allclose(cp.asnumpy(y), ref, rtol=1e-5, atol=1e-6)


def test_mixed_frameworks_are_refused():
    a = randn(8, 8)
    b = cp.ones((8, 8), cp.float32) * 2
    with pytest.raises(ge2jit.ArgumentTypeError, match=r"b: a cupy.ndarray, but a is a "
                                                        r"torch.Tensor"):
        ge2jit.gemm_bias_act(a, b)
    with pytest.raises(ge2jit.ArgumentTypeError, match=r"bias: a torch.Tensor, but a is a "
                                                       r"cupy.ndarray"):
        ge2jit.gemm_bias_act(b, b, torch.ones(8, device="cuda"))
    with pytest.raises(ge2jit.ArgumentTypeError, match="a: a torch.Tensor, but gy is a cupy"):
        ge2jit.gemm_bias_act_backward(b, a, a)


def test_cpu_tensors_and_unsupported_dtypes_are_one_line_errors():
    with pytest.raises(ge2jit.ArgumentTypeError, match=r"CUDA device, got one on cpu"):
        ge2jit.gemm_bias_act(torch.ones(4, 4), torch.ones(4, 4))
    with pytest.raises(ge2jit.ArgumentTypeError, match=r"b: expected a tensor on a CUDA device"):
        ge2jit.gemm_bias_act(randn(4, 4), torch.ones(4, 4))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"a: dtype float64 is not supported"):
        ge2jit.gemm_bias_act(randn(4, 4, dtype=torch.float64), randn(4, 4, dtype=torch.float64))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"a: dtype torch.float8_e4m3fnuz is not"):
        x = randn(4, 4).to(torch.float8_e4m3fnuz)   # (float8_e4m3fn and float8_e5m2 are read)
        ge2jit.gemm_bias_act(x, x)


def test_the_current_torch_stream_orders_the_launch():
    """On a side stream busy with a long sleep and then a copy into A, the GEMM sees the copied
    values only if it is queued on that stream (the default stream would run it first)."""
    a, b = randn(256, 256), randn(256, 256)
    new_a = randn(256, 256)
    ge2jit.gemm_bias_act(a, b)   # compiled and prepared before timing matters
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    for _ in range(2):   # the first call and the cached one
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)   # about 25 ms of GPU time
            a.copy_(new_a)
            y = ge2jit.gemm_bias_act(a, b)
            out = torch.empty(256, 256, device="cuda")
            ge2jit.gemm_bias_act(a, b, out=out)
        torch.cuda.synchronize()
        check_gemm(y, new_a, b, None, "none", 1e-5)
        check_gemm(out, new_a, b, None, "none", 1e-5)
        new_a = randn(256, 256)


def test_split_k_and_staged_plans_on_a_side_stream():
    """Plans that allocate scratch memory (split-K partial sums) on a torch side stream."""
    a, b = randn(64, 4096), randn(4096, 64)
    side = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)
            a.copy_(randn(64, 4096))
            y = ge2jit.gemm_bias_act(a, b, config="64x64x8_w32x32_s3_k4")
        torch.cuda.synchronize()
        check_gemm(y, a, b, None, "none", 1e-5)


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_backward_on_tensors_matches_cupy(dtype, rtol):
    m, k, n = 80, 48, 64
    a, b, bias = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype), randn(n, dtype=dtype)
    for _ in range(2):
        gy = randn(m, n, dtype=dtype)
        y, z = ge2jit.gemm_bias_act(a, b, bias, act="gelu", save_preact=True)
        g = ge2jit.gemm_bias_act_backward(gy, a, b, bias, act="gelu", z=z)
        assert all(isinstance(x, torch.Tensor) for x in (g.a, g.b, g.bias))
        cg = ge2jit.gemm_bias_act_backward(*(cp.from_dlpack(x) for x in (gy, a, b, bias)),
                                           act="gelu", z=cp.from_dlpack(z))
        for ours, theirs in zip((g.a, g.b, g.bias), (cg.a, cg.b, cg.bias)):
            np.testing.assert_allclose(f64(ours), cp.asnumpy(theirs).astype(np.float64),
                                       rtol=rtol, atol=rtol)
        # against torch's autograd, in float64
        ta, tb, tbias = (x.detach().double().requires_grad_() for x in (a, b, bias))
        ty = torch.nn.functional.gelu(ta @ tb + tbias)
        ty.backward(gy.double())
        for ours, ref in ((g.a, ta.grad), (g.b, tb.grad), (g.bias, tbias.grad)):
            err = (ours.double() - ref).abs().max().item()
            assert err <= rtol * 4 * ref.abs().max().item(), err


def test_optimizer_steps_on_tensors():
    p = randn(1000)
    g = randn(1000)
    m, v = randn(1000) * 0.1, randn(1000).abs() * 0.01
    p0, m0, v0 = (x.double().clone() for x in (p, m, v))
    ge2jit.adam_update(p, g, m, v, step=3, lr=1e-2)
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 1e-2
    m2 = b1 * m0 + (1 - b1) * g.double()
    v2 = b2 * v0 + (1 - b2) * g.double() ** 2
    p2 = p0 - lr * (m2 / (1 - b1**3)) / ((v2 / (1 - b2**3)).sqrt() + eps)
    torch.testing.assert_close(p.double(), p2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.double(), m2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("first_in_thread", [False, True])
def test_a_call_on_a_thread_with_no_current_context(first_in_thread):
    """A fresh thread has no CUDA context current until something makes it so (PyTorch's
    autograd threads run so): a first call and a cached call there both run, CuPy arrays
    and torch tensors alike, into outputs passed in (no allocation makes it current first)."""
    import threading

    a, b = randn(64, 48), randn(48, 40)
    out = torch.empty(64, 40, device="cuda")
    ca, cb, cout = cp.asarray(a), cp.asarray(b), cp.empty((64, 40), dtype=cp.float32)
    if not first_in_thread:
        ge2jit.gemm_bias_act(a, b, act="relu", out=out)
        ge2jit.gemm_bias_act(ca, cb, act="relu", out=cout)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    cout.fill(float("nan"))
    errors = []

    def run():
        try:
            ge2jit.gemm_bias_act(a, b, act="relu", out=out)
            ge2jit.gemm_bias_act(ca, cb, act="relu", out=cout)
        except Exception as e:   # reported below, in the test's thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    torch.cuda.synchronize()
    check_gemm(out, a, b, None, "relu", 1e-5)
    check_gemm(torch.as_tensor(cout, device="cuda"), a, b, None, "relu", 1e-5)
