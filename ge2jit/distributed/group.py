"""A data-parallel job on CuPy: one process a GPU, NCCL through ``cupyx.distributed``, and
gradients all-reduced in buckets on a side stream while the backward goes on."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ArgumentValueError
from .buckets import BUCKET_BYTES, plan_buckets
from .environment import ProcessInfo, process_info

#: the gradient types NCCL reduces through ``cupyx.distributed``
REDUCIBLE = ("float16", "float32", "float64")


def _cupy():
    import cupy

    return cupy


class Group:
    """This process's part of a data-parallel job: its GPU (``device_id``, selected) and,
    with more than one process, CuPy's NCCL communicator. ``all_reduce`` and ``broadcast``
    are in place and queued on a stream (nothing waits on the host), so they may be captured
    in a CUDA graph (NCCL >= 2.9). With one process they do nothing."""

    def __init__(self, info: ProcessInfo, device_id: int, backend=None):
        self.info, self.device_id, self._backend = info, device_id, backend

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def _check(self, arrays, what: str):
        for i, a in enumerate(arrays):
            if a.dtype.name not in REDUCIBLE:
                raise ArgumentValueError(f"{what}[{i}]: expected dtype {', '.join(REDUCIBLE)}, "
                                         f"got {a.dtype}")
            if not a.flags.c_contiguous and not a.flags.f_contiguous:
                raise ArgumentValueError(f"{what}[{i}]: expected a contiguous array, got "
                                         f"strides {a.strides}")
            if a.device.id != self.device_id:
                raise ArgumentValueError(f"{what}[{i}]: expected an array on device "
                                         f"{self.device_id} (this rank's), got device "
                                         f"{a.device.id}")

    def _grouped(self, arrays: Sequence, call) -> None:
        """``call(array)`` for each array, checked, as one group of NCCL calls (none with
        one process)."""
        arrays = list(arrays)
        self._check(arrays, "arrays")
        if self._backend is None or not arrays:
            return
        from cupy.cuda import nccl

        nccl.groupStart()
        try:
            for a in arrays:
                call(a)
        finally:
            nccl.groupEnd()

    def all_reduce(self, arrays: Sequence, *, stream=None) -> None:
        """Sums each array over the ranks, in place, as one group of NCCL calls queued on
        ``stream`` (default: CuPy's current stream)."""
        self._grouped(arrays, lambda a: self._backend.all_reduce(a, a, "sum", stream))

    def broadcast(self, arrays: Sequence, *, root: int = 0, stream=None) -> None:
        """Copies rank ``root``'s arrays to every rank, in place (the parameters' initial
        values, so that every replica starts equal)."""
        self._grouped(arrays, lambda a: self._backend.broadcast(a, root, stream))


def init(info: ProcessInfo | None = None, *, device_id: int | None = None) -> Group:
    """Joins the job the launcher started (``info``: default ``process_info()``): selects
    this rank's GPU (``device_id``, default the local rank) and, with more than one process,
    makes CuPy's NCCL communicator, rank 0 serving the rendezvous at ``MASTER_ADDR`` on
    ``MASTER_PORT + 1``. Every rank must call it."""
    cp = _cupy()
    info = process_info() if info is None else info
    count = cp.cuda.runtime.getDeviceCount()
    device_id = info.local_rank if device_id is None else device_id
    if not 0 <= device_id < count:
        raise ArgumentValueError(f"device_id: expected a GPU in [0, {count}) on this host, got "
                                 f"{device_id} (local rank {info.local_rank})")
    cp.cuda.Device(device_id).use()
    backend = None
    if info.world_size > 1:
        import cupyx.distributed

        backend = cupyx.distributed.init_process_group(
            info.world_size, info.rank, backend="nccl", host=info.master_addr,
            port=info.rendezvous_port)
    return Group(info, device_id, backend)


class GradientAllReduce:
    """Gradients all-reduced (averaged, by default) over the ranks in buckets, each bucket's
    all-reduce issued on a side stream as soon as its last gradient is given, so it runs
    under the rest of the backward:

        reducer = GradientAllReduce(group, [w.nbytes for w in params])
        # in the backward, as each gradient is written (on the current stream):
        reducer.ready(i, grad_i)
        # before the optimizer reads them:
        reducer.wait()

    ``ready`` records an event on the current stream; the side stream waits for it, then
    reduces the bucket's arrays in place (one group of NCCL calls) and scales them by
    1 / world size. ``wait`` makes the current stream wait for the side stream. Nothing
    waits on the host, so a step with its all-reduces can be captured as a CUDA graph.

    ``timing=True`` (for profiling) records a pair of timing events on the side stream
    around each bucket's all-reduce and scaling, ``events[b]`` = (start, end) of bucket
    ``b`` in the step last issued; read them after synchronizing, with
    ``cupy.cuda.get_elapsed_time``. They time eager steps: an event recorded while a graph
    is captured orders the capture's streams, it is no timing of a replay. Off (the
    default), ``events`` is None and nothing is recorded.
    """

    def __init__(self, group: Group, nbytes: Sequence[int], *,
                 bucket_bytes: int = BUCKET_BYTES, kinds: Sequence | None = None,
                 average: bool = True, timing: bool = False):
        cp = _cupy()
        self.group, self.average = group, bool(average)
        self.nbytes = list(nbytes)
        self.buckets = plan_buckets(self.nbytes, bucket_bytes, kinds)
        self._bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self._given: list[dict] = [{} for _ in self.buckets]
        with cp.cuda.Device(group.device_id):
            self.stream = cp.cuda.Stream(non_blocking=True)
            self._ready = [cp.cuda.Event(disable_timing=True) for _ in self.buckets]
            self._done = cp.cuda.Event(disable_timing=True)
            self.events = ([(cp.cuda.Event(), cp.cuda.Event()) for _ in self.buckets]
                           if timing else None)

    def ready(self, index: int, grad) -> None:
        """Gradient ``index`` is ``grad``, written (or queued) on the current stream."""
        bucket = self._bucket_of.get(index) if isinstance(index, int) else None
        if bucket is None:
            raise ArgumentValueError(f"index: expected a gradient's index in [0, "
                                     f"{len(self.nbytes)}), got {index!r}")
        if grad.nbytes != self.nbytes[index]:
            raise ArgumentValueError(f"grad: gradient {index} was planned at "
                                     f"{self.nbytes[index]} bytes, got {grad.nbytes} "
                                     f"(shape {grad.shape}, {grad.dtype})")
        given = self._given[bucket]
        if index in given:
            raise ArgumentValueError(f"index: gradient {index} was given twice in one step "
                                     "(call wait() to end a step)")
        given[index] = grad
        if len(given) == len(self.buckets[bucket]):
            self._issue(bucket)

    def _issue(self, bucket: int) -> None:
        cp = _cupy()
        arrays = [self._given[bucket][i] for i in self.buckets[bucket]]
        event = self._ready[bucket]
        event.record(cp.cuda.get_current_stream())
        self.stream.wait_event(event)
        if self.events is not None:
            self.events[bucket][0].record(self.stream)
        self.group.all_reduce(arrays, stream=self.stream)
        if self.average and self.group.world_size > 1:
            scale = 1.0 / self.group.world_size
            with self.stream:
                for a in arrays:
                    cp.multiply(a, a.dtype.type(scale), out=a)
        if self.events is not None:
            self.events[bucket][1].record(self.stream)

    def wait(self) -> None:
        """Ends the step: the current stream waits for every bucket's all-reduce. Every
        gradient must have been given."""
        cp = _cupy()
        missing = sorted(i for b, members in enumerate(self.buckets) for i in members
                         if i not in self._given[b])
        if missing:
            raise ArgumentValueError(f"ready: gradients {missing} were not given this step; "
                                     "every planned gradient must be, before wait()")
        self._done.record(self.stream)
        cp.cuda.get_current_stream().wait_event(self._done)
        self._given = [{} for _ in self.buckets]
