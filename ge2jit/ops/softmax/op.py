"""softmax: the call's plumbing. Argument checks, the layout of the softmax vectors in memory,
the kernel choice (``spec.choose``, pure), the cached launcher and the launch all live here."""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import NamedTuple

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit.device import sm_count
from ...jit.loader import launcher_for
from ...runtime import arrays
from ...runtime.arrays import call_arguments, framework_of_type, views
from ...runtime.checks import (
    _cupy,
    byte_span,
    check_aligned,
    check_array,
    check_dtype,
    check_same_device,
    check_shaped,
)
from ...runtime.dtypes import DType
from ...runtime.prepared import OverlapGuard, PreparedCalls
from ...runtime.rows import vector_width, walk_as_one
from ...runtime.tools import tuned_config
from .spec import access_width, choose, parse_config

_prepared = PreparedCalls("softmax")
_choose = lru_cache(maxsize=4096)(choose)


class AxisLayout(NamedTuple):
    """An array seen as (outer, n, inner): the dimensions before the axis walked as one, the
    axis, the dimensions after it walked as one; strides in elements."""

    outer: int
    n: int
    inner: int
    outer_stride: int
    n_stride: int
    inner_stride: int


def axis_layout(shape: tuple, strides: tuple, axis: int) -> AxisLayout | None:
    """``shape`` and element ``strides`` as (outer, n, inner) around ``axis``; None when the
    dimensions on one side of it cannot be walked as one (the call then copies)."""
    outer = walk_as_one(list(zip(shape[:axis], strides[:axis])))
    inner = walk_as_one(list(zip(shape[axis + 1:], strides[axis + 1:])))
    if outer is None or inner is None:
        return None
    n = shape[axis]
    return AxisLayout(outer[0], n, inner[0], outer[1], strides[axis] if n > 1 else 1,
                      inner[1])


def rows_fast(lx: AxisLayout, ly: AxisLayout) -> bool:
    """Whether x and y are rows along a unit-stride last axis (the warp, block and loop
    variants); else the strided variant runs."""
    return lx.inner == 1 and lx.n_stride == 1 and ly.n_stride == 1


def max_vec(x_ptr: int, x_row: int, y_ptr: int, y_row: int, in_dtype: DType,
            out_dtype: DType, rows: int) -> int:
    """The widest access (elements, a power of two, at most 16 bytes) that every row start of
    x and y allows."""
    return vector_width(access_width(in_dtype, out_dtype),
                        ((x_ptr, x_row, in_dtype.itemsize), (y_ptr, y_row, out_dtype.itemsize)),
                        rows)


def _check_axis(axis, ndim: int) -> int:
    try:
        if isinstance(axis, bool):
            raise TypeError
        a = operator.index(axis)
    except TypeError:
        raise ArgumentTypeError(f"axis: expected an int, got {axis!r}") from None
    dims = max(ndim, 1)      # a 0-d array is one row of one element: axis 0 or -1
    if not -dims <= a < dims:
        raise ArgumentValueError(f"axis: expected an int in [{-dims}, {dims}) for an array of "
                                 f"{ndim} dimension{'s' if ndim != 1 else ''}, got {a}")
    return a % dims


def _check_out(x, out) -> None:
    """out may be x itself (same memory, dtype and strides: in place) or overlap it nowhere;
    it may not write one element twice (a zero stride)."""
    for size, stride in zip(out.shape, out.strides):
        if size > 1 and stride == 0 and out.size:
            raise ArgumentValueError(f"out: expected an array that holds each element once, got "
                                     f"strides {out.strides} (a broadcast view)")
    if x.size == 0:
        return
    xs, ys = byte_span(x), byte_span(out)
    if xs[0] < ys[1] and ys[0] < xs[1]:
        if out.data.ptr == x.data.ptr and out.strides == x.strides and out.dtype == x.dtype:
            return
        raise ArgumentValueError(
            f"out: overlaps x without being x (x bytes [{xs[0]:#x}, {xs[1]:#x}), out bytes "
            f"[{ys[0]:#x}, {ys[1]:#x})); pass out=x for an in-place softmax, or a separate array")



def _element_strides(a) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def softmax(x, axis: int = -1, *, out=None, config=None):
    """Softmax along ``axis``: ``y = exp(x - max) / sum(exp(x - max))`` over each vector of
    ``x`` along the axis, computed in float32.

    Args:
        x: a GPU array (``cupy.ndarray``, ``torch.Tensor`` on a CUDA device, or an object
            with ``__cuda_array_interface__``; the result is of its framework, on PyTorch's
            current stream for tensors) of float32, float16 or bfloat16, of any number of
            dimensions. A 0-d
            array is one vector of one element (``axis`` 0 or -1): its softmax is 1.0 (NaN for
            ±inf or NaN).
        axis: the axis to normalize over (negative counts from the end). Along a unit-stride
            last axis the rows are read in place with any row stride (a slice of a wider array
            is not copied); any other axis, or a last axis with a stride, runs the strided
            kernel (one thread per vector, reading it twice) without a copy. Only when the
            dimensions before (or after) the axis cannot be walked with one stride, e.g.
            ``x = big[:, :5, :]`` of a (4, 8, n) array with axis 2, is x first copied to a
            C-contiguous array (and when ``out`` is such an array, the result is written to a
            C-contiguous temporary and copied into it).
        out: optional array of x's shape, float32, float16 or bfloat16 (the result's dtype;
            default x's), written and returned. It may be x itself (in place: every kernel
            reads each vector whole before writing it); any other overlap with x is refused.
        config: pin the kernel variant by name (see ``ge2jit.ops.softmax.spec``):
            ``"warp{G}_v{V}_r{R}"`` (rows of up to G*V elements, G lanes per row),
            ``"block_{T}_v{V}"`` (rows of up to T*V elements, a block per row),
            ``"loop_{T}"`` (any row length, input read twice) or ``"strided_{T}"`` (any
            layout). The first three need rows along a unit-stride last axis.

    Semantics are those of a float64 ``e = exp(x - max(x)); e / sum(e)``: -inf entries give 0,
    a vector holding +inf or NaN gives NaN everywhere, a vector of -inf only gives NaN (0/0,
    as PyTorch). Empty arrays give an empty result without a launch. The call runs on CuPy's
    current device and stream (PyTorch tensors: their device, PyTorch's current stream) and
    never synchronizes.

    Raises:
        ArgumentTypeError: x or out is not a CuPy array; axis is not an int.
        ArgumentValueError: unsupported dtype, axis out of range, out of the wrong shape or
            dtype or partly overlapping x, an unknown config or one that does not fit.
        DeviceMismatchError: x or out is not on the current device.
    """
    fw = framework_of_type(type(x))
    sig = None
    if fw is not None:
        try:
            sig = (fw, fw.key(x), None if out is None else fw.key(out), axis, config,
                   arrays.current_device())
            call = _prepared.get(sig)
        except (AttributeError, TypeError):   # other arrays, or unhashable: checked below
            sig = call = None
        if call is not None:
            return call(x, out)
    fw, device_id, native = call_arguments({"x": x, "out": out})
    if sig is None and framework_of_type(type(x)) is fw:
        try:
            sig = (fw, fw.key(x), None if out is None else fw.key(out), axis, config,
                   arrays.current_device())
        except (AttributeError, TypeError):
            sig = None
    with fw.context(device_id):
        v = views(fw, native)
        result, call = _first_call(fw, device_id, v["x"], v["out"], out, axis, config)
        if call is not None and sig is not None and device_id == arrays.current_device():
            _prepared.put(sig, call)
    return result


def _first_call(fw, device_id, x, out, out_native, axis, config):
    """Check a call (x, out: CuPy views), launch it; (the result, its prepared call or
    None)."""
    given = out is not None
    x, out, ax, in_dtype, out_dtype, cfg = checked(x, axis, out, config)
    check_same_device({"x": x, "out": out}, device_id)
    if out is None:
        out_native = fw.allocator(x.dtype, device_id)(x.shape)
        out = fw.view(out_native, "out")
    if x.size == 0:
        return out_native, None
    return _execute(fw, x, out, ax, in_dtype, out_dtype, cfg, device_id, out_native, given)


def _execute(fw, x, out, ax, in_dtype, out_dtype, cfg, device_id, out_native, given):
    """Choose, launch and prepare a checked, non-empty call (x, out: CuPy views)."""
    choice, layouts, _ = decide(x, out, ax, in_dtype, out_dtype, cfg, device_id)
    if layouts is None:   # copies: not prepared
        _run(x, out, ax, choice, fw.stream_getter(device_id)())
        return out_native, None
    lx, ly = layouts
    launch = launcher_for(choice.spec, device_id).bind(
        choice.grid, choice.block, 0, rows=choice_rows(lx, ly), n=lx.n, inner=lx.inner,
        xo=lx.outer_stride, xn=lx.n_stride, xi=lx.inner_stride, yo=ly.outer_stride,
        yn=ly.n_stride, yi=ly.inner_stride)
    ptr, stream = fw.ptr, fw.stream_getter(device_id)
    new, shape = fw.allocator(x.dtype, device_id), x.shape
    launch(stream(), x=x.data.ptr, y=out.data.ptr)

    guard = OverlapGuard(("x", "out"), (x, out), (1,), in_place={(1, 0)}) if given else None

    def call(x, out):
        x_ptr = ptr(x)
        if out is None:
            y = new(shape)
        else:
            y = out
            if guard is not None:   # out given on the first call too (the signature says)
                guard((x_ptr, ptr(y)))
        launch(stream(), x=x_ptr, y=ptr(y))
        return y

    return out_native, call


def decide(x, out, axis: int, in_dtype: DType, out_dtype: DType, cfg, device_id: int):
    """(choice, layouts or None, reason) of a checked call (CuPy views; ``axis`` normalized):
    the pinned config, else the tuning database's for this key, else the heuristic."""
    reason = "pinned"
    if cfg is None:
        tuned = tuned_config("softmax", tuning_key(x, axis, out=out))
        cfg = None if tuned is None else parse_config(tuned)
        reason = "heuristic" if cfg is None else "tuned"
    choice, layouts = _plan(x, out, axis, in_dtype, out_dtype, cfg, device_id)
    return choice, layouts, reason


def checked(x, axis, out, config):
    """(x, out, axis, in dtype, out dtype, config or None) of a call's arguments (CuPy
    views), checked as the call checks them; ``out`` None stays None."""
    check_array(x, "x")
    in_dtype = check_dtype(x, "x")
    ax = _check_axis(axis, x.ndim)
    cfg = None if config is None else parse_config(config)
    out_dtype = in_dtype
    if out is not None:
        out_dtype = check_shaped(out, "out", x.shape, "(x's)", tuple(DType))
        _check_out(x, out)
    check_aligned(x, "x")
    return x, out, ax, in_dtype, out_dtype, cfg


def choice_rows(lx: AxisLayout, ly: AxisLayout) -> int:
    return lx.outer if rows_fast(lx, ly) else lx.outer * lx.inner


def tuning_key(x, axis: int = -1, *, out=None, config=None) -> dict:
    """What keys the tuning database for a softmax of ``x``: the types, the vector length
    (rounded up to a power of two), the vector count (likewise) and whether the vectors are
    rows along a unit-stride last axis."""
    ax = _check_axis(axis, x.ndim)
    shape = x.shape or (1,)
    n = shape[ax]
    rows = max(x.size // max(n, 1), 1)
    out_dtype = check_dtype(out if out is not None else x, "out")
    last = ax == len(shape) - 1 and (n <= 1 or x.strides[ax] == x.itemsize)
    return {"dtype": check_dtype(x, "x").value, "out_dtype": out_dtype.value,
            "n": 1 << max(n - 1, 0).bit_length(), "rows": 1 << max(rows - 1, 0).bit_length(),
            "rows_along_last_axis": last}


def _plan(x, out, axis, in_dtype, out_dtype, cfg, device_id):
    """(choice, (x's layout, y's layout)) of a call, or (choice, None) when x or out is
    copied first (``_run``). ``out`` None: the new C-contiguous output a call would make
    (explain, tune)."""
    xv = x.reshape(1) if x.ndim == 0 else x
    lx = axis_layout(xv.shape, _element_strides(xv), axis)
    if out is None:
        y_ptr, ly = 0, axis_layout(xv.shape, _contiguous_strides(xv.shape), axis)
    else:
        yv = out.reshape(1) if x.ndim == 0 else out
        y_ptr, ly = yv.data.ptr, axis_layout(yv.shape, _element_strides(yv), axis)
    copies = lx is None or ly is None
    if lx is None:
        lx = axis_layout(xv.shape, _contiguous_strides(xv.shape), axis)
    if ly is None:
        ly = axis_layout(xv.shape, _contiguous_strides(xv.shape), axis)
    fast = rows_fast(lx, ly)
    sms = sm_count(device_id)
    if fast:
        vec = 1 if copies else max_vec(xv.data.ptr, lx.outer_stride, y_ptr,
                                       ly.outer_stride, in_dtype, out_dtype, lx.outer)
        choice = _choose(lx.outer, lx.n, in_dtype, sms, out_dtype=out_dtype, max_vec=vec,
                         strided=False, config=cfg)
    else:
        choice = _choose(lx.outer * lx.inner, lx.n, in_dtype, sms, out_dtype=out_dtype,
                         max_vec=1, strided=True, config=cfg)
    return choice, None if copies else (lx, ly)


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.insert(0, acc)
        acc *= max(size, 1)
    return tuple(strides)


def _run(x, out, axis, choice, stream_ptr: int) -> None:
    """A call whose x or out cannot be walked as (outer, n, inner): x copied to a C-contiguous
    array, or the result written to one and copied into ``out`` (on the launch stream)."""
    cp = _cupy()
    xv, yv = (x.reshape(1), out.reshape(1)) if x.ndim == 0 else (x, out)
    lx = axis_layout(xv.shape, _element_strides(xv), axis)
    if lx is None:
        xv = cp.ascontiguousarray(xv)
        lx = axis_layout(xv.shape, _element_strides(xv), axis)
    target = yv
    ly = axis_layout(yv.shape, _element_strides(yv), axis)
    if ly is None:
        yv = cp.empty(yv.shape, dtype=yv.dtype)
        ly = axis_layout(yv.shape, _element_strides(yv), axis)
    spec, device_id = choice.spec, cp.cuda.runtime.getDevice()
    launcher_for(spec, device_id).launch(
        choice.grid, choice.block, 0, stream_ptr, x=xv.data.ptr, y=yv.data.ptr,
        rows=choice_rows(lx, ly), n=lx.n, inner=lx.inner, xo=lx.outer_stride,
        xn=lx.n_stride, xi=lx.inner_stride, yo=ly.outer_stride, yn=ly.n_stride,
        yi=ly.inner_stride)
    if yv is not target:
        target[...] = yv
