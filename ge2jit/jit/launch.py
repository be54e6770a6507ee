"""Launching a loaded kernel with little host overhead.

The parameters of ge2jit's kernels are 8 bytes each (pointers, ``long long``, ``double``),
optionally preceded by 128-byte tensor maps. They are packed with one ``struct.pack_into`` into a
per-thread buffer whose slots a fixed array of pointers already addresses, and the kernel is
launched with one ``cuLaunchKernel`` (the driver copies the parameters at launch, so the buffer
is free again at once).
"""

from __future__ import annotations

import re
import struct
import threading

import numpy as np

from ..errors import KernelLaunchError

MAX_PARAMS = 64
_tls = threading.local()


def _buffers(offsets: tuple[int, ...], size: int):
    """(values, pointers, pointer array address) of this thread for one parameter layout."""
    table = getattr(_tls, "bufs", None)
    if table is None:
        table = _tls.bufs = {}
    bufs = table.get(offsets)
    if bufs is None:
        values = np.zeros(-(-size // 8), dtype=np.uint64)
        base = values.ctypes.data
        pointers = np.array([base + o for o in offsets], dtype=np.uintp)
        bufs = table[offsets] = (values, pointers, pointers.ctypes.data)
    return bufs


def _layout(fmt: str) -> tuple[tuple[int, ...], int]:
    """Byte offsets of the parameters of ``fmt`` (codes Q, q, d, and 128s for a tensor map)."""
    codes = re.findall(r"128s|[Qqd]|.", fmt.lstrip("<"))
    if len(codes) > MAX_PARAMS or set(codes) - {"Q", "q", "d", "128s"}:
        raise ValueError(f"parameters must be at most {MAX_PARAMS} of Q, q, d or 128s, "
                         f"got {fmt!r}")
    offsets, at = [], 0
    for c in codes:
        offsets.append(at)
        at += 128 if c == "128s" else 8
    return tuple(offsets), at


class Launcher:
    """Launches one kernel whose parameters are described by ``fmt`` (struct codes Q, q, d;
    ``128s`` for a 128-byte tensor map passed by value)."""

    __slots__ = ("name", "fptr", "_pack", "_launch", "_offsets", "_size")

    def __init__(self, name: str, function_ptr: int, fmt: str):
        try:
            self._offsets, self._size = _layout(fmt)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        import cupy

        self.name = name
        self.fptr = function_ptr
        self._pack = struct.Struct("<" + fmt.lstrip("<")).pack_into
        self._launch = cupy.cuda.driver.launchKernel

    def __call__(self, grid, block, smem: int, stream_ptr: int, *args) -> None:
        values, _, params = _buffers(self._offsets, self._size)
        self._pack(values, 0, *args)
        try:
            self._launch(self.fptr, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         smem, stream_ptr, params, 0)
        except Exception as e:  # noqa: BLE001 - the driver's reason is in the message
            raise KernelLaunchError(f"launch of {self.name} failed: {e}") from e
