"""The float64 reference of the backward (no GPU): its derivatives and chain rule against
central finite differences of the forward reference."""

from __future__ import annotations

import numpy as np
import pytest

from ge2jit.ops.gemm.reference import activation, gemm_bias_act_backward_ref
from ge2jit.ops.gemm.spec import Act


@pytest.mark.parametrize("bias_shape", ["col", "row", "scalar"])
@pytest.mark.parametrize("act", [a.value for a in Act])
def test_backward_reference_matches_finite_differences(act, bias_shape):
    rng = np.random.default_rng(11)
    m, n, k = 7, 5, 6
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    c, gy = rng.standard_normal((m, n)), rng.standard_normal((m, n))
    bias = rng.standard_normal({"col": (n,), "row": (m, 1), "scalar": (1,)}[bias_shape])
    slope, alpha, beta = 0.1, 0.7, -0.4

    def loss(a_, b_, bias_, c_):
        z = alpha * a_ @ b_ + beta * c_ + bias_
        return float((gy * activation(act, z, slope)).sum())

    grads = gemm_bias_act_backward_ref(gy, a, b, bias, act=act, c=c, alpha=alpha, beta=beta,
                                       leaky_slope=slope)
    h = 1e-6
    for pos, (x, grad) in enumerate(zip((a, b, bias, c), grads)):
        assert grad.shape == x.shape
        for _ in range(6):
            idx = tuple(rng.integers(0, s) for s in x.shape)
            up, down = [a, b, bias, c], [a, b, bias, c]
            up[pos], down[pos] = x.copy(), x.copy()
            up[pos][idx] += h
            down[pos][idx] -= h
            fd = (loss(*up) - loss(*down)) / (2 * h)
            assert abs(fd - grad[idx]) <= 1e-5 * max(1.0, abs(fd)), (act, pos, idx, fd)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu", "sigmoid", "none"])
def test_gated_backward_reference_matches_finite_differences(act, with_bias):
    from ge2jit.ops.gemm.reference import gemm_gated_backward_ref, gemm_gated_ref

    rng = np.random.default_rng(12)
    m, n, k = 6, 5, 7
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, 2 * n))
    bias = rng.standard_normal(2 * n) if with_bias else None
    gy = rng.standard_normal((m, n))
    alpha = 0.8

    def loss(a_, b_, bias_):
        return float((gy * gemm_gated_ref(a_, b_, bias_, act=act, alpha=alpha)[0]).sum())

    # the forward: act(gate) * up with gate and up the even and odd columns
    y, z = gemm_gated_ref(a, b, bias, act=act, alpha=alpha)
    gate = alpha * a @ b[:, 0::2] + (0 if bias is None else bias[0::2])
    up = alpha * a @ b[:, 1::2] + (0 if bias is None else bias[1::2])
    np.testing.assert_allclose(y, activation(act, gate) * up, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(z[:, 1::2], up, rtol=1e-12, atol=1e-12)
    grads = gemm_gated_backward_ref(gy, a, b, bias, act=act, alpha=alpha)
    h = 1e-6
    for pos, (x, grad) in enumerate(zip((a, b, bias), grads)):
        if x is None:
            assert grad is None
            continue
        assert grad.shape == x.shape
        for _ in range(8):
            idx = tuple(rng.integers(0, s) for s in x.shape)
            up_, down = [a, b, bias], [a, b, bias]
            up_[pos], down[pos] = x.copy(), x.copy()
            up_[pos][idx] += h
            down[pos][idx] -= h
            fd = (loss(*up_) - loss(*down)) / (2 * h)
            assert abs(fd - grad[idx]) <= 1e-5 * max(1.0, abs(fd)), (act, pos, idx, fd)
