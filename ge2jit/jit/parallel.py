"""Compiling many kernels at once, in worker processes (NVRTC holds the GIL while it works)."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    ArgumentValueError,
    CacheWarning,
    Ge2jitError,
    MissingDependencyError,
    NvrtcError,
    SettingsError,
)
from .spec import KernelSpec


@dataclass(frozen=True)
class CompileOutcome:
    """What happened to one (spec, arch).

    ``status``: "compiled" (and stored in the disk cache), "cached" (found there), "memory"
    (compiled or found, but not on disk: the cache could not store it; ``error`` says why when
    this process learned it) or "failed" (``error`` holds NVRTC's log).
    """

    spec: KernelSpec
    arch: str
    kernel_name: str
    status: str
    registers: int = -1
    spill_bytes: int = -1
    stack_bytes: int = -1
    seconds: float = 0.0
    error: str = ""
    fatal: str = ""             # failed with an error every kernel would meet: its class


#: Errors that every other kernel would meet as well (NVRTC unusable, CuPy not installed, a bad
#: GE2JIT_* variable): the first one stops the whole run instead of being reported per kernel.
FATAL = (NvrtcError, MissingDependencyError, SettingsError)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Worker initializer: end this compiler process when the command that started it ends,
    even by kill -9 (which runs no clean-up in the parent), instead of finishing its queue."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
        if armed:
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)
            return
    # elsewhere (or without prctl): a thread that watches for the parent to go
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                     name="ge2jit-parent-watch").start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _compile_one(spec: KernelSpec, arch: str, cache_root: str | None) -> CompileOutcome:
    from .cache import SUFFIX, KernelCache, default_cache
    from .loader import build

    cache = KernelCache(Path(cache_root)) if cache_root else default_cache()
    try:
        # The cache says once per process, in a warning, that it cannot write: the reason
        # goes into the outcome instead (a warning from a worker would break the progress bar).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheWarning)
            entry, cached = build(spec, arch, cache=cache)
    except FATAL as e:
        # by the name of its class in FATAL: exceptions do not all survive pickling
        fatal = next(c.__name__ for c in FATAL if isinstance(e, c))
        return CompileOutcome(spec, arch, spec.kernel_name, "failed", error=str(e), fatal=fatal)
    except Ge2jitError as e:
        return CompileOutcome(spec, arch, spec.kernel_name, "failed", error=str(e))
    reason = ""
    for w in caught:
        if issubclass(w.category, CacheWarning):
            reason = reason or str(w.message)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    # what counts is the file: a cache that cannot write keeps the entry in memory only
    status = "cached" if cached else "compiled"
    if not any(Path(r, entry.key[:2], entry.key[2:] + SUFFIX).is_file() for r in cache.roots):
        status = "memory"
    return CompileOutcome(spec, arch, spec.kernel_name, status, entry.registers,
                          entry.spill_bytes, entry.stack_bytes,
                          0.0 if cached else entry.compile_seconds, error=reason)


def usable_cores() -> int:
    """The number of cores this process may run on (its affinity mask, where there is one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compile_many(jobs: Iterable[tuple[KernelSpec, str]], *, processes: int | None = None,
                 cache_root: str | Path | None = None,
                 on_result: Callable[[CompileOutcome], None] | None = None,
                 ) -> list[CompileOutcome]:
    """Compile every (spec, arch) into the disk cache, skipping what the cache holds.

    ``processes`` compile at once: by default one per usable core, and never more than the
    cores or the jobs (each compiler process holds a few hundred MB). Failures of single
    kernels are returned, not raised; an error that every kernel would meet stops the run.

    Raises:
        ArgumentValueError: ``processes`` below 1.
        NvrtcError, MissingDependencyError, SettingsError: NVRTC or CuPy is unusable, or a
            GE2JIT_* variable; nothing more compiles.
        Ge2jitError: a compiler process ended without a result (killed, out of memory).
    """
    if processes is not None and (not isinstance(processes, int) or processes < 1):
        raise ArgumentValueError(f"processes: expected a positive integer, got {processes!r}")
    jobs = list(dict.fromkeys(jobs))
    root = str(cache_root) if cache_root is not None else None
    processes = max(1, min(processes or usable_cores(), usable_cores(), len(jobs)))
    results: list[CompileOutcome] = []

    def done(r: CompileOutcome) -> None:
        if r.fatal:
            raise next(c for c in FATAL if c.__name__ == r.fatal)(r.error)
        results.append(r)
        if on_result:
            on_result(r)

    if processes == 1 or len(jobs) <= 1:
        for spec, arch in jobs:
            done(_compile_one(spec, arch, root))
        return results
    # spawn: the parent may hold a CUDA context, which a forked child must not inherit.
    pool = ProcessPoolExecutor(max_workers=processes, mp_context=mp.get_context("spawn"),
                               initializer=_die_with_parent, initargs=(os.getpid(),))
    try:
        futures = [pool.submit(_compile_one, spec, arch, root) for spec, arch in jobs]
        for f in as_completed(futures):
            try:
                r = f.result()
            except BrokenProcessPool as e:
                raise Ge2jitError(f"a compiler process ended without a result ({e}); if memory "
                                  "ran out, use fewer processes") from None
            done(r)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    return results


def _stop(pool: ProcessPoolExecutor) -> None:
    """Drop the jobs not started and end the compiles under way (a fatal error, Ctrl-C): their
    results would not be reported, and waiting for them could take minutes."""
    # The pool has no public way to end its workers before Python 3.14 (terminate_workers).
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for w in workers:
        w.kill()
    for w in workers:
        w.join(timeout=10)
