"""Tensor maps for the Hopper copy engine (TMA), made by the driver's cuTensorMapEncodeTiled.

A tensor map describes an array of up to 5 dimensions in global memory (address, sizes,
strides) and the box a kernel copies from it; kernels take it by value (a 128-byte
``__grid_constant__`` parameter).
The driver call is made through ctypes on ``libcuda`` (CuPy does not expose it). Maps depend on
the array's address, so they are kept in a small table keyed by everything they encode: a
training loop that reuses its buffers encodes each map once.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import numpy as np

from ..errors import KernelLaunchError

#: CUtensorMapDataType of the element types
DATA_TYPES = {"f16": 6, "f32": 7, "bf16": 9, "e4m3": 0, "e5m2": 0}   # 8-bit floats as bytes (UINT8)
#: CUtensorMapSwizzle of the swizzle spans (bytes)
_SWIZZLES = {64: 2, 128: 3}
_L2_PROMOTION_128B = 2
_TABLE_SIZE = 1024

_lock = threading.Lock()
_table: OrderedDict[tuple, bytes] = OrderedDict()
_encode = None


def _driver_function():
    global _encode
    if _encode is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise KernelLaunchError(f"the CUDA driver library (libcuda.so.1) could not be "
                                    f"loaded for tensor maps: {e}") from e
        fn = lib.cuTensorMapEncodeTiled
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p,
                       u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _encode = fn
    return _encode


def tensor_map_2d(dtype: str, ptr: int, inner: int, outer: int, row_bytes: int,
                  box_inner: int, box_outer: int, swizzle: int = 128) -> bytes:
    """The 128 bytes of a tensor map of a 2-D array.

    ``inner`` elements are contiguous, ``outer`` rows are ``row_bytes`` apart; boxes of
    ``box_inner`` x ``box_outer`` elements move between global and shared memory with the
    128-byte swizzle (``swizzle``: 64 for boxes of 64-byte rows); elements outside the array
    read as zero, and stores skip them.
    """
    return tensor_map(dtype, ptr, (inner, outer), (row_bytes,), (box_inner, box_outer),
                      swizzle)


def tensor_map(dtype: str, ptr: int, dims: tuple[int, ...], strides: tuple[int, ...],
               box: tuple[int, ...], swizzle: int = 128) -> bytes:
    """The 128 bytes of a tensor map of an array of up to 5 dimensions: ``dims`` (innermost
    first; the innermost contiguous), the byte ``strides`` of the others (multiples of 16),
    the ``box`` a copy moves (innermost first), with the 128-byte swizzle (or 64). Elements
    outside the array read as zero, and stores skip them."""
    rank = len(dims)
    key = (dtype, ptr, tuple(dims), tuple(strides), tuple(box), swizzle)
    with _lock:
        blob = _table.get(key)
        if blob is not None:
            _table.move_to_end(key)
            return blob
    fn = _driver_function()
    storage = np.zeros(128 + 64, dtype=np.uint8)            # the map must be 64-byte aligned
    offset = -storage.ctypes.data % 64
    c_dims = (ctypes.c_uint64 * rank)(*dims)
    c_strides = (ctypes.c_uint64 * max(rank - 1, 1))(*strides)
    c_box = (ctypes.c_uint32 * rank)(*box)
    ones = (ctypes.c_uint32 * rank)(*([1] * rank))
    status = fn(storage.ctypes.data + offset, DATA_TYPES[dtype], rank, ctypes.c_void_p(ptr),
                c_dims, c_strides, c_box, ones, 0, _SWIZZLES[swizzle], _L2_PROMOTION_128B, 0)
    if status != 0:
        raise KernelLaunchError(
            f"cuTensorMapEncodeTiled failed (CUresult {status}) for a {dtype} array at "
            f"{ptr:#x} of sizes {tuple(dims)} (innermost first), strides {tuple(strides)} "
            f"bytes, box {tuple(box)}")
    blob = storage[offset:offset + 128].tobytes()
    with _lock:
        _table[key] = blob
        if len(_table) > _TABLE_SIZE:
            _table.popitem(last=False)
    return blob
