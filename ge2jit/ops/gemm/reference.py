"""The float64 NumPy reference of gemm_bias_act, for checking results (tests, demo, notebooks)."""

from __future__ import annotations

import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def activation(name: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "none":
            return z
        if name == "relu":
            return np.where(z < 0, 0.0, z)
        if name == "leaky_relu":
            return np.where(z < 0, z * slope, z)
        if name == "gelu":
            return 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)).astype(np.float64))
        if name == "gelu_tanh":
            return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
        if name == "sigmoid":
            return 1.0 / (1.0 + np.exp(-z))
        if name == "tanh":
            return np.tanh(z)
        if name == "silu":
            return z / (1.0 + np.exp(-z))
    raise ValueError(name)


def activation_grad(name: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """act'(z) in float64 (at the ReLUs' kink, the side z <= 0, as PyTorch)."""
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "none":
            return np.ones_like(z)
        if name == "relu":
            return np.where(z <= 0, 0.0, 1.0)
        if name == "leaky_relu":
            return np.where(z <= 0, slope, 1.0)
        if name == "gelu":
            cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)).astype(np.float64))
            return cdf + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        if name == "gelu_tanh":
            k = math.sqrt(2.0 / math.pi)
            t = np.tanh(k * (z + 0.044715 * z**3))
            return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * z * z)
        if name == "sigmoid":
            s = 1.0 / (1.0 + np.exp(-z))
            return s * (1.0 - s)
        if name == "tanh":
            return 1.0 - np.tanh(z) ** 2
        if name == "silu":
            s = 1.0 / (1.0 + np.exp(-z))
            return s * (1.0 + z * (1.0 - s))
    raise ValueError(name)


def gemm_bias_act_backward_ref(gy, a, b, bias=None, *, act="none", c=None, alpha=1.0,
                               beta=0.0, leaky_slope=0.01, abs_dz=False, a_act=None, a_z=None,
                               a_leaky_slope=0.01):
    """(dA, dB, dBias, dC) in float64 from host arrays (dBias in the bias' shape). ``abs_dz``:
    from |dZ| instead (the magnitudes that a sum of dZ's terms adds up, for error bounds).
    ``a_act``, ``a_z``: A = a_act(a_z), and dA is returned as the gradient of a_z."""
    _, z = gemm_bias_act_ref(a, b, bias, act=act, c=c, alpha=alpha, beta=beta,
                             leaky_slope=leaky_slope)
    dz = np.asarray(gy, np.float64) * activation_grad(act, z, leaky_slope)
    if abs_dz:
        dz = np.abs(dz)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d_bias = None
    if bias is not None:
        shape = np.shape(bias)
        if np.size(bias) == 1:
            d_bias = np.full(shape, dz.sum())
        elif len(shape) == 2 and shape[1] == 1 and shape[0] == dz.shape[0] != 1:
            d_bias = dz.sum(axis=1).reshape(shape)
        else:
            d_bias = dz.sum(axis=0).reshape(shape)
    d_c = None if c is None else beta * dz
    d_a = alpha * dz @ b.T
    if a_act is not None:
        d_a = d_a * activation_grad(a_act, a_z, a_leaky_slope)
    return d_a, alpha * a.T @ dz, d_bias, d_c


def gemm_bias_act_ref(a, b, bias=None, *, act="none", c=None, alpha=1.0, beta=0.0,
                      leaky_slope=0.01):
    """(Y, Z) in float64 from host arrays."""
    z = alpha * (np.asarray(a, np.float64) @ np.asarray(b, np.float64))
    if c is not None and beta != 0.0:
        z = z + beta * np.asarray(c, np.float64)
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    return activation(act, z, leaky_slope), z


def magnitude_scale(a, b, bias=None, *, c=None, alpha=1.0, beta=0.0) -> float:
    """The norm a result of these operands has when its terms do not cancel, over sqrt(K).

    Float32 rounding errors scale with the magnitudes of the summed terms, not with the result;
    a tiny output (a 1 x 1 product whose terms cancel) makes ||Y - ref|| / ||ref|| meaningless.
    For random inputs ||ref|| is about this value, so using it as a floor of the denominator
    leaves the check unchanged except where cancellation would make it ill-conditioned.
    """
    a = np.abs(np.asarray(a, np.float64))
    b = np.abs(np.asarray(b, np.float64))
    mag = abs(alpha) * (a @ b)
    if c is not None and beta != 0.0:
        mag = mag + abs(beta) * np.abs(np.asarray(c, np.float64))
    if bias is not None:
        mag = mag + np.abs(np.asarray(bias, np.float64))
    return float(np.linalg.norm(mag) / np.sqrt(max(a.shape[1], 1)))


def rel_error(got, ref, floor: float = 0.0) -> float:
    """||got - ref|| / max(||ref||, floor); NaN anywhere gives NaN (which fails any check)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    denom = max(float(np.linalg.norm(ref)), floor)
    return float(np.linalg.norm(got - ref) / (denom if denom > 0 else 1.0))


def gemm_gated_ref(a, b, bias=None, *, act="silu", alpha=1.0, leaky_slope=0.01):
    """(Y, Z) of ``gemm_gated`` in float64 from host arrays: Z = alpha * A @ B + bias (B's
    columns (gate, up) pairs), Y = act(Z[:, 0::2]) * Z[:, 1::2]."""
    _, z = gemm_bias_act_ref(a, b, bias, alpha=alpha)
    return activation(act, z[:, 0::2], leaky_slope) * z[:, 1::2], z


def gemm_gated_backward_ref(gy, a, b, bias=None, *, act="silu", alpha=1.0, leaky_slope=0.01):
    """(dA, dB, dBias) of ``gemm_gated`` in float64 from host arrays (dBias in the bias'
    shape)."""
    _, z = gemm_gated_ref(a, b, bias, act=act, alpha=alpha, leaky_slope=leaky_slope)
    gy = np.asarray(gy, np.float64)
    gate, up = z[:, 0::2], z[:, 1::2]
    dz = np.empty_like(z)
    dz[:, 0::2] = gy * up * activation_grad(act, gate, leaky_slope)
    dz[:, 1::2] = gy * activation(act, gate, leaky_slope)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d_bias = None if bias is None else dz.sum(axis=0).reshape(np.shape(bias))
    return alpha * dz @ b.T, alpha * a.T @ dz, d_bias
