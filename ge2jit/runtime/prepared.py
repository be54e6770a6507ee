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

from ..errors import ArgumentValueError
from . import arrays
from .arrays import call_arguments, framework_of_type, views
from .checks import byte_span

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

    def lookup(self, probe, signature):
        """The prepared call of a call whose first array is ``probe``, ``signature(fw)`` being
        its key under probe's framework; None when there is none (a first call, or arguments
        the signature cannot key: the first call checks them)."""
        fw = framework_of_type(type(probe))
        if fw is None:
            return None
        try:
            return self.get(signature(fw))
        except (AttributeError, TypeError):   # other arrays, or unhashable
            return None

    def first_call(self, probe, signature, named: dict, first):
        """A call without a prepared call: its arrays (``named``: name -> array or None) read
        by their framework, ``first(fw, device_id, views, native) -> (result, prepared call
        or None)`` run in the framework's context (``views``: CuPy views by name, ``native``:
        the arrays as given), and the prepared call it returns stored under the call's
        signature (when the arrays' framework keys it and the call ran on the current
        device)."""
        fw, device_id, native = call_arguments(named)
        sig = None
        if framework_of_type(type(probe)) is fw:
            try:
                sig = signature(fw)
                hash(sig)
            except (AttributeError, TypeError):
                sig = None
        with fw.context(device_id):
            result, call = first(fw, device_id, views(fw, native), native)
            if call is not None and sig is not None and device_id == arrays.current_device():
                self.put(sig, call)
        return result

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"PreparedCalls({self.name!r}, {len(self)} of {self.limit})"


def clear_all() -> None:
    """Forget every op's prepared calls (after the tuning database changed)."""
    for table in _tables:
        table.clear()


def check_spans(names, spans, outputs) -> None:
    """Refuse outputs whose byte ranges meet an earlier array's: ``spans[i]`` is the
    (first byte, end) of ``names[i]`` or None; ``outputs`` the indices of the outputs, each
    checked against every array before it."""
    for oi in outputs:
        if spans[oi] is None:
            continue
        ol, oh = spans[oi]
        for xi in range(oi):
            if spans[xi] is not None:
                xl, xh = spans[xi]
                if ol < xh and xl < oh:
                    raise ArgumentValueError(f"{names[oi]}: overlaps {names[xi]}; pass a "
                                             "separate array")


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
                out, inp = self.names[oi], self.names[xi]
                if (oi, xi) in self.in_place:
                    raise ArgumentValueError(f"{out}: overlaps {inp} without being {inp}; pass "
                                             f"{out}={inp} (in place) or a separate array")
                raise ArgumentValueError(f"{out}: overlaps {inp}; pass a separate array")


def _relative(x) -> tuple[int, int]:
    lo, hi = byte_span(x)
    return lo - x.data.ptr, hi - x.data.ptr
