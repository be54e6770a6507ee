"""Timing launches on the GPU with CUDA events (median of repeats, after warm-up)."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def time_ms(fn: Callable[[], object], *, warmup: int = 3, reps: int = 20) -> float:
    """Median time of ``fn()`` in milliseconds, measured on the current stream with events."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)
