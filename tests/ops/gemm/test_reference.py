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
