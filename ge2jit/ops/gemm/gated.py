"""The gated GEMM (a gated linear unit: SwiGLU, GeGLU, ReGLU, GLU): ``Y = act(A @ B_gate +
b_gate) * (A @ B_up + b_up)`` as one GEMM over a weight that holds both projections, its
columns interleaved in (gate, up) pairs, with an epilogue that writes Y (half the GEMM's
columns) once; its backward; the helpers that build and split the interleaved weight."""

from __future__ import annotations

from ...errors import ArgumentValueError
from ...jit.fastlaunch import MISS
from .backward import Gradients, backward, compiled_backward
from .op import explain_call, gemm_glu

__all__ = ["gemm_gated", "gemm_gated_backward", "interleave_gate_up", "split_gate_up",
           "explain_gated", "GATED_ACTS", "GATED_NEEDS"]

#: The activations of the gate, by the names of the units they make (any of gemm_bias_act's
#: activations works).
GATED_ACTS = {"silu": "SwiGLU", "gelu": "GeGLU", "gelu_tanh": "GeGLU (tanh)", "relu": "ReGLU",
              "sigmoid": "GLU"}
GATED_NEEDS = ("a", "b", "bias")


def interleave_gate_up(gate, up, out=None):
    """The weight (or bias) of ``gemm_gated`` from its two halves: ``out[..., 0::2] = gate``,
    ``out[..., 1::2] = up``.

    Args:
        gate: a (K, N) weight (or an (N,) bias), CuPy array or PyTorch tensor.
        up: a (K, N) weight (or an (N,) bias) of gate's dtype and framework.
        out: optional (K, 2N) (or (2N,)) array to write; default a new C-contiguous one.

    Returns:
        The (K, 2N) (or (2N,)) interleaved array. ``b.T`` of it is the (2N, K) weight of a
        ``torch.nn.Linear(K, 2N)`` whose output rows alternate gate and up.
    """
    for name, x in (("gate", gate), ("up", up)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ArgumentValueError(f"{name}: expected a CuPy array or a PyTorch tensor, got "
                                     f"{type(x).__name__}")
        if len(x.shape) not in (1, 2):
            raise ArgumentValueError(f"{name}: expected a (K, N) weight or an (N,) bias, got "
                                     f"shape {tuple(x.shape)}")
    if tuple(up.shape) != tuple(gate.shape) or up.dtype != gate.dtype:
        raise ArgumentValueError(f"up: expected gate's shape {tuple(gate.shape)} and dtype "
                                 f"{gate.dtype}, got {tuple(up.shape)} and {up.dtype}")
    shape = (*gate.shape[:-1], 2 * gate.shape[-1])
    if out is None:
        out = _empty_like(gate, shape)
    elif tuple(out.shape) != shape or out.dtype != gate.dtype:
        raise ArgumentValueError(f"out: expected shape {shape} and dtype {gate.dtype}, got "
                                 f"{tuple(out.shape)} and {out.dtype}")
    out[..., 0::2] = gate
    out[..., 1::2] = up
    return out


def _empty_like(x, shape):
    """A new C-contiguous array of ``shape`` of ``x``'s type, device and framework (a PyTorch
    tensor, a CuPy array or a NumPy array)."""
    if hasattr(x, "new_empty"):   # torch.Tensor
        return x.new_empty(shape)
    if type(x).__module__.startswith("numpy"):
        import numpy as np

        return np.empty(shape, x.dtype)
    import cupy as cp

    with cp.cuda.Device(x.device.id):
        return cp.empty(shape, x.dtype)


def split_gate_up(b):
    """The (gate, up) halves of an interleaved weight or bias, as strided views (no copy):
    ``b[..., 0::2]``, ``b[..., 1::2]``."""
    if not hasattr(b, "shape") or len(b.shape) not in (1, 2) or b.shape[-1] % 2:
        raise ArgumentValueError(f"b: expected a (K, 2N) weight or a (2N,) bias, got "
                                 f"{getattr(b, 'shape', type(b).__name__)}")
    return b[..., 0::2], b[..., 1::2]


def gemm_gated(a, b, bias=None, *, act: str = "silu", alpha: float = 1.0,
               leaky_slope: float = 0.01, save_preact: bool = False, out=None, preact_out=None,
               out_dtype=None, precision=None, config=None, autotune: bool = False):
    """The gated GEMM: ``Y = act(Z[:, 0::2]) * Z[:, 1::2]`` with ``Z = alpha * A @ B + bias``,
    in one GEMM whose epilogue writes Y (N columns) once.

    ``b`` holds the gate and up projections of a gated linear unit in one (K, 2N) weight whose
    columns alternate: column ``2j`` is the gate's column ``j``, column ``2j + 1`` the up
    projection's (``interleave_gate_up(w_gate, w_up)`` builds it from two (K, N) weights;
    ``split_gate_up`` gives the halves back as views). Every thread of the GEMM kernels holds
    adjacent column pairs of its accumulators, so each output comes from one thread's
    registers: no second pass, and no (M, 2N) intermediate in memory.

    With ``act="silu"`` this is the SwiGLU of LLaMA-style MLPs; "gelu" and "gelu_tanh" make
    GeGLU, "relu" ReGLU, "sigmoid" the original GLU; any of ``gemm_bias_act``'s activations
    works ("none": a bilinear unit).

    Args:
        a: (M, K) array (float32, float16 or bfloat16; CuPy, PyTorch or any
            ``__cuda_array_interface__`` object), any layout ``gemm_bias_act`` takes.
        b: (K, 2N) interleaved weight of ``a``'s dtype, row- or column-major (a (2N, K)
            ``nn.Linear`` weight read as ``w.T`` is column-major: no copy).
        bias: None, or a (2N,) (or (1, 2N)) bias interleaved as ``b``'s columns (``a``'s dtype
            or float32).
        act: the gate's activation.
        alpha: scale of ``A @ B``.
        leaky_slope: slope of "leaky_relu".
        save_preact: also return Z, the (M, 2N) pre-activations (interleaved as ``b``), for
            the backward.
        out: optional (M, N) Y to write, row-major, of Y's dtype.
        preact_out: optional (M, 2N) Z to write, row-major, of Y's dtype.
        out_dtype: as ``gemm_bias_act``'s.
        precision: as ``gemm_bias_act``'s.
        config: as ``gemm_bias_act``'s (the configs are the GEMM's, for a GEMM of
            (M, 2N, K)).
        autotune: as ``gemm_bias_act``'s.

    Returns:
        ``Y`` (M, N), or ``(Y, Z)`` with ``save_preact``.

    Raises:
        ArgumentValueError: as ``gemm_bias_act``, and for a ``b`` with an odd number of
            columns or a bias that is not per column.
    """
    return gemm_glu(a, b, bias, act, alpha, leaky_slope, save_preact, out, preact_out,
                    out_dtype, precision, config, autotune)


def explain_gated(a, b, bias=None, *, act: str = "silu", alpha: float = 1.0,
                  leaky_slope: float = 0.01, save_preact: bool = False, out=None,
                  preact_out=None, out_dtype=None, precision=None, config=None,
                  autotune: bool = False):
    """Which configuration and kernels ``gemm_gated`` would use for these arguments, and
    why. Compiles the kernels; launches nothing."""
    return explain_call(True, a, b, bias, act, None, alpha, 0.0, leaky_slope, save_preact, out,
                        preact_out, out_dtype, precision, config, autotune)


def gemm_gated_backward(gy, a, b, bias=None, *, act: str = "silu", z=None, alpha: float = 1.0,
                        leaky_slope: float = 0.01, needs=GATED_NEEDS, precision=None,
                        a_act: str | None = None, a_z=None, a_leaky_slope: float = 0.01,
                        a_bias=None, db_dtype=None) -> Gradients:
    """Gradients of ``gemm_gated`` given ``gy`` = dL/dY.

    One elementwise pass over gY (M, N) and Z (M, 2N) forms dZ in float32, for each pair:
    ``d(gate) = gY * up * act'(gate)``, ``d(up) = gY * act(gate)``, stored interleaved as Z in
    the inputs' dtype, with dBias's column sums reduced in the same pass (in a fixed order).
    Then ``dA = alpha * dZ @ B.T`` and ``dB = alpha * A.T @ dZ`` are two GEMMs (dB interleaved
    as B, in B's layout).

    Args:
        gy: (M, N) gradient of Y, in the inputs' dtype or float32.
        a: as given to the forward.
        b: as given to the forward.
        bias: as given to the forward.
        act: as given to the forward.
        alpha: as given to the forward.
        leaky_slope: as given to the forward.
        precision: as given to the forward.
        z: the forward's (M, 2N) pre-activations (``save_preact=True``); without it Z is
            recomputed by a GEMM (float32, one more GEMM's time, no memory kept).
        needs: the gradients to compute, of "a", "b", "bias".
        a_act: as ``gemm_bias_act_backward``'s: dA formed as the gradient of the
            pre-activation of the layer that produced A.
        a_z: as ``gemm_bias_act_backward``'s.
        a_leaky_slope: as ``gemm_bias_act_backward``'s.
        a_bias: as ``gemm_bias_act_backward``'s.
        db_dtype: dB's dtype, None (the inputs') or float32, as ``gemm_bias_act_backward``'s.

    Returns:
        ``Gradients(a, b, bias, c=None, a_bias)``.
    """
    if isinstance(needs, (tuple, list, set, frozenset)) and "c" in needs:
        raise ArgumentValueError(f"needs: expected names of {', '.join(GATED_NEEDS)} (a gated "
                                 f"GEMM has no C), got {needs!r}")
    grads = compiled_backward(True, gy, a, b, bias, None, z, None, act, alpha, 0.0, leaky_slope,
                              needs, precision, a_act, a_z, a_leaky_slope, a_bias, None,
                              db_dtype)
    if grads is not MISS:
        return Gradients(*grads)
    return backward(True, gy, a, b, bias, act, z, None, None, alpha, 0.0, leaky_slope, needs,
                    precision, a_act, a_z, a_leaky_slope, a_bias, None, db_dtype)
