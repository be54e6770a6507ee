"""GradientAllReduce without a GPU, on a recording stand-in for CuPy and NCCL: where its
streams wait, what it reduces and scales, and the timing events that ``timing=True`` records
around each bucket's all-reduce (none without it)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from ge2jit import ArgumentValueError
from ge2jit.distributed import GradientAllReduce, Group, ProcessInfo


class Recorder:
    """A stand-in for the parts of CuPy, NCCL and an NCCL backend that the reducer uses; every
    call is appended to ``log`` as a tuple naming it."""

    def __init__(self):
        self.log = []
        self.main = self.Stream(self, "main")

    class Stream:
        def __init__(self, rec, name=None, non_blocking=False):
            self.rec, self.name = rec, name or "side"

        def wait_event(self, event):
            self.rec.log.append(("wait", self.name, event.name))

        def __enter__(self):
            self.rec.current = self

        def __exit__(self, *exc):
            self.rec.current = self.rec.main

        def __repr__(self):
            return self.name

    class Event:
        count = 0

        def __init__(self, rec, disable_timing=False):
            Recorder.Event.count += 1
            self.rec, self.timing = rec, not disable_timing
            self.name = f"{'timing' if self.timing else 'sync'}{Recorder.Event.count}"

        def record(self, stream=None):
            stream = stream or self.rec.current
            self.rec.log.append(("record", stream.name, self.name))

    def modules(self) -> dict:
        rec = self
        rec.current = rec.main
        cupy = types.ModuleType("cupy")
        cuda = types.ModuleType("cupy.cuda")
        nccl = types.ModuleType("cupy.cuda.nccl")
        nccl.groupStart = lambda: rec.log.append(("groupStart",))
        nccl.groupEnd = lambda: rec.log.append(("groupEnd",))
        cuda.nccl = nccl
        cuda.Stream = lambda non_blocking=False: Recorder.Stream(rec, "side")
        cuda.Event = lambda disable_timing=False: Recorder.Event(rec, disable_timing)
        cuda.get_current_stream = lambda: rec.current

        class Device:
            def __init__(self, i):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        cuda.Device = Device
        cupy.cuda = cuda
        cupy.multiply = lambda a, s, out: rec.log.append(("scale", rec.current.name, a.name,
                                                           float(s)))
        return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl}

    def backend(self):
        rec = self

        class Backend:
            def all_reduce(self, a, out, op, stream):
                rec.log.append(("all_reduce", stream.name, a.name, op))

        return Backend()


def grad(name: str, nbytes: int):
    """A float32 stand-in array of ``nbytes`` bytes on device 0."""
    return SimpleNamespace(name=name, nbytes=nbytes, dtype=np.dtype(np.float32),
                           shape=(nbytes // 4,),
                           flags=SimpleNamespace(c_contiguous=True, f_contiguous=False),
                           device=SimpleNamespace(id=0))


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    for name, module in r.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    return r


def _group(rec, world: int) -> Group:
    info = ProcessInfo(0, world, 0, "127.0.0.1", 29500, "torchrun")
    return Group(info, 0, rec.backend() if world > 1 else None)


def _step(reducer, grads) -> None:
    for i in reversed(range(len(grads))):   # the backward's order: the last layer's first
        reducer.ready(i, grads[i])
    reducer.wait()


SIZES = [4000, 40, 8000, 80]   # two layers' (W, b): buckets of 8100 bytes hold one layer each


def test_without_timing_nothing_is_timed(rec):
    grads = [grad(f"g{i}", n) for i, n in enumerate(SIZES)]
    reducer = GradientAllReduce(_group(rec, 2), SIZES, bucket_bytes=8100)
    assert reducer.buckets == [[3, 2], [1, 0]] and reducer.events is None
    _step(reducer, grads)
    assert not any(entry[0] == "record" and "timing" in entry[2] for entry in rec.log)
    # each bucket: the side stream waits for the backward, reduces, scales by 1 / world
    kinds = [e[0] for e in rec.log]
    assert kinds == ["record", "wait", "groupStart", "all_reduce", "all_reduce", "groupEnd",
                     "scale", "scale"] * 2 + ["record", "wait"]
    assert all(e[1] == "side" for e in rec.log if e[0] in ("all_reduce", "scale"))
    assert [e[3] for e in rec.log if e[0] == "scale"] == [0.5] * 4


@pytest.mark.parametrize("world", [1, 2])
def test_timing_events_surround_each_buckets_all_reduce(rec, world):
    grads = [grad(f"g{i}", n) for i, n in enumerate(SIZES)]
    reducer = GradientAllReduce(_group(rec, world), SIZES, bucket_bytes=8100, timing=True)
    assert len(reducer.events) == 2 and all(s.timing and e.timing for s, e in reducer.events)
    for _ in range(2):   # the same events, recorded again by every step
        rec.log.clear()
        _step(reducer, grads)
        for b, (start, end) in enumerate(reducer.events):
            at = rec.log.index(("record", "side", start.name))
            until = rec.log.index(("record", "side", end.name))
            inside = rec.log[at + 1:until]
            assert rec.log[at - 1][0] == "wait", "timed from when the backward's event is met"
            reduced = [e[2] for e in inside if e[0] == "all_reduce"]
            assert reduced == ([f"g{i}" for i in reducer.buckets[b]] if world > 1 else [])
            assert sum(e[0] == "scale" for e in inside) == (len(reducer.buckets[b])
                                                            if world > 1 else 0)
        assert rec.log[-2:] == [("record", "side", reducer._done.name),
                                ("wait", "main", reducer._done.name)]


def test_a_gradient_of_another_size_is_refused(rec):
    reducer = GradientAllReduce(_group(rec, 1), SIZES, timing=True)
    with pytest.raises(ArgumentValueError, match="grad: gradient 3 was planned at 80 bytes"):
        reducer.ready(3, grad("g3", 40))
