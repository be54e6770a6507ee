"""A stand-in for the few CuPy array attributes that validation reads, so that every argument
check runs on machines without a GPU. The GPU suite repeats the checks with real arrays."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np

_addresses = itertools.count(1 << 40, 1 << 32)   # each fresh array gets its own 4 GiB range


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
        self.base = base if base is not None else next(_addresses)
        self.offset = offset
        self.data = SimpleNamespace(ptr=self.base + offset, device_id=device)

    @property
    def flags(self):
        expect, acc = [], self.itemsize
        for n in reversed(self.shape):
            expect.insert(0, acc)
            acc *= max(n, 1)
        return SimpleNamespace(c_contiguous=all(
            n == 1 or s == e for n, s, e in zip(self.shape, self.strides, expect)))

    @property
    def T(self):
        return FakeArray(self.shape[::-1], self.dtype, self.strides[::-1], self.data.device_id,
                         self.base, self.offset)

    def __repr__(self):
        return f"FakeArray(shape={self.shape}, strides={self.strides})"


def make_module(device: int = 0):
    def ascontiguousarray(x):
        return FakeArray(x.shape, x.dtype, device=x.data.device_id)

    return SimpleNamespace(
        ndarray=FakeArray,
        cuda=SimpleNamespace(runtime=SimpleNamespace(getDevice=lambda: device)),
        ascontiguousarray=ascontiguousarray,
    )
