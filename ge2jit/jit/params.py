"""Kernel parameters, declared once per spec: the C parameter list and the launcher's packing
both come from them.

Every parameter takes one 8-byte slot (a pointer, a ``long long``, a ``double``) except a
TMA tensor map, passed by value in 128 bytes. Names are the kernel's own: the template's C
parameters and the keywords of its launch functions.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from enum import Enum

#: the most parameters a kernel takes (the launcher's buffers are sized per layout)
MAX_PARAMS = 64


class Kind(Enum):
    """How a parameter is passed: its ``struct`` code, its size in bytes, its C type (pointers
    carry their own)."""

    POINTER = ("Q", 8, "")
    INT64 = ("q", 8, "long long")
    DOUBLE = ("d", 8, "double")
    TENSOR_MAP = ("128s", 128, "const __grid_constant__ TensorMap")

    @property
    def code(self) -> str:
        return self.value[0]

    @property
    def size(self) -> int:
        return self.value[1]

    @property
    def ctype(self) -> str:
        return self.value[2]


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name, kind and (pointers only) C type, such as
    ``const bf16_t* __restrict__``."""

    name: str
    kind: Kind
    ctype: str = ""

    def __post_init__(self):
        if (not self.name.isidentifier() or keyword.iskeyword(self.name)
                or self.name.startswith("_")):
            raise ValueError(f"kernel parameter {self.name!r}: expected an identifier of C "
                             "and Python that does not start with '_'")
        if not isinstance(self.kind, Kind):
            raise TypeError(f"kernel parameter {self.name}: expected a Kind, got {self.kind!r}")
        if (self.kind is Kind.POINTER) != bool(self.ctype):
            raise ValueError(f"kernel parameter {self.name}: pointers, and only they, take a "
                             "C type")

    @property
    def declaration(self) -> str:
        """The C declaration: ``const float* __restrict__ A``, ``long long lda``."""
        return f"{self.ctype or self.kind.ctype} {self.name}"


def pointer(name: str, element: str, const: bool = False, restrict: bool = True) -> Param:
    """A ``__restrict__`` pointer to ``element`` values (read only with ``const``; without
    ``restrict`` where it may alias another parameter, as an in-place output does)."""
    return Param(name, Kind.POINTER, f"{'const ' if const else ''}{element}*"
                                     f"{' __restrict__' if restrict else ''}")


def array(name: str, element: str, *strides: str, const: bool = False) -> tuple[Param, ...]:
    """A pointer and the int64 strides (or leading dimension) that go with it."""
    return (pointer(name, element, const), *int64(*strides))


def int64(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, Kind.INT64) for n in names)


def double(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, Kind.DOUBLE) for n in names)


def tensor_maps(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, Kind.TENSOR_MAP) for n in names)


def param_list(params: tuple[Param, ...]) -> str:
    """The C parameter list, one parameter a line."""
    return ",\n    ".join(p.declaration for p in params)


def layout(params: tuple[Param, ...]) -> tuple[tuple[int, ...], int, str]:
    """(byte offset of each parameter, total size, ``struct`` format) of a parameter list."""
    if len(params) > MAX_PARAMS:
        raise ValueError(f"{len(params)} parameters; at most {MAX_PARAMS} allowed")
    names = [p.name for p in params]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"parameters named twice: {', '.join(repeated)}")
    offsets, at = [], 0
    for p in params:
        offsets.append(at)
        at += p.kind.size
    return tuple(offsets), at, "<" + "".join(p.kind.code for p in params)
