"""The float64 reference of rms_norm and layer_norm (no GPU): the backward's formulas against
central finite differences of the forward, with and without a weight, a bias and dh; the
forward's defining properties; h as the kernels round it."""

from __future__ import annotations

import numpy as np
import pytest

from ge2jit.ops.norm.reference import (
    layer_norm_backward_ref,
    layer_norm_ref,
    residual_sum,
    rms_norm_backward_ref,
    rms_norm_ref,
)


def _loss(kind, h, weight, bias, dy, dh, eps):
    """sum(dy * norm(h)) + sum(dh * h): its gradient in h is the backward's dx."""
    if kind == "rms":
        y = rms_norm_ref(h, weight, eps=eps)[0]
    else:
        y = layer_norm_ref(h, weight, bias, eps=eps)[0]
    return float((dy * y).sum() + (0.0 if dh is None else (dh * h).sum()))


@pytest.mark.parametrize("with_dh", [False, True])
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_backward_reference_matches_finite_differences(kind, affine, with_dh):
    if kind == "rms" and affine == "both":
        pytest.skip("RMSNorm has no bias")
    rng = np.random.default_rng(5)
    rows, n, eps = 4, 7, 1e-3
    h = rng.standard_normal((rows, n)) * 2 + 0.5
    dy = rng.standard_normal((rows, n))
    dh = rng.standard_normal((rows, n)) if with_dh else None
    weight = rng.standard_normal(n) if affine != "none" else None
    bias = rng.standard_normal(n) if affine == "both" else None
    if kind == "rms":
        dx, dweight = rms_norm_backward_ref(dy, h, weight, eps=eps, dh=dh)
        dbias = None
    else:
        dx, dweight, dbias = layer_norm_backward_ref(dy, h, weight, eps=eps, dh=dh)
    assert dx.shape == h.shape and (dweight is None) == (weight is None)
    step = 1e-6
    for name, x, grad in (("h", h, dx), ("weight", weight, dweight), ("bias", bias, dbias)):
        if x is None:
            continue
        args = {"h": h, "weight": weight, "bias": bias}
        for _ in range(8):
            idx = tuple(rng.integers(0, s) for s in x.shape)
            up, down = x.copy(), x.copy()
            up[idx] += step
            down[idx] -= step
            fd = (_loss(kind, **{**args, name: up}, dy=dy, dh=dh, eps=eps)
                  - _loss(kind, **{**args, name: down}, dy=dy, dh=dh, eps=eps)) / (2 * step)
            assert abs(fd - grad[idx]) <= 1e-6 * max(1.0, abs(fd)), (kind, name, idx, fd)


def test_dbias_is_the_sum_of_dy_over_rows():
    rng = np.random.default_rng(2)
    dy, h = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    _, dweight, dbias = layer_norm_backward_ref(dy, h, np.ones(5))
    np.testing.assert_allclose(dbias, dy.sum(axis=(0, 1)))
    assert dweight.shape == (5,)


def test_forward_reference_properties():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 50)) * 3 + 10
    y, h, mean, rstd = layer_norm_ref(x, eps=0.0)
    assert h is x
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-12)
    np.testing.assert_allclose((y * y).mean(axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(mean, x.mean(axis=-1))
    y, _, rstd = rms_norm_ref(x, eps=0.0)
    np.testing.assert_allclose((y * y).mean(axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(rstd, 1 / np.sqrt((x * x).mean(axis=-1)))
    w, b = rng.standard_normal(50), rng.standard_normal(50)
    y2 = layer_norm_ref(x, w, b, eps=1e-5)[0]
    np.testing.assert_allclose(y2, layer_norm_ref(x, eps=1e-5)[0] * w + b)


def test_special_values_follow_the_float_formulas():
    row = np.array([[1.0, np.inf, 2.0], [1.0, np.nan, 2.0], [3.0, 3.0, 3.0]])
    y = rms_norm_ref(row)[0]
    assert y[0, 0] == 0.0 and np.isnan(y[0, 1]) and y[0, 2] == 0.0   # rstd 0
    assert np.isnan(y[1]).all()
    yl = layer_norm_ref(row, eps=0.0)[0]
    assert np.isnan(yl[:2]).all() and np.isnan(yl[2]).all()         # 0 * inf: NaN


def test_residual_sum_rounds_as_the_kernels_do():
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = np.array([1.0, 2.0**-8, 3.0], np.float32).astype(bf16)
    r = np.array([2.0**-9, 1.0, 1e-3], np.float32)
    h = residual_sum(x, r)
    assert h.dtype == np.float32
    np.testing.assert_array_equal(h, x.astype(np.float32) + r)
    h16 = residual_sum(x, r, bf16)
    assert h16.dtype == bf16
    np.testing.assert_array_equal(h16, (x.astype(np.float32) + r).astype(bf16))
    assert residual_sum(x) is x
