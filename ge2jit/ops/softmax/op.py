"""softmax and softmax_backward: the calls' plumbing. Argument checks, the layout of the
vectors in memory, the kernel choice (``spec.choose``, pure), the cached launcher and the
launch all live here; both directions share it (``Kind`` says which)."""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import NamedTuple

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit.device import sm_count
from ...jit.loader import launcher_for
from ...runtime.checks import (
    _cupy,
    check_aligned,
    check_array,
    check_dtype,
    check_out,
    check_same_device,
    check_shaped,
)
from ...runtime.dtypes import DType
from ...runtime.prepared import OverlapGuard, PreparedCalls
from ...runtime.rows import vector_width, walk_as_one
from ...runtime.tools import tuned_config
from .spec import access_width, check_held, choose, parse_config

_choose = lru_cache(maxsize=4096)(choose)


class Kind(NamedTuple):
    """One direction of the op: its function's name (also the tuning database's op), its
    array arguments (named as the kernel names them), whether it is the backward, and its
    prepared calls."""

    name: str
    inputs: tuple[str, ...]
    backward: bool
    prepared: PreparedCalls


FORWARD = Kind("softmax", ("x",), False, PreparedCalls("softmax"))
BACKWARD = Kind("softmax_backward", ("dy", "y"), True, PreparedCalls("softmax_backward"))


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


def rows_fast(*layouts: AxisLayout) -> bool:
    """Whether the arrays (inputs, then the output) are rows along a unit-stride last axis
    (the warp, block and loop variants); else the strided variant runs."""
    return layouts[0].inner == 1 and all(lay.n_stride == 1 for lay in layouts)


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
            ``"warp{G}_v{V}_r{R}"`` (rows of up to ``G*V`` elements, G lanes per row),
            ``"block_{T}_v{V}"`` (rows of up to ``T*V`` elements, a block per row),
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
    return _call(FORWARD, (x,), out, axis, config)


def softmax_backward(dy, y, axis: int = -1, *, out=None, config=None):
    """The gradient of a softmax along ``axis``: ``dx = y * (dy - sum(dy * y))`` over each
    vector along the axis, where ``y`` is the softmax's output and ``dy`` the gradient of the
    loss with respect to it; one fused pass in float32 (the dot product added in a fixed
    order: the same bits on every run).

    Args:
        dy: the output's gradient, a GPU array as ``softmax``'s x (CuPy, PyTorch on a CUDA
            device, or ``__cuda_array_interface__``) of float32, float16 or bfloat16, any
            number of dimensions.
        y: the softmax's output, of dy's shape and dtype. dy and y may share memory (both
            are only read).
        axis: as ``softmax``'s; the same layouts are read in place (rows along a unit-stride
            last axis with any row stride by the warp, block and loop variants; anything
            else by the strided variant, or copied when the dimensions on one side of the
            axis cannot be walked with one stride).
        out: optional array of dy's shape, float32, float16 or bfloat16 (dx's dtype; default
            dy's), written and returned. It may be dy or y itself (in place); any other
            overlap with them is refused.
        config: pin the kernel variant by name, as ``softmax``'s: the warp and block variants
            hold two arrays' values, so the backward takes those holding at most 16 values
            of each per thread (``warp{G}_v{V}_r{R}`` with V * R <= 16, ``block_{T}_v{V}``
            with V <= 16: rows of up to 512 and 16384 elements); ``loop_{T}`` reads dy and y
            twice (a dot-product pass, then the writing pass).

    NaN anywhere in a vector's dy or y makes that vector's dx NaN; an infinite dy gives NaN or
    infinities through the dot product, as the formula does in float64 (and PyTorch's
    ``_softmax_backward_data``). Empty arrays give an empty result without a launch; the call
    runs on CuPy's current device and stream (PyTorch tensors: their device, PyTorch's current
    stream) and never synchronizes.

    Raises:
        ArgumentTypeError: dy, y or out is not a GPU array; axis is not an int.
        ArgumentValueError: unsupported dtype, y of another shape or dtype than dy's, axis
            out of range, out of the wrong shape or dtype or partly overlapping dy or y, an
            unknown config or one that does not fit.
        DeviceMismatchError: an array is not on the current device.
    """
    return _call(BACKWARD, (dy, y), out, axis, config)


def _call(kind: Kind, inputs: tuple, out, axis, config):
    """A call of ``kind`` on its input arrays: the prepared call of its signature, else a
    first call (checked, launched, prepared)."""
    def first(fw, device_id, v, native):
        return _first_call(kind, fw, device_id, [v[n] for n in kind.inputs], v["out"], out,
                           axis, config)

    return kind.prepared.run({**dict(zip(kind.inputs, inputs)), "out": out}, (axis, config),
                             first)


def _first_call(kind, fw, device_id, ins, out, out_native, axis, config):
    """Check a call (ins, out: CuPy views), launch it; (the result, its prepared call or
    None)."""
    given = out is not None
    ins, out, ax, in_dtype, out_dtype, cfg = checked(kind, ins, axis, out, config)
    check_same_device({**dict(zip(kind.inputs, ins)), "out": out}, device_id)
    if out is None:
        out_native = fw.allocator(ins[0].dtype, device_id)(ins[0].shape)
        out = fw.view(out_native, "out")
    if ins[0].size == 0:
        return out_native, None
    return _execute(kind, fw, ins, out, ax, in_dtype, out_dtype, cfg, device_id, out_native,
                    given)


def _strides(spec, layouts) -> dict:
    """The kernel's stride parameters (``{array}o``, ``{array}n``, ``{array}i``) of the
    arrays' layouts (inputs, then the output)."""
    params = {}
    for name, lay in zip((*spec.inputs, spec.output), layouts):
        params[name + "o"], params[name + "n"], params[name + "i"] = (
            lay.outer_stride, lay.n_stride, lay.inner_stride)
    return params


def _execute(kind, fw, ins, out, ax, in_dtype, out_dtype, cfg, device_id, out_native, given):
    """Choose, launch and prepare a checked, non-empty call (ins, out: CuPy views)."""
    choice, layouts, _ = decide(kind, ins, out, ax, in_dtype, out_dtype, cfg, device_id)
    stream = fw.stream_getter(device_id)
    if layouts is None:   # copies: not prepared
        _run(ins, out, ax, choice, stream())
        return out_native, None
    spec, lx = choice.spec, layouts[0]
    launch = launcher_for(spec, device_id).bind(
        choice.grid, choice.block, 0, rows=choice_rows(*layouts), n=lx.n, inner=lx.inner,
        **_strides(spec, layouts))
    ptr = fw.ptr
    new, shape = fw.allocator(ins[0].dtype, device_id), ins[0].shape
    launch(stream(), **{name: a.data.ptr for name, a in zip((*spec.inputs, spec.output),
                                                             (*ins, out))})
    k = len(ins)
    guard = (OverlapGuard((*kind.inputs, "out"), (*ins, out), (k,),
                          in_place={(k, i) for i in range(k)}) if given else None)

    def output(in_ptrs: tuple, out):
        if out is None:
            return new(shape)
        if guard is not None:   # out given on the first call too (the signature says)
            guard((*in_ptrs, ptr(out)))
        return out

    if kind.backward:
        def call(dy, y, out):
            g, v = ptr(dy), ptr(y)
            dx = output((g, v), out)
            launch(stream(), dy=g, y=v, dx=ptr(dx))
            return dx
    else:
        def call(x, out):
            x_ptr = ptr(x)
            y = output((x_ptr,), out)
            launch(stream(), x=x_ptr, y=ptr(y))
            return y

    return out_native, call


def decide(kind, ins, out, axis: int, in_dtype: DType, out_dtype: DType, cfg, device_id: int):
    """(choice, layouts or None, reason) of a checked call (CuPy views; ``axis`` normalized):
    the pinned config, else the tuning database's for this key, else the heuristic."""
    reason = "pinned"
    if cfg is None:
        tuned = tuned_config(kind.name, tuning_key(ins[0], axis, out=out))
        cfg = None if tuned is None else parse_config(tuned)
        reason = "heuristic" if cfg is None else "tuned"
    choice, layouts = _plan(kind, ins, out, axis, in_dtype, out_dtype, cfg, device_id)
    return choice, layouts, reason


def checked(kind, ins, axis, out, config):
    """(inputs, out, axis, in dtype, out dtype, config or None) of a call's arguments (CuPy
    views), checked as the call checks them; ``out`` None stays None."""
    names = kind.inputs
    for a, name in zip(ins, names):
        check_array(a, name)
    first, shape = names[0], ins[0].shape
    in_dtype = check_dtype(ins[0], first)
    for a, name in zip(ins[1:], names[1:]):
        if a.shape != shape:
            raise ArgumentValueError(f"{name}: expected shape {shape} ({first}'s), got "
                                     f"{a.shape}")
        if check_dtype(a, name) is not in_dtype:
            raise ArgumentValueError(f"{name}: expected dtype {in_dtype.numpy_name} "
                                     f"({first}'s), got {a.dtype}")
    ax = _check_axis(axis, ins[0].ndim)
    cfg = None if config is None else parse_config(config)
    if cfg is not None:
        check_held(cfg, kind.backward)
    out_dtype = in_dtype
    if out is not None:
        out_dtype = check_shaped(out, "out", shape, f"({first}'s)", tuple(DType))
        check_out(out, dict(zip(names, ins)))
    for a, name in zip(ins, names):
        check_aligned(a, name)
    return list(ins), out, ax, in_dtype, out_dtype, cfg


def choice_rows(*layouts: AxisLayout) -> int:
    lx = layouts[0]
    return lx.outer if rows_fast(*layouts) else lx.outer * lx.inner


def tuning_key(x, axis: int = -1, *, out=None, config=None) -> dict:
    """What keys the tuning database for a softmax (or its backward) of ``x`` (the backward:
    of dy): the types, the vector length (rounded up to a power of two), the vector count
    (likewise) and whether the vectors are rows along a unit-stride last axis."""
    ax = _check_axis(axis, x.ndim)
    shape = x.shape or (1,)
    n = shape[ax]
    rows = max(x.size // max(n, 1), 1)
    out_dtype = check_dtype(out if out is not None else x, "out")
    last = ax == len(shape) - 1 and (n <= 1 or x.strides[ax] == x.itemsize)
    return {"dtype": check_dtype(x, "x").value, "out_dtype": out_dtype.value,
            "n": 1 << max(n - 1, 0).bit_length(), "rows": 1 << max(rows - 1, 0).bit_length(),
            "rows_along_last_axis": last}


def _as_vectors(a):
    return a.reshape(1) if a.ndim == 0 else a


def _plan(kind, ins, out, axis, in_dtype, out_dtype, cfg, device_id):
    """(choice, layouts of the inputs and the output) of a call, or (choice, None) when an
    array is copied first (``_run``). ``out`` None: the new C-contiguous output a call would
    make (explain, tune)."""
    vs = [_as_vectors(a) for a in ins]
    shape = vs[0].shape
    contiguous = axis_layout(shape, _contiguous_strides(shape), axis)
    lins = [axis_layout(v.shape, _element_strides(v), axis) for v in vs]
    if out is None:
        y_ptr, ly = 0, contiguous
    else:
        yv = _as_vectors(out)
        y_ptr, ly = yv.data.ptr, axis_layout(yv.shape, _element_strides(yv), axis)
    copies = ly is None or any(lay is None for lay in lins)
    layouts = (*(lay or contiguous for lay in lins), ly or contiguous)
    lx, sms = layouts[0], sm_count(device_id)
    if rows_fast(*layouts):
        spans = [(v.data.ptr, lay.outer_stride, in_dtype.itemsize)
                 for v, lay in zip(vs, layouts)]
        spans.append((y_ptr, layouts[-1].outer_stride, out_dtype.itemsize))
        vec = 1 if copies else vector_width(access_width(in_dtype, out_dtype), spans,
                                            lx.outer)
        choice = _choose(lx.outer, lx.n, in_dtype, sms, out_dtype=out_dtype, max_vec=vec,
                         strided=False, config=cfg, backward=kind.backward)
    else:
        choice = _choose(lx.outer * lx.inner, lx.n, in_dtype, sms, out_dtype=out_dtype,
                         max_vec=1, strided=True, config=cfg, backward=kind.backward)
    return choice, None if copies else layouts


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.insert(0, acc)
        acc *= max(size, 1)
    return tuple(strides)


def _run(ins, out, axis, choice, stream_ptr: int) -> None:
    """A call whose inputs or output cannot be walked as (outer, n, inner): such an input
    copied to a C-contiguous array, or the result written to one and copied into ``out`` (on
    the launch stream)."""
    cp = _cupy()
    vs, layouts = [], []
    for a in ins:
        v = _as_vectors(a)
        lay = axis_layout(v.shape, _element_strides(v), axis)
        if lay is None:
            v = cp.ascontiguousarray(v)
            lay = axis_layout(v.shape, _element_strides(v), axis)
        vs.append(v)
        layouts.append(lay)
    target = yv = _as_vectors(out)
    ly = axis_layout(yv.shape, _element_strides(yv), axis)
    if ly is None:
        yv = cp.empty(yv.shape, dtype=yv.dtype)
        ly = axis_layout(yv.shape, _element_strides(yv), axis)
    layouts.append(ly)
    spec, device_id = choice.spec, cp.cuda.runtime.getDevice()
    pointers = {name: a.data.ptr for name, a in zip((*spec.inputs, spec.output), (*vs, yv))}
    launcher_for(spec, device_id).launch(
        choice.grid, choice.block, 0, stream_ptr, **pointers, rows=choice_rows(*layouts),
        n=layouts[0].n, inner=layouts[0].inner, **_strides(spec, layouts))
    if yv is not target:
        target[...] = yv
