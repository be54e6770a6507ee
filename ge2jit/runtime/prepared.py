"""Prepared calls: the cached path of every op.

The first call of an argument pattern validates, chooses and loads its kernels, then binds
everything the pattern fixes into one function of the call's arrays and scalars (a *prepared
call*), stored under the pattern's signature: shapes, strides, dtypes, devices and the pointers'
16-byte alignment of the arrays (``Framework.key``), and the other arguments. A later call with
the same signature runs the prepared call directly. Pointers are not in the signature, so a
prepared call still checks, per call, that outputs passed in do not overlap inputs
(``OverlapGuard``: the byte ranges relative to each pointer are fixed by the signature).
"""

from __future__ import annotations

import threading

from ..jit import fastlaunch
from ..jit.device import on_sm_change
from . import arrays as _arrays
from .arrays import call_arguments, framework_of_type, views
from .checks import byte_span, overlap_error

_tables: list[PreparedCalls] = []


class PreparedCalls:
    """A bounded table signature -> prepared call (cleared whole when full: patterns are few
    in a real program, so a full table means signatures that never repeat)."""

    def __init__(self, name: str, limit: int = 4096):
        self.name, self.limit = name, limit
        self._table: dict = {}
        self._lock = threading.Lock()
        #: ``get(signature)``: the prepared call, or None
        self.get = self._table.get
        _tables.append(self)

    def put(self, signature, call) -> None:
        with self._lock:
            if len(self._table) >= self.limit:
                self._table.clear()
            self._table[signature] = call

    def clear(self) -> None:
        self._table.clear()

    def run(self, arrays: dict, extra: tuple, first_call, args: tuple = ()):
        """One call through this table. ``arrays`` (name -> array or None; the first decides
        the framework) and ``extra`` (the call's other arguments, hashable) make the call's
        signature; a prepared call stored under it runs as ``call(*arrays.values(), *args)``
        (``args``: values that vary from call to call without changing the signature, such as
        a scale factor). Otherwise ``first_call(fw, device_id, views, native)`` (``views``:
        CuPy views of the arrays by name, ``native``: the arrays as the framework reads them)
        checks and launches the call in the framework's context and returns (result, prepared
        call or None); the prepared call is stored for the next call of this signature."""
        values = tuple(arrays.values())
        fw = framework_of_type(type(values[0]))
        sig = None
        if fw is not None:
            sig = _signature(fw, values, extra)
            call = None if sig is None else self.get(sig)
            if call is not None:
                return call(*values, *args)
        fw, device_id, native = call_arguments(arrays)
        if sig is None and framework_of_type(type(values[0])) is fw:
            sig = _signature(fw, values, extra)
        with fw.context(device_id):
            result, call = first_call(fw, device_id, views(fw, native), native)
            if call is not None and sig is not None and device_id == _arrays.current_device():
                self.put(sig, call)
        return result

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"PreparedCalls({self.name!r}, {len(self)} of {self.limit})"


def _signature(fw, values: tuple, extra: tuple):
    """The signature of a call on ``values`` (arrays or None) of framework ``fw`` with the
    other arguments ``extra``; None when an argument has no key or is not hashable (such a
    call is checked and launched, never prepared). The other arguments' types are in it too:
    1, 1.0 and True are equal and hash alike, but only True passes a flag's check."""
    try:
        sig = (fw, *(None if x is None else fw.key(x) for x in values), extra,
               tuple(map(type, extra)), _arrays.current_device())
        hash(sig)
    except (AttributeError, TypeError):
        return None
    return sig


def clear_all() -> None:
    """Forget every op's prepared calls (after the tuning database or ``set_num_sms``
    changed)."""
    for table in _tables:
        table.clear()
    fastlaunch.clear_all()


on_sm_change(clear_all)


def check_spans(names, spans, outputs, in_place=(), same=()) -> None:
    """Refuse outputs whose byte ranges meet an earlier array's: ``spans[i]`` is the
    (first byte, end) of ``names[i]`` or None; ``outputs`` the indices of the outputs, each
    checked against every array before it. ``in_place``: (output, input) index pairs where the
    output may be the input itself; ``same``: those of them that are (the same view: pointer,
    shape, strides and dtype)."""
    for oi in outputs:
        if spans[oi] is None:
            continue
        ol, oh = spans[oi]
        for xi in range(oi):
            if spans[xi] is not None:
                xl, xh = spans[xi]
                if ol < xh and xl < oh and (oi, xi) not in same:
                    raise overlap_error(names[oi], names[xi], (oi, xi) in in_place, (ol, oh),
                                        (xl, xh))


def same_view(x, y) -> bool:
    """Whether two arrays are one view of the same memory: pointer, shape, strides, dtype."""
    return (x.data.ptr == y.data.ptr and x.shape == y.shape and x.strides == y.strides
            and x.dtype == y.dtype)


class OverlapGuard:
    """The per-call form of ``check_spans`` for one signature: ``guard(ptrs)`` with the
    arrays' pointers (0 or anything for an absent one) raises if an output given meets an
    input. Built from the first call's arrays (CuPy views). ``in_place``: (output, input)
    index pairs where the output may be the input itself (same pointer; the signature fixes
    that their strides and dtypes match, as they must for it to be allowed)."""

    __slots__ = ("names", "pairs", "outputs", "in_place")

    def __init__(self, names, arrays, outputs, in_place=()):
        rel = [None if x is None else _relative(x) for x in arrays]
        self.names, self.outputs, self.in_place = tuple(names), tuple(outputs), set(in_place)
        self.pairs = tuple(
            (oi, rel[oi][0], rel[oi][1], xi, rel[xi][0], rel[xi][1],
             (oi, xi) in in_place and arrays[oi].strides == arrays[xi].strides
             and arrays[oi].dtype == arrays[xi].dtype)
            for oi in outputs if rel[oi] is not None
            for xi in range(oi) if rel[xi] is not None)

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def __call__(self, ptrs) -> None:
        for oi, olo, ohi, xi, xlo, xhi, same_ok in self.pairs:
            o, x = ptrs[oi], ptrs[xi]
            if o + olo < x + xhi and x + xlo < o + ohi and not (same_ok and o == x):
                raise overlap_error(self.names[oi], self.names[xi], (oi, xi) in self.in_place,
                                    (o + olo, o + ohi), (x + xlo, x + xhi))


def _relative(x) -> tuple[int, int]:
    lo, hi = byte_span(x)
    return lo - x.data.ptr, hi - x.data.ptr
