"""rms_norm and layer_norm, forward and backward: the calls' plumbing. Argument checks, the
layout of the rows in memory, the kernel choice (``spec.choose``, pure), the prepared calls
and the launches live here."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ...errors import ArgumentValueError
from ...jit import fastlaunch
from ...jit.device import sm_count
from ...jit.fastlaunch import Ptr
from ...jit.loader import launcher_for, resident_blocks
from ...runtime.checks import (
    _cupy,
    check_aligned,
    check_array,
    check_bool,
    check_dtype,
    check_same_device,
    check_scalar,
    check_shaped,
)
from ...runtime.dtypes import DType
from ...runtime.prepared import OverlapGuard, PreparedCalls
from ...runtime.rows import pow2_at_least, vector_width, walk_as_one
from ...runtime.tools import tuned_config
from .spec import (
    MAX_N,
    OP_NAMES,
    BackwardTypes,
    ForwardTypes,
    NormSumsSpec,
    choose,
    choose_backward,
    parse_backward_config,
    parse_config,
    sums_shape,
)

_prepared = PreparedCalls("norm")
_prepared_backward = PreparedCalls("norm backward", 256)
#: the compiled launch path's programs (``jit.fastlaunch``), per kind ("rms", "layer"). The
#: forward's: its arrays and two output slots (mean, rstd: no caller fills them), then eps,
#: save_stats and the config by value. The backward's: its arrays and five slots (dx, the
#: partial sums of dweight and dbias, dweight, dbias), then the config.
_FWD_SLOTS, _BWD_SLOTS = 2, 5
_COMPILED = {kind: fastlaunch.Table(f"{kind}_norm", "A" * (6 + _FWD_SLOTS) + "VVV")
             for kind in ("rms", "layer")}
_COMPILED_BACKWARD = {kind: fastlaunch.Table(f"{kind}_norm_backward",
                                             "A" * (7 + _BWD_SLOTS) + "V")
                      for kind in ("rms", "layer")}
_choose = lru_cache(maxsize=4096)(choose)
_choose_backward = lru_cache(maxsize=4096)(choose_backward)

ALL = tuple(DType)
#: The forward's arrays, in the order of its prepared calls' arguments; the last two are
#: outputs, each of which may be x or the residual itself (in place).
FORWARD_NAMES = ("x", "weight", "bias", "residual", "out", "residual_out")
BACKWARD_NAMES = ("dy", "h", "weight", "bias", "mean", "rstd", "dh")


class NormOutput(NamedTuple):
    """A forward's results with ``save_stats=True``: ``y``; ``h``, x + residual as stored
    (None without a residual: h is x); the per-row ``mean`` (LayerNorm; None for RMSNorm) and
    ``rstd`` (float32, of x's leading shape), which the backward takes."""

    y: object
    h: object
    mean: object
    rstd: object


class NormGradients(NamedTuple):
    """A backward's results: ``dx`` (the gradient of h: of x, and of the residual, which h =
    x + residual passes on unchanged; in h's dtype), ``dweight`` (in the weight's dtype; None
    without a weight) and ``dbias`` (in the bias' dtype; None without a bias)."""

    dx: object
    dweight: object
    dbias: object


class Rows(NamedTuple):
    """An array as rows along its last axis: how many, and the stride between them
    (elements)."""

    count: int
    stride: int


def row_layout(a) -> Rows | None:
    """The rows of ``a`` along a unit-stride last axis, the dimensions before it walked as one
    with a single stride; None when its strides do not allow that."""
    item, n = a.itemsize, a.shape[-1]
    if n > 1 and a.strides[-1] != item:
        return None
    lead = walk_as_one([(s, st // item) for s, st in zip(a.shape[:-1], a.strides[:-1])])
    return None if lead is None else Rows(*lead)


def _ptr(a) -> int:
    return 0 if a is None else a.data.ptr


# ---- checks -------------------------------------------------------------------------------

def _check_rows(x, name: str) -> tuple[int, int]:
    """(rows, n) of an input normalized along its last axis."""
    check_array(x, name)
    if x.ndim < 1:
        raise ArgumentValueError(f"{name}: expected an array of at least 1 dimension (rows "
                                 "along the last axis), got a 0-d array")
    n = x.shape[-1]
    if n < 1:
        raise ArgumentValueError(f"{name}: expected a last axis of at least 1 element, got "
                                 f"shape {x.shape}")
    if n > MAX_N:
        raise ArgumentValueError(f"{name}: expected rows of at most {MAX_N} elements "
                                 f"(2**31 - 1), got {n}")
    return x.size // n, n


def _check_eps(eps) -> float:
    value = check_scalar(eps, "eps")
    if not (math.isfinite(value) and value >= 0.0):
        raise ArgumentValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    return value


def _check_vector(a, name: str, n: int, what: str) -> DType | None:
    """A weight or bias: None, or an (n,) array."""
    if a is None:
        return None
    return check_shaped(a, name, (n,), f"({what}'s last axis)", ALL)


def _check_output(a, name: str, shape: tuple, what: str) -> DType:
    """An output passed in: ``shape``, a supported dtype, rows along a unit-stride last axis
    that hold each element once (the kernels write rows with one stride)."""
    dt = check_shaped(a, name, shape, f"({what}'s)", ALL)
    lay = row_layout(a)
    n = shape[-1]
    if a.size and (lay is None or (lay.count > 1 and abs(lay.stride) < n)):
        raise ArgumentValueError(
            f"{name}: expected rows along a unit-stride last axis, each element held once "
            f"(C-contiguous, or the rows of a wider array), got strides {a.strides}; pass a "
            "C-contiguous array")
    return dt


def _check_stats(a, name: str, lead: tuple, rows: int):
    """A per-row statistic of the forward: float32 of the rows' leading shape (or (rows,))."""
    check_array(a, name)
    if a.shape not in (lead, (rows,)):
        raise ArgumentValueError(f"{name}: expected shape {lead} (dy's leading dimensions) or "
                                 f"({rows},), got {a.shape}")
    if check_dtype(a, name) is not DType.F32:
        raise ArgumentValueError(f"{name}: expected dtype float32 (the forward's statistics), "
                                 f"got {a.dtype}")
    check_aligned(a, name)


def _config(config, parse):
    return None if config is None else parse(config)


class Call(NamedTuple):
    """A checked call: its arrays (CuPy views, None where absent) in the order of ``names``,
    the kernel's types (``ForwardTypes`` or ``BackwardTypes``), the rows, the pinned config
    (or None) and eps (the forward's)."""

    kind: str
    names: tuple
    arrays: tuple
    types: object
    rows: int
    n: int
    config: object
    eps: float = 0.0

    def get(self, name: str):
        return self.arrays[self.names.index(name)]


def checked_forward(kind: str, v: dict, eps, save_stats, config) -> Call:
    """A forward's arguments (CuPy views by name, ``FORWARD_NAMES``), checked as the call
    checks them."""
    x = v["x"]
    rows, n = _check_rows(x, "x")
    x_dt = check_dtype(x, "x")
    check_aligned(x, "x")
    weight = _check_vector(v["weight"], "weight", n, "x")
    bias = _check_vector(v.get("bias"), "bias", n, "x")
    residual = v["residual"]
    r_dt = h_dt = None
    if residual is not None:
        r_dt = h_dt = check_shaped(residual, "residual", x.shape, "(x's)", ALL)
    y_dt = x_dt if v["out"] is None else _check_output(v["out"], "out", x.shape, "x")
    if v["residual_out"] is not None:
        if residual is None:
            raise ArgumentValueError("residual_out: given without residual (it receives h = x "
                                     "+ residual); pass residual= too, or leave it out")
        h_dt = _check_output(v["residual_out"], "residual_out", x.shape, "x")
    eps = _check_eps(eps)
    stats = check_bool(save_stats, "save_stats")
    cfg = _config(config, parse_config)
    types = ForwardTypes(x_dt, y_dt, r_dt, h_dt, weight, bias, stats)
    return Call(kind, FORWARD_NAMES, tuple(v.get(k) for k in FORWARD_NAMES), types, rows, n,
                cfg, eps)


def checked_backward(kind: str, v: dict, config) -> Call:
    """A backward's arguments (CuPy views by name, ``BACKWARD_NAMES``), checked."""
    dy = v["dy"]
    rows, n = _check_rows(dy, "dy")
    dy_dt = check_dtype(dy, "dy")
    check_aligned(dy, "dy")
    h_dt = check_shaped(v["h"], "h", dy.shape, "(dy's)", ALL)
    weight = _check_vector(v["weight"], "weight", n, "dy")
    bias = _check_vector(v.get("bias"), "bias", n, "dy")
    lead = dy.shape[:-1]
    if kind == "layer":
        _check_stats(v["mean"], "mean", lead, rows)
    _check_stats(v["rstd"], "rstd", lead, rows)
    dh_dt = None
    if v["dh"] is not None:
        dh_dt = check_shaped(v["dh"], "dh", dy.shape, "(dy's)", ALL)
    cfg = _config(config, parse_backward_config)
    types = BackwardTypes(dy_dt, h_dt, h_dt, weight, bias, dh_dt)
    return Call(kind, BACKWARD_NAMES, tuple(v.get(k) for k in BACKWARD_NAMES), types, rows, n,
                cfg)


# ---- layouts and choices ------------------------------------------------------------------

def _readable(a, copies: list):
    """``a`` (a CuPy view) as rows the kernels read: itself, or a C-contiguous copy (noted in
    ``copies``: such a call is not prepared) when its strides do not allow one row stride."""
    if a is None or row_layout(a) is not None:
        return a
    copies.append(a)
    return _cupy().ascontiguousarray(a)


def _vector(a, copies: list):
    """A weight or bias read with unit stride: itself or a copy."""
    if a is None or a.size <= 1 or a.strides[0] == a.itemsize:
        return a
    copies.append(a)
    return _cupy().ascontiguousarray(a)


def _stride(a, n: int) -> int:
    """The row stride of ``a`` (elements; an array the call allocates: n)."""
    return n if a is None else row_layout(a).stride


def forward_key(kind: str, types: ForwardTypes, rows: int, n: int) -> dict:
    """What keys the tuning database for a forward: the types, n and the row count (rounded
    up to powers of two)."""
    t = types

    def name(d):
        return "none" if d is None else d.numpy_name

    return {"kind": kind, "dtype": t.x.numpy_name, "out_dtype": t.y.numpy_name,
            "residual": name(t.residual), "h_dtype": name(t.h), "weight": name(t.weight),
            "bias": name(t.bias), "n": pow2_at_least(n), "rows": pow2_at_least(rows)}


def backward_key(kind: str, types: BackwardTypes, rows: int, n: int) -> dict:
    """What keys the tuning database for a backward."""
    t = types

    def name(d):
        return "none" if d is None else d.numpy_name

    return {"kind": kind, "dy": t.dy.numpy_name, "h": t.h.numpy_name,
            "weight": name(t.weight), "bias": name(t.bias), "dh": name(t.dh),
            "n": pow2_at_least(n), "rows": pow2_at_least(rows)}


def _pinned_or_tuned(name: str, config, key: dict, parse):
    """(config or None, reason): the pinned config, else the tuning database's, else None
    (the heuristic)."""
    if config is not None:
        return config, "pinned"
    tuned = tuned_config(name, key)
    if tuned is not None:
        return parse(tuned), "tuned"
    return None, "heuristic"


def decide_forward(call: Call, device_id: int, arrays=None):
    """(choice, reason) of a checked forward; ``arrays``: the views the kernel reads (default
    the call's, the outputs it allocates being aligned C-contiguous rows)."""
    x, weight, bias, residual, out, residual_out = arrays or call.arrays
    t, n = call.types, call.n
    cfg, reason = _pinned_or_tuned(OP_NAMES[call.kind], call.config,
                                   forward_key(call.kind, t, call.rows, n), parse_config)
    rows_ = [(x, t.x), (residual, t.residual), (out, t.y), (residual_out, t.h)]
    vec = vector_width(t.width, [(_ptr(a), _stride(a, n), d.itemsize) for a, d in rows_ if d]
                       + [(_ptr(a), None, a.itemsize) for a in (weight, bias) if a is not None],
                       call.rows)
    choice = _choose(call.kind, call.rows, n, t, sm_count(device_id), max_vec=vec, config=cfg)
    return choice, reason


def decide_backward(call: Call, device_id: int, arrays=None):
    """(choice, sums spec or None, reason) of a checked backward: the grid is what the GPU
    holds of the kernel at once (no more blocks than rows)."""
    dy, h, weight, bias, mean, rstd, dh = arrays or call.arrays
    t, n = call.types, call.n
    cfg, reason = _pinned_or_tuned(f"{OP_NAMES[call.kind]}_backward", call.config,
                                   backward_key(call.kind, t, call.rows, n),
                                   parse_backward_config)
    rows_ = [(dy, t.dy), (h, t.h), (dh, t.dh), (None, t.dx)]
    vec = vector_width(t.width, [(_ptr(a), _stride(a, n), d.itemsize) for a, d in rows_ if d]
                       + [(_ptr(a), None, a.itemsize) for a in (weight,) if a is not None],
                       call.rows)
    sms = sm_count(device_id)
    choice = _choose_backward(call.kind, call.rows, n, t, sms, 1, max_vec=vec, config=cfg)
    resident = resident_blocks(choice.spec, device_id, choice.block[0])
    choice = _choose_backward(call.kind, call.rows, n, t, sms, resident, max_vec=vec,
                              config=cfg)
    sums = NormSumsSpec(call.kind, t.weight, t.bias) if t.partials else None
    return choice, sums, reason


# ---- the forward --------------------------------------------------------------------------

def forward(kind: str, x, weight, bias, residual, out, residual_out, eps, save_stats, config):
    """One forward call (``rms_norm``, ``layer_norm``): its program in C where one is stored
    for the call's signature, else through the prepared calls (which store one)."""
    args = (x, weight, bias, residual, out, residual_out, None, None, eps, save_stats, config)
    done = _COMPILED[kind].call(*args)
    if done is not fastlaunch.MISS:
        return NormOutput(*done) if type(done) is tuple and len(done) == 4 else done
    arrays = {"x": x, "weight": weight, "bias": bias, "residual": residual, "out": out,
              "residual_out": residual_out}
    extra = (kind, eps, save_stats, config)   # (the prepared calls key their types too)

    def first(fw, device_id, v, native):
        result, call = _first_forward(kind, fw, device_id, v, native, eps, save_stats, config)
        if call is not None:
            _COMPILED[kind].put(args, call.program, fw.name)
        return result, call

    return _prepared.run(arrays, extra, first)


def _first_forward(kind, fw, device_id, v, native, eps, save_stats, config):
    call = checked_forward(kind, v, eps, save_stats, config)
    check_same_device({k: v.get(k) for k in FORWARD_NAMES}, device_id)
    guard = OverlapGuard(FORWARD_NAMES, call.arrays, (4, 5),
                         in_place={(4, 0), (4, 3), (5, 0), (5, 3)})
    guard(tuple(_ptr(a) for a in call.arrays))
    return _execute_forward(fw, device_id, call, native, guard)


def _execute_forward(fw, device_id, call: Call, native: dict, guard):
    """Launch a checked forward (``call``: CuPy views; ``native``: the arrays as given);
    (result, prepared call or None)."""
    t, n, rows = call.types, call.n, call.rows
    x, weight, bias, residual, out, residual_out = call.arrays
    shape, lead = x.shape, x.shape[:-1]
    has_residual, layer = residual is not None, call.kind == "layer"
    new_y = fw.allocator(x.dtype, device_id)
    new_h = fw.allocator((residual_out if residual_out is not None else residual).dtype,
                         device_id) if has_residual else None
    new_stats = fw.allocator(np.float32, device_id)

    def outputs(out, residual_out):
        """y, h, mean, rstd: those given, else new ones (None where there are none)."""
        y = new_y(shape) if out is None else out
        h = (new_h(shape) if residual_out is None else residual_out) if has_residual else None
        return (y, h, new_stats(lead) if t.stats and layer else None,
                new_stats(lead) if t.stats else None)

    def result(y, h, mean, rstd):
        if t.stats:
            return NormOutput(y, h, mean, rstd)
        return (y, h) if has_residual else y

    made = outputs(native["out"], native["residual_out"])
    if rows == 0:
        return result(*made), None
    copies: list = []
    xr, rr = _readable(x, copies), _readable(residual, copies)
    wr, br = _vector(weight, copies), _vector(bias, copies)
    choice, _ = decide_forward(call, device_id, (xr, wr, br, rr, out, residual_out))
    launch = launcher_for(choice.spec, device_id).bind(
        choice.grid, choice.block, 0, rows=rows, n=n, sx=_stride(xr, n),
        sr=_stride(rr, n) if has_residual else 0,
        sh=_stride(residual_out, n) if has_residual else 0, sy=_stride(out, n), eps=call.eps)
    stream, ptr = fw.stream_getter(device_id), fw.ptr

    def run(x_p, w_p, b_p, r_p, made):
        y, h, mean, rstd = made
        launch(stream(), x=x_p, r=r_p, h=0 if h is None else ptr(h), y=ptr(y), w=w_p, b=b_p,
               mean=0 if mean is None else ptr(mean), rstd=0 if rstd is None else ptr(rstd))
        return result(*made)

    first = run(_ptr(xr), _ptr(wr), _ptr(br), _ptr(rr), made)
    if copies:
        return first, None
    check = guard if guard else None

    def call_(x, weight, bias, residual, out, residual_out):
        made = outputs(out, residual_out)
        x_p, w_p = ptr(x), 0 if weight is None else ptr(weight)
        b_p, r_p = 0 if bias is None else ptr(bias), 0 if residual is None else ptr(residual)
        if check is not None:
            check((x_p, w_p, b_p, r_p, 0 if out is None else ptr(out),
                   0 if residual_out is None else ptr(residual_out)))
        return run(x_p, w_p, b_p, r_p, made)

    # the same launch as a program: y, h (with a residual), mean (LayerNorm) and rstd made in
    # their slots where the call gives none; the slots returned as the Python path returns
    allocs = []
    if native["out"] is None:
        allocs.append((4, new_y, shape))
    if has_residual and native["residual_out"] is None:
        allocs.append((5, new_h, shape))
    if t.stats and layer:
        allocs.append((6, new_stats, lead))
    if t.stats:
        allocs.append((7, new_stats, lead))
    call_.program = fastlaunch.program(
        fw.name, [fastlaunch.step(launcher_for(choice.spec, device_id), choice.grid,
                                  choice.block, 0, {
            "rows": rows, "n": n, "sx": _stride(xr, n), "sr": _stride(rr, n) if has_residual
            else 0, "sh": _stride(residual_out, n) if has_residual else 0,
            "sy": _stride(out, n), "eps": call.eps, "x": Ptr(0), "w": Ptr(1), "b": Ptr(2),
            "r": Ptr(3), "y": Ptr(4), "h": Ptr(5), "mean": Ptr(6), "rstd": Ptr(7)})],
        allocs, guard.pairs if check is not None else (), check, stream,
        fastlaunch.launch_failed(choice.spec.kernel_name),
        returns=(4, 5, 6, 7) if t.stats else (4, 5) if has_residual else (4,),
        slots=6 + _FWD_SLOTS)
    return first, call_


# ---- the backward -------------------------------------------------------------------------

def backward(kind: str, dy, h, weight, bias, mean, rstd, dh, config):
    """One backward call (``rms_norm_backward``, ``layer_norm_backward``): its program in C
    where one is stored for the call's signature, else through the prepared calls."""
    args = (dy, h, weight, bias, mean, rstd, dh, *(None,) * _BWD_SLOTS, config)
    done = _COMPILED_BACKWARD[kind].call(*args)
    if done is not fastlaunch.MISS:
        return NormGradients(*done)
    arrays = {"dy": dy, "h": h, "weight": weight, "bias": bias, "mean": mean, "rstd": rstd,
              "dh": dh}

    def first(fw, device_id, v, native):
        result, call = _first_backward(kind, fw, device_id, v, config)
        if call is not None:
            _COMPILED_BACKWARD[kind].put(args, call.program, fw.name)
        return result, call

    return _prepared_backward.run(arrays, (kind, config), first)


def _first_backward(kind, fw, device_id, v, config):
    call = checked_backward(kind, v, config)
    check_same_device({k: v.get(k) for k in BACKWARD_NAMES}, device_id)
    return _execute_backward(fw, device_id, call)


def _stats(a, copies: list):
    """Per-row statistics read contiguously: themselves or a copy."""
    if a is None or a.flags.c_contiguous:
        return a
    copies.append(a)
    return _cupy().ascontiguousarray(a)


def _execute_backward(fw, device_id, call: Call):
    """Launch a checked backward (CuPy views); (gradients, prepared call or None)."""
    t, n, rows = call.types, call.n, call.rows
    dy, h, weight, bias, mean, rstd, dh = call.arrays
    shape = dy.shape
    new_dx = fw.allocator(h.dtype, device_id)
    new_dw = None if weight is None else fw.allocator(weight.dtype, device_id)
    new_db = None if bias is None else fw.allocator(bias.dtype, device_id)
    if rows == 0:   # sums over no rows
        return NormGradients(
            new_dx(shape), None if weight is None else fw.zeros((n,), weight.dtype, device_id),
            None if bias is None else fw.zeros((n,), bias.dtype, device_id)), None
    copies: list = []
    dyr, hr, dhr = (_readable(a, copies) for a in (dy, h, dh))
    wr = _vector(weight, copies)
    meanr, rstdr = _stats(mean, copies), _stats(rstd, copies)
    choice, sums, _ = decide_backward(call, device_id, (dyr, hr, wr, bias, meanr, rstdr, dhr))
    parts = choice.grid[0]
    launch = launcher_for(choice.spec, device_id).bind(
        choice.grid, choice.block, choice.spec.smem_bytes, rows=rows, n=n, sdy=_stride(dyr, n),
        sh=_stride(hr, n),
        sdh=_stride(dhr, n) if dh is not None else 0, sdx=n)
    add_up = None
    if sums is not None:
        grid, block = sums_shape(n, t)
        add_up = launcher_for(sums, device_id).bind(grid, block, 0, parts=parts, n=n)
    new_part = fw.allocator(np.float32, device_id)
    stream, ptr = fw.stream_getter(device_id), fw.ptr

    def run(dy_p, h_p, w_p, mean_p, rstd_p, dh_p):
        s = stream()
        dx = new_dx(shape)
        pw = None if weight is None else new_part((parts, n))
        pb = None if bias is None else new_part((parts, n))
        pw_p, pb_p = 0 if pw is None else ptr(pw), 0 if pb is None else ptr(pb)
        launch(s, dy=dy_p, h=h_p, w=w_p, mean=mean_p, rstd=rstd_p, dh=dh_p, dx=ptr(dx),
               pw=pw_p, pb=pb_p)
        dw = None if new_dw is None else new_dw((n,))
        db = None if new_db is None else new_db((n,))
        if add_up is not None:
            add_up(s, pw=pw_p, pb=pb_p, dw=0 if dw is None else ptr(dw),
                   db=0 if db is None else ptr(db))
        return NormGradients(dx, dw, db)

    first = run(_ptr(dyr), _ptr(hr), _ptr(wr), _ptr(meanr), _ptr(rstdr), _ptr(dhr))
    if copies:
        return first, None

    def call_(dy, h, weight, bias, mean, rstd, dh):
        return run(ptr(dy), ptr(h), 0 if weight is None else ptr(weight),
                   0 if mean is None else ptr(mean), ptr(rstd), 0 if dh is None else ptr(dh))

    # the same launches as a program: dx, the partial sums, dweight and dbias made in the
    # slots after the arrays (7: dx, 8, 9: the partial sums, 10: dweight, 11: dbias)
    allocs = [(7, new_dx, shape)]
    if weight is not None:
        allocs += [(8, new_part, (parts, n)), (10, new_dw, (n,))]
    if bias is not None:
        allocs += [(9, new_part, (parts, n)), (11, new_db, (n,))]
    steps = [fastlaunch.step(launcher_for(choice.spec, device_id), choice.grid, choice.block,
                             choice.spec.smem_bytes, {
        "rows": rows, "n": n, "sdy": _stride(dyr, n), "sh": _stride(hr, n),
        "sdh": _stride(dhr, n) if dh is not None else 0, "sdx": n, "dy": Ptr(0), "h": Ptr(1),
        "w": Ptr(2), "mean": Ptr(4), "rstd": Ptr(5), "dh": Ptr(6), "dx": Ptr(7), "pw": Ptr(8),
        "pb": Ptr(9)})]
    if sums is not None:
        grid, block = sums_shape(n, t)
        steps.append(fastlaunch.step(launcher_for(sums, device_id), grid, block, 0, {
            "parts": parts, "n": n, "pw": Ptr(8), "pb": Ptr(9), "dw": Ptr(10),
            "db": Ptr(11)}))
    call_.program = fastlaunch.program(
        fw.name, steps, allocs, stream=stream,
        failed=fastlaunch.launch_failed(choice.spec.kernel_name), returns=(7, 10, 11),
        slots=7 + _BWD_SLOTS)
    return first, call_


# ---- the public functions -----------------------------------------------------------------

def rms_norm(x, weight=None, *, eps: float = 1e-6, residual=None, out=None, residual_out=None,
             save_stats: bool = False, config=None):
    """RMSNorm over the last axis: ``y = h / sqrt(mean(h**2) + eps) * weight``, with ``h = x``,
    or ``h = x + residual`` computed in the same pass (the pre-norm residual stream).

    Args:
        x: a GPU array (``cupy.ndarray``, ``torch.Tensor`` on a CUDA device, or an object
            with ``__cuda_array_interface__``; results are of its framework) of float32,
            float16 or bfloat16, of shape (..., n): rows of n elements along a unit-stride last
            axis, the dimensions before it walked with one stride (any rows of a wider array
            are read in place). Other layouts are copied first.
        weight: None (no scale) or an (n,) array, float32, float16 or bfloat16 (usually x's
            type or float32).
        eps: added to the mean square (a finite number >= 0).
        residual: None, or an array of x's shape (any of the three types): h = x + residual,
            rounded to h's type (``residual_out``'s, else the residual's) and written out, and
            y is the normalization of h as stored. The call then returns ``(y, h)``.
        out: optional array of x's shape for y (its dtype is y's; default x's). Rows along a
            unit-stride last axis, each element once; it may be x or the residual itself (in
            place), and may not overlap anything else.
        residual_out: optional array of x's shape for h (with a residual only; its dtype is
            h's), with the same rules as ``out`` (it may be x or the residual itself: the
            residual stream updated in place).
        save_stats: also return the per-row ``rstd`` (float32, x's leading shape) for
            ``rms_norm_backward``: the result is then ``NormOutput(y, h, None, rstd)``.
        config: pin the kernel variant by name (``ge2jit.ops.norm.spec``):
            ``"warp{G}_v{V}_r{R}"``, ``"block_{T}_v{V}"`` or ``"loop_{T}"``.

    Statistics are float32 (the sum of squares of the float32 values of h), y is rounded once
    to its type. A NaN in a row makes that row NaN; an infinite value makes its row's rstd 0
    (y NaN where h is infinite, 0 elsewhere), as PyTorch's float32 formula gives; a mean
    square beyond float32's range (values beyond about 1e19) also gives rstd 0. Rows of zero
    elements are refused; no rows give empty results without a launch. The call runs on
    CuPy's current device and stream (tensors: their device, PyTorch's current stream) and
    never synchronizes.

    Returns:
        y; ``(y, h)`` with a residual; ``NormOutput(y, h, mean=None, rstd)`` with
        ``save_stats``.

    Raises:
        ArgumentTypeError: an argument that is no GPU array; eps not a number, save_stats not
            a bool.
        ArgumentValueError: unsupported dtype, mismatched shapes, rows of zero or more than
            2**31 - 1 elements, eps < 0, residual_out without a residual, outputs that
            overlap inputs (other than exactly) or each other, an unknown config or one that
            does not hold the rows.
        DeviceMismatchError: arrays on another device.
    """
    return forward("rms", x, weight, None, residual, out, residual_out, eps, save_stats,
                   config)


def layer_norm(x, weight=None, bias=None, *, eps: float = 1e-5, residual=None, out=None,
               residual_out=None, save_stats: bool = False, config=None):
    """LayerNorm over the last axis: ``y = (h - mean(h)) / sqrt(var(h) + eps) * weight +
    bias`` (biased variance, as ``torch.nn.functional.layer_norm``), with ``h = x``, or ``h = x
    + residual`` computed in the same pass.

    The arguments are ``rms_norm``'s, plus ``bias`` (None, or an (n,) array like the weight).
    The variance is that of the float32 values of h about their mean, accurate to float32's
    rounding however large the mean: from the values held in registers by the corrected
    two-pass formula (rows up to 16384 elements) or by Chan's combination of per-step means
    and squared deviations of h less the row's first value (longer rows). A NaN or an
    infinite value in a row makes that row NaN, as in PyTorch.

    Returns:
        y; ``(y, h)`` with a residual; ``NormOutput(y, h, mean, rstd)`` with ``save_stats``
        (the mean and rstd per row, float32, of x's leading shape).
    """
    return forward("layer", x, weight, bias, residual, out, residual_out, eps, save_stats,
                   config)


def rms_norm_backward(dy, h, weight, rstd, *, dh=None, config=None) -> NormGradients:
    """The gradients of ``rms_norm``: ``NormGradients(dx, dweight, dbias=None)``.

    Args:
        dy: the gradient of y, of h's shape (any of the three types).
        h: what the forward normalized: x, or ``x + residual`` as it returned it.
        weight: the forward's weight, or None.
        rstd: the forward's per-row rstd (``save_stats=True``), float32, of h's leading shape
            or (rows,).
        dh: optional gradient arriving at h from elsewhere (the residual stream's, in the
            pre-norm pattern), of h's shape: added to dx in the same pass.
        config: pin the backward's kernel variant (``"warp{G}_v{V}_r1"``, ``"block_{T}_v{V}"``,
            ``"loop_{T}"``).

    With ``x-hat = h * rstd`` and ``g = dy * weight``: ``dx = rstd * (g - x-hat *
    mean(g * x-hat)) + dh`` per row (float32, rounded once to h's type): the gradient of h, so
    of x and of the residual alike. ``dweight = sum over rows of dy * x-hat`` in the weight's
    type: each block of the kernel writes its rows' partial sums to a float32 workspace
    (blocks x n, from the arrays' allocator) and a second kernel adds them up column by column
    in a fixed order, so the same inputs give the same bits (no atomics). Empty rows give
    zero dweight.
    """
    return backward("rms", dy, h, weight, None, None, rstd, dh, config)


def layer_norm_backward(dy, h, weight, mean, rstd, *, bias=None, dh=None,
                        config=None) -> NormGradients:
    """The gradients of ``layer_norm``: ``NormGradients(dx, dweight, dbias)``.

    The arguments are ``rms_norm_backward``'s, plus the forward's per-row ``mean`` (float32)
    and ``bias`` (None, or the forward's bias: read for its dtype and shape only; dbias is
    made when it is given). With ``x-hat = (h - mean) * rstd`` and ``g = dy * weight``:
    ``dx = rstd * (g - mean(g) - x-hat * mean(g * x-hat)) + dh``; ``dweight = sum of dy *
    x-hat`` and ``dbias = sum of dy`` over the rows, deterministic as in
    ``rms_norm_backward``.
    """
    return backward("layer", dy, h, weight, bias, mean, rstd, dh, config)
