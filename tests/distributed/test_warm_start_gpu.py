"""A job started on a warmed, read-only kernel cache behind a fresh directory per rank
(``GE2JIT_CACHE_DIR="fresh/rank<r>:warmed"``), as a cluster job starts on a shared cache that
a warm-up filled: no rank compiles a kernel, every rank loads its kernels from the cache, none
writes to its fresh directory, and every rank's step completes. The step is an MLP block's
(d = 4096, 16384 tokens a GPU, bfloat16, the gradients averaged under the backward), run by
``bench/bench_warm_start.py``'s job, which also reports the first step's time against a later
one's (a speed target, so a benchmark's number, not this test's assertion); the times are
printed here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

BENCH = Path(__file__).resolve().parents[2] / "bench"
D, TOKENS = 4096, 16384


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_warm_start_test",
                                                      BENCH / "bench_warm_start.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def _gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.fixture(scope="module")
def warmed(bench, tmp_path_factory):
    """A kernel cache warmed by the job's step run once in one process, and that run."""
    root, warming = bench.warm(tmp_path_factory.mktemp("warm"), D, TOKENS)
    assert warming["misses"] > 0, "it compiled into the empty directory"
    return root, warming


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_start_on_a_warmed_read_only_cache(world, bench, warmed, tmp_path):
    if _gpus() < world:
        pytest.skip(f"needs {world} GPUs, found {_gpus()}")
    root, warming = warmed
    reports, fresh = bench.start(world, root, tmp_path, D, TOKENS)
    for r in reports:
        print(f"\nrank {r['rank']}: first step {r['first_s'] * 1e3:.1f} ms from the warmed "
              f"cache ({warming['first_s'] * 1e3:.1f} ms warming it), later steps "
              f"{r['later_s'] * 1e3:.1f} ms; {r['hits']} kernels loaded, {r['misses']} "
              "compiled")
    assert [r["rank"] for r in reports] == list(range(world))
    for r in reports:
        assert r["misses"] == 0 and r["hits"] > 0, r
        assert r["first_s"] > 0 and r["later_s"] > 0, r
    assert [p for f in fresh for p in f.rglob("*") if p.is_file()] == []
