"""Layout cases: what an op declares so that one shared test can prove it on every layout it
accepts (``Op.layout_cases``; the test is ``tests/test_layouts_gpu.py``).

A case is one call of the op on host values with its float64 reference. The test places each
array argument in GPU memory in every layout the case allows (contiguous; rows of a wider
array, with pads that keep 16-byte alignment and pads that don't; one element past an aligned
base; transposed; every other element of a wider vector), leaves the other arrays contiguous,
and runs the call once with the outputs allocated by the op and once per ``out=`` argument
given in each of those layouts. Every result is compared with the reference, every pad around
an array is checked to be untouched, and a layout is refused only where the case says so
(with one ``ArgumentValueError`` line, the outputs still untouched). No op is named here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

#: what the layout test varies, by name: a 2-D array's rows padded by p elements
#: (``pad<p>``), one element past an aligned base (``offset``), both (``offset_pad3``), the
#: transposed view of a column-major array (``transposed``); a vector's every other element
#: (``stride2``)
PADS = (1, 2, 3, 5, 8)
MATRIX_LAYOUTS = ("contiguous", *(f"pad{p}" for p in PADS), "offset", "offset_pad3",
                  "transposed")
VECTOR_LAYOUTS = ("contiguous", "offset", "stride2")
#: the sizes the test runs a case's varying extent at: multiples of every vector width and
#: not, up to the vocabularies of real models (GPT-2's 50257)
SIZES = (1, 2, 3, 7, 31, 33, 1000, 4097, 32003, 50257)


@dataclass(frozen=True)
class Case:
    """One call of an op, on host arrays, with its float64 reference.

    - ``label``: what distinguishes the case (dtype, options), for failure messages.
    - ``arrays``: the array arguments by name, host values in the dtype the call takes (a
      2-D array is laid out as a matrix, a 1-D one as a vector, anything else contiguous).
      Arrays the call updates in place are here too and named in ``expected``.
    - ``outputs``: the ``out=``-style arguments the call may be given: name -> (shape,
      dtype). The test allocates them, poisoned, in each layout; left out, the op allocates.
    - ``run(arrays) -> results``: calls the op on GPU arrays by name (outputs only where
      given) and returns its results by name; an output given is returned under its name.
    - ``expected``: the float64 reference of each result by name.
    - ``tolerance``: per result name (or one number for all), the largest
      ``max |got - ref| / max |ref|`` allowed; 0 asks for the reference's values exactly.
      NaN must be where the reference has NaN, and nowhere else.
    - ``magnitude``: per result name, the size errors are measured against where it is not
      the result's own largest element (a mean whose terms cancel: the terms' size).
    - ``transposed``: names of 2-D arrays the op reads (or writes) column-major.
    - ``refused``: name -> the layouts the op refuses for it (with ``ArgumentValueError``,
      before any launch); every other layout must compute the reference.
    - ``fixed``: names of arrays the test leaves contiguous.
    - ``required``: outputs always given (contiguous where another array's layout varies):
      those that choose the result's type, say.
    """

    label: str
    arrays: Mapping[str, np.ndarray]
    run: Callable[[Mapping[str, object]], Mapping[str, object]]
    expected: Mapping[str, np.ndarray]
    tolerance: Mapping[str, float] | float
    outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]] = field(default_factory=dict)
    magnitude: Mapping[str, float] = field(default_factory=dict)
    transposed: frozenset[str] = frozenset()
    refused: Mapping[str, frozenset[str]] = field(default_factory=dict)
    fixed: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()

    def tol(self, name: str) -> float:
        t = self.tolerance
        return t[name] if isinstance(t, Mapping) else t

    def layouts(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The layouts the test tries for the argument ``name`` of ``shape`` (a matrix with
        a single row or column is not transposed: that would be the same memory)."""
        if name in self.fixed or len(shape) not in (1, 2):
            return ("contiguous",)
        if len(shape) == 1:
            return VECTOR_LAYOUTS
        return tuple(lay for lay in MATRIX_LAYOUTS
                     if lay != "transposed" or name in self.transposed and 1 not in shape)


def rng_for(*key) -> np.random.Generator:
    """A generator seeded from ``key`` (the case's op, size, dtype): fresh inputs in each
    case, the same on a rerun."""
    digest = hashlib.sha256(repr(tuple(map(str, key))).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def normal(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> np.ndarray:
    """Standard normal values times ``scale``, rounded to ``dtype`` (host)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


#: the unit roundoff of each element type by name: a case's tolerances are multiples of it
ROUNDING = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
            "float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}
#: the 32- and 16-bit element types by name, which every op reads
FLOATS = ("float32", "float16", "bfloat16")


def host_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an element type's name (ml_dtypes' for bfloat16 and 8-bit)."""
    if name in ("float32", "float16", "int32", "int64", "uint8"):
        return np.dtype(name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def new_like(like, shape):
    """An uninitialized array of ``like``'s framework (CuPy or PyTorch), type and device: an
    output a case's ``run`` makes where the test gives only some of them."""
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=like.dtype, device=like.device)
    import cupy

    return cupy.empty(shape, like.dtype)
