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
        def __init__(self, rec, name=None, non_blocking=False, priority=None):
            self.rec, self.name, self.priority = rec, name or "side", priority
            self.ptr = self   # the communicator is handed the stream's handle

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
        cuda.Stream = lambda non_blocking=False, priority=None: Recorder.Stream(
            rec, "side", non_blocking, priority)
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
        return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl}

    def comm(self):
        """An NCCL communicator's stand-in: ``allReduce`` of pointers (the arrays' names
        here), counts and NCCL's type and operation codes on a stream."""
        rec = self

        class Comm:
            def allReduce(self, send, recv, count, dtype, op, stream):
                assert send == recv, "in place"
                rec.log.append(("all_reduce", stream.name, send, count, dtype, op))

            def reduceScatter(self, send, recv, count, dtype, op, stream):
                rec.log.append(("reduce_scatter", stream.name, send, recv, count, dtype, op))

            def allGather(self, send, recv, count, dtype, stream):
                rec.log.append(("all_gather", stream.name, send, recv, count, dtype))

        return Comm()


def grad(name: str, nbytes: int, dtype=np.float32):
    """A stand-in array of ``nbytes`` bytes on device 0 (its pointer: its name)."""
    dtype = np.dtype(dtype)
    return SimpleNamespace(name=name, nbytes=nbytes, dtype=dtype,
                           shape=(nbytes // dtype.itemsize,), size=nbytes // dtype.itemsize,
                           data=SimpleNamespace(ptr=name),
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
    return Group(info, 0, rec.comm() if world > 1 else None)


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
    # each bucket: the side stream waits for the backward, averages in NCCL (ncclAvg = 4,
    # float32 = 7), marks the bucket done; the step's end waits for the last one
    kinds = [e[0] for e in rec.log]
    assert kinds == ["record", "wait", "groupStart", "all_reduce", "all_reduce", "groupEnd",
                     "record"] * 2 + ["wait"]
    reduced = [e for e in rec.log if e[0] == "all_reduce"]
    assert [(e[1], e[2], e[3], e[4], e[5]) for e in reduced] == [
        ("side", "g3", 20, 7, 4), ("side", "g2", 2000, 7, 4),
        ("side", "g1", 10, 7, 4), ("side", "g0", 1000, 7, 4)]
    assert rec.log[-1] == ("wait", "main", reducer._done[1].name)
    assert reducer.stream.priority < 0, "the side stream's kernels get SMs first"


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
        assert rec.log[-2:] == [("record", "side", reducer._done[1].name),
                                ("wait", "main", reducer._done[1].name)]


def test_a_gradient_of_another_size_is_refused(rec):
    reducer = GradientAllReduce(_group(rec, 1), SIZES, timing=True)
    with pytest.raises(ArgumentValueError, match="grad: gradient 3 was planned at 80 bytes"):
        reducer.ready(3, grad("g3", 40))


def test_each_bucket_is_waited_for_by_itself(rec):
    """``wait(b)``: the current stream waits for bucket ``b``'s all-reduce only (its
    parameters' optimizer step may start while the next bucket is reduced); a bucket not
    complete yet is refused; ``wait()`` ends the step."""
    grads = [grad(f"g{i}", n) for i, n in enumerate(SIZES)]
    reducer = GradientAllReduce(_group(rec, 2), SIZES, bucket_bytes=8100)
    reducer.ready(3, grads[3])
    reducer.ready(2, grads[2])
    with pytest.raises(ArgumentValueError, match=r"bucket: gradients \[0, 1\] of bucket 1"):
        reducer.wait(1)
    rec.log.clear()
    reducer.wait(0)
    assert rec.log == [("wait", "main", reducer._done[0].name)]
    reducer.ready(1, grads[1])
    reducer.ready(0, grads[0])
    rec.log.clear()
    reducer.wait(1)
    reducer.wait()
    assert rec.log == [("wait", "main", reducer._done[1].name)] * 2
    with pytest.raises(ArgumentValueError, match="bucket: expected a bucket in"):
        reducer.wait(2)


def test_gradients_travel_in_their_own_type(rec):
    """bfloat16 and float16 gradients are reduced as such (NCCL's codes 9 and 6), float32
    beside them in the same group of calls; float64 is 8."""
    bf16 = np.dtype("bfloat16") if "bfloat16" in np.sctypeDict else None
    if bf16 is None:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        bf16 = np.dtype(ml_dtypes.bfloat16)
    grads = [grad("w", 64, bf16), grad("b", 16), grad("h", 32, np.float16),
             grad("d", 64, np.float64)]
    reducer = GradientAllReduce(_group(rec, 2), [g.nbytes for g in grads], average=False)
    assert reducer.buckets == [[3, 2, 1, 0]]
    _step(reducer, grads)
    reduced = {e[2]: (e[3], e[4], e[5]) for e in rec.log if e[0] == "all_reduce"}
    assert reduced == {"w": (32, 9, 0), "b": (4, 7, 0), "h": (16, 6, 0), "d": (8, 8, 0)}


def test_other_types_and_operations_are_refused(rec):
    group = _group(rec, 2)
    with pytest.raises(ArgumentValueError, match=r"arrays\[0\]: expected dtype float16, "
                                                 r"float32, float64, bfloat16, got int32"):
        group.all_reduce([grad("i", 16, np.int32)])
    with pytest.raises(ArgumentValueError, match="op: expected one of sum, avg, got 'max'"):
        group.all_reduce([grad("f", 16)], op="max")
    assert not [e for e in rec.log if e[0] == "all_reduce"]


def test_reduce_scatter_and_all_gather_move_shards(rec):
    """A sharded optimizer's collectives: each (whole, shard) pair reduce-scattered (NCCL's
    count is the shard's), each (shard, whole) all-gathered, one group of calls each, on the
    stream given."""
    group = _group(rec, 2)
    whole, shard = grad("w", 64), grad("s", 32)
    rec.log.clear()
    group.reduce_scatter([(whole, shard)], stream=rec.main)
    group.all_gather([(shard, whole)])
    assert rec.log == [("groupStart",), ("reduce_scatter", "main", "w", "s", 8, 7, 4),
                       ("groupEnd",), ("groupStart",), ("all_gather", "main", "s", "w", 8, 7),
                       ("groupEnd",)]


@pytest.mark.parametrize("pairs, message", [
    ([(grad("w", 64), grad("s", 16))], r"pairs\[0\]: expected the whole array to hold 2 shards "
                                       r"of 4 elements, got 16 elements"),
    ([(grad("w", 64), grad("s", 16, np.float16))], r"pairs\[0\]: expected arrays of one type, "
                                                   r"got float32 and float16"),
    ([(grad("w", 64),)], r"pairs\[0\]: expected a pair of arrays, got 1 items"),
])
def test_bad_shards_are_refused_before_any_call(rec, pairs, message):
    group = _group(rec, 2)
    rec.log.clear()
    with pytest.raises(ArgumentValueError, match=message):
        group.reduce_scatter(pairs)
    assert rec.log == []
