"""A stand-in for the few CuPy array attributes that validation reads, so that every argument
check runs on machines without a GPU. The GPU suite repeats the checks with real arrays."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


class FakeArray:
    def __init__(self, shape, dtype=np.float32, strides=None, device=0, base=None, offset=0):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape)) if self.shape else 1
        if strides is None:
            strides, acc = [], self.itemsize
            for s in reversed(self.shape):
                strides.insert(0, acc)
                acc *= max(s, 1)
        self.strides = tuple(strides)
        self.device = SimpleNamespace(id=device)
        self.base = base if base is not None else id(self)
        self.offset = offset

    @property
    def T(self):
        return FakeArray(self.shape[::-1], self.dtype, self.strides[::-1], self.device.id,
                         self.base, self.offset)

    def __repr__(self):
        return f"FakeArray(shape={self.shape}, strides={self.strides})"


def make_module(device: int = 0):
    def may_share_memory(x, y):
        return x.base == y.base

    def ascontiguousarray(x):
        return FakeArray(x.shape, x.dtype, device=x.device.id)

    return SimpleNamespace(
        ndarray=FakeArray,
        cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: device)),
        may_share_memory=may_share_memory,
        ascontiguousarray=ascontiguousarray,
    )
