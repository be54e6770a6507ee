"""A job's processes started on this host without a launcher, and a batch's shards. Pure
Python: no GPU, no CuPy.

``launch_local(argv, n)`` starts ``argv`` ``n`` times, one process a GPU, each with the
variables ``torchrun --nproc-per-node n`` would give it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` 127.0.0.1, a free ``MASTER_PORT``), so
that each one joins the job with ``init()`` as under a launcher; it waits for all of them and
stops the others when one fails (they would wait for it in their collectives forever).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ArgumentValueError
from .environment import DEFAULT_ADDR

#: lines of a failed rank's output that a report shows (its last ones)
REPORT_LINES = 200


def _count(value, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArgumentValueError(f"{name}: expected an integer >= {least}, got {value!r}")
    return value


def shard(total: int, rank: int, world_size: int, *, what: str = "rows") -> slice:
    """Rank ``rank``'s share of ``total`` items (a batch's rows): the ``rank``-th of
    ``world_size`` equal, contiguous slices, so that the means over the shards, averaged over
    the ranks, are the means over the whole batch.

    Raises:
        ArgumentValueError: a world size that does not divide ``total`` (the message counts
            them as ``what``), a rank outside the world, a negative total.
    """
    total = _count(total, "total", 0)
    world_size = _count(world_size, "world_size", 1)
    rank = _count(rank, "rank", 0)
    if rank >= world_size:
        raise ArgumentValueError(f"rank: expected a rank in [0, {world_size}), got {rank}")
    if total % world_size:
        raise ArgumentValueError(f"world_size: expected a number of processes that divides the "
                                 f"{total} {what} into equal shards, got {world_size}")
    size = total // world_size
    return slice(rank * size, (rank + 1) * size)


def _bindable(addr: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def free_port(addr: str = DEFAULT_ADDR, tries: int = 50) -> int:
    """A port of ``addr`` that is free now, and the next one with it (the CuPy rendezvous
    listens on ``MASTER_PORT + 1``; torchrun's store, where there is one, on the port)."""
    for _ in range(tries):
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        if port + 1 < 65535 and _bindable(addr, port + 1):
            return port
    raise OSError(f"no two consecutive free ports found on {addr} in {tries} tries")


def local_environments(world_size: int, *, master_port: int, master_addr: str = DEFAULT_ADDR,
                       base: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """Each local rank's environment for a job of ``world_size`` processes on this host:
    ``base`` (default ``os.environ``) with torchrun's variables, rank ``r`` the ``r``-th GPU
    (of those ``CUDA_VISIBLE_DEVICES`` shows, when set)."""
    world_size = _count(world_size, "world_size", 1)
    if isinstance(master_port, bool) or not isinstance(master_port, int) \
            or not 1 <= master_port < 65535:
        raise ArgumentValueError(f"master_port: expected a port in [1, 65535) (the rendezvous "
                                 f"uses it and the next), got {master_port!r}")
    base = dict(os.environ if base is None else base)
    return [{**base, "RANK": str(r), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(r),
             "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr,
             "MASTER_PORT": str(master_port)} for r in range(world_size)]


@dataclass(frozen=True)
class LocalRun:
    """How the processes of ``launch_local`` ended.

    ``returncodes``: each rank's exit status (negative: the signal that ended it).
    ``outputs``: what each rank above 0 wrote (stdout and stderr, in order); rank 0 wrote to
    this process's own, so its entry is empty. ``failed``: the first rank that exited with an
    error by itself, or None when every rank succeeded. ``stopped``: the ranks still running
    then, which were stopped.
    """

    returncodes: tuple[int, ...]
    outputs: tuple[str, ...]
    failed: int | None
    stopped: tuple[int, ...] = ()

    @property
    def returncode(self) -> int:
        """0 when every rank succeeded; else the failed rank's status (1 for a signal)."""
        if self.failed is None:
            return 0
        code = self.returncodes[self.failed]
        return code if code > 0 else 1

    def report(self, prog: str) -> str:
        """What to print on stderr: on failure, one line naming the rank and its status, then
        its output (the last ``REPORT_LINES`` lines, each led by ``[rank r]``); on success,
        the output of the ranks above 0, led the same way ("" when they wrote nothing)."""
        world = len(self.returncodes)
        if self.failed is None:
            return "\n".join(line for r in range(1, world) for line in self._lines(r))
        r, code = self.failed, self.returncodes[self.failed]
        status = f"exit status {code}" if code >= 0 else f"signal {-code}"
        stopped = ""
        if self.stopped:
            ranks = ", ".join(str(s) for s in self.stopped)
            stopped = f"; rank{'s' if len(self.stopped) > 1 else ''} {ranks} stopped"
        head = f"{prog}: rank {r} of {world} failed ({status}){stopped}"
        if r == 0:
            return head + "; its output is above"
        lines = self._lines(r)[-REPORT_LINES:]
        return "\n".join([head + ("; its output:" if lines else "; it wrote nothing"), *lines])

    def _lines(self, rank: int) -> list[str]:
        return [f"[rank {rank}] {line}" for line in self.outputs[rank].splitlines()]


def _terminated(signum, frame):
    """SIGTERM while ranks run: leave through ``launch_local``'s clean-up, which stops them."""
    raise SystemExit(128 + signum)


def _stop(procs: Sequence[subprocess.Popen], timeout_s: float) -> tuple[int, ...]:
    """SIGTERM to every process still running, SIGKILL to those that outlive ``timeout_s``;
    returns their indices."""
    running = [i for i, p in enumerate(procs) if p.poll() is None]
    for i in running:
        procs[i].terminate()
    deadline = time.monotonic() + timeout_s
    for i in running:
        try:
            procs[i].wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            procs[i].kill()
            procs[i].wait()
    return tuple(running)


def launch_local(argv: Sequence[str], world_size: int, *, env: Mapping[str, str] | None = None,
                 master_addr: str = DEFAULT_ADDR, master_port: int | None = None,
                 poll_s: float = 0.05, stop_timeout_s: float = 10.0) -> LocalRun:
    """Runs ``argv`` as ``world_size`` processes on this host, ranks 0 to ``world_size - 1``
    with the environments of ``local_environments`` (``env``: default ``os.environ``;
    ``master_port``: default a free one), and waits for them.

    Rank 0 writes to this process's stdout and stderr (a progress bar shows as it goes); the
    output of the others is kept in temporary files and returned. When a rank exits with an
    error, the others are stopped (SIGTERM, then SIGKILL after ``stop_timeout_s``): they
    would wait for it in their next collective. An interrupt (Ctrl-C), a SIGTERM of this
    process (called from the main thread) or an error here stops them too.
    """
    world_size = _count(world_size, "world_size", 1)
    port = free_port(master_addr) if master_port is None else master_port
    envs = local_environments(world_size, master_port=port, master_addr=master_addr, base=env)
    procs: list[subprocess.Popen] = []
    files = []
    failed = None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        for rank, rank_env in enumerate(envs):
            out = tempfile.TemporaryFile() if rank else None
            files.append(out)
            procs.append(subprocess.Popen(list(argv), env=rank_env, stdout=out,
                                          stderr=subprocess.STDOUT if out else None))
        while failed is None and any(p.poll() is None for p in procs):
            time.sleep(poll_s)
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        if failed is None:   # every one ended: one may have failed since the last look
            failed = next((r for r, p in enumerate(procs) if p.returncode != 0), None)
    finally:
        if main:   # a handler installed outside Python reads as None: the default then
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        stopped = _stop(procs, stop_timeout_s)
        outputs = []
        for out in files:
            text = ""
            if out is not None:
                out.seek(0)
                text = out.read().decode("utf-8", errors="replace")
                out.close()
            outputs.append(text)
    return LocalRun(tuple(p.returncode for p in procs), tuple(outputs), failed, stopped)
