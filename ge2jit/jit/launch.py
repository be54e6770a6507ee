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
from threading import get_ident

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
    ``128s`` for a 128-byte tensor map passed by value).

    The parameter buffers of the last thread that launched it are kept as one tuple
    ``(thread id, values, pointer array address)``, read once per call (so a thread never uses
    another's buffers); another thread takes its own from thread-local storage."""

    __slots__ = ("name", "fptr", "_pack", "_launch", "_offsets", "_size", "_owner")

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
        self._owner = (None, None, 0)

    def _packed(self, args) -> int:
        """Pack ``args`` into this thread's parameter buffer; the pointer array's address."""
        owner = self._owner
        thread = get_ident()
        if owner[0] != thread:
            values, _, params = _buffers(self._offsets, self._size)
            self._owner = owner = (thread, values, params)
        self._pack(owner[1], 0, *args)
        return owner[2]

    def bind(self, grid, block, smem: int):
        """``launch(stream_ptr, *args)``: this kernel with a fixed launch shape."""
        gx, gy, gz = grid
        bx, by, bz = block
        packed, driver, fptr, name = self._packed, self._launch, self.fptr, self.name

        def launch(stream_ptr, *args):
            params = packed(args)
            try:
                driver(fptr, gx, gy, gz, bx, by, bz, smem, stream_ptr, params, 0)
            except Exception as e:  # noqa: BLE001 - the driver's reason is in the message
                raise KernelLaunchError(f"launch of {name} failed: {e}") from e

        return launch

    def __call__(self, grid, block, smem: int, stream_ptr: int, *args) -> None:
        params = self._packed(args)
        try:
            self._launch(self.fptr, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         smem, stream_ptr, params, 0)
        except Exception as e:  # noqa: BLE001 - the driver's reason is in the message
            raise KernelLaunchError(f"launch of {self.name} failed: {e}") from e
