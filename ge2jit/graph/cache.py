"""The bounded table of a ``captured`` function's graphs: one per argument signature, the
least recently used one dropped when a new one would exceed the bound."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..errors import ArgumentTypeError, ArgumentValueError


def check_max_graphs(max_graphs) -> int:
    if isinstance(max_graphs, bool) or not isinstance(max_graphs, int):
        raise ArgumentTypeError(f"max_graphs: expected an int >= 1 (graphs kept, one per "
                                f"argument signature), got {max_graphs!r}")
    if max_graphs < 1:
        raise ArgumentValueError(f"max_graphs: expected an int >= 1 (graphs kept, one per "
                                 f"argument signature), got {max_graphs}")
    return max_graphs


class GraphCache:
    """signature -> captured step, least recently used first; at most ``max_graphs``.

    ``hits``, ``captures`` (entries added) and ``evictions`` count what happened. An evicted
    graph is dropped: its memory returns once no output of it is referenced any more."""

    def __init__(self, max_graphs: int = 8):
        self.max_graphs = check_max_graphs(max_graphs)
        self._table: OrderedDict = OrderedDict()
        self.lock = threading.RLock()
        self.hits = self.captures = self.evictions = 0

    def get(self, key):
        """The entry of ``key`` (now the most recently used), or None."""
        with self.lock:
            entry = self._table.get(key)
            if entry is not None:
                self._table.move_to_end(key)
                self.hits += 1
            return entry

    def put(self, key, entry) -> list:
        """Adds ``entry``; returns the entries evicted to keep the bound."""
        with self.lock:
            self._table[key] = entry
            self._table.move_to_end(key)
            self.captures += 1
            evicted = []
            while len(self._table) > self.max_graphs:
                evicted.append(self._table.popitem(last=False)[1])
                self.evictions += 1
            return evicted

    def clear(self) -> None:
        with self.lock:
            self._table.clear()

    def keys(self) -> list:
        """The signatures kept, least recently used first."""
        with self.lock:
            return list(self._table)

    def values(self) -> list:
        with self.lock:
            return list(self._table.values())

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return (f"GraphCache({len(self)} of {self.max_graphs} graphs; hits {self.hits}, "
                f"captures {self.captures}, evictions {self.evictions})")
