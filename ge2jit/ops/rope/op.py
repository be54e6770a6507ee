"""rope and rope_backward: the calls. Argument checks, the arrays' strides, the kernel's spec
(``spec.py``), the launch and the prepared calls; both directions share them."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit import fastlaunch
from ...jit.fastlaunch import Ptr
from ...jit.loader import launcher_for
from ...runtime.checks import (
    check_aligned,
    check_apart,
    check_array,
    check_dtype,
    check_out,
    check_same_device,
    check_shaped,
    out_arrays,
)
from ...runtime.dtypes import DType
from ...runtime.prepared import OverlapGuard, PreparedCalls
from .spec import RopeSpec, check_fits, launch_geometry, make_spec, max_vec

#: the arrays of a call, in the order of the signature and of a prepared call's arguments
NAMES = ("q", "k", "cos", "sin", "positions", "q_out", "k_out")
_FLOATS = tuple(DType)
_PREPARED = {False: PreparedCalls("rope"), True: PreparedCalls("rope_backward")}
#: the compiled launch path's programs (``jit.fastlaunch``): the arrays, then interleaved
_COMPILED = {False: fastlaunch.Table("rope", "AAAAAAAV"),
             True: fastlaunch.Table("rope_backward", "AAAAAAAV")}


class Call(NamedTuple):
    """A checked call: CuPy views (``k``, ``positions``, ``q_out``, ``k_out`` may be None:
    absent, or outputs to allocate), its sizes and the spec it runs."""

    q: object
    k: object
    cos: object
    sin: object
    positions: object
    q_out: object
    k_out: object
    batch: int
    seq: int
    half: int
    spec: RopeSpec


def rope(q, k, cos, sin, *, interleaved: bool = False, positions=None, out=None):
    """Rotary position embedding of ``q`` and ``k`` in one launch: each pair of a head's
    elements rotated by the angle of its token's position, float32 math.

    Pair ``j < half`` of a head is ``(x[j], x[j + half])`` (GPT-NeoX, Hugging Face's LLaMA:
    ``interleaved=False``) or ``(x[2j], x[2j + 1])`` (GPT-J: ``interleaved=True``), and
    becomes ``(x1 cos - x2 sin, x2 cos + x1 sin)`` with ``cos[row, j]`` and ``sin[row, j]``.
    The elements from ``2 * half`` to the head's end pass through unchanged (a partial
    rotary dimension, as GPT-NeoX's).

    Args:
        q: a GPU array (``cupy.ndarray``, ``torch.Tensor`` on a CUDA device, or an object
            with ``__cuda_array_interface__``) of shape (batch, seq, heads, head_dim) or
            (seq, heads, head_dim), float32, float16 or bfloat16, with unit stride along
            head_dim and any other strides (a (batch, heads, seq, head_dim) tensor passes as
            its ``transpose(1, 2)`` view, not copied).
        k: None, or an array of q's type, batch, seq and head_dim with its own head count
            (grouped-query attention) and strides.
        cos: the cosines, (rows, half) or (batch or 1, rows, half), a floating type (it may
            differ from q's), unit stride along half. ``half`` is the number of rotated
            pairs: ``2 * half <= head_dim``. Hugging Face's cos and sin, which repeat their
            ``half`` columns twice, pass as ``cos[..., :half]``.
        sin: the sines, of cos's shape and type.
        interleaved: False for the half-split layout, True for the interleaved one.
        positions: None (token ``s`` of each sequence takes row ``s``: then ``rows >= seq``),
            or an int32 or int64 array of (batch, seq) or (seq,) giving each token's row. A
            position outside ``[0, rows)`` reads no table: its rotated elements become NaN.
        out: None (new arrays of q's and k's shapes and type, laid out as they are: the
            transposed view of a (batch, heads, seq, head_dim) array gets one too, else
            C-contiguous), or ``(q_out,
            k_out)``, arrays of q's and k's shapes and type (``k_out`` None with ``k``
            None), any strides with unit stride along head_dim; ``(q, k)`` rotates in place.

    Returns:
        ``(q_out, k_out)``, in q's framework (``k_out`` None when ``k`` is None), on
        PyTorch's current stream for tensors.

    Raises:
        ArgumentTypeError: an argument of the wrong kind (not a GPU array, a bad flag).
        ArgumentValueError: a shape, type, stride or overlap the kernel cannot take, named
            in one line, before anything is launched.
    """
    return _call(False, q, k, cos, sin, interleaved, positions, out)


def rope_backward(dq, dk, cos, sin, *, interleaved: bool = False, positions=None, out=None):
    """The gradients of ``rope``'s inputs from those of its outputs: ``dq`` and ``dk`` (the
    outputs' gradients) rotated by the opposite angles. Arguments as ``rope``'s, ``dq`` and
    ``dk`` in the places of ``q`` and ``k``; returns ``(dq_in, dk_in)``."""
    return _call(True, dq, dk, cos, sin, interleaved, positions, out)


#: (q_out, k_out) of ``out=`` (None: both None; k_out None with k None)
outputs = partial(out_arrays, names=("q_out", "k_out"), optional=("k_out",))


def _call(backward: bool, q, k, cos, sin, interleaved, positions, out):
    if not isinstance(interleaved, bool | np.bool_):
        raise ArgumentTypeError(f"interleaved: expected a bool, got {interleaved!r}")
    q_out, k_out = outputs(out)
    done = _COMPILED[backward].call(q, k, cos, sin, positions, q_out, k_out, interleaved)
    if done is not fastlaunch.MISS:
        return done
    arrays = {"q": q, "k": k, "cos": cos, "sin": sin, "positions": positions, "q_out": q_out,
              "k_out": k_out}

    def first(fw, device_id, v, native):
        call = checked(v, bool(interleaved), backward)
        check_same_device(v, device_id)
        result, prepared = _execute(fw, device_id, call, native)
        if prepared is not None:
            _COMPILED[backward].put((q, k, cos, sin, positions, q_out, k_out, interleaved),
                                    prepared.program, fw.name)
        return result, prepared

    return _PREPARED[backward].run(arrays, (bool(interleaved),), first)


def _heads(x, name: str, like=None) -> tuple[int, int, int, int]:
    """(batch, seq, heads, head_dim) of q or k (a 3-D array is one batch)."""
    check_array(x, name)
    if x.ndim not in (3, 4):
        raise ArgumentValueError(f"{name}: expected 4 dimensions (batch, seq, heads, head_dim) "
                                 f"or 3 (seq, heads, head_dim), got shape {x.shape}")
    b, s, h, d = (1, *x.shape) if x.ndim == 3 else x.shape
    if d > 1 and x.size and x.strides[-1] != x.itemsize:
        raise ArgumentValueError(f"{name}: expected unit stride along head_dim, got strides "
                                 f"{x.strides} (bytes); pass a copy with head_dim contiguous")
    if like is not None and (x.ndim != like[0] or (b, s, d) != like[1:]):
        raise ArgumentValueError(f"{name}: expected q's batch, seq and head_dim "
                                 f"{like[1:]} in {like[0]} dimensions, got shape {x.shape}")
    return b, s, h, d


def _check_table(x, name: str, batch: int, like=None) -> None:
    check_array(x, name)
    if x.ndim not in (2, 3) or (x.ndim == 3 and x.shape[0] not in (1, batch)):
        raise ArgumentValueError(f"{name}: expected shape (rows, half) or ({batch} or 1, rows, "
                                 f"half), got {x.shape}")
    if x.shape[-1] > 1 and x.size and x.strides[-1] != x.itemsize:
        raise ArgumentValueError(f"{name}: expected unit stride along half, got strides "
                                 f"{x.strides} (bytes)")
    if like is not None and (x.shape != like.shape or x.dtype != like.dtype):
        raise ArgumentValueError(f"{name}: expected cos's shape {like.shape} and dtype "
                                 f"{like.dtype}, got {x.shape} and {x.dtype}")
    check_dtype(x, name)
    check_aligned(x, name)


def _check_positions(p, batch: int, seq: int):
    check_array(p, "positions")
    if p.dtype.name not in ("int32", "int64"):
        raise ArgumentValueError(f"positions: expected dtype int32 or int64, got {p.dtype}")
    if p.shape not in ((seq,), (batch, seq), (1, seq)):
        raise ArgumentValueError(f"positions: expected shape ({batch}, {seq}) or ({seq},), "
                                 f"got {p.shape}")
    check_aligned(p, "positions")


def checked(v: dict, interleaved: bool, backward: bool) -> Call:
    """A call's arrays (CuPy views by name) checked as the call checks them, with the spec
    it runs."""
    q, k = v["q"], v["k"]
    b, s, _, d = _heads(q, "q")
    dtype = check_dtype(q, "q")
    if k is not None:
        _heads(k, "k", (q.ndim, b, s, d))
        if k.dtype != q.dtype:
            raise ArgumentValueError(f"k: expected q's dtype {q.dtype}, got {k.dtype}")
    cos, sin = v["cos"], v["sin"]
    _check_table(cos, "cos", b)
    _check_table(sin, "sin", b, like=cos)
    half, rows = cos.shape[-1], cos.shape[-2]
    positions = v["positions"]
    if positions is not None:
        _check_positions(positions, b, s)
    elif rows < s:
        raise ArgumentValueError(f"cos: expected at least seq = {s} rows without positions, "
                                 f"got {rows}")
    if half < 1 or 2 * half > d:
        raise ArgumentValueError(f"cos: expected 1 to head_dim / 2 = {d // 2} columns (the "
                                 f"rotated pairs), got {half}")
    q_out, k_out = v["q_out"], v["k_out"]
    if (k_out is None) != (k is None) and q_out is not None:
        raise ArgumentValueError(f"out: expected k_out {'None' if k is None else 'an array'} "
                                 f"as k is {'None' if k is None else 'given'}")
    inputs = {"q": q, "k": k, "cos": cos, "sin": sin, "positions": positions, "q_out": q_out}
    for name, o, own in (("q_out", q_out, "q"), ("k_out", k_out, "k")):
        if o is not None:
            x = inputs[own]
            check_shaped(o, name, x.shape, f"({own}'s)", _FLOATS)
            if o.dtype != x.dtype:
                raise ArgumentValueError(f"{name}: expected {own}'s dtype {x.dtype}, got "
                                         f"{o.dtype}")
            _heads(o, name)
            check_out(o, {own: x}, name)   # it may be its own input (in place), no other
            _check_apart(o, name, {n: a for n, a in inputs.items() if n not in (own, name)})
    for name in ("q", "k"):
        if inputs[name] is not None:
            check_aligned(inputs[name], name)
    arrays = [(a.data.ptr, _used_strides(a)) for a in (q, k, q_out, k_out) if a is not None]
    tables = [(t.data.ptr, _used_strides(t)) for t in (cos, sin)]
    vec = max_vec(dtype, cos.dtype, half=half, head_dim=d, copy_rest=2 * half < d,
                  arrays=arrays, tables=tables)
    spec = make_spec(dtype, cos.dtype, positions=None if positions is None else positions.dtype,
                     interleaved=interleaved, backward=backward, copy_rest=2 * half < d,
                     vec=vec)
    check_fits(spec, half, d)
    return Call(q, k, cos, sin, positions, q_out, k_out, b, s, half, spec)


def _check_apart(o, name: str, others: dict) -> None:
    """Refuse an output that meets any of ``others`` (arrays by name, None: absent)."""
    check_apart(o, name, others, lambda other: " (in place: out=(q, k))"
                if other in ("q", "k") else "")


def _used_strides(a) -> tuple[int, ...]:
    """The element strides of ``a``'s dimensions of more than one index, but the last."""
    return tuple(st // a.itemsize for n, st in zip(a.shape[:-1], a.strides[:-1]) if n > 1)


def _strides4(a) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of q, k or an output (0 for a missing batch)."""
    if a is None:
        return 0, 0, 0
    st = [x // a.itemsize for x in a.strides[:-1]]
    return (0, *st) if a.ndim == 3 else tuple(st)


def _table_strides(t) -> tuple[int, int]:
    st = [x // t.itemsize for x in t.strides[:-1]]
    return (0, st[0]) if t.ndim == 2 else (0 if t.shape[0] == 1 else st[0], st[1])


def _position_strides(p) -> tuple[int, int]:
    if p is None:
        return 0, 0
    st = [x // p.itemsize for x in p.strides]
    return (0, st[0]) if p.ndim == 1 else (0 if p.shape[0] == 1 else st[0], st[1])


def launch_params(call: Call, q_out, k_out) -> tuple[tuple, tuple, dict]:
    """(grid, block, the scalar parameters) of a checked call whose outputs are ``q_out``
    and ``k_out`` (CuPy views)."""
    hq = call.q.shape[-2]
    hk = 0 if call.k is None else call.k.shape[-2]
    tokens = call.batch * call.seq
    grid, block = launch_geometry(call.spec, tokens, hq + hk, call.half)
    names = ("qb", "qs", "qh", "kb", "ks", "kh", "qob", "qos", "qoh", "kob", "kos", "koh")
    strides = (*_strides4(call.q), *_strides4(call.k), *_strides4(q_out), *_strides4(k_out))
    params = dict(zip(names, strides))
    params.update(zip(("cb", "cr"), _table_strides(call.cos)))
    params.update(zip(("sb", "sr"), _table_strides(call.sin)))
    params.update(zip(("pb", "ps"), _position_strides(call.positions)))
    params.update(tokens=tokens, seq=call.seq, hq=hq, hk=hk, head_dim=call.q.shape[-1],
                  half=call.half, table_rows=call.cos.shape[-2])
    return grid, block, params


def swapped(x) -> bool:
    """Whether ``x`` (q or k) is the ``transpose(-3, -2)`` view of a C-contiguous array (a
    (batch, heads, seq, head_dim) array seen as (batch, seq, heads, head_dim)): its new
    output is laid out so too. (The strides of dimensions of one index do not count, as
    ``torch.Tensor.is_contiguous`` does not count them.)"""
    if x.size == 0 or x.shape[-3] == 1 or x.shape[-2] == 1:
        return False
    shape = (*x.shape[:-3], x.shape[-2], x.shape[-3], x.shape[-1])
    strides = (*x.strides[:-3], x.strides[-2], x.strides[-3], x.strides[-1])
    acc = x.itemsize
    for n, st in zip(reversed(shape), reversed(strides)):
        if n > 1 and st != acc:
            return False
        acc *= n
    return True


def _maker(fw, device_id: int, x):
    """``make()``: a new output for ``x`` (None: none), laid out as ``x`` (``swapped``) or
    C-contiguous."""
    if x is None:
        return None
    order = list(range(x.ndim))
    if swapped(x):
        order[-3], order[-2] = order[-2], order[-3]
    strides, acc = [0] * x.ndim, 1
    for axis in reversed(order):   # contiguous in ``order``'s sequence of axes
        strides[axis] = acc
        acc *= x.shape[axis]
    return fw.shaped_allocator(x.dtype, device_id, tuple(x.shape), tuple(strides))


def _execute(fw, device_id: int, call: Call, native: dict):
    """Launch a checked call; (its result, its prepared call)."""
    make_q, make_k = _maker(fw, device_id, call.q), _maker(fw, device_id, call.k)
    outs = []
    for name, make in (("q_out", make_q), ("k_out", make_k)):
        outs.append(native[name] if native[name] is not None or make is None else make())
    views = [None if o is None else fw.view(o, name) for o, name in zip(outs, ("q_out",
                                                                                 "k_out"))]
    given = native["q_out"] is not None
    result = (outs[0], outs[1])
    if call.q.size == 0 or not call.half:
        return result, None
    grid, block, params = launch_params(call, *views)
    launch = launcher_for(call.spec, device_id).bind(grid, block, 0, **params)
    stream, ptr = fw.stream_getter(device_id), fw.ptr
    launch(stream(), **_pointers(call, *views))
    guard = None
    if given:
        arrays = (call.q, call.k, call.cos, call.sin, call.positions, *views)
        guard = OverlapGuard(NAMES, arrays, (5, 6), in_place={(5, 0), (6, 1)}) or None
    def prepared(q, k, cos, sin, positions, q_out, k_out):
        ptrs = [ptr(q), 0 if k is None else ptr(k), ptr(cos), ptr(sin),
                0 if positions is None else ptr(positions)]
        if q_out is None:
            q_out = make_q()
            k_out = None if make_k is None else make_k()
        qo, ko = ptr(q_out), 0 if k_out is None else ptr(k_out)
        if guard is not None:
            guard((*ptrs, qo, ko))
        launch(stream(), q=ptrs[0], k=ptrs[1], cos=ptrs[2], sin=ptrs[3], positions=ptrs[4],
               q_out=qo, k_out=ko)
        return q_out, k_out

    prepared.program = fastlaunch.program(
        fw.name, [fastlaunch.step(launcher_for(call.spec, device_id), grid, block, 0, {
            **params, **{n: Ptr(i) for i, n in enumerate(NAMES)}})],
        [] if given else [(5, make_q, call.q.shape)] + (
            [] if make_k is None else [(6, make_k, call.k.shape)]),
        guard.pairs if guard is not None else (), guard, stream,
        fastlaunch.launch_failed(call.spec.kernel_name), returns=(5, 6))
    return result, prepared


def _pointers(call: Call, q_out, k_out) -> dict:
    def p(a):
        return 0 if a is None else a.data.ptr

    return dict(q=p(call.q), k=p(call.k), cos=p(call.cos), sin=p(call.sin),
                positions=p(call.positions), q_out=p(q_out), k_out=p(k_out))
