"""The kernel cache: keys, atomic entries, corruption, unwritable directories, concurrency."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from ge2jit import CacheWarning
from ge2jit.jit import cache as cache_mod
from ge2jit.jit.cache import CacheEntry, KernelCache, cache_key
from ge2jit.jit.loader import build, key_for
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec

SPEC = TiledGemmSpec(DType.F32, Layout.ROW, Layout.ROW,
                     Epilogue(out_dtype=DType.F32, act=Act.RELU, bias=BiasKind.COL,
                              bias_dtype=DType.F32), TILED_CONFIGS[-1])


def _with_act(act: Act) -> TiledGemmSpec:
    """SPEC with another activation: another kernel."""
    return replace(SPEC, epilogue=replace(SPEC.epilogue, act=act))

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
    other = _with_act(Act.GELU)
    assert key_for(other, "sm_90")[0] != k90
    assert "--gpu-architecture=sm_90" in opts and "extern \"C\"" in src


_CUBIN = b"\x7fELF" + os.urandom(100)


def _entry(key="ab" + "c" * 62, cubin=_CUBIN) -> CacheEntry:
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
        other = _with_act(Act.TANH)
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
    files = sorted(p.suffix for p in tmp_path.rglob("*") if p.is_file())
    assert files == [".cubin", ".key"], files   # one entry and its alias
    assert KernelCache(tmp_path).get(keys.pop()) is not None


def test_compile_many_in_processes(tmp_path):
    from ge2jit.jit.parallel import compile_many

    specs = [_with_act(act)
             for act in (Act.RELU, Act.SILU, Act.TANH)]
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


# --- clear and prune: only ge2jit's own files, never through a symlink, counted --------------

def _fill(root: Path, n: int = 3, size: int = 100) -> list[CacheEntry]:
    c = KernelCache(root)
    out = []
    for i in range(n):
        e = _entry(key=f"{i:02x}" + "c" * 62, cubin=b"\x7fELF" + os.urandom(size))
        c.put(e)
        out.append(e)
    return out


def test_clear_removes_only_entries_and_reports_counts(tmp_path):
    root = tmp_path / "cache"
    entries = _fill(root)
    c = KernelCache(root)
    sizes = sum(c.path_for(e.key).stat().st_size for e in entries)
    c.path_for(entries[0].key).with_suffix(".cu").write_text("source")
    tmp_file = root / "01" / ".tmp-ge2jit-123-abcdefgh"
    tmp_file.write_bytes(b"partial")
    # files that look a bit like the cache's but are not ge2jit's own
    strangers = [root / "01" / "notes.txt", root / "01" / ("c" * 62 + ".cubin.bak"),
                 root / "01" / ("C" * 62 + ".cubin"), root / "01" / ".tmp-other",
                 root / "go" / "main.go", root / "ab" / "x.cubin", root / "top.cubin",
                 root / "abc" / ("c" * 62 + ".cubin")]
    for p in strangers:
        p.parent.mkdir(exist_ok=True)
        p.write_text("keep me")
    result = c.clear()
    assert (result.removed, result.ok, result.failed) == (3, True, ())
    assert result.freed == sizes + len("source") + len("partial")
    assert all(p.read_text() == "keep me" for p in strangers)
    assert not tmp_file.exists() and list(c.entries()) == []
    assert c.clear() == cache_mod.RemoveResult(0, 0, ())


def test_clear_and_prune_never_follow_symlinks(tmp_path):
    root, victim = tmp_path / "cache", tmp_path / "victim"
    victim.mkdir()
    precious = victim / ("d" * 62 + ".cubin")
    precious.write_bytes(b"precious")
    root.mkdir()
    (root / "dd").symlink_to(victim)                       # a symlinked shard
    _fill(root, n=1)
    linked_entry = root / "00" / ("e" * 62 + ".cubin")
    linked_entry.symlink_to(precious)                      # a symlinked entry
    c = KernelCache(root)
    assert c.prune(older_than_s=-1).removed == 1
    assert c.clear().removed == 0
    assert precious.read_bytes() == b"precious" and (root / "dd").is_symlink()
    assert linked_entry.is_symlink()


def test_prune_returns_a_remove_result(tmp_path):
    root = tmp_path / "cache"
    entries = _fill(root, n=4)
    c = KernelCache(root)
    paths = [c.path_for(e.key) for e in entries]
    for age, p in enumerate(paths):                        # entries[0] is the oldest
        os.utime(p, (1000.0 + age, 1000.0 + age))
    size = paths[0].stat().st_size
    r = c.prune(max_bytes=2 * size)
    assert (r.removed, r.freed, r.ok) == (2, 2 * size, True)
    assert [p.exists() for p in paths] == [False, False, True, True]
    assert c.prune(older_than_s=1e12) == cache_mod.RemoveResult(0, 0, ())


def test_clear_leaves_the_tuning_database(tmp_path):
    from ge2jit.tune.db import TuningDB

    root = tmp_path / "cache"
    _fill(root, n=1)
    TuningDB(root / "tuning").put({"op": "x"}, {"config": "a"})
    assert KernelCache(root).clear().removed == 1
    assert TuningDB(root / "tuning").get({"op": "x"}) == {"config": "a"}


def test_clear_and_prune_report_an_unusable_root(tmp_path):
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    for result in (KernelCache(not_dir).clear(), KernelCache(not_dir).prune(max_bytes=0)):
        assert not result.ok and result.removed == 0
        assert result.failed[0][0] == str(not_dir) and "not a directory" in result.failed[0][1]
    assert KernelCache(tmp_path / "missing").clear().ok, "nothing to remove is not a failure"


def test_clear_reports_what_it_could_not_remove(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    _fill(root, n=2)
    real_unlink, calls = os.unlink, []

    def unlink(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:                                # the first entry, in shard 00
            raise PermissionError(13, "Permission denied")
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(cache_mod.os, "unlink", unlink)
    r = KernelCache(root).clear()
    assert r.removed == 1 and not r.ok
    assert r.failed == ((str(root / "00" / ("c" * 62 + ".cubin")), "Permission denied"),)


def test_clear_and_prune_touch_only_the_first_directory(tmp_path):
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    _fill(mine, n=1)
    _fill(shared, n=2)
    c = KernelCache([mine, shared])
    assert c.roots == (mine, shared) and c.root == mine
    assert c.prune(max_bytes=0).removed == 1
    _fill(mine, n=1)
    assert c.clear().removed == 1
    assert len(list(KernelCache(shared).entries())) == 2


# --- an entry is what was asked for: key, kernel name, architecture, checksummed header -------

def _forge(path: Path, **changes) -> None:
    """Rewrite an entry's header fields and fix up every checksum, as a forger would."""
    e = CacheEntry.from_bytes(path.read_bytes())
    path.write_bytes(CacheEntry(**{**e.__dict__, **changes}).to_bytes())


def test_an_entry_of_another_kernel_under_this_key_is_a_miss(tmp_path):
    c = KernelCache(tmp_path)
    other = _with_act(Act.TANH)
    mine, _ = build(SPEC, "sm_80", cache=c)
    theirs, _ = build(other, "sm_80", cache=c)
    path = c.path_for(mine.key)
    path.write_bytes(c.path_for(theirs.key).read_bytes())
    _forge(path, key=mine.key)                        # the other kernel, its key rewritten
    fresh = KernelCache(tmp_path)
    assert fresh.get(mine.key, kernel_name=SPEC.kernel_name, arch="sm_80") is None
    assert fresh.corrupt == 1
    entry, cached = build(SPEC, "sm_80", cache=fresh)
    assert not cached and entry.kernel_name == SPEC.kernel_name
    assert KernelCache(tmp_path).get(mine.key, kernel_name=SPEC.kernel_name, arch="sm_80")
    # the header made to name this kernel: the cubin still defines the other one
    path.write_bytes(c.path_for(theirs.key).read_bytes())
    _forge(path, key=mine.key, kernel_name=SPEC.kernel_name)
    fresh = KernelCache(tmp_path)
    assert fresh.get(mine.key, kernel_name=SPEC.kernel_name, arch="sm_80") is None
    assert fresh.corrupt == 1 and not build(SPEC, "sm_80", cache=fresh)[1]


def test_an_entry_for_another_architecture_is_a_miss(tmp_path):
    c = KernelCache(tmp_path)
    mine, _ = build(SPEC, "sm_80", cache=c)
    _forge(c.path_for(mine.key), arch="sm_90")
    fresh = KernelCache(tmp_path)
    assert fresh.get(mine.key, kernel_name=SPEC.kernel_name, arch="sm_80") is None
    assert fresh.corrupt == 1 and not build(SPEC, "sm_80", cache=fresh)[1]


def test_a_header_edited_without_its_checksum_is_a_miss(tmp_path):
    c = KernelCache(tmp_path)
    e = _entry()
    path = c.put(e)
    data = path.read_bytes()
    assert b'"registers": 10' in data
    path.write_bytes(data.replace(b'"registers": 10', b'"registers": 99'))
    fresh = KernelCache(tmp_path)
    assert fresh.get(e.key) is None and fresh.corrupt == 1


def test_an_entry_of_the_previous_format_is_a_miss(tmp_path):
    c = KernelCache(tmp_path)
    e = _entry()
    path = c.put(e)
    assert path.read_bytes().startswith(b"GE2JITK2")
    path.write_bytes(b"GE2JITK1" + path.read_bytes()[8:])
    assert KernelCache(tmp_path).get(e.key) is None


@pytest.mark.parametrize("header", [{"key": 1}, {"registers": "10"}, {"unknown": 1}, [1, 2]])
def test_a_header_of_the_wrong_shape_is_a_miss(tmp_path, header):
    import hashlib
    import json
    import struct

    e = _entry()
    good = json.loads(e.to_bytes()[12:12 + struct.unpack_from("<I", e.to_bytes(), 8)[0]])
    fields = [*header] if isinstance(header, list) else {**good, **header}
    blob = json.dumps(fields).encode()
    body = b"GE2JITK2" + struct.pack("<I", len(blob)) + blob + e.cubin
    with pytest.raises(ValueError):
        CacheEntry.from_bytes(body + hashlib.sha256(body).digest())
    c = KernelCache(tmp_path)
    c.path_for(e.key).parent.mkdir(parents=True)
    c.path_for(e.key).write_bytes(body + hashlib.sha256(body).digest())
    assert c.get(e.key) is None and c.corrupt == 1


# --- reading trusts only regular files of a bounded size, owned right, in private dirs -------

class _Hang(Exception):
    pass


def _within(seconds: int, fn):
    """fn(), or _Hang if it blocks longer than ``seconds`` (a FIFO opened for reading would)."""
    import signal

    def alarm(*_):
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_fifo_in_place_of_an_entry_is_a_miss_without_blocking(tmp_path):
    c = KernelCache(tmp_path)
    e = _entry()
    path = c.put(e)
    path.unlink()
    os.mkfifo(path)
    fresh = KernelCache(tmp_path)
    assert _within(5, lambda: fresh.get(e.key)) is None and fresh.corrupt == 1
    assert _within(5, lambda: list(fresh.entries())) == []
    assert _within(5, lambda: fresh.info())["entries"] == 0


@pytest.mark.parametrize("target", ["entry", "dev"])
def test_a_symlinked_entry_is_a_miss(tmp_path, target):
    c = KernelCache(tmp_path / "c")
    e = _entry()
    path = c.put(e)
    elsewhere = tmp_path / "elsewhere.cubin"
    path.replace(elsewhere)
    path.symlink_to(elsewhere if target == "entry" else Path("/dev/zero"))
    fresh = KernelCache(tmp_path / "c")
    assert _within(5, lambda: fresh.get(e.key)) is None and fresh.corrupt == 1
    assert list(fresh.entries()) == []
    assert fresh.put(e) == path and not path.is_symlink(), "the link is replaced, not followed"
    assert KernelCache(tmp_path / "c").get(e.key) == e


def test_a_symlinked_shard_is_a_miss(tmp_path):
    c = KernelCache(tmp_path / "other")
    e = _entry()
    c.put(e)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "ab").symlink_to(tmp_path / "other" / "ab")
    fresh = KernelCache(tmp_path / "c")
    assert fresh.get(e.key) is None and list(fresh.entries()) == []


def test_an_oversized_entry_is_a_miss_and_is_not_read(tmp_path, monkeypatch):
    c = KernelCache(tmp_path)
    e = _entry()
    path = c.put(e)
    monkeypatch.setattr(cache_mod, "MAX_ENTRY_BYTES", path.stat().st_size - 1)
    fresh = KernelCache(tmp_path)
    assert fresh.get(e.key) is None and fresh.corrupt == 1
    assert [x for _, x in fresh.entries()] == [None]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_entry_owned_by_another_user_is_a_miss(tmp_path):
    c = KernelCache(tmp_path)
    e = _entry()
    os.chown(c.put(e), 12345, 12345)
    fresh = KernelCache(tmp_path)
    assert fresh.get(e.key) is None and fresh.corrupt == 1
    assert [x for _, x in fresh.entries()] == [None]


# --- a directory that other users can write is refused ----------------------------------------

@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o722])
def test_a_directory_others_can_write_is_refused(tmp_path, mode):
    root = tmp_path / "c"
    e = _entry()
    KernelCache(root).put(e)
    root.chmod(mode)
    c = KernelCache(root)
    with pytest.warns(CacheWarning, match="writable by") as w:
        assert c.get(e.key) is None, "nothing is read from it"
        other = _entry(key="ef" + "0" * 62)
        assert c.put(other) is None, "nothing is written to it"
        c.put(_entry(key="ef" + "1" * 62))
    assert len(w) == 1 and str(root) in str(w[0].message)
    assert c.get(other.key) is other, "kept in memory"
    assert not (root / "ef").exists()
    assert not c.clear().ok and (root / "ab").exists(), "clear refuses it too"


def test_a_shard_others_can_write_is_refused(tmp_path):
    e = _entry()
    path = KernelCache(tmp_path).put(e)
    path.parent.chmod(0o777)
    c = KernelCache(tmp_path)
    assert c.get(e.key) is None and c.corrupt == 1
    assert list(c.entries()) == []
    with pytest.warns(CacheWarning, match="writable by"):
        assert c.put(e) is None


def test_a_group_writable_directory_is_refused_unless_the_group_is_private(tmp_path,
                                                                         monkeypatch):
    root = tmp_path / "c"
    e = _entry()
    KernelCache(root).put(e)
    root.chmod(0o775)
    monkeypatch.setattr(cache_mod, "_group_is_private", lambda gid: True)
    assert KernelCache(root).get(e.key) == e, "a user-private group (umask 002) is fine"
    monkeypatch.setattr(cache_mod, "_group_is_private", lambda gid: False)
    with pytest.warns(CacheWarning, match="writable by group"):
        assert KernelCache(root).get(e.key) is None


# --- several directories: look-ups in order, writes to the first ------------------------------

def test_lookups_go_through_the_directories_in_order_and_misses_go_to_the_first(tmp_path):
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    warm = _entry(key="aa" + "1" * 62)
    KernelCache(shared).put(warm)
    shared_files = sorted(p for p in shared.rglob("*"))
    shared.chmod(0o555)
    try:
        c = KernelCache([mine, shared])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert c.get(warm.key) == warm and c.hits == 1
            cold = _entry(key="bb" + "2" * 62)
            assert c.get(cold.key) is None
            assert c.put(cold) == mine / "bb" / ("2" * 62 + ".cubin")
        assert sorted(p for p in shared.rglob("*")) == shared_files
        # the first directory wins when both hold a key
        KernelCache(mine).put(_entry(key=warm.key, cubin=b"\x7fELF mine"))
        assert KernelCache([mine, shared]).get(warm.key).cubin == b"\x7fELF mine"
    finally:
        shared.chmod(0o755)


def test_cache_dir_variable_lists_directories(tmp_path, monkeypatch):
    from ge2jit.settings import reload_settings

    monkeypatch.setenv("GE2JIT_CACHE_DIR", f"{tmp_path}/a:{tmp_path}/b::~/c")
    reload_settings()
    try:
        c = KernelCache()
        assert c.roots == (tmp_path / "a", tmp_path / "b", Path("~/c").expanduser())
        assert c.root == tmp_path / "a"
    finally:
        monkeypatch.undo()
        reload_settings()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_a_shared_directory_may_belong_to_another_user_if_only_they_can_write(tmp_path):
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    e = _entry()
    path = KernelCache(shared).put(e)
    for p in (shared, path.parent, path):
        os.chown(p, 12345, 12345)
    assert KernelCache([mine, shared]).get(e.key) == e
    with pytest.warns(CacheWarning, match="owned by another user"):
        assert KernelCache(shared).get(e.key) is None, "as the first directory it must be mine"
    path.chmod(0o664)
    c = KernelCache([mine, shared])
    assert c.get(e.key) is None and c.corrupt == 1, "a file its group can write is refused"
    path.chmod(0o644)
    path.parent.chmod(0o775)
    assert KernelCache([mine, shared]).get(e.key) is None
    path.parent.chmod(0o755)
    shared.chmod(0o777)
    with pytest.warns(CacheWarning, match="writable by every user"):
        assert KernelCache([mine, shared]).get(e.key) is None


def test_writable_problem_names_why_the_first_directory_cannot_take_entries(tmp_path):
    assert KernelCache(tmp_path / "new").writable_problem() is None
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())
    (tmp_path / "file").write_text("x")
    assert "Not a directory" in KernelCache(tmp_path / "file" / "c").writable_problem()
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    assert "writable by every user" in KernelCache(tmp_path / "open").writable_problem()
    assert "disabled" in KernelCache(tmp_path, enabled=False).writable_problem()


# --- the size cap holds at every write, cheaply ---------------------------------------------

def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture
def max_size(monkeypatch):
    """Sets GE2JIT_CACHE_MAX_SIZE for one test."""
    from ge2jit.settings import reload_settings

    def set_cap(text: str) -> None:
        monkeypatch.setenv("GE2JIT_CACHE_MAX_SIZE", text)
        reload_settings()

    yield set_cap
    monkeypatch.undo()
    reload_settings()


def _count_scans(monkeypatch) -> list:
    scans = []
    real = cache_mod._shards
    monkeypatch.setattr(cache_mod, "_shards", lambda fd: scans.append(1) or real(fd))
    return scans


def test_the_size_cap_holds_after_every_write(tmp_path, monkeypatch):
    size = len(_entry().to_bytes())
    cap = 20 * size + size // 2
    c = KernelCache(tmp_path, max_size=cap)       # GE2JIT_CACHE_MAX_SIZE takes 1 MiB at least
    scans = _count_scans(monkeypatch)
    for i in range(80):
        c.put(_entry(key=f"{i % 256:02x}" + f"{i:062x}"))
        assert _disk_bytes(tmp_path) <= cap, f"over the cap at write {i}"
    assert len(list(c.entries())) >= 18, "evicted down to the cap, not far below it"
    assert len(scans) <= 80 // 2, "the cache is not rescanned at every write"
    last = _entry(key="ff" + "e" * 62)
    assert c.put(last) is not None and KernelCache(tmp_path).get(last.key) == last


def test_an_entry_larger_than_the_cap_is_kept_in_memory_only_with_one_warning(tmp_path):
    """It is not written at all: writing it would evict every other entry, then itself."""
    small = [_entry(key=f"{i:02x}" + "c" * 62) for i in range(3)]
    size = len(small[0].to_bytes())
    c = KernelCache(tmp_path, max_size=10 * size)
    for e in small:
        assert c.put(e) is not None
    big = [_entry(key=f"{i:02x}" + "d" * 62, cubin=b"\x7fELF" + os.urandom(10 * size))
           for i in range(2)]
    with pytest.warns(CacheWarning, match=r"cap \(max_size, \d+ bytes\) is too small for a "
                                          r"kernel of \d+ bytes.*kept in memory") as w:
        assert c.put(big[0]) is None and c.put(big[1]) is None
    assert len([x for x in w if issubclass(x.category, CacheWarning)]) == 1
    assert c.get(big[0].key) is big[0] and c.where(big[0].key) is None
    assert [c.where(e.key) for e in small] == [c.path_for(e.key) for e in small], \
        "the others stay"
    assert _disk_bytes(tmp_path) == 3 * size


def test_a_kernel_larger_than_the_cap_setting_names_the_variable(tmp_path, max_size):
    max_size("1MiB")
    c = KernelCache(tmp_path)
    e = _entry(cubin=b"\x7fELF" + os.urandom(2 ** 20))
    with pytest.warns(CacheWarning, match=r"GE2JIT_CACHE_MAX_SIZE=1MiB, 1048576 bytes"):
        assert c.put(e) is None
    assert c.info()["max_size_bytes"] == 2 ** 20 and c.info()["max_size_setting"] == "1MiB"


def test_no_scan_while_under_the_cap(tmp_path, monkeypatch, max_size):
    max_size("1GB")
    c = KernelCache(tmp_path)
    scans = _count_scans(monkeypatch)
    for i in range(50):
        c.put(_entry(key=f"{i:02x}" + "c" * 62))
    assert len(scans) == 1, "one scan at the first write"


# --- file modes follow the umask --------------------------------------------------------------

@pytest.mark.parametrize("umask, file_mode, dir_mode", [
    (0o022, 0o644, 0o755), (0o027, 0o640, 0o750), (0o077, 0o600, 0o700),
    (0o002, 0o644, 0o755),           # never group-writable: a writable cache is private
])
def test_entries_and_directories_follow_the_umask(tmp_path, monkeypatch, umask, file_mode,
                                                   dir_mode):
    old = os.umask(umask)
    try:
        monkeypatch.setattr(cache_mod, "_UMASK", cache_mod._read_umask())
        assert cache_mod._UMASK == umask
        path = KernelCache(tmp_path / "c").put(_entry())
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == file_mode
    assert path.parent.stat().st_mode & 0o777 == dir_mode
    assert (tmp_path / "c").stat().st_mode & 0o777 == dir_mode


def test_entries_are_still_read_after_a_failed_write(tmp_path, monkeypatch):
    old = _entry(key="aa" + "1" * 62)
    KernelCache(tmp_path).put(old)
    c = KernelCache(tmp_path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "replace", full)
    with pytest.warns(CacheWarning, match="No space left"):
        assert c.put(_entry(key="bb" + "2" * 62)) is None
    assert c.get(old.key) == old, "the disk is full, not unreadable"


def test_entries_lists_the_disk_even_when_the_process_does_not_use_it(tmp_path):
    e = _entry()
    KernelCache(tmp_path).put(e)
    assert [x for _, x in KernelCache(tmp_path, enabled=False).entries()] == [e]


# --- where kernels really went, and whether the cache can store them -------------------------

def _unusable(tmp_path: Path, how: str) -> Path:
    """A cache directory that cannot store kernels, as a user may set GE2JIT_CACHE_DIR."""
    if how == "a plain file":
        root = tmp_path / "file"
        root.write_text("x")
    elif how == "under a plain file":           # as /proc/x: its parent takes no new directory
        (tmp_path / "file").write_text("x")
        root = tmp_path / "file" / "cache"
    else:
        root = tmp_path / "open"
        root.mkdir()
        root.chmod(0o777)
    return root


@pytest.mark.parametrize("how, words", [
    ("a plain file", "is not a directory"),
    ("under a plain file", "is not a directory"),
    ("open to all", "writable by every user"),
])
def test_where_a_kernel_went_is_memory_when_the_directory_cannot_store_it(tmp_path, how, words):
    root = _unusable(tmp_path, how)
    c = KernelCache(root)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        info = c.info()
        e, cached = build(SPEC, "sm_80", cache=c)
        build(_with_act(Act.TANH), "sm_80", cache=c)
    assert info["writable"] is False and words in info["not_writable_reason"], info
    assert info["disk_cache"] == f"not used: {info['not_writable_reason']}"
    assert len([x for x in w if issubclass(x.category, CacheWarning)]) == 1, "one warning"
    assert not cached and c.where(e.key) is None, "in memory only, not at path_for"
    assert not c.path_for(e.key).exists()


def test_where_names_the_file_a_kernel_is_in(tmp_path):
    mine, shared = tmp_path / "mine", tmp_path / "shared"
    e = _entry()
    KernelCache(shared).put(e)
    c = KernelCache([mine, shared])
    assert c.where(e.key) == shared / e.key[:2] / (e.key[2:] + ".cubin")
    other = _entry(key="cd" + "e" * 62)
    assert c.put(other) == c.where(other.key) == c.path_for(other.key)
    assert KernelCache(mine, enabled=False).where(other.key) is None


def test_info_says_the_directory_is_writable_and_creates_nothing(tmp_path):
    c = KernelCache(tmp_path / "new" / "cache")
    info = c.info()
    assert info["writable"] is True and info["not_writable_reason"] is None
    assert info["disk_cache"] == "enabled" and info["max_size_bytes"] is None
    assert not (tmp_path / "new").exists() and not list(tmp_path.iterdir())
    off = KernelCache(tmp_path, enabled=False).info()
    assert off["writable"] is False and off["disk_cache"] == "disabled (GE2JIT_DISABLE_CACHE)"


def test_info_after_a_failed_write_says_so(tmp_path, monkeypatch):
    c = KernelCache(tmp_path)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "replace", full)
    with pytest.warns(CacheWarning):
        assert c.put(_entry()) is None
    info = c.info()
    assert info["writable"] is False and "No space left" in info["not_writable_reason"]


# --- aliases: an entry found from its spec, without rendering ------------------------------

def _no_render(monkeypatch):
    """Rendering (and so the key) fails from here on: only an alias finds an entry."""
    from ge2jit.jit import loader

    def refuse(*a, **k):
        raise AssertionError("rendered")

    monkeypatch.setattr(loader, "key_for", refuse)
    monkeypatch.setattr(loader, "render", refuse)


def test_a_compiled_kernel_is_found_again_without_rendering(tmp_path, monkeypatch):
    """Compiling links the spec's alias to the entry; another process (a new cache object)
    finds the entry by the alias alone, and counts a hit."""
    from ge2jit.jit.loader import alias_for

    entry, cached = build(SPEC, "sm_80", cache=KernelCache(tmp_path))
    assert not cached
    alias = alias_for(SPEC, "sm_80")
    assert (tmp_path / alias[:2] / (alias[2:] + ".key")).read_text() == entry.key
    assert alias_for(_with_act(Act.TANH), "sm_80") != alias != alias_for(SPEC, "sm_90")
    _no_render(monkeypatch)
    again = KernelCache(tmp_path)
    got, cached = build(SPEC, "sm_80", cache=again)
    assert cached and got.cubin == entry.cubin and (again.hits, again.misses) == (1, 0)


def test_a_shared_warmed_cache_is_found_by_alias_and_the_fresh_one_stays_empty(
        tmp_path, monkeypatch):
    warmed, fresh = tmp_path / "warmed", tmp_path / "fresh"
    entry, _ = build(SPEC, "sm_80", cache=KernelCache(warmed))
    both = KernelCache([fresh, warmed])
    _no_render(monkeypatch)
    got, cached = build(SPEC, "sm_80", cache=both)
    assert cached and got.key == entry.key
    assert not fresh.exists() or not any(p.is_file() for p in fresh.rglob("*"))


def test_an_entry_found_by_its_key_in_a_shared_cache_links_nothing_in_the_first(tmp_path):
    """A warmed cache without aliases (made by an older ge2jit) still serves by key, and the
    first directory gets no alias of an entry it does not hold."""
    warmed, fresh = tmp_path / "warmed", tmp_path / "fresh"
    entry, _ = build(SPEC, "sm_80", cache=KernelCache(warmed))
    for p in warmed.rglob("*.key"):
        p.unlink()
    both = KernelCache([fresh, warmed])
    got, cached = build(SPEC, "sm_80", cache=both)
    assert cached and got.key == entry.key and (both.hits, both.misses) == (1, 0)
    assert not fresh.exists() or not any(p.is_file() for p in fresh.rglob("*"))


@pytest.mark.parametrize("damage", ["entry", "alias"])
def test_a_stale_or_damaged_alias_falls_back_to_the_key(tmp_path, damage):
    """An alias whose entry is gone (pruned), or that holds no key, is no alias: the source is
    rendered and keyed as before, one miss counted for a recompile, and the alias linked
    again."""
    from ge2jit.jit.loader import alias_for

    entry, _ = build(SPEC, "sm_80", cache=KernelCache(tmp_path))
    alias_path = tmp_path / alias_for(SPEC, "sm_80")[:2] / (alias_for(SPEC, "sm_80")[2:]
                                                            + ".key")
    if damage == "entry":
        KernelCache(tmp_path).path_for(entry.key).unlink()
    else:
        alias_path.write_text("not a key")
    c = KernelCache(tmp_path)
    got, cached = build(SPEC, "sm_80", cache=c)
    assert got.cubin == entry.cubin and cached == (damage == "alias")
    assert c.misses == (1 if damage == "entry" else 0)
    assert alias_path.read_text() == entry.key


def test_clear_and_prune_take_the_aliases_along(tmp_path):
    c = KernelCache(tmp_path)
    build(SPEC, "sm_80", cache=c)
    assert list(tmp_path.rglob("*.key")) and c.info()["entries"] == 1
    assert c.prune(older_than_s=-1).ok
    assert not list(tmp_path.rglob("*.key")) and not list(tmp_path.rglob("*.cubin"))
    c = KernelCache(tmp_path)   # no copy in memory: compiled and written again
    build(SPEC, "sm_80", cache=c)
    assert list(tmp_path.rglob("*.key"))
    assert c.clear().removed == 1 and not list(tmp_path.rglob("*.key"))
