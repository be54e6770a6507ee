"""Adam with its step count on the device equals Adam with a Python int step, step after step,
eagerly and inside a captured CUDA graph, for every counter type (CuPy and PyTorch)."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.gpu

_rng = np.random.default_rng(11)


def state(shape=(300, 7)):
    p = cp.asarray(_rng.standard_normal(shape), np.float32)
    return [p, cp.zeros_like(p), cp.zeros_like(p)]


def grads(count, shape=(300, 7), dtype=np.float32):
    return [cp.asarray(_rng.standard_normal(shape).astype(np.float32).astype(dtype))
            for _ in range(count)]


def assert_close(device, host):
    """m and v do not depend on the step: equal bits; the parameter through the corrections
    computed on the device (float64 pow there, C's pow on the host, both rounded to float32,
    the same in all but the rarest cases): within two float32 ulps."""
    for d, h in zip(device[1:], host[1:]):
        cp.testing.assert_array_equal(d, h)
    np.testing.assert_array_max_ulp(cp.asnumpy(device[0]), cp.asnumpy(host[0]), maxulp=2)


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0d", "1"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
@pytest.mark.parametrize("grad_dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_device_step_equals_host_step(dtype, shape, grad_dtype):
    host = state()
    dev = [x.copy() for x in host]
    copy_h = cp.zeros(host[0].shape, ml_dtypes.bfloat16)
    copy_d = cp.zeros_like(copy_h)
    t = cp.zeros(shape, dtype)
    for i, g in enumerate(grads(6, dtype=grad_dtype), 1):
        t += 1
        kw = dict(lr=3e-3, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.01)
        ge2jit.adam_update(host[0], g, host[1], host[2], step=i, param_copy=copy_h, **kw)
        ge2jit.adam_update(dev[0], g, dev[1], dev[2], step=t, param_copy=copy_d, **kw)
        assert_close(dev, host)
    assert float(t.reshape(())) == 6
    e = ge2jit.explain(ge2jit.adam_update, dev[0], g, dev[1], dev[2], step=t)
    assert e.kernels[0].spec.step_dtype == dtype


def test_device_step_inside_a_captured_step():
    host = state()
    dev = [x.copy() for x in host]
    t = cp.zeros((), cp.int32)
    gs = grads(8)

    def train(g):
        cp.add(t, 1, out=t)   # (t += 1 would make t local to train)
        ge2jit.adam_update(dev[0], g, dev[1], dev[2], step=t, lr=1e-2)

    step = ge2jit.graph.capture(train, gs[0])        # its warm-up is step 1
    ge2jit.adam_update(host[0], gs[0], host[1], host[2], step=1, lr=1e-2)
    for i, g in enumerate(gs[1:], 2):
        step(g)
        ge2jit.adam_update(host[0], g, host[1], host[2], step=i, lr=1e-2)
        assert_close(dev, host)
    assert int(t) == 8


def test_torch_counters():
    torch = pytest.importorskip("torch")
    p = torch.randn(513, device="cuda")
    host = [p, torch.zeros_like(p), torch.zeros_like(p)]
    dev = [x.clone() for x in host]
    for dtype in (torch.int64, torch.float32):
        t = torch.zeros(1, dtype=dtype, device="cuda")
        for i in range(1, 4):
            g = torch.randn(513, device="cuda")
            t += 1
            ge2jit.adam_update(host[0], g, host[1], host[2], step=i)
            ge2jit.adam_update(dev[0], g, dev[1], dev[2], step=t)
        for h, d in zip(host[1:], dev[1:]):
            assert torch.equal(h, d)
        torch.testing.assert_close(dev[0], host[0], rtol=4e-7, atol=0)
        host = [x.clone() for x in dev]
    with pytest.raises(ge2jit.ArgumentTypeError, match="step: a cupy.ndarray, but param is a "
                                                       "torch.Tensor"):
        ge2jit.adam_update(dev[0], g, dev[1], dev[2], step=cp.ones((), cp.int32))
