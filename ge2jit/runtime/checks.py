"""Checks of an op's array and scalar arguments, shared by every op: each raises one line that
names the argument, what was expected and what came."""

from __future__ import annotations

import numbers
import operator

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, DeviceMismatchError
from .dtypes import SUPPORTED_DTYPES, SUPPORTED_TEXT, DType


def not_an_array(x, name: str) -> ArgumentTypeError:
    """The error for an argument that is no GPU array (a NumPy array gets a hint)."""
    what = ("expected a GPU array (cupy.ndarray, torch.Tensor on a CUDA device, or an object "
            "with __cuda_array_interface__)")
    if isinstance(x, np.ndarray):
        return ArgumentTypeError(f"{name}: {what}, got a numpy.ndarray of shape {x.shape}; move "
                                 f"it to the GPU with cupy.asarray({name})")
    return ArgumentTypeError(f"{name}: {what}, got {type(x).__name__}")


def not_on_cuda(x, name: str) -> ArgumentTypeError:
    """The error for a PyTorch tensor that is not on a CUDA device (the CPU, say)."""
    return ArgumentTypeError(f"{name}: expected a tensor on a CUDA device, got one on "
                             f"{x.device}; move it with {name}.cuda()")


def _cupy():
    from .._deps import require_cupy

    return require_cupy()


def check_array(x, name: str):
    """``x`` must be a CuPy ndarray (ops read other frameworks' arrays through CuPy views,
    ``runtime.arrays``); a NumPy array gets a hint to move it."""
    cp = _cupy()
    if isinstance(x, cp.ndarray):
        return x
    raise not_an_array(x, name)


def check_dtype(x, name: str) -> DType:
    dt = SUPPORTED_DTYPES.get(x.dtype.name)
    if dt is None:
        raise ArgumentValueError(
            f"{name}: dtype {x.dtype} is not supported; supported dtypes: {SUPPORTED_TEXT}"
        )
    return dt


def check_aligned(x, name: str) -> None:
    """The kernels read and write whole elements: ``x``'s pointer and every stride that is
    used (a dimension longer than 1) must be multiples of its item size. (A view at an odd
    byte offset of a larger buffer would fault or be read rounded down, never right.)"""
    item = x.itemsize
    if x.size == 0:
        return
    if x.data.ptr % item:
        raise ArgumentValueError(
            f"{name}: expected a pointer aligned to its {item}-byte elements, got one "
            f"{x.data.ptr % item} bytes past that; pass an aligned array (a copy: "
            f"cupy.ascontiguousarray({name}) will not fix the pointer, cupy.array({name}) does)")
    for size, stride in zip(x.shape, x.strides):
        if size > 1 and stride % item:
            raise ArgumentValueError(
                f"{name}: expected strides that are multiples of its {item}-byte elements, got "
                f"strides {x.strides} (bytes); pass cupy.array({name})")


def check_shaped(x, name: str, shape: tuple, shape_text: str,
                  allowed: tuple[DType, ...]) -> DType:
    """``x`` must be a CuPy array of ``shape`` (``shape_text`` says whose) with a dtype in
    ``allowed``; returns its DType."""
    check_array(x, name)
    if x.shape != shape:
        raise ArgumentValueError(f"{name}: expected shape {shape} {shape_text}, got {x.shape}")
    dt = check_dtype(x, name)
    if dt not in allowed:
        names = " or ".join(sorted({d.numpy_name for d in allowed}))
        raise ArgumentValueError(f"{name}: expected dtype {names}, got {x.dtype}")
    check_aligned(x, name)
    return dt


def check_scalar(x, name: str) -> float:
    """A real number that a double holds (the kernels take their scalars as doubles)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ArgumentTypeError(f"{name}: expected a real number, got {x!r}")
    try:
        return float(x)
    except OverflowError:
        raise ArgumentValueError(f"{name}: expected a real number within float64's range "
                                 f"(magnitude below about 1.8e308), got a {type(x).__name__} "
                                 "beyond it") from None


def check_float32_word(x, name: str):
    """``x`` must be a float32 GPU array of one element (an amax or a scale the kernels read
    or write in place), aligned."""
    check_array(x, name)
    if x.dtype != np.float32 or x.size != 1:
        raise ArgumentValueError(f"{name}: expected a float32 array of one element, got dtype "
                                 f"{x.dtype} and shape {x.shape}")
    check_aligned(x, name)
    return x


def host_scale(x) -> bool:
    """Whether a scale argument is None or a host number (not a device array)."""
    return x is None or isinstance(x, (int, float)) and not isinstance(x, bool)


def check_host_scale(x, name: str) -> None:
    """A host scale must be None or a positive finite number."""
    if x is not None and not 0 < check_scalar(x, name) < float("inf"):
        raise ArgumentValueError(f"{name}: expected a positive finite scale, got {x!r}")


#: the bounds of a 64-bit integer argument (``check_int64``)
INT64 = (-2**63, 2**63 - 1)


def check_int64(value, name: str) -> int:
    """An integer argument (Python's or NumPy's, not a bool) that fits 64 bits, as an int."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{name}: expected an int, got {value!r}") from None
    if not INT64[0] <= v <= INT64[1]:
        raise ArgumentValueError(f"{name}: expected a 64-bit integer, got {v}")
    return v


def check_bool(x, name: str) -> bool:
    """A flag: True or False (Python's or NumPy's bool; not 0, 1 or other truthy values)."""
    if not isinstance(x, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name}: expected True or False, got {x!r}")
    return bool(x)


def check_same_device(arrays: dict, device_id: int) -> None:
    for name, x in arrays.items():
        if x is not None and x.data.device_id != device_id:
            raise DeviceMismatchError(
                f"{name}: expected an array on the current device (GPU {device_id}), got one on "
                f"GPU {x.data.device_id}; move it with cupy.asarray inside "
                f"`with cupy.cuda.Device({device_id}):` or switch devices"
            )


def out_arrays(out, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> tuple:
    """The arrays of an ``out=`` that holds several outputs by position, ``names`` (a pair or
    a triple of output names); None gives a None each. Those in ``optional`` may be None."""
    if out is None:
        return (None,) * len(names)
    if not isinstance(out, tuple | list) or len(out) != len(names):
        word = {2: "pair", 3: "triple"}.get(len(names), f"{len(names)}-tuple")
        raise ArgumentTypeError(f"out: expected None or a {word} ({', '.join(names)}), got "
                                f"{type(out).__name__}"
                                + (f" of {len(out)}" if isinstance(out, tuple | list) else ""))
    for name, x in zip(names, out):
        if x is None and name not in optional:
            raise ArgumentTypeError(f"out: expected {name} an array, got None (pass out=None "
                                    f"for new outputs)")
    return tuple(out)


def check_out(out, inputs: dict, name: str = "out") -> None:
    """An output ``out`` (a CuPy array) may be one of ``inputs`` (``{name: array}``) itself
    (same memory, dtype and strides: the kernel writes in place, each element after reading
    it) or overlap none of them; it may not hold an element twice (a zero stride)."""
    for size, stride in zip(out.shape, out.strides):
        if size > 1 and stride == 0 and out.size:
            raise ArgumentValueError(f"{name}: expected an array that holds each element once, "
                                     f"got strides {out.strides} (a broadcast view)")
    if out.size == 0:
        return
    ys = byte_span(out)
    for x_name, x in inputs.items():
        if x is None or x.size == 0:
            continue
        xs = byte_span(x)
        if xs[0] < ys[1] and ys[0] < xs[1]:
            if out.data.ptr == x.data.ptr and out.strides == x.strides and out.dtype == x.dtype:
                continue
            raise overlap_error(name, x_name, True, ys, xs)


def check_apart(out, name: str, others: dict, hint=lambda other: "") -> None:
    """Refuse an output ``out`` that shares a byte range with any of ``others`` (``{name:
    array}``, None: absent), for a kernel that does not write in place; ``hint(other)``: text
    added to the message of an overlap with ``other``."""
    if out.size == 0:
        return
    lo, hi = byte_span(out)
    for other, x in others.items():
        if x is not None and x.size:
            xlo, xhi = byte_span(x)
            if lo < xhi and xlo < hi:
                raise overlap_error(name, other, False, (lo, hi), (xlo, xhi), hint(other))


def overlap_error(out: str, inp: str, in_place: bool, out_span: tuple, in_span: tuple,
                  hint: str = "") -> ArgumentValueError:
    """The error for an output ``out`` whose byte range (``out_span``: first byte, end) meets
    input ``inp``'s (``in_span``); ``in_place``: whether ``out`` may be ``inp`` itself;
    ``hint``: text after the remedy. Arrays are kept apart by their byte ranges, so two views
    that interleave (a wider array's halves) meet without sharing an element: the message
    gives both ranges."""
    what, fix = ((f"overlaps {inp} without being {inp}",
                  f"pass {out}={inp} (in place) or a separate array") if in_place
                 else (f"overlaps {inp}", "pass a separate array"))
    return ArgumentValueError(
        f"{out}: {what}; {fix}{hint} ({out}'s bytes [{out_span[0]:#x}, {out_span[1]:#x}) meet "
        f"{inp}'s [{in_span[0]:#x}, {in_span[1]:#x}): outputs are kept apart from inputs by "
        f"their byte ranges)")


def byte_span(x) -> tuple[int, int]:
    """[first byte, one past the last byte] an array can touch."""
    lo = hi = x.data.ptr
    for size, stride in zip(x.shape, x.strides):
        if size == 0:
            return lo, lo
        d = (size - 1) * stride
        if d < 0:
            lo += d
        else:
            hi += d
    return lo, hi + x.itemsize
