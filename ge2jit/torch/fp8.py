"""Linear layers on the FP8 tensor cores (Hopper): ``linear_fp8`` quantizes its input per
token (or per tensor) and its weight per output channel (``quantize_fp8``) and runs the FP8
GEMM with both scales, the bias and the activation in its epilogue (``gemm_bias_act``);
``ge2jit.torch.Linear(..., fp8="e4m3")`` runs it. The backward runs
ge2jit's fused GEMM backward in the layer's own precision (FP8 in the forward only).
Composed here, above the ops, from their public functions; ``Linear`` finds it here when
its FP8 mode runs."""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.gemm import gemm_bias_act as _gemm
from ..ops.quantize.torch_ops import quantize_fp8
from ..runtime.dtypes import as_fp8
from ..runtime.torchlib import (
    absent,
    autocast_dtype,
    cast,
    define_op,
    eager_function,
    needs_grad,
    precision_for,
    register_autograd,
    register_fake,
    traced,
)


def _linear_fp8(a: Tensor, b: Tensor, bias: Tensor | None, act: str, leaky_slope: float,
                save_preact: bool, fmt: str, per_token: bool, qw: Tensor | None = None,
                sw: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(Y, Z)`` of ``act(A @ B + bias)`` in 8 bits: A quantized per row (``per_token``) or
    per tensor, B per column (``b.t()`` per row: a linear layer's weight per output channel;
    ``qw``, ``sw``: that quantization, made already), then the FP8 GEMM; Y (and Z with
    ``save_preact``, else empty) of A's type."""
    qa, sa = quantize_fp8(a, fmt, per_token)
    if qw is None:
        qw, sw = quantize_fp8(b.t(), fmt, True)
    out = _gemm(qa, qw.t(), bias, act=act, leaky_slope=leaky_slope, save_preact=save_preact,
                scale_a=sa, scale_b=sw, out_dtype=str(a.dtype).removeprefix("torch."))
    y, z = out if save_preact else (out, absent(out))
    return y, z


linear_fp8_op = define_op("linear_fp8", _linear_fp8)


@register_fake(linear_fp8_op)
def _(a, b, bias, act, leaky_slope, save_preact, fmt, per_token, qw=None, sw=None):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "a, b: expected 2-D tensors")
    torch._check(a.shape[1] == b.shape[0], lambda: f"a, b: K mismatch, {a.shape} @ {b.shape}")
    y = a.new_empty((a.shape[0], b.shape[1]))
    return y, (torch.empty_like(y) if save_preact else absent(y))


def _setup(ctx, inputs, output):
    a, b, bias, act, leaky_slope, save_preact, *_ = inputs
    y, z = output
    ctx.mark_non_differentiable(z)
    ctx.set_materialize_grads(False)
    ctx.scalars = (act, leaky_slope)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a, b, bias, z if save_preact else None)


def _grads(ctx, gy):
    """The gradients of a, b and bias: ge2jit's GEMM backward on the unquantized a and b (in
    their precision; float32 master weights of 16-bit a get a float32 gradient), act' from
    the forward's Z."""
    if gy is None:
        return (None,) * 10
    a, b, bias, z = ctx.saved_tensors
    act, leaky_slope = ctx.scalars
    needs = [bool(n) for n in ctx.needs_input_grad[:3]] + [False]
    needs[2] = needs[2] and ctx.has_bias
    if act != "none" and z is None:
        raise RuntimeError("linear_fp8: the forward kept no pre-activation for the backward")
    grads = torch.ops.ge2jit.gemm_bias_act_backward(
        gy, a, b, bias, None, z if act != "none" else None, None, act, 1.0, 0.0, leaky_slope,
        precision_for(a.dtype, None), needs, None)
    return (*(g if n else None for g, n in zip(grads[:3], needs)), *(None,) * 7)


register_autograd(linear_fp8_op, lambda ctx, gy, gz: _grads(ctx, gy), setup_context=_setup)


_LinearFp8Function = eager_function("_LinearFp8Function", _linear_fp8, _setup,
                                    lambda ctx, gy, gz: _grads(ctx, gy))


def linear_fp8(a: Tensor, b: Tensor, bias: Tensor | None = None, *, act: str = "none",
               fmt="e4m3", per_token: bool = True, leaky_slope: float = 0.01,
               save_preact: bool = False,
               weight_fp8: tuple[Tensor, Tensor] | None = None):
    """``act(a @ b + bias)`` on the FP8 tensor cores (Hopper): ``a`` (M, K) quantized per row
    (``per_token``; else per tensor), ``b`` (K, N) per column, ``b`` being a linear layer's
    ``weight.t()`` (so per output channel), both with dynamic scales (``quantize_fp8``); the
    scales, the bias and the activation applied in the GEMM's epilogue; Y of a's type.
    ``weight_fp8``: ``(q, scale)`` of ``b.t()`` quantized per row already (an inference
    layer's cached weights). ``fmt``: "e4m3" (the default) or "e5m2".

    Differentiable: the backward runs ge2jit's fused GEMM backward on the unquantized a and
    b in their own precision, act' from the forward's pre-activation, so training sees FP8
    in the forward only. A custom op (``torch.ops.ge2jit.linear_fp8``) under
    ``torch.compile``; inside ``torch.autocast`` a is cast to the region's type first.
    Returns Y, or ``(Y, Z)`` with ``save_preact``."""
    dtype = autocast_dtype()
    a = cast(a, dtype)
    if bias is not None and bias.dtype != torch.float32:
        bias = cast(bias, dtype)
    name = as_fp8(fmt).value
    grad = needs_grad(a, b, bias)
    keep_z = bool(save_preact) or (grad and act != "none")
    qw, sw = weight_fp8 if weight_fp8 is not None else (None, None)
    args = (a, b, bias, act, float(leaky_slope), keep_z, name, bool(per_token), qw, sw)
    if traced(a, b, bias, names=("a", "b", "bias")):
        y, z = linear_fp8_op(*args)
    elif grad:
        y, z = _LinearFp8Function.fast_apply(*args)
    else:
        y, z = _linear_fp8(*args)
    return (y, z) if save_preact else y


def quantized_weight(weight: Tensor, fmt) -> tuple[Tensor, Tensor]:
    """``(q, scale)`` of a linear layer's weight (out_features, in_features) quantized per
    output channel: what ``linear_fp8`` takes as ``weight_fp8``."""
    return quantize_fp8(weight.detach(), fmt, True)
