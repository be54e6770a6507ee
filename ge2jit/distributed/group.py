"""A data-parallel job on CuPy: one process a GPU, NCCL through CuPy's communicator, and
gradients all-reduced in buckets on a side stream while the backward goes on."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Sequence

from ..errors import ArgumentValueError
from .buckets import BUCKET_BYTES, plan_buckets
from .environment import ProcessInfo, process_info

#: NCCL's code of each type it reduces here (``ncclDataType_t`` in nccl.h): NCCL has reduced
#: bfloat16 since 2.10, which CuPy's ``cupyx.distributed`` does not pass on, so the group
#: calls CuPy's communicator with NCCL's own codes
NCCL_TYPES = {"float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
#: the array types the group reduces
REDUCIBLE = tuple(NCCL_TYPES)
#: NCCL's reductions (``ncclRedOp_t``): ``avg`` divides the sum by the ranks inside NCCL
NCCL_OPS = {"sum": 0, "avg": 4}
#: the NCCL version (``ncclGetVersion``: major * 10000 + minor * 100 + patch) that brought
#: bfloat16 and ``ncclAvg``
NCCL_MIN_VERSION = 21000
#: a stream priority above any device's range: CUDA takes the device's highest
HIGHEST_PRIORITY = -1000
#: how long ``init`` waits for every rank to join (seconds)
RENDEZVOUS_TIMEOUT_S = 300.0


def _cupy():
    import cupy

    return cupy


class Group:
    """This process's part of a data-parallel job: its GPU (``device_id``, selected) and,
    with more than one process, an NCCL communicator (``comm``: CuPy's
    ``cupy.cuda.nccl.NcclCommunicator``). Its collectives are in place and queued on a stream
    (nothing waits on the host), so they may be captured in a CUDA graph (NCCL >= 2.9). With
    one process they do nothing."""

    def __init__(self, info: ProcessInfo, device_id: int, comm=None):
        self.info, self.device_id, self.comm = info, device_id, comm

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def _check(self, arrays, what: str):
        for i, a in enumerate(arrays):
            if a.dtype.name not in NCCL_TYPES:
                raise ArgumentValueError(f"{what}[{i}]: expected dtype {', '.join(REDUCIBLE)}, "
                                         f"got {a.dtype}")
            if not a.flags.c_contiguous and not a.flags.f_contiguous:
                raise ArgumentValueError(f"{what}[{i}]: expected a contiguous array, got "
                                         f"strides {a.strides}")
            if a.device.id != self.device_id:
                raise ArgumentValueError(f"{what}[{i}]: expected an array on device "
                                         f"{self.device_id} (this rank's), got device "
                                         f"{a.device.id}")

    def _grouped(self, arrays: Sequence, call, stream) -> None:
        """``call(array, stream_ptr)`` for each array, checked, as one group of NCCL calls
        (none with one process)."""
        arrays = list(arrays)
        self._check(arrays, "arrays")
        self._collective([(a,) for a in arrays], stream, call)

    def all_reduce(self, arrays: Sequence, *, op: str = "sum", stream=None) -> None:
        """Reduces each array over the ranks, in place (``op``: "sum", or "avg": the sum
        divided by the world size, inside NCCL), as one group of NCCL calls queued on
        ``stream`` (default: CuPy's current stream). float16, bfloat16, float32 and float64
        arrays travel in their own type."""
        code = NCCL_OPS.get(op) if isinstance(op, str) else None
        if code is None:
            raise ArgumentValueError(f"op: expected one of {', '.join(NCCL_OPS)}, got {op!r}")
        self._grouped(arrays, lambda a, s: self.comm.allReduce(
            a.data.ptr, a.data.ptr, a.size, NCCL_TYPES[a.dtype.name], code, s), stream)

    def broadcast(self, arrays: Sequence, *, root: int = 0, stream=None) -> None:
        """Copies rank ``root``'s arrays to every rank, in place (the parameters' initial
        values, so that every replica starts equal)."""
        if isinstance(root, bool) or not isinstance(root, int) \
                or not 0 <= root < self.world_size:
            raise ArgumentValueError(f"root: expected a rank in [0, {self.world_size}), got "
                                     f"{root!r}")
        self._grouped(arrays, lambda a, s: self.comm.broadcast(
            a.data.ptr, a.data.ptr, a.size, NCCL_TYPES[a.dtype.name], root, s), stream)

    def _pairs(self, pairs: Sequence, big: int, what: str) -> list:
        """``pairs`` checked: each (a, b) of one type, contiguous, on this rank's GPU, with
        ``pair[big]`` world-size times the other's elements."""
        pairs = [tuple(p) for p in pairs]
        for i, pair in enumerate(pairs):
            if len(pair) != 2:
                raise ArgumentValueError(f"{what}[{i}]: expected a pair of arrays, got "
                                         f"{len(pair)} items")
            self._check(pair, f"{what}[{i}]")
            small = pair[1 - big]
            if pair[0].dtype != pair[1].dtype:
                raise ArgumentValueError(f"{what}[{i}]: expected arrays of one type, got "
                                         f"{pair[0].dtype} and {pair[1].dtype}")
            if pair[big].size != small.size * self.world_size:
                raise ArgumentValueError(
                    f"{what}[{i}]: expected the whole array to hold {self.world_size} shards "
                    f"of {small.size} elements, got {pair[big].size} elements")
        return pairs

    def _copies(self, pairs, stream) -> None:
        """One process: each pair's second array = its first (nothing when they are one)."""
        cp = _cupy()
        with stream if stream is not None else cp.cuda.get_current_stream():
            for src, dst in pairs:
                if src.data.ptr != dst.data.ptr:
                    dst.reshape(-1)[...] = src.reshape(-1)

    def reduce_scatter(self, pairs: Sequence, *, op: str = "avg", stream=None) -> None:
        """For each ``(whole, shard)``: ``shard`` gets this rank's part of ``whole`` reduced
        over the ranks (``op``: "avg" or "sum"), elements ``[rank * n, (rank + 1) * n)`` of
        the flat array, ``n = shard.size = whole.size / world size``; ``shard`` may be that
        part of ``whole`` itself. One group of NCCL calls on ``stream``; with one process, a
        copy. The gradients of a sharded optimizer (ZeRO-1): each rank steps its part."""
        code = NCCL_OPS.get(op) if isinstance(op, str) else None
        if code is None:
            raise ArgumentValueError(f"op: expected one of {', '.join(NCCL_OPS)}, got {op!r}")
        self._collective(self._pairs(pairs, 0, "pairs"), stream, lambda whole, shard, s:
                         self.comm.reduceScatter(
                             whole.data.ptr, shard.data.ptr, shard.size,
                             NCCL_TYPES[whole.dtype.name], code, s), copy_alone=True)

    def all_gather(self, pairs: Sequence, *, stream=None) -> None:
        """For each ``(shard, whole)``: ``whole`` gets every rank's ``shard``, rank ``r``'s at
        elements ``[r * n, (r + 1) * n)``; ``shard`` may be this rank's part of ``whole``
        (in place). One group of NCCL calls on ``stream``; with one process, a copy. The
        updated parameters of a sharded optimizer, back on every rank."""
        self._collective(self._pairs(pairs, 1, "pairs"), stream, lambda shard, whole, s:
                         self.comm.allGather(shard.data.ptr, whole.data.ptr, shard.size,
                                             NCCL_TYPES[shard.dtype.name], s), copy_alone=True)

    def _collective(self, items, stream, call, copy_alone: bool = False) -> None:
        """``call(*item, stream_ptr)`` for each item (checked), as one group of NCCL calls on
        ``stream`` (default: CuPy's current one). Without a communicator, nothing; with one
        process and ``copy_alone``, each pair's second array becomes its first."""
        if self.comm is None:
            if copy_alone and self.world_size == 1:
                self._copies(items, stream)
            return
        if not items:
            return
        from cupy.cuda import nccl

        ptr = (stream if stream is not None else _cupy().cuda.get_current_stream()).ptr
        nccl.groupStart()
        try:
            for item in items:
                call(*item, ptr)
        finally:
            nccl.groupEnd()

# --- joining a job -------------------------------------------------------------------------

def _send(conn: socket.socket, data: bytes) -> None:
    conn.sendall(struct.pack("!I", len(data)) + data)


def _receive(conn: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = conn.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            out += chunk
        return out

    return exactly(struct.unpack("!I", exactly(4))[0])


def rendezvous(info: ProcessInfo, unique_id, timeout_s: float = RENDEZVOUS_TIMEOUT_S):
    """The job's NCCL id, from rank 0 to every rank: rank 0 (which passes ``unique_id``, a
    callable making it) listens on ``MASTER_ADDR:MASTER_PORT + 1`` until every other rank
    has connected, said its rank and the world size, and received the id; the others connect
    (retrying until rank 0 listens). Pure sockets: no GPU.

    Raises:
        ArgumentValueError: the ranks disagree on the world size, or two say the same rank.
        TimeoutError: not every rank joined within ``timeout_s`` (one line naming the
            address and what was missing).
    """
    address = (info.master_addr, info.rendezvous_port)
    deadline = time.monotonic() + timeout_s
    where = f"{address[0]}:{address[1]} (MASTER_ADDR, MASTER_PORT + 1)"
    if info.rank == 0:
        uid = unique_id()   # bytes (CuPy >= 13) or a tuple of integers (before)
        payload = json.dumps(uid.hex() if isinstance(uid, bytes) else list(uid)).encode()
        joined: set[int] = set()
        with socket.create_server(address, backlog=max(info.world_size, 8)) as server:
            while len(joined) < info.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, info.world_size)) - joined)
                    raise TimeoutError(f"rendezvous: ranks {missing} of {info.world_size} did "
                                       f"not join rank 0 at {where} within {timeout_s:g} s")
                server.settimeout(left)
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(max(1.0, deadline - time.monotonic()))
                    rank, world = json.loads(_receive(conn))
                    if world != info.world_size:
                        raise ArgumentValueError(
                            f"WORLD_SIZE: rank {rank} was started with {world}, rank 0 with "
                            f"{info.world_size}; every rank of a job needs the same")
                    if rank in joined or not 0 < rank < info.world_size:
                        raise ArgumentValueError(f"RANK: rank {rank} joined twice or is "
                                                 f"outside [1, {info.world_size})")
                    _send(conn, payload)
                    joined.add(rank)
        return uid
    while True:
        try:
            with socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic())
                                          ) as conn:
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                _send(conn, json.dumps([info.rank, info.world_size]).encode())
                uid = json.loads(_receive(conn))
                return bytes.fromhex(uid) if isinstance(uid, str) else tuple(uid)
        except OSError as e:   # rank 0 not listening yet (refused), or gone
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rendezvous: rank {info.rank} could not reach rank 0 at "
                                   f"{where} within {timeout_s:g} s ({e})") from None
            time.sleep(0.05)


def connect_at_init(env=None) -> bool:
    """Ask NCCL to connect the ranks when the communicator is made rather than at each kind of
    collective's first call (``NCCL_RUNTIME_CONNECT=0``, NCCL >= 2.22), so that a job's first
    step does not pay for it. A value the user set is kept; True when it is 0 now."""
    import os

    env = os.environ if env is None else env
    env.setdefault("NCCL_RUNTIME_CONNECT", "0")
    return env["NCCL_RUNTIME_CONNECT"].strip() == "0"


def init(info: ProcessInfo | None = None, *, device_id: int | None = None,
         timeout_s: float = RENDEZVOUS_TIMEOUT_S, connect: bool = True) -> Group:
    """Joins the job the launcher started (``info``: default ``process_info()``): selects
    this rank's GPU (``device_id``, default the local rank) and, with more than one process,
    makes the job's NCCL communicator (NCCL >= 2.10), rank 0 handing out its id at
    ``MASTER_ADDR`` on ``MASTER_PORT + 1`` (``rendezvous``). Every rank must call it.
    ``connect``: the ranks are connected now (``connect_at_init``), not in the first step
    (NCCL reads the setting when its first communicator is made in the process)."""
    cp = _cupy()
    info = process_info() if info is None else info
    count = cp.cuda.runtime.getDeviceCount()
    device_id = info.local_rank if device_id is None else device_id
    if not 0 <= device_id < count:
        raise ArgumentValueError(f"device_id: expected a GPU in [0, {count}) on this host, got "
                                 f"{device_id} (local rank {info.local_rank})")
    cp.cuda.Device(device_id).use()
    comm = None
    if info.world_size > 1:
        from cupy.cuda import nccl

        version = nccl.get_version()
        if version < NCCL_MIN_VERSION:
            raise ArgumentValueError(f"NCCL: expected version 2.10 or later (bfloat16 and "
                                     f"average reductions), got {version}")
        if connect:
            connect_at_init()
        uid = rendezvous(info, nccl.get_unique_id, timeout_s)
        comm = nccl.NcclCommunicator(info.world_size, uid, info.rank)
    return Group(info, device_id, comm)


class GradientAllReduce:
    """Gradients all-reduced (averaged, by default) over the ranks in buckets, each bucket's
    all-reduce issued on a side stream as soon as its last gradient is given, so it runs
    under the rest of the backward:

        reducer = GradientAllReduce(group, [w.nbytes for w in params])
        # in the backward, as each gradient is written (on the current stream):
        reducer.ready(i, grad_i)
        # before the optimizer reads them: all of them ...
        reducer.wait()
        # ... or bucket by bucket, each one's optimizer step as soon as it is reduced:
        for b in range(len(reducer.buckets)):
            reducer.wait(b)
            ...   # the step of the parameters of reducer.buckets[b]
        reducer.wait()

    ``ready`` records an event on the current stream; the side stream (of the highest
    priority, so that its kernels get SMs as soon as any free) waits for it, then reduces the
    bucket's arrays in place as one group of NCCL calls (with ``average``, NCCL's ``avg``:
    no pass of its own). ``wait(b)`` makes the current stream wait for bucket ``b``;
    ``wait()`` for all of them, and ends the step. Nothing waits on the host, so a step with
    its all-reduces can be captured as a CUDA graph. Gradients may be of different types
    (each travels as its own; a bucket's are reduced by one group of calls); a gradient may
    be a piece of a parameter's (the rows of a weight gradient written by one of several
    matrix products), so that its reduction starts before the rest is written.

    ``first_bucket_bytes`` caps the first bucket (the last layer's gradients, complete
    earliest), so that communication starts early (DistributedDataParallel's 1 MiB).

    ``timing=True`` (for profiling) records a pair of timing events on the side stream
    around each bucket's all-reduce, ``events[b]`` = (start, end) of bucket ``b`` in the
    step last issued; read them after synchronizing, with ``cupy.cuda.get_elapsed_time``.
    They time eager steps: an event recorded while a graph is captured orders the capture's
    streams, it is no timing of a replay. Off (the default), ``events`` is None.
    """

    def __init__(self, group: Group, nbytes: Sequence[int], *,
                 bucket_bytes: int = BUCKET_BYTES, first_bucket_bytes: int | None = None,
                 kinds: Sequence | None = None, average: bool = True, timing: bool = False):
        cp = _cupy()
        self.group, self.average = group, bool(average)
        self.nbytes = list(nbytes)
        self.buckets = plan_buckets(self.nbytes, bucket_bytes, kinds,
                                    first_bucket_bytes=first_bucket_bytes)
        self._bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self._given: list[dict] = [{} for _ in self.buckets]
        self._last: int | None = None   # the bucket issued last this step
        with cp.cuda.Device(group.device_id):
            # CUDA clamps a priority beyond the device's range to its highest
            self.stream = cp.cuda.Stream(non_blocking=True, priority=HIGHEST_PRIORITY)
            self._ready = [cp.cuda.Event(disable_timing=True) for _ in self.buckets]
            self._done = [cp.cuda.Event(disable_timing=True) for _ in self.buckets]
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
        average = self.average and self.group.world_size > 1
        self.group.all_reduce(arrays, op="avg" if average else "sum", stream=self.stream)
        if self.events is not None:
            self.events[bucket][1].record(self.stream)
        self._done[bucket].record(self.stream)
        self._last = bucket

    def reset(self) -> None:
        """Forgets the gradients given this step (after a step that failed part-way: its
        reductions queued so far still run)."""
        self._given, self._last = [{} for _ in self.buckets], None

    def wait(self, bucket: int | None = None) -> None:
        """``bucket``: the current stream waits for that bucket's all-reduce (all of its
        gradients must have been given). None: it waits for every bucket's, and the step
        ends (every gradient must have been given)."""
        cp = _cupy()
        if bucket is not None:
            if isinstance(bucket, bool) or not isinstance(bucket, int) \
                    or not 0 <= bucket < len(self.buckets):
                raise ArgumentValueError(f"bucket: expected a bucket in [0, "
                                         f"{len(self.buckets)}), got {bucket!r}")
            missing = [i for i in self.buckets[bucket] if i not in self._given[bucket]]
            if missing:
                raise ArgumentValueError(f"bucket: gradients {sorted(missing)} of bucket "
                                         f"{bucket} were not given yet this step")
            cp.cuda.get_current_stream().wait_event(self._done[bucket])
            return
        missing = sorted(i for b, members in enumerate(self.buckets) for i in members
                         if i not in self._given[b])
        if missing:
            raise ArgumentValueError(f"ready: gradients {missing} were not given this step; "
                                     "every planned gradient must be, before wait()")
        # the side stream runs the buckets in the order they were issued: the last one's end
        # is every one's
        cp.cuda.get_current_stream().wait_event(self._done[self._last])
        self._given, self._last = [{} for _ in self.buckets], None
