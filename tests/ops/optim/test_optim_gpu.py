"""The fused optimizer steps against float64 NumPy updates (random parameters, gradients and
states, never zeros), and their argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.gpu

_rng = np.random.default_rng(3)
GRAD_TYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def arrays(shape, grad_dtype):
    p = _rng.standard_normal(shape).astype(np.float32)
    g = _rng.standard_normal(shape).astype(np.float32).astype(grad_dtype)
    m = (_rng.standard_normal(shape) * 0.1).astype(np.float32)
    v = np.abs(_rng.standard_normal(shape) * 0.01).astype(np.float32)
    return p, g, m, v


@pytest.mark.parametrize("copy", [None, "bfloat16", "float16"])
@pytest.mark.parametrize("grad_dtype", GRAD_TYPES, ids=str)
@pytest.mark.parametrize("shape", [(1000, 37), (5,), (300_001,)], ids=str)
def test_adam_matches_numpy(shape, grad_dtype, copy):
    p, g, m, v = arrays(shape, grad_dtype)
    step, lr, b1, b2, eps, wd = 7, 1e-2, 0.8, 0.95, 1e-6, 0.05
    gp, gg, gm, gv = (cp.asarray(x) for x in (p, g, m, v))
    out = None if copy is None else cp.full(shape, np.nan, np.float32).astype(
        ml_dtypes.bfloat16 if copy == "bfloat16" else copy)
    ge2jit.adam_update(gp, gg, gm, gv, step=step, lr=lr, betas=(b1, b2), eps=eps,
                       weight_decay=wd, param_copy=out)
    g64 = g.astype(np.float64)
    m2 = b1 * m + (1 - b1) * g64
    v2 = b2 * v + (1 - b2) * g64 * g64
    p2 = p - lr * ((m2 / (1 - b1**step)) / (np.sqrt(v2 / (1 - b2**step)) + eps) + wd * p)
    np.testing.assert_allclose(cp.asnumpy(gm), m2, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(cp.asnumpy(gv), v2, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(cp.asnumpy(gp), p2, rtol=1e-5, atol=1e-6)
    if out is not None:
        tol = 2.0**-8 if copy == "bfloat16" else 2.0**-11
        np.testing.assert_allclose(cp.asnumpy(out).astype(np.float64), p2, rtol=tol,
                                   atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("grad_dtype", GRAD_TYPES, ids=str)
def test_sgd_momentum_matches_numpy(grad_dtype, nesterov):
    p, g, buf, _ = arrays((777, 3), grad_dtype)
    lr, mom, wd = 0.05, 0.9, 1e-3
    gp, gg, gb = (cp.asarray(x) for x in (p, g, buf))
    ge2jit.sgd_update(gp, gg, gb, lr=lr, momentum=mom, weight_decay=wd, nesterov=nesterov)
    g64 = g.astype(np.float64) + wd * p
    b2 = mom * buf + g64
    p2 = p - lr * (g64 + mom * b2 if nesterov else b2)
    np.testing.assert_allclose(cp.asnumpy(gb), b2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cp.asnumpy(gp), p2, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_refused():
    p = cp.ones((4, 3), np.float32)
    z = cp.zeros((4, 3), np.float32)
    with pytest.raises(ge2jit.ArgumentValueError, match="step: expected an int >= 1"):
        ge2jit.adam_update(p, p, z, z, step=0)
    with pytest.raises(ge2jit.ArgumentValueError, match="betas: expected two floats"):
        ge2jit.adam_update(p, p, z, z, step=1, betas=(0.9,))
    with pytest.raises(ge2jit.ArgumentValueError, match=r"grad: expected shape \(4, 3\)"):
        ge2jit.adam_update(p, p[:2], z, z, step=1)
    with pytest.raises(ge2jit.ArgumentValueError, match="param: expected dtype float32"):
        ge2jit.sgd_update(p.astype(np.float16), p, z, lr=0.1)
    with pytest.raises(ge2jit.ArgumentValueError, match="momentum_buffer: expected a C-contig"):
        ge2jit.sgd_update(p, p, cp.zeros((3, 4), np.float32).T, lr=0.1)
    with pytest.raises(ge2jit.ArgumentTypeError, match="lr: expected a real number"):
        ge2jit.sgd_update(p, p, z, lr="fast")
