"""gemm_bias_act as PyTorch custom ops (``torch.ops.ge2jit.*``): the forward, its fused
backward, and a chained stack of layers (an MLP whose backward gates each dA by the previous
layer's act' in its epilogue). Each has a fake implementation (shapes and types, for
``torch.compile`` and meta tensors); the forwards are differentiable through
``register_autograd``, their backwards being the backward ops. The functions users call
(``gemm_bias_act``, ``mlp``) run the same implementations through ``torch.autograd.Function``
classes in eager mode (less host time) and the custom ops where the call is traced. Imported
by ``ge2jit.torch``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from ...jit.fastlaunch import MISS
from ...runtime.torchlib import (
    Differentiable,
    absent,
    autocast_dtype,
    cast,
    define_op,
    eager_function,
    fast_apply,
    is_master,
    kept_cast,
    lowered,
    lowered_like,
    needs_grad,
    precision_for,
    register_autograd,
    register_fake,
    traced,
    weight_cast,
)
from . import chain as _stack
from .backward import gemm_bias_act_backward as _backward
from .epilogue import ACT_NAMES, ACTS_FROM_Y, Act
from .gated import gemm_gated as _gated_forward
from .gated import gemm_gated_backward as _gated_backward
from .op import gemm_bias_act as _forward
from .problem import layout_by_strides
from .spec import Layout

NEEDS = ("a", "b", "bias", "c")


def _source_kind(act: str, leaky_slope: float) -> str:
    """Where the backward takes act' from: "none" (act' is 1), "y" (the output) or "z" (the
    pre-activation, saved by the forward)."""
    a = ACT_NAMES.get(act)
    if a is Act.NONE:
        return "none"
    if a in ACTS_FROM_Y and not (a is Act.LEAKY_RELU and leaky_slope < 0):
        return "y"
    return "z"


def _gradient_like(x: Tensor, shape) -> Tensor:
    """A new tensor of ``shape`` (and ``x``'s type) laid out as the backward lays out the
    gradient of ``x``: a column-major 2-D operand gets a column-major gradient."""
    if x.dim() == 2 and x.numel():
        found = layout_by_strides(x.shape[0], x.shape[1], x.stride(0), x.stride(1))
        if found is not None and found[0] is Layout.COL:
            return x.new_empty((shape[1], shape[0])).t()
    return x.new_empty(shape)


def _db_dtype(b: Tensor, a: Tensor) -> str | None:
    """dB's type for the core backward: float32 for master weights, else the inputs'."""
    return "float32" if is_master(b, a) else None


# --- the forward ---------------------------------------------------------------------------

def _gemm(a: Tensor, b: Tensor, bias: Tensor | None, c: Tensor | None, act: str,
          alpha: float, beta: float, leaky_slope: float, precision: str | None,
          save_preact: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(Y, Z, B16)`` of ``ge2jit.gemm_bias_act`` (Z empty without ``save_preact``). ``b``
    may be float32 master weights of 16-bit ``a``: the GEMM reads them cast to ``a``'s type,
    B16, which the backward reads (empty otherwise)."""
    low = lowered(b, a)
    out = _forward(a, low, bias, act=act, c=c, alpha=alpha, beta=beta, leaky_slope=leaky_slope,
                   save_preact=save_preact, precision=precision)
    y, z = out if save_preact else (out, absent(out))
    return y, z, kept_cast(b, low, a)


gemm_bias_act_op = define_op("gemm_bias_act", _gemm)


@register_fake(gemm_bias_act_op)
def _(a, b, bias, c, act, alpha, beta, leaky_slope, precision, save_preact):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "a, b: expected 2-D tensors")
    torch._check(a.shape[1] == b.shape[0], lambda: f"a, b: K mismatch, {a.shape} @ {b.shape}")
    y = a.new_empty((a.shape[0], b.shape[1]))
    return y, (torch.empty_like(y) if save_preact else absent(y)), lowered_like(b, a)


def _forward_setup(ctx, inputs, output):
    a, b, bias, c, act, alpha, beta, leaky_slope, precision, save_preact = inputs
    y, z, low = output
    ctx.mark_non_differentiable(z, low)
    ctx.set_materialize_grads(False)   # Z has no gradient: no zeros made for it
    kind = _source_kind(act, leaky_slope)
    src = z if save_preact and kind == "z" else y if kind == "y" else None
    ctx.kind = kind if src is not None or kind == "none" else "recompute"
    ctx.scalars = (act, alpha, beta, leaky_slope, precision)
    ctx.has = (bias is not None, c is not None)
    ctx.save_for_backward(a, b, bias, c, src, low)


def _gemm_grads(ctx, gy, backward):
    """The gradients of ``_gemm``'s inputs, by ``backward`` (the backward op, or in eager mode
    its implementation)."""
    if gy is None:
        return (None,) * 10
    a, b, bias, c, src, low = ctx.saved_tensors
    act, alpha, beta, leaky_slope, precision = ctx.scalars
    needs = [bool(n) for n in ctx.needs_input_grad[:4]]
    needs[2] = needs[2] and ctx.has[0]
    needs[3] = needs[3] and ctx.has[1]
    z = src if ctx.kind == "z" else None
    y = src if ctx.kind == "y" else None
    grads = backward(gy, a, b, bias, c, z, y, act, alpha, beta, leaky_slope, precision, needs,
                     low)
    return (*(g if n else None for g, n in zip(grads, needs)), None, None, None, None, None,
            None)


def _gemm_autograd(ctx, gy, gz, glow):
    return _gemm_grads(ctx, gy, torch.ops.ge2jit.gemm_bias_act_backward)


register_autograd(gemm_bias_act_op, _gemm_autograd, setup_context=_forward_setup)


# --- the backward --------------------------------------------------------------------------

def _gemm_backward(gy: Tensor, a: Tensor, b: Tensor, bias: Tensor | None, c: Tensor | None,
                   z: Tensor | None, y: Tensor | None, act: str, alpha: float, beta: float,
                   leaky_slope: float, precision: str | None, needs: list[bool],
                   b16: Tensor | None = None) -> list[Tensor]:
    """``[dA, dB, dBias, dC]`` of ``ge2jit.gemm_bias_act_backward`` (empty where ``needs``,
    over (a, b, bias, c), is false). ``b`` float32 master weights of 16-bit ``a``: the GEMMs
    read ``b16``, the forward's cast of them (cast again when it is absent), and dB is
    float32."""
    names = tuple(n for n, want in zip(NEEDS, needs) if want)
    g = _backward(gy, a, lowered(b, a, b16), bias, act=act, z=z, y=y, c=c, alpha=alpha,
                  beta=beta, leaky_slope=leaky_slope, needs=names, precision=precision,
                  db_dtype=_db_dtype(b, a))
    return [x if x is not None else absent(gy) for x in (g.a, g.b, g.bias, g.c)]


gemm_bias_act_backward_op = define_op("gemm_bias_act_backward", _gemm_backward)


@register_fake(gemm_bias_act_backward_op)
def _(gy, a, b, bias, c, z, y, act, alpha, beta, leaky_slope, precision, needs, b16=None):
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    shapes = ((a, (m, k)), (b, (k, n)), (bias, None), (c, None))
    out = []
    for (x, shape), want in zip(shapes, needs):
        if not want or x is None:
            out.append(absent(gy))
        elif shape is None:
            out.append(torch.empty_like(x, memory_format=torch.contiguous_format))
        else:
            out.append(_gradient_like(x, shape) if x is b else x.new_empty(shape))
    return out


# --- the gated GEMM ------------------------------------------------------------------------

def _gated(a: Tensor, b: Tensor, bias: Tensor | None, act: str, alpha: float,
           leaky_slope: float, precision: str | None, save_preact: bool
           ) -> tuple[Tensor, Tensor, Tensor]:
    """``(Y, Z, B16)`` of ``ge2jit.gemm_gated`` (Z empty without ``save_preact``; master
    weights ``b`` and their cast B16 as ``_gemm``'s)."""
    low = lowered(b, a)
    out = _gated_forward(a, low, bias, act=act, alpha=alpha, leaky_slope=leaky_slope,
                         save_preact=save_preact, precision=precision)
    y, z = out if save_preact else (out, absent(out))
    return y, z, kept_cast(b, low, a)


gemm_gated_op = define_op("gemm_gated", _gated)


@register_fake(gemm_gated_op)
def _(a, b, bias, act, alpha, leaky_slope, precision, save_preact):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "a, b: expected 2-D tensors")
    torch._check(a.shape[1] == b.shape[0], lambda: f"a, b: K mismatch, {a.shape} @ {b.shape}")
    torch._check(b.shape[1] % 2 == 0, lambda: f"b: expected (K, 2N), got {tuple(b.shape)}")
    z = a.new_empty((a.shape[0], b.shape[1]))
    return (a.new_empty((a.shape[0], b.shape[1] // 2)), (z if save_preact else absent(z)),
            lowered_like(b, a))


def _gated_setup(ctx, inputs, output):
    a, b, bias, act, alpha, leaky_slope, precision, save_preact = inputs
    y, z, low = output
    ctx.mark_non_differentiable(z, low)
    ctx.set_materialize_grads(False)
    ctx.scalars = (act, alpha, leaky_slope, precision)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a, b, bias, z if save_preact else None, low)


def _gated_grads(ctx, gy, backward):
    """The gradients of ``_gated``'s inputs, by ``backward`` (the backward op, or in eager
    mode its implementation)."""
    if gy is None:
        return (None,) * 8
    a, b, bias, z, low = ctx.saved_tensors
    act, alpha, leaky_slope, precision = ctx.scalars
    needs = [bool(n) for n in ctx.needs_input_grad[:3]]
    needs[2] = needs[2] and ctx.has_bias
    grads = backward(gy, a, b, bias, z, act, alpha, leaky_slope, precision, needs, low)
    return (*(g if n else None for g, n in zip(grads, needs)), None, None, None, None, None)


def _gated_autograd(ctx, gy, gz, glow):
    return _gated_grads(ctx, gy, torch.ops.ge2jit.gemm_gated_backward)


register_autograd(gemm_gated_op, _gated_autograd, setup_context=_gated_setup)


def _gated_backward_impl(gy: Tensor, a: Tensor, b: Tensor, bias: Tensor | None,
                         z: Tensor | None, act: str, alpha: float, leaky_slope: float,
                         precision: str | None, needs: list[bool], b16: Tensor | None = None
                         ) -> list[Tensor]:
    """``[dA, dB, dBias]`` of ``ge2jit.gemm_gated_backward`` (empty where ``needs``, over
    (a, b, bias), is false; master weights ``b`` and their cast ``b16`` as in
    ``gemm_bias_act_backward``)."""
    names = tuple(n for n, want in zip(("a", "b", "bias"), needs) if want)
    g = _gated_backward(gy, a, lowered(b, a, b16), bias, act=act, z=z, alpha=alpha,
                        leaky_slope=leaky_slope, needs=names, precision=precision,
                        db_dtype=_db_dtype(b, a))
    return [x if x is not None else absent(gy) for x in (g.a, g.b, g.bias)]


gemm_gated_backward_op = define_op("gemm_gated_backward", _gated_backward_impl)


@register_fake(gemm_gated_backward_op)
def _(gy, a, b, bias, z, act, alpha, leaky_slope, precision, needs, b16=None):
    out = []
    for x, want in zip((a, b, bias), needs):
        if not want or x is None:
            out.append(absent(gy))
        elif x is b:
            out.append(_gradient_like(b, tuple(b.shape)))
        else:
            out.append(x.new_empty(x.shape) if x is a
                       else torch.empty_like(x, memory_format=torch.contiguous_format))
    return out


# --- a gated MLP with a chained backward ---------------------------------------------------

def _gated_mlp(x: Tensor, gate_up: Tensor, gate_up_bias: Tensor | None, down: Tensor,
               down_bias: Tensor | None, act: str, precision: str | None, save: bool
               ) -> list[Tensor]:
    """``[Y, H, Z, gate_up16, down16]`` of ``Y = H @ down.T + down_bias`` with ``H =
    gemm_gated(x, gate_up.T, gate_up_bias)`` (``gate_up`` of (2 * hidden, d), rows
    alternating gate and up; ``Z`` its (M, 2 * hidden) pre-activations; the weights' casts
    where they are float32 master weights of a 16-bit ``x``, as ``_gemm``'s, else empty);
    without ``save`` only ``[Y]``."""
    gate_up16, down16 = lowered(gate_up, x), lowered(down, x)
    out = _gated_forward(x, gate_up16.t(), gate_up_bias, act=act, save_preact=save,
                         precision=precision)
    h, z = out if save else (out, None)
    y = _forward(h, down16.t(), down_bias, precision=precision)
    if not save:
        return [y]
    return [y, h, z, kept_cast(gate_up, gate_up16, x), kept_cast(down, down16, x)]


gated_mlp_op = define_op("gated_mlp", _gated_mlp)


@register_fake(gated_mlp_op)
def _(x, gate_up, gate_up_bias, down, down_bias, act, precision, save):
    m = x.shape[0]
    y = x.new_empty((m, down.shape[0]))
    if not save:
        return [y]
    return [y, x.new_empty((m, down.shape[1])), x.new_empty((m, gate_up.shape[0])),
            lowered_like(gate_up, x), lowered_like(down, x)]


def _gated_mlp_setup(ctx, inputs, output):
    x, gate_up, gate_up_bias, down, down_bias, act, precision, save = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    ctx.scalars = (act, precision)
    ctx.save_for_backward(x, gate_up, gate_up_bias, down, down_bias, *output[1:])


def _gated_mlp_grads(ctx, gy, backward, gated):
    """The gradients of ``_gated_mlp``'s inputs by ``backward`` (the backward op, or in eager
    mode its implementation). Called without ``save``, the forward kept no H and Z: ``gated``
    (the gated GEMM's op or implementation) recomputes them."""
    if gy is None:
        return (None,) * 8
    x, gate_up, gate_up_bias, down, down_bias, *saved = ctx.saved_tensors
    act, precision = ctx.scalars
    if saved:
        h, z, gate_up16, down16 = saved
    else:   # (the gated GEMM's cast of master weights kept; down's cast again)
        h, z, low = gated(x, gate_up.t(), gate_up_bias, act, 1.0, 0.01, precision, True)
        gate_up16, down16 = low.t(), None
    gx, g_gate_up, g_gate_up_bias, g_down, g_down_bias = backward(
        gy, x, gate_up, gate_up_bias, down, down_bias, h, z, act, precision,
        bool(ctx.needs_input_grad[0]), gate_up16, down16)
    return (gx if ctx.needs_input_grad[0] else None, g_gate_up,
            g_gate_up_bias if gate_up_bias is not None else None, g_down,
            g_down_bias if down_bias is not None else None, None, None, None)


def _gated_mlp_autograd(ctx, grads):
    return _gated_mlp_grads(ctx, grads[0], torch.ops.ge2jit.gated_mlp_backward,
                            torch.ops.ge2jit.gemm_gated)


register_autograd(gated_mlp_op, _gated_mlp_autograd, setup_context=_gated_mlp_setup)


def _gated_mlp_backward(gy: Tensor, x: Tensor, gate_up: Tensor, gate_up_bias: Tensor | None,
                        down: Tensor, down_bias: Tensor | None, h: Tensor, z: Tensor, act: str,
                        precision: str | None, needs_x: bool, gate_up16: Tensor | None = None,
                        down16: Tensor | None = None) -> list[Tensor]:
    """``[dX, d gate_up, d gate_up_bias, d down, d down_bias]`` of ``gated_mlp`` (empty where
    there is no such input or dX is not wanted). Chained: the down projection's dA GEMM
    writes the gated unit's dZ (``a_glu``) in its epilogue, so no pass forms it; the unit's
    bias gradient is the column sums of dZ; then dX and d gate_up are the two GEMMs of dZ.
    Master weights (float32 of a 16-bit ``x``) are read as their casts ``gate_up16`` and
    ``down16`` (cast again where absent) and get float32 gradients."""
    grads = _gated_chain_backward(gy, x, gate_up, gate_up_bias, down, down_bias, h, z, act,
                                  precision, needs_x, gate_up16, down16)
    return [g if g is not None else absent(gy) for g in grads]


def _gated_chain_backward(gy, x, gate_up, gate_up_bias, down, down_bias, h, z, act, precision,
                          needs_x, gate_up16, down16) -> tuple:
    """``_gated_mlp_backward``'s gradients, None where there is no such input or dX is not
    wanted."""
    needs = ("a", "b", "bias") if down_bias is not None else ("a", "b")
    g = _backward(gy, h, lowered(down, x, down16).t(), down_bias, needs=needs,
                  precision=precision, a_glu=act, a_z=z, a_bias=gate_up_bias,
                  db_dtype=_db_dtype(down, x))
    g2 = _backward(g.a, x, lowered(gate_up, x, gate_up16).t(), None,
                   needs=("a", "b") if needs_x else ("b",), precision=precision,
                   db_dtype=_db_dtype(gate_up, x))
    return (g2.a if needs_x else None), g2.b.t(), g.a_bias, g.b.t(), g.bias


gated_mlp_backward_op = define_op("gated_mlp_backward", _gated_mlp_backward)


@register_fake(gated_mlp_backward_op)
def _(gy, x, gate_up, gate_up_bias, down, down_bias, h, z, act, precision, needs_x,
      gate_up16=None, down16=None):
    def like(t):
        return absent(gy) if t is None else torch.empty_like(
            t, memory_format=torch.contiguous_format)

    return [x.new_empty(x.shape) if needs_x else absent(gy), like(gate_up), like(gate_up_bias),
            like(down), like(down_bias)]


# --- a gated MLP on two weights (a model's gate and up projections) -----------------------

def _alike(w_gate: Tensor, w_up: Tensor) -> bool:
    """Two non-empty 2-D weights of one shape, type and device: a gate and up pair."""
    return (w_gate.dim() == 2 and w_gate.shape == w_up.shape and w_gate.dtype == w_up.dtype
            and w_gate.device == w_up.device and w_gate.numel() > 0)


def gate_up_view(w_gate: Tensor, w_up: Tensor) -> Tensor | None:
    """The (2 * hidden, d) weight with rows alternating gate and up that ``gated_mlp`` takes,
    as a view over ``w_gate``'s and ``w_up``'s own memory, where it is one: up's rows right
    after gate's in one storage (each of (hidden, d) with strides (2 d, 1), up's first element
    d after gate's: what :func:`pair_gate_up_` makes). Else None."""
    if not _alike(w_gate, w_up):
        return None
    n, d = w_gate.shape
    if w_gate.stride() != (2 * d, 1) or w_up.stride() != (2 * d, 1):
        return None
    if (w_up.untyped_storage().data_ptr() != w_gate.untyped_storage().data_ptr()
            or w_up.storage_offset() != w_gate.storage_offset() + d):
        return None
    return w_gate.as_strided((2 * n, d), (d, 1), w_gate.storage_offset())


def _gate_up_of(w_gate: Tensor, w_up: Tensor) -> Tensor:
    """``gate_up_view``, or where the weights are apart their rows interleaved (a copy)."""
    view = gate_up_view(w_gate, w_up)
    return view if view is not None else torch.stack((w_gate, w_up), 1).flatten(0, 1)


def pair_gate_up_(w_gate: torch.nn.Parameter, w_up: torch.nn.Parameter) -> bool:
    """Put two (hidden, d) weights in one storage, rows alternating, in place: each keeps its
    ``Parameter`` object, values and shape (its ``data`` becomes a strided view), so modules,
    state dicts and optimizers made before keep working, and ``gated_mlp_pair`` then reads
    them as one weight without a copy. False (nothing changed) where they are already paired
    or cannot be (other shapes, types or devices, or tensor subclasses such as DTensor)."""
    if (not _alike(w_gate, w_up) or gate_up_view(w_gate, w_up) is not None
            or any(type(w.data) is not torch.Tensor for w in (w_gate, w_up))):
        return False   # (a subclass's data, such as FSDP's sharded DTensor, is left as it is)
    with torch.no_grad():
        both = torch.stack((w_gate.detach(), w_up.detach()), 1)   # (hidden, 2, d)
    w_gate.data, w_up.data = both[:, 0], both[:, 1]
    return True


def _gated_mlp_pair(x: Tensor, w_gate: Tensor, w_up: Tensor, down: Tensor, act: str,
                    precision: str | None, save: bool
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``_gated_mlp`` of ``_gate_up_of(w_gate, w_up)`` without biases: ``(Y, H, Z, gate_up16,
    down16)``, all but Y empty without ``save`` (a tuple: the eager Function's outputs)."""
    out = _gated_mlp(x, _gate_up_of(w_gate, w_up), None, down, None, act, precision, save)
    return tuple(out) if save else (out[0], *(absent(x) for _ in range(4)))


def _gated_mlp_pair_fake(x, w_gate, w_up, down, act, precision, save):
    m, n = x.shape[0], w_gate.shape[0]
    y = x.new_empty((m, down.shape[0]))
    if not save:
        return (y, *(absent(x) for _ in range(4)))
    gate_up = w_gate.new_empty((2 * n, w_gate.shape[1]))
    return (y, x.new_empty((m, down.shape[1])), x.new_empty((m, 2 * n)),
            lowered_like(gate_up, x), lowered_like(down, x))


def _gated_mlp_pair_setup(ctx, inputs, output):
    x, w_gate, w_up, down, act, precision, save = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    ctx.scalars = (act, precision)
    ctx.save_for_backward(x, w_gate, w_up, down, *output[1:])


def _gated_mlp_pair_grads(ctx, gy, *unused, backward):
    if gy is None:
        return (None,) * 7
    x, w_gate, w_up, down, h, z, gate_up16, down16 = ctx.saved_tensors
    act, precision = ctx.scalars
    gx, g_gate, g_up, g_down = backward(gy, x, w_gate, w_up, down, h, z, act, precision,
                                        bool(ctx.needs_input_grad[0]), gate_up16, down16)
    return (gx if ctx.needs_input_grad[0] else None, g_gate, g_up, g_down, None, None, None)


def _gated_mlp_pair_backward(gy: Tensor, x: Tensor, w_gate: Tensor, w_up: Tensor,
                             down: Tensor, h: Tensor, z: Tensor, act: str,
                             precision: str | None, needs_x: bool,
                             gate_up16: Tensor | None = None,
                             down16: Tensor | None = None) -> list[Tensor]:
    """``[dX, d w_gate, d w_up, d down]`` of ``gated_mlp_pair`` (dX empty where not wanted):
    ``_gated_mlp_backward``'s chain, the interleaved weight's gradient split in two. H and Z
    empty (a forward without ``save``) are made again."""
    if h.numel() == 0 and x.shape[0] > 0 and w_gate.shape[0] > 0:
        _, h, z, gate_up16, down16 = _gated_mlp_pair(x, w_gate, w_up, down, act, precision,
                                                     True)
    gx, g_gate_up, _, g_down, _ = _gated_chain_backward(
        gy, x, _gate_up_of(w_gate, w_up), None, down, None, h, z, act, precision, needs_x,
        gate_up16, down16)
    return [gx if gx is not None else absent(gy), g_gate_up[0::2].contiguous(),
            g_gate_up[1::2].contiguous(), g_down]


def _gated_mlp_pair_backward_fake(gy, x, w_gate, w_up, down, h, z, act, precision, needs_x,
                                  gate_up16=None, down16=None):
    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    return [x.new_empty(x.shape) if needs_x else absent(gy), like(w_gate), like(w_up),
            like(down)]


_GATED_MLP_PAIR = Differentiable(
    "gated_mlp_pair", _gated_mlp_pair, fake=_gated_mlp_pair_fake,
    setup=_gated_mlp_pair_setup, grads=_gated_mlp_pair_grads,
    backward=_gated_mlp_pair_backward, backward_fake=_gated_mlp_pair_backward_fake)


def gated_mlp_pair(x: Tensor, w_gate: Tensor, w_up: Tensor, down: Tensor, act: str = "silu",
                   *, precision: str | None = None) -> Tensor:
    """``down(act(x @ w_gate.T) * (x @ w_up.T))``, a model's gated MLP on its own weights
    (``nn.Linear``'s (hidden, d) gate and up, (d, hidden) down; no biases), as
    ``gated_mlp``: one gated GEMM, its chained backward (``torch.ops.ge2jit.gated_mlp_pair``);
    x of (..., d), its leading dimensions kept.
    The gated GEMM reads gate's and up's rows alternating: where :func:`pair_gate_up_` has
    put them so (``ge2jit.torch.compile`` and ``patch`` do, for Hugging Face's MLPs) that is
    a view of them, elsewhere a copy each call. Their gradients come back apart (each
    contiguous). Precision and autocast as in ``gemm_bias_act``."""
    dtype = autocast_dtype()
    x, down = cast(x, dtype), weight_cast(down, dtype)
    w_gate, w_up = weight_cast(w_gate, dtype), weight_cast(w_up, dtype)
    precision = precision_for(x.dtype, precision)
    save = needs_grad(x, w_gate, w_up, down)
    if x.dim() in (0, 2):   # (a 0-D x is refused by the op, in one line)
        return _GATED_MLP_PAIR(x, w_gate, w_up, down, act, precision, save)[0]
    y = _GATED_MLP_PAIR(x.reshape(-1, x.shape[-1]), w_gate, w_up, down, act, precision, save)[0]
    return y.reshape(*x.shape[:-1], down.shape[0])


# --- a chained stack of layers -------------------------------------------------------------

class _Chain(NamedTuple):
    """What a stack's non-tensor arguments fix, made once per pattern (``_chain``): each
    layer's activation, where its backward takes act' from ("z", "y" or "none",
    ``_source_kind``), and the index of its bias among the present biases (-1: none)."""

    names: tuple
    kinds: tuple
    bias_at: tuple
    leaky_slope: float


@functools.lru_cache(maxsize=256)
def _chain(acts: str, has_bias: tuple, layers: int, leaky_slope: float,
           present: int) -> _Chain:
    """The pattern of a stack of ``layers`` layers (``acts``: their comma-separated
    activations; ``has_bias``: which have a bias, ``present`` of which are given)."""
    names = tuple(acts.split(","))
    torch._check(len(names) == layers,
                 lambda: f"acts: expected {layers} comma-separated names, got {acts!r}")
    torch._check(len(has_bias) == layers and present == sum(has_bias),
                 lambda: f"biases: {present} given for {sum(has_bias)} layers with a bias")
    found, bias_at = 0, []
    for has in has_bias:
        bias_at.append(found if has else -1)
        found += bool(has)
    return _Chain(names, tuple(_source_kind(a, leaky_slope) for a in names), tuple(bias_at),
                  leaky_slope)


def _chain_of(acts: str, has_bias, layers: int, leaky_slope: float, present: int) -> _Chain:
    return _chain(acts, tuple(has_bias), layers, leaky_slope, present)


def _layers(x: Tensor, weights, biases, chain: _Chain, precision: str | None, save: bool):
    """The stack's forward: ``(Y, [H_1 .. H_L], [Z_l or None], [W16_l or None])`` (``biases``:
    the present ones; ``H_L`` is Y; Z kept with ``save`` where the backward takes act' from
    it; W16 the casts of master weights)."""
    found = _stack.call(x, weights, biases, chain, precision, save)
    if found is not MISS:   # the whole stack's launches by one compiled program
        y, hs, zs = found
        hs.append(y)
        return y, hs, zs, [None] * len(weights)
    h, hs, zs, lows, keep = x, [], [], [], []
    slope = chain.leaky_slope
    for w, at, act, kind in zip(weights, chain.bias_at, chain.names, chain.kinds):
        keep_z = save and kind == "z"
        low = lowered(w, x)
        out = _forward(h, low.t(), None if at < 0 else biases[at], act=act, leaky_slope=slope,
                       save_preact=keep_z, precision=precision)
        h, z = out if keep_z else (out, None)
        hs.append(h)
        zs.append(z)
        keep.append(keep_z)
        lows.append(low if low is not w else None)
    if all(w is None for w in lows):   # (master weights are cast per call: no program)
        _stack.store(x, weights, biases, chain, precision, save, [x, *hs[:-1]], keep)
    return h, hs, zs, lows


def _mlp(x: Tensor, weights: list[Tensor], biases: list[Tensor], has_bias: list[bool],
         acts: str, leaky_slope: float, precision: str | None, save: bool) -> list[Tensor]:
    """``[Y, H_1 .. H_{L-1}, Z_1 .. Z_L, W16_1 .. W16_L]`` of layers ``H_l = act_l(H_{l-1} @
    W_l.T + b_l)`` (``W_l``: (out, in), as ``nn.Linear`` stores it; ``biases``: those of the
    layers whose ``has_bias`` is true, in order); without ``save`` only ``[Y]``. ``Z_l`` is
    empty where the backward takes act' from the layer's output or needs none; ``W16_l`` is
    the cast of float32 master weights of a 16-bit ``x``, as ``_gemm``'s (else empty)."""
    chain = _chain_of(acts, has_bias, len(weights), leaky_slope, len(biases))
    h, hs, zs, lows = _layers(x, weights, biases, chain, precision, save)
    if not save:
        return [h]
    return [h, *hs[:-1], *(z if z is not None else absent(h) for z in zs),
            *(w if w is not None else absent(x) for w in lows)]


mlp_op = define_op("mlp", _mlp)


@register_fake(mlp_op)
def _(x, weights, biases, has_bias, acts, leaky_slope, precision, save):
    chain = _chain_of(acts, has_bias, len(weights), leaky_slope, len(biases))
    m, hs, zs = x.shape[0], [], []
    for w, kind in zip(weights, chain.kinds):
        h = x.new_empty((m, w.shape[0]))
        hs.append(h)
        zs.append(torch.empty_like(h) if save and kind == "z" else absent(h))
    if not save:
        return [hs[-1]]
    return [hs[-1], *hs[:-1], *zs, *(lowered_like(w, x) for w in weights)]


def _mlp_setup(ctx, inputs, output):
    x, weights, biases, has_bias, acts, leaky_slope, precision, save = inputs
    layers = len(weights)
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)   # only Y has a gradient: no zeros made for the others
    ctx.scalars = (acts, leaky_slope, precision, layers, len(biases))
    ctx.has_bias = list(has_bias)
    ctx.save_for_backward(x, *weights, *biases, *output)


def _mlp_grads(ctx, gy, backward, forward):
    """``(dX, [dW_l], [the biases' gradients])`` of ``_mlp``, by ``backward`` (the backward
    op). Called without ``save``, the forward kept only Y: ``forward`` (the op) recomputes the
    layers' outputs and Z."""
    acts, leaky_slope, precision, layers, nb = ctx.scalars
    saved = list(ctx.saved_tensors)
    x, weights, biases = saved[0], saved[1:1 + layers], saved[1 + layers:1 + layers + nb]
    rest = saved[1 + layers + nb:]
    if len(rest) == 1:   # only Y (saved, 3 * layers tensors): recompute the rest
        rest = forward(x, weights, biases, ctx.has_bias, acts, leaky_slope, precision, True)
    y, hs, zs, lows = (rest[0], rest[1:layers], rest[layers:2 * layers],
                       rest[2 * layers:3 * layers])
    if gy is None:   # Y's gradient: none reached it
        return None, [None] * layers, [None] * nb
    grads = backward(gy, x, weights, biases, ctx.has_bias, [*hs, y], zs, acts, leaky_slope,
                     precision, bool(ctx.needs_input_grad[0]), lows)
    gx, gws, gbs = grads[0], grads[1:1 + layers], grads[1 + layers:]
    return gx if ctx.needs_input_grad[0] else None, list(gws), list(gbs)


def _mlp_autograd(ctx, grads):   # grads: one per output of the list mlp returns
    return (*_mlp_grads(ctx, grads[0], torch.ops.ge2jit.mlp_backward, torch.ops.ge2jit.mlp),
            None, None, None, None, None)


register_autograd(mlp_op, _mlp_autograd, setup_context=_mlp_setup)


def _chain_backward(gy, x, weights, biases, outputs, zs, chain: _Chain, precision, needs_x,
                    lows):
    """``(dX or None, [dW_l], [dBias_l or None])`` of the stack (``biases``: the present ones;
    ``outputs``: H_1 .. H_L; ``zs``, ``lows``: per layer, None or empty where absent). Each
    layer's dA is formed by its GEMM's epilogue as the gradient of the previous layer's
    pre-activation, with that layer's bias gradient (``a_act``, ``a_z``, ``a_bias``)."""
    layers = len(weights)
    names, kinds, bias_at, slope = chain
    gws, gbs = [None] * layers, [None] * layers
    g, act = gy, names[-1]   # g: dL/dY of the last layer, then dL/dZ of each layer below
    kind = kinds[-1]
    src_z = zs[-1] if kind == "z" else None
    src_y = outputs[-1] if kind == "y" else None
    gx = None
    for i in range(layers - 1, -1, -1):
        at = bias_at[i]
        bias = None if at < 0 else biases[at]
        needs = ("b", "bias") if bias is not None and gbs[i] is None else ("b",)
        if i:
            needs += ("a",)
            prev_at = bias_at[i - 1]
            a_bias = None if prev_at < 0 else biases[prev_at]
            gate = dict(a_act=names[i - 1], a_leaky_slope=slope,
                        a_z=zs[i - 1] if kinds[i - 1] == "z" else None, a_bias=a_bias)
        else:
            gate = {}
            if needs_x:
                needs += ("a",)
        w = weights[i]
        grads = _backward(g, outputs[i - 1] if i else x, lowered(w, x, lows[i]).t(), bias, act=act,
                          leaky_slope=slope, needs=needs, precision=precision,
                          db_dtype=_db_dtype(w, x), z=src_z, y=src_y, **gate)
        gws[i] = grads.b.t()
        if "bias" in needs:
            gbs[i] = grads.bias
        if i:
            g, act, src_z, src_y = grads.a, "none", None, None
            if gate["a_bias"] is not None:
                gbs[i - 1] = grads.a_bias
        else:
            gx = grads.a
    return gx, gws, gbs


def _mlp_backward(gy: Tensor, x: Tensor, weights: list[Tensor], biases: list[Tensor],
                  has_bias: list[bool], outputs: list[Tensor], zs: list[Tensor], acts: str,
                  leaky_slope: float, precision: str | None, needs_x: bool,
                  lows: list[Tensor]) -> list[Tensor]:
    """``[dX, dW_1 .. dW_L, the biases' gradients]`` of ``mlp`` (dX empty when not
    wanted): ``outputs`` are the layers' outputs ``H_1 .. H_L``, ``zs`` the saved
    pre-activations, ``lows`` the casts of master weights (``mlp``'s; float32 master weights
    get float32 gradients). Each layer's dA is formed by its GEMM's epilogue as the gradient
    of the previous layer's pre-activation, with that layer's bias gradient (``a_act``,
    ``a_z``, ``a_bias``): the backward is the GEMMs and nearly nothing else."""
    chain = _chain_of(acts, has_bias, len(weights), leaky_slope, len(biases))
    gx, gws, gbs = _chain_backward(gy, x, weights, biases, outputs, zs, chain, precision,
                                   needs_x, lows)
    return [gx if gx is not None else absent(gy), *gws, *(b for b in gbs if b is not None)]


mlp_backward_op = define_op("mlp_backward", _mlp_backward)


@register_fake(mlp_backward_op)
def _(gy, x, weights, biases, has_bias, outputs, zs, acts, leaky_slope, precision, needs_x,
      lows):
    gws = [torch.empty_like(w, memory_format=torch.contiguous_format) for w in weights]
    gbs = [torch.empty_like(b, memory_format=torch.contiguous_format) for b in biases]
    return [x.new_empty(x.shape) if needs_x else absent(gy), *gws, *gbs]


# --- eager mode ----------------------------------------------------------------------------
# The same implementations and autograd formulas as the custom ops, as torch.autograd.Function
# classes: in eager mode a step pays for neither the dispatcher's custom-op layers nor the
# generated autograd wrapper around them (about 0.3 ms of host time per MLP block step).
# Traced code (torch.compile, fake or other tensor subclasses) takes the custom ops.

class _GemmFunction(torch.autograd.Function):
    """The eager mode's ``gemm_bias_act``: the op's implementation and fused backward, with
    Y (and Z where the forward keeps it) as outputs and nothing allocated for what is
    absent."""

    @staticmethod
    def forward(ctx, a, b, bias, c, act, alpha, beta, leaky_slope, precision, keep_z):
        low = lowered(b, a)
        out = _forward(a, low, bias, act=act, c=c, alpha=alpha, beta=beta,
                       leaky_slope=leaky_slope, save_preact=keep_z, precision=precision)
        y, z = out if keep_z else (out, None)
        kind = _source_kind(act, leaky_slope)
        src = z if kind == "z" else y if kind == "y" else None
        ctx.kind = kind if src is not None or kind == "none" else "recompute"
        ctx.scalars = (act, alpha, beta, leaky_slope, precision)
        ctx.save_for_backward(a, b, bias, c, src, None if low is b else low)
        if z is None:
            return y
        ctx.mark_non_differentiable(z)
        ctx.set_materialize_grads(False)   # Z has no gradient: no zeros made for it
        return y, z

    @staticmethod
    def backward(ctx, gy, gz=None):
        if gy is None:
            return (None,) * 10
        a, b, bias, c, src, low = ctx.saved_tensors
        act, alpha, beta, leaky_slope, precision = ctx.scalars
        na, nb, nbias, nc = ctx.needs_input_grad[:4]
        needs = ("a",) if na else ()
        if nb:
            needs += ("b",)
        if nbias and bias is not None:
            needs += ("bias",)
        if nc and c is not None:
            needs += ("c",)
        kind = ctx.kind
        g = _backward(gy, a, lowered(b, a, low), bias, act=act,
                      z=src if kind == "z" else None, y=src if kind == "y" else None, c=c,
                      alpha=alpha, beta=beta, leaky_slope=leaky_slope, needs=needs,
                      precision=precision, db_dtype=_db_dtype(b, a))
        return g.a, g.b, g.bias, g.c, None, None, None, None, None, None

_gemm_apply = fast_apply(_GemmFunction)

_GatedFunction = eager_function(
    "_GatedFunction", _gated, _gated_setup,
    lambda ctx, gy, gz, glow: _gated_grads(ctx, gy, _gated_backward_impl))


class _GatedMLPFunction(torch.autograd.Function):
    """The eager mode's ``gated_mlp``: the op's forward and chained backward on the same
    implementations, with only Y as output and nothing allocated for what is absent."""

    @staticmethod
    def forward(ctx, x, gate_up, gate_up_bias, down, down_bias, act, precision):
        gate_up16, down16 = lowered(gate_up, x), lowered(down, x)
        h, z = _gated_forward(x, gate_up16.t(), gate_up_bias, act=act, save_preact=True,
                              precision=precision)
        y = _forward(h, down16.t(), down_bias, precision=precision)
        ctx.scalars = (act, precision)
        ctx.save_for_backward(x, gate_up, gate_up_bias, down, down_bias, h, z,
                              None if gate_up16 is gate_up else gate_up16,
                              None if down16 is down else down16)
        return y

    @staticmethod
    def backward(ctx, gy):
        if gy is None:
            return (None,) * 7
        x, gate_up, gate_up_bias, down, down_bias, h, z, gate_up16, down16 = ctx.saved_tensors
        act, precision = ctx.scalars
        gx, g_gate_up, g_gate_up_bias, g_down, g_down_bias = _gated_chain_backward(
            gy, x, gate_up, gate_up_bias, down, down_bias, h, z, act, precision,
            ctx.needs_input_grad[0], gate_up16, down16)
        return gx, g_gate_up, g_gate_up_bias, g_down, g_down_bias, None, None


_gated_mlp_apply = fast_apply(_GatedMLPFunction)


class _MLPFunction(torch.autograd.Function):
    """The eager mode's stack (``mlp``): the op's forward and chained backward on the same
    implementations, with only Y as output (the op also returns what its backward reads, as
    a custom op must) and nothing allocated for what is absent."""

    @staticmethod
    def forward(ctx, x, chain, precision, *params):
        layers = len(chain.names)
        y, hs, zs, lows = _layers(x, params[:layers], params[layers:], chain, precision, True)
        ctx.chain, ctx.precision = chain, precision
        ctx.save_for_backward(x, *params, *hs, *zs, *lows)
        return y

    @staticmethod
    def backward(ctx, gy):
        if gy is None:
            return None
        chain = ctx.chain
        layers = len(chain.names)
        saved = ctx.saved_tensors
        np_ = len(saved) - 1 - 3 * layers   # the parameters
        params = saved[1:1 + np_]
        rest = saved[1 + np_:]
        needs_x = ctx.needs_input_grad[0]
        gx, gws, gbs = _chain_backward(gy, saved[0], params[:layers], params[layers:],
                                       rest[:layers], rest[layers:2 * layers], chain,
                                       ctx.precision, needs_x, rest[2 * layers:])
        return (gx if needs_x else None, None, None, *gws, *(b for b in gbs if b is not None))


_mlp_apply = fast_apply(_MLPFunction)


# --- the functions users call --------------------------------------------------------------

def gemm_bias_act(a: Tensor, b: Tensor, bias: Tensor | None = None, *, act: str = "none",
                  c: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
                  leaky_slope: float = 0.01, save_preact: bool = False,
                  precision: str | None = None):
    """``ge2jit.gemm_bias_act`` on PyTorch tensors as a differentiable custom op
    (``torch.ops.ge2jit.gemm_bias_act``): gradients flow to ``a``, ``b``, ``bias`` and ``c``
    through ge2jit's fused backward; it works in eager mode (through an autograd.Function
    over the same implementation, bit for bit the op's results), under ``torch.compile`` (the
    op, no graph break) and inside CUDA-graph capture.

    float32 inputs run at ``precision`` if given, else at PyTorch's
    ``torch.get_float32_matmul_precision()``: "highest" is exact float32, "high" is 3xTF32
    (float32 accuracy on the tensor cores), "medium" is TF32. Inside ``torch.autocast`` the
    inputs (not a float32 bias or C, which the epilogue reads as they are) are cast to the
    region's type first. A float32 ``b`` that needs a gradient with a 16-bit ``a`` (master
    weights: autocast's, or given so) is cast inside the op, and its gradient comes out of
    dB's GEMM in float32, with no cast of it after (autocast would round dB to 16 bits and
    cast it back). When a gradient is needed the forward keeps what the backward reads:
    nothing more for none, relu, leaky_relu, sigmoid and tanh (their derivative comes from Y),
    Z for gelu, gelu_tanh and silu. Returns Y, or ``(Y, Z)`` with ``save_preact`` (Z carries no
    gradient).
    """
    dtype = autocast_dtype()
    a, b = cast(a, dtype), weight_cast(b, dtype)
    if bias is not None and bias.dtype != torch.float32:
        bias = cast(bias, dtype)
    if c is not None and c.dtype != torch.float32:
        c = cast(c, dtype)
    precision = precision_for(a.dtype, precision)
    grad = needs_grad(a, b, bias, c)
    keep_z = save_preact or (grad and _source_kind(act, leaky_slope) == "z")
    args = (a, b, bias, c, act, float(alpha), float(beta), float(leaky_slope), precision, keep_z)
    if traced(a, b, bias, c, names=("a", "b", "bias", "c")):
        y, z, _ = gemm_bias_act_op(*args)
    elif grad:
        out = _gemm_apply(*args)
        if not keep_z:
            return out
        return out if save_preact else out[0]
    else:
        y, z, _ = _gemm(*args)
    return (y, z) if save_preact else y


def gemm_gated(a: Tensor, b: Tensor, bias: Tensor | None = None, *, act: str = "silu",
               alpha: float = 1.0, leaky_slope: float = 0.01, save_preact: bool = False,
               precision: str | None = None):
    """``ge2jit.gemm_gated`` (``Y = act(A @ B[:, 0::2] + bias[0::2]) * (A @ B[:, 1::2] +
    bias[1::2])``, one GEMM) on PyTorch tensors as a differentiable custom op
    (``torch.ops.ge2jit.gemm_gated``): gradients flow to ``a``, ``b`` and ``bias`` through
    ``ge2jit.gemm_gated_backward``; eager mode (an autograd.Function over the same
    implementation), ``torch.compile`` (no graph break) and CUDA-graph capture. When a
    gradient is needed the forward keeps Z, the (M, 2N) pre-activations. Precision and
    autocast as in ``gemm_bias_act``. Returns Y, or ``(Y, Z)`` with ``save_preact``."""
    dtype = autocast_dtype()
    a, b = cast(a, dtype), weight_cast(b, dtype)
    if bias is not None and bias.dtype != torch.float32:
        bias = cast(bias, dtype)
    precision = precision_for(a.dtype, precision)
    grad = needs_grad(a, b, bias)
    args = (a, b, bias, act, float(alpha), float(leaky_slope), precision, save_preact or grad)
    if traced(a, b, bias, names=("a", "b", "bias")):
        y, z, _ = gemm_gated_op(*args)
    elif grad:
        y, z, _ = _GatedFunction.fast_apply(*args)
    else:
        y, z, _ = _gated(*args)
    return (y, z) if save_preact else y


def gated_mlp(x: Tensor, gate_up: Tensor, gate_up_bias: Tensor | None, down: Tensor,
              down_bias: Tensor | None, act: str = "silu", *,
              precision: str | None = None) -> Tensor:
    """``down(act(x @ W_gate.T + b_gate) * (x @ W_up.T + b_up))`` as one differentiable op
    (``torch.ops.ge2jit.gated_mlp``; in eager mode an autograd.Function over the same
    implementation): ``gate_up`` of (2 * hidden, d) with rows alternating gate and up (and
    its bias alike), ``down`` of (d, hidden). Its backward is chained: the down projection's
    dX GEMM writes the gated unit's dZ in its epilogue (no pass of its own), then two GEMMs.
    Precision and autocast as in ``gemm_bias_act``."""
    dtype = autocast_dtype()
    x, gate_up, down = cast(x, dtype), weight_cast(gate_up, dtype), weight_cast(down, dtype)
    gate_up_bias, down_bias = (b if b is None or b.dtype == torch.float32 else cast(b, dtype)
                               for b in (gate_up_bias, down_bias))
    precision = precision_for(x.dtype, precision)
    tensors = (x, gate_up, gate_up_bias, down, down_bias)
    save = needs_grad(*tensors)
    if traced(*tensors, names=("x", "gate_up", "gate_up_bias", "down", "down_bias")):
        return gated_mlp_op(*tensors, act, precision, save)[0]
    if save:
        return _gated_mlp_apply(*tensors, act, precision)
    return _gated_mlp(*tensors, act, precision, False)[0]


def mlp(x: Tensor, weights, biases, acts, *, leaky_slope: float = 0.01,
        precision: str | None = None) -> Tensor:
    """Layers ``H_l = act_l(H_{l-1} @ W_l.T + b_l)`` from ``x`` (``W_l`` of (out, in), as
    ``nn.Linear`` stores them; ``b_l`` a tensor or None; ``acts`` one name per layer) as one
    differentiable custom op (``torch.ops.ge2jit.mlp``; in eager mode an autograd.Function
    over the same implementation), whose backward is chained: each
    layer's dA leaves its GEMM as the previous layer's dZ (act' applied in the epilogue) with
    that layer's bias gradient, so the backward is the 2L - 1 GEMMs and nearly nothing else.
    Precision and autocast as in ``gemm_bias_act``."""
    dtype = autocast_dtype()
    if dtype is not None:
        x = cast(x, dtype)
        weights = [weight_cast(w, dtype) for w in weights]
        biases = [b if b is None or b.dtype == torch.float32 else cast(b, dtype)
                  for b in biases]
    precision = precision_for(x.dtype, precision)
    present = [b for b in biases if b is not None]
    save = needs_grad(x, *weights, *present)
    has_bias = [b is not None for b in biases]
    acts, leaky_slope = ",".join(acts), float(leaky_slope)
    if traced(x, *weights, *present,
              names=lambda: ("x", *("weights",) * len(weights), *("biases",) * len(present))):
        return mlp_op(x, weights, present, has_bias, acts, leaky_slope, precision, save)[0]
    if save:
        chain = _chain_of(acts, has_bias, len(weights), leaky_slope, len(present))
        return _mlp_apply(x, chain, precision, *weights, *present)
    return _mlp(x, weights, present, has_bias, acts, leaky_slope, precision, False)[0]
