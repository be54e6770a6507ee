"""The shared layout test's machinery: host arrays placed in GPU memory in a named layout
(``ge2jit.runtime.cases``), poisoned around them, for CuPy and PyTorch; the variants of one
case; and one variant run and checked against the case's reference."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.runtime.cases import Case

cp = pytest.importorskip("cupy")

#: only the all-contiguous and the most awkward layout of each case (racecheck, synccheck)
QUICK = bool(os.environ.get("GE2JIT_LAYOUT_QUICK"))


def geometry(layout: str, shape: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
    """(elements of the flat base, offset of the first element, strides in elements) of an
    array of ``shape`` in ``layout``."""
    if len(shape) == 2:
        r, n = shape
        if layout == "transposed":
            return r * n, 0, (1, r)
        pad = 3 if layout == "offset_pad3" else int(layout[3:]) if layout.startswith("pad") else 0
        off = 1 if layout.startswith("offset") else 0
        return r * (n + pad) + off, off, (n + pad, 1)
    if len(shape) == 1 and layout != "contiguous":
        n = shape[0]
        return (n + 1, 1, (1,)) if layout == "offset" else (2 * n, 0, (2,))
    strides = np.empty(shape, np.int8).strides
    return max(1, int(np.prod(shape))), 0, strides


def poison(dtype: np.dtype) -> np.ndarray:
    """One element of ``dtype`` a kernel would never write: NaN for floats (0xff bytes for
    the 8-bit formats, a NaN in both), 0x5a.. bytes for integers."""
    if dtype.kind in "fV":   # V: ml_dtypes' bfloat16 and 8-bit floats
        return np.array([np.nan], np.float32).astype(dtype)
    return np.frombuffer(bytes([0x5A]) * dtype.itemsize, dtype)


class Placed:
    """A host array placed in a fresh GPU allocation in ``layout``, every element of the
    allocation outside the view poisoned. ``view`` is a CuPy array or a torch tensor."""

    def __init__(self, values: np.ndarray | None, shape, dtype, layout: str, framework: str):
        dtype = np.dtype(dtype)
        self.shape, self.dtype, self.layout = tuple(shape), dtype, layout
        size, off, strides = geometry(layout, self.shape)
        self.index = np.lib.stride_tricks.as_strided(
            np.arange(size, dtype=np.int64)[off:], self.shape,
            tuple(s * 8 for s in strides)) if size else np.zeros(self.shape, np.int64)
        host = np.full(size, poison(dtype)[0], dtype)
        if values is not None:
            host[self.index] = values.astype(dtype)
        self.before = host.copy()
        self.base = cp.asarray(host.view(_uint(dtype)))
        if framework == "torch":
            self.view = _torch_view(self.base, dtype, self.shape, strides, off)
        else:
            self.view = cp.lib.stride_tricks.as_strided(
                self.base.view(dtype)[off:], self.shape,
                tuple(s * dtype.itemsize for s in strides))

    def read(self) -> np.ndarray:
        """The whole allocation, on the host."""
        return cp.asnumpy(self.base).view(self.dtype)

    def values(self, host: np.ndarray) -> np.ndarray:
        return host[self.index]

    def pads_intact(self, host: np.ndarray) -> bool:
        mask = np.ones(host.shape, bool)
        mask[self.index] = False
        return np.array_equal(_bits(host[mask]), _bits(self.before[mask]))

    def unchanged(self, host: np.ndarray) -> bool:
        return np.array_equal(_bits(host), _bits(self.before))


def _uint(dtype: np.dtype):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(_uint(x.dtype))


def _torch_view(base, dtype: np.dtype, shape, strides, off):
    import torch

    signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    t = torch.from_dlpack(base.view({1: np.uint8, 2: np.int16, 4: np.int32,
                                     8: np.int64}[dtype.itemsize])).view(signed)
    t = t.view(torch_dtype(dtype))
    return torch.as_strided(t, shape, strides, off)


def torch_dtype(dtype: np.dtype):
    import torch

    name = np.dtype(dtype).name
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
            "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
            "float64": torch.float64}[name]


def to_host(x) -> np.ndarray:
    """A result (CuPy array or torch tensor, any dtype) as float64 on the host."""
    if isinstance(x, cp.ndarray):
        return cp.asnumpy(x).astype(np.float64)
    import torch

    return x.detach().to(torch.float64).cpu().numpy()


def pointer(x) -> int:
    return x.data.ptr if isinstance(x, cp.ndarray) else x.data_ptr()


def variants(case: Case) -> list[dict]:
    """The layouts of one case to run: all contiguous (outputs allocated by the op); each
    array in each other layout; each output given in each layout; every array and output in
    its most awkward layout at once (rows padded by 3 past an odd start, or a vector one
    element off), where the op accepts it. Each: name -> layout, outputs given included."""
    base = {name: "contiguous" for name in (*case.arrays, *case.required)}
    out = [dict(base)]
    for name, x in case.arrays.items():
        out += [{**base, name: lay} for lay in case.layouts(name, x.shape)
                if lay != "contiguous"]
    for name, (shape, _) in case.outputs.items():
        out += [{**base, name: lay} for lay in case.layouts(name, shape)]
    worst = {}
    for name, shape in [*((k, x.shape) for k, x in case.arrays.items()),
                        *((k, s) for k, (s, _) in case.outputs.items())]:
        lays = case.layouts(name, shape)
        pick = "offset_pad3" if "offset_pad3" in lays else "offset" if "offset" in lays else (
            "contiguous")
        worst[name] = "contiguous" if pick in case.refused.get(name, ()) else pick
    out.append(worst)
    unique = []
    for v in (out[0], out[-1]) if QUICK else out:
        if v not in unique:
            unique.append(v)
    return unique


def run_variant(case: Case, layout: dict, framework: str) -> str | None:
    """Run ``case`` with its arrays in ``layout`` (name -> layout; outputs named there are
    given); None if all is as it should be, else what went wrong (one line)."""
    placed = {}
    for name, x in case.arrays.items():
        placed[name] = Placed(x, x.shape, x.dtype, layout[name], framework)
    for name, (shape, dtype) in case.outputs.items():
        if name in layout:
            placed[name] = Placed(None, shape, dtype, layout[name], framework)
    refused = any(lay in case.refused.get(name, ()) for name, lay in layout.items())
    where = ", ".join(f"{k}={v}" for k, v in layout.items() if v != "contiguous") or "contiguous"
    what = f"{case.label} [{where}]"
    try:
        results = case.run({k: p.view for k, p in placed.items()})
    except ArgumentValueError as e:
        if not refused:
            return f"{what}: refused: {e}"
        if "\n" in str(e):
            return f"{what}: a refusal of more than one line: {e!r}"
        changed = [k for k, p in placed.items() if not p.unchanged(p.read())]
        return f"{what}: refused after writing {changed}" if changed else None
    if refused:
        return f"{what}: ran, but the case says this layout is refused"
    for name, p in placed.items():
        host = p.read()
        if name in case.expected:
            if not p.pads_intact(host):
                return f"{what}: {name}: an element around the array changed"
        elif not p.unchanged(host):
            return f"{what}: {name}: an input (or its surroundings) changed"
    for name, ref in case.expected.items():
        got = results.get(name)
        if got is None and name in case.outputs and name not in placed:
            continue   # an output the op makes only when it is given
        if got is None:
            return f"{what}: {name}: no result"
        if name in placed and pointer(got) != pointer(placed[name].view):
            return f"{what}: {name}: the result is not the array given"
        host = placed[name].values(placed[name].read()).astype(np.float64) if (
            name in placed) else to_host(got)
        msg = compare(host, np.asarray(ref, np.float64), case.tol(name),
                      case.magnitude.get(name))
        if msg:
            return f"{what}: {name}: {msg}"
    return None


def compare(got: np.ndarray, ref: np.ndarray, tol: float,
            magnitude: float | None = None) -> str | None:
    """None if ``got`` matches ``ref`` within ``tol`` (``max |got - ref| / max |ref|``, or
    over ``magnitude`` where given; NaN and infinities where the reference has them and
    nowhere else), else why not."""
    if got.shape != ref.shape:
        return f"shape {got.shape}, expected {ref.shape}"
    nan = np.isnan(ref)
    if not np.array_equal(np.isnan(got), nan):
        return (f"NaN at {np.count_nonzero(np.isnan(got) & ~nan)} elements where the "
                f"reference has none, or missing at {np.count_nonzero(nan & ~np.isnan(got))}")
    inf = np.isinf(ref)
    if not np.array_equal(got[inf], ref[inf]) or np.isinf(got[~inf]).any():
        return "infinities differ from the reference's"
    fin = ~(nan | inf)
    if not fin.any():
        return None
    diff = np.abs(got[fin] - ref[fin])
    scale = np.abs(ref[fin]).max() if magnitude is None else magnitude
    err = diff.max() / scale if scale > 0 else diff.max()
    if err > tol:
        i = int(np.argmax(diff))
        return (f"error {err:.3g} > {tol:.3g} (worst: {got[fin][i]!r} against "
                f"{ref[fin][i]!r})")
    return None
