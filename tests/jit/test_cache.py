"""The kernel cache: keys, atomic entries, corruption, unwritable directories, concurrency."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import warnings
from pathlib import Path

import pytest

from ge2jit import CacheWarning
from ge2jit.jit import cache as cache_mod
from ge2jit.jit.cache import CacheEntry, KernelCache, cache_key
from ge2jit.jit.loader import build, key_for
from ge2jit.ops.gemm.spec import SIMT_F32_TILES, Act, BiasKind, DType, GemmSpec, Layout

SPEC = GemmSpec(DType.F32, Layout.ROW, Layout.ROW, None, Act.RELU, BiasKind.COL, False,
                SIMT_F32_TILES[-1])

BASE = dict(source="src", options=("--gpu-architecture=sm_90",), arch="sm_90",
            nvrtc_fingerprint="f" * 16, ge2jit_version="0.1.0", header_checksum="")


@pytest.mark.parametrize("field, value", [
    ("source", "src "), ("options", ("--gpu-architecture=sm_90", "-lineinfo")),
    ("arch", "sm_80"), ("nvrtc_fingerprint", "e" * 16), ("ge2jit_version", "0.1.1"),
    ("header_checksum", "abc"),
])
def test_key_changes_with_everything_compiled(field, value):
    assert cache_key(**BASE) == cache_key(**BASE)
    assert cache_key(**{**BASE, field: value}) != cache_key(**BASE)


def test_key_follows_rendered_source_not_spec():
    k90, src, opts = key_for(SPEC, "sm_90")
    assert key_for(SPEC, "sm_80")[0] != k90
    assert key_for(SPEC, "sm_90a")[0] != k90
    other = GemmSpec(**{**SPEC.__dict__, "act": Act.GELU})
    assert key_for(other, "sm_90")[0] != k90
    assert "--gpu-architecture=sm_90" in opts and "extern \"C\"" in src


def _entry(key="ab" + "c" * 62, cubin=b"\x7fELF" + os.urandom(100)) -> CacheEntry:
    return CacheEntry(key=key, kernel_name="k", arch="sm_90", cubin=cubin, registers=10,
                      shared_bytes=0, stack_bytes=0, spill_stores=0, spill_loads=0,
                      compile_seconds=0.1, nvrtc_version="13.5", ge2jit_version="0.1.0",
                      created=1.0)


def test_entry_round_trip_and_sharded_path(tmp_path):
    c = KernelCache(tmp_path)
    e = _entry()
    path = c.put(e)
    assert path == tmp_path / "ab" / ("c" * 62 + ".cubin")
    fresh = KernelCache(tmp_path)
    got = fresh.get(e.key)
    assert got == e and fresh.hits == 1
    assert not list(path.parent.glob(".tmp-*")), "no temporary files left behind"


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "magic", "header"])
def test_damaged_entry_is_a_miss_then_recompiled(tmp_path, damage):
    c = KernelCache(tmp_path)
    entry, cached = build(SPEC, "sm_80", cache=c)
    assert not cached
    path = c.path_for(entry.key)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    elif damage == "magic":
        data[:8] = b"NOTMAGIC"
    else:
        data[12:20] = b"{{{{{{{{"
    path.write_bytes(bytes(data))
    fresh = KernelCache(tmp_path)
    assert fresh.get(entry.key) is None and fresh.misses == 1
    entry2, cached2 = build(SPEC, "sm_80", cache=fresh)
    assert not cached2 and entry2.cubin == entry.cubin
    assert KernelCache(tmp_path).get(entry.key) is not None, "the bad entry was overwritten"


def test_entry_under_another_key_is_refused(tmp_path):
    c = KernelCache(tmp_path)
    e = _entry()
    path = c.put(e)
    other = "ab" + "d" * 62
    c.path_for(other).write_bytes(path.read_bytes())
    assert KernelCache(tmp_path).get(other) is None


def test_unwritable_directory_falls_back_to_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    c = KernelCache(blocker / "cache")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        e1, _ = build(SPEC, "sm_80", cache=c)
        other = GemmSpec(**{**SPEC.__dict__, "act": Act.TANH})
        e2, _ = build(other, "sm_80", cache=c)
    msgs = [x for x in w if issubclass(x.category, CacheWarning)]
    assert len(msgs) == 1 and "kept in memory" in str(msgs[0].message)
    assert c.get(e1.key) is e1 and c.get(e2.key) is e2
    assert build(SPEC, "sm_80", cache=c)[1], "the memory copy is used"


@pytest.mark.parametrize("where, err", [
    ("replace", OSError(errno.ENOSPC, "No space left on device")),
    ("mkstemp", OSError(errno.EROFS, "Read-only file system")),
    ("mkstemp", PermissionError(errno.EACCES, "Permission denied")),
])
def test_full_or_read_only_disk_falls_back_to_memory(tmp_path, monkeypatch, where, err):
    def fail(*args, **kwargs):
        raise err

    c = KernelCache(tmp_path)
    target = cache_mod.os if where == "replace" else cache_mod.tempfile
    monkeypatch.setattr(target, where, fail)
    with pytest.warns(CacheWarning, match=err.strerror):
        e, _ = build(SPEC, "sm_80", cache=c)
    assert c.get(e.key) is e
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.rglob("*")), \
        "the partial file was removed"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only directories")
def test_read_only_directory(tmp_path):
    tmp_path.chmod(0o500)
    try:
        c = KernelCache(tmp_path / "cache")
        with pytest.warns(CacheWarning):
            e, _ = build(SPEC, "sm_80", cache=c)
        assert c.get(e.key) is e
    finally:
        tmp_path.chmod(0o700)


def test_disabled_cache_never_touches_disk(tmp_path):
    c = KernelCache(tmp_path / "c", enabled=False)
    e, _ = build(SPEC, "sm_80", cache=c)
    assert not (tmp_path / "c").exists()
    assert c.get(e.key) is e


def test_save_source_writes_the_rendered_kernel(tmp_path, monkeypatch):
    from ge2jit.settings import reload_settings

    monkeypatch.setenv("GE2JIT_SAVE_SOURCE", "1")
    reload_settings()
    try:
        c = KernelCache(tmp_path)
        e, _ = build(SPEC, "sm_80", cache=c)
        src = c.path_for(e.key).with_suffix(".cu").read_text()
        assert SPEC.kernel_name in src
    finally:
        monkeypatch.delenv("GE2JIT_SAVE_SOURCE")
        reload_settings()


def _compile_in_child(root: str, barrier, queue) -> None:
    c = KernelCache(Path(root))
    barrier.wait()
    entry, _ = build(SPEC, "sm_90", cache=c)
    queue.put(entry.key)


def test_many_processes_compiling_one_key(tmp_path):
    ctx = mp.get_context("spawn")
    n = 4
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child, args=(str(tmp_path), barrier, queue))
             for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert all(p.exitcode == 0 for p in procs)
    keys = {queue.get(timeout=5) for _ in range(n)}
    assert len(keys) == 1
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1, files
    assert KernelCache(tmp_path).get(keys.pop()) is not None


def test_compile_many_in_processes(tmp_path):
    from ge2jit.jit.parallel import compile_many

    specs = [GemmSpec(**{**SPEC.__dict__, "act": act}) for act in (Act.RELU, Act.SILU, Act.TANH)]
    jobs = [(s, "sm_80") for s in specs] + [(specs[0], "sm_80")]     # a duplicate
    seen = []
    out = compile_many(jobs, processes=2, cache_root=tmp_path, on_result=seen.append)
    assert len(out) == 3 and len(seen) == 3
    assert {o.status for o in out} == {"compiled"}
    again = compile_many(jobs, processes=2, cache_root=tmp_path)
    assert {o.status for o in again} == {"cached"}
    assert all(o.registers > 0 and o.spill_bytes == 0 for o in out)


def test_info_counts_entries_and_this_process_hits(tmp_path):
    c = KernelCache(tmp_path)
    build(SPEC, "sm_80", cache=c)
    KernelCache(tmp_path).get("ff" * 32)                  # a miss in another object
    fresh = KernelCache(tmp_path)
    build(SPEC, "sm_80", cache=fresh)                      # a hit from disk
    info = fresh.info()
    assert info["entries"] == 1 and info["size_bytes"] > 0 and info["unreadable_entries"] == 0
    assert (info["process_hits"], info["process_misses"], info["process_writes"]) == (1, 0, 0)
    assert c.info()["process_writes"] == 1 and c.info()["process_misses"] == 1
