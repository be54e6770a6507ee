"""Launching a loaded kernel with little host overhead.

Every parameter of ge2jit's kernels is 8 bytes (pointers, ``long long``, ``double``), so the
arguments are packed with one ``struct.pack_into`` into a per-thread buffer whose slots a fixed
array of pointers already addresses, and the kernel is launched with one ``cuLaunchKernel``
(the driver copies the parameters at launch, so the buffer is free again at once).
"""

from __future__ import annotations

import struct
import threading

import numpy as np

from ..errors import KernelLaunchError

MAX_PARAMS = 64
_tls = threading.local()


def _buffers():
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        values = np.zeros(MAX_PARAMS, dtype=np.uint64)
        base = values.ctypes.data
        pointers = np.array([base + 8 * i for i in range(MAX_PARAMS)], dtype=np.uintp)
        bufs = _tls.bufs = (values, pointers, pointers.ctypes.data)
    return bufs


class Launcher:
    """Launches one kernel whose parameters are described by ``fmt`` (struct codes Q, q, d)."""

    __slots__ = ("name", "fptr", "_pack", "_launch")

    def __init__(self, name: str, function_ptr: int, fmt: str):
        codes = fmt.lstrip("<")
        if len(codes) > MAX_PARAMS or set(codes) - set("Qqd"):
            raise ValueError(f"{name}: parameters must be at most {MAX_PARAMS} of Q, q or d")
        import cupy

        self.name = name
        self.fptr = function_ptr
        self._pack = struct.Struct("<" + codes).pack_into
        self._launch = cupy.cuda.driver.launchKernel

    def __call__(self, grid, block, smem: int, stream_ptr: int, *args) -> None:
        values, _, params = _buffers()
        self._pack(values, 0, *args)
        try:
            self._launch(self.fptr, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         smem, stream_ptr, params, 0)
        except Exception as e:  # noqa: BLE001 - the driver's reason is in the message
            raise KernelLaunchError(f"launch of {self.name} failed: {e}") from e
