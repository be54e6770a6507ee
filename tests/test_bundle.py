"""Bundles (``ge2jit cache export/import``): written through a private temporary file, read as
bounded streams, refused whole when anything in them is wrong."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ge2jit import bundle
from ge2jit.bundle import BundleError, export_bundle, import_bundle
from ge2jit.jit import cache as kernel_cache
from ge2jit.settings import reload_settings
from ge2jit.tune import db
from ge2jit.tune.db import TuningDB

from .test_cli import ROOT, fake_entries, ge2jit, one_line_error, valid_entries


@pytest.fixture
def use_cache(monkeypatch):
    """use_cache(path): GE2JIT_CACHE_DIR for the bundle functions of this process."""

    def use(path: Path) -> Path:
        monkeypatch.setenv("GE2JIT_CACHE_DIR", str(path))
        reload_settings()
        # the process-wide cache and tuning database: new ones, on this directory
        monkeypatch.setattr(kernel_cache, "_default", None)
        monkeypatch.setattr(db, "_default", None)
        return path

    yield use
    monkeypatch.undo()
    reload_settings()


@pytest.fixture
def source(tmp_path, use_cache) -> Path:
    """A cache with three kernels and one tuning record, in use."""
    src = use_cache(tmp_path / "src")
    fake_entries(src, ["gemm_a", "gemm_b", "gemm_c"])
    TuningDB(src / "tuning").put({"op": "gemm_bias_act", "arch": "sm_80"},
                                 {"config": "64x64x8_4x4", "ms": 0.1})
    return src


# --- export -----------------------------------------------------------------------------------


def test_export_goes_through_a_private_temporary_file(tmp_path, source):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    # the names a predictable temporary file would take, planted as symlinks to the victim
    for name in ("b.zip.partial", ".b.zip.partial", "b.zip.tmp"):
        (out / name).symlink_to(victim)
    summary = export_bundle(out / "b.zip")
    assert (summary.kernels, summary.tuning_records) == (3, 1)
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == [
        ".b.zip.partial", "b.zip", "b.zip.partial", "b.zip.tmp"]
    with zipfile.ZipFile(out / "b.zip") as z:
        assert len(z.namelist()) == 5
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((out / "b.zip").stat().st_mode) == 0o666 & ~mask


def test_export_replaces_a_symlink_at_the_target_not_what_it_points_to(tmp_path, source):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "b.zip").symlink_to(victim)
    export_bundle(tmp_path / "b.zip")
    assert victim.read_text() == "precious" and not (tmp_path / "b.zip").is_symlink()


def test_a_failed_export_leaves_nothing_behind(tmp_path, source, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "b.zip").write_text("the previous bundle")

    class Full:
        def records(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bundle, "default_db", Full)
    with pytest.raises(OSError, match="No space left"):
        export_bundle(out / "b.zip")
    assert [p.name for p in out.iterdir()] == ["b.zip"]
    assert (out / "b.zip").read_text() == "the previous bundle"


@pytest.mark.parametrize("where, words", [
    ("dir", ["is a directory", "bundle.zip"]),
    ("missing/b.zip", ["missing", "does not exist"]),
])
def test_export_to_a_folder_or_into_a_missing_one_is_one_line(tmp_path, source, where, words):
    (tmp_path / "dir").mkdir()
    target = tmp_path / where
    with pytest.raises(BundleError) as e:
        export_bundle(target)
    for w in words:
        assert w in str(e.value)
    line = one_line_error(ge2jit(["cache", "export", str(target)], source), "ge2jit cache export")
    assert all(w in line for w in words), line


# --- import -----------------------------------------------------------------------------------


def _members(bundle_path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(bundle_path) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(path: Path, members: dict[str, bytes], compress=zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = compress
            z.writestr(info, data)
    return path


@pytest.fixture
def good(tmp_path, source, use_cache) -> Path:
    """A valid bundle of the source cache; the cache in use is then an empty one."""
    b = tmp_path / "good.zip"
    export_bundle(b)
    use_cache(tmp_path / "dst")
    return b


def _manifest(bundle_members: dict[str, bytes], **edit) -> dict[str, bytes]:
    m = json.loads(bundle_members["manifest.json"])
    m.update(edit)
    return {**bundle_members, "manifest.json": json.dumps(m).encode()}


def _refused(bundle_path: Path, *words: str) -> str:
    with pytest.raises(BundleError) as e:
        import_bundle(bundle_path)
    msg = str(e.value)
    assert msg.startswith(f"{bundle_path}: ") and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    assert not (bundle_path.parent / "dst").exists() or valid_entries(
        bundle_path.parent / "dst") == (0, 0), "nothing imported"
    return msg


def test_import_round_trip(good, tmp_path):
    s = import_bundle(good)
    assert (s.kernels, s.tuning_records) == (3, 1)
    assert valid_entries(tmp_path / "dst") == (3, 0)
    assert TuningDB(tmp_path / "dst" / "tuning").get(
        {"op": "gemm_bias_act", "arch": "sm_80"})["config"] == "64x64x8_4x4"


def test_a_member_too_large_is_refused_by_its_declared_size_before_reading(good, monkeypatch):
    members = _members(good)
    name = next(n for n in members if n.endswith(".cubin"))
    monkeypatch.setattr(bundle, "MAX_KERNEL_BYTES", len(members[name]) - 1)
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, *a, **k: opened.append(a) or pytest.fail("read"))
    _refused(good, name, f"{len(members[name])} bytes", f"at most {len(members[name]) - 1}")
    assert opened == []


def test_a_member_whose_header_understates_its_size_is_refused(good, tmp_path):
    members = _members(good)
    name = next(n for n in members if n.endswith(".cubin"))
    bad = _zip(tmp_path / "bad.zip", members, compress=zipfile.ZIP_STORED)
    _patch_directory(bad, name, 24, (10).to_bytes(4, "little"))  # "10 bytes", where more are
    _refused(bad, name)


def _patch_directory(path: Path, name: str, offset: int, value: bytes) -> None:
    """Overwrite bytes of ``name``'s central directory record (offset 8: flags, 24: size)."""
    data = bytearray(path.read_bytes())
    at = next(i for i in range(len(data)) if data[i:i + 4] == b"PK\x01\x02" and
              data[i + 46:i + 46 + len(name)] == name.encode())
    data[at + offset:at + offset + len(value)] = value
    path.write_bytes(bytes(data))


def test_the_total_and_the_count_of_members_are_bounded(good, monkeypatch):
    total = sum(len(d) for n, d in _members(good).items() if n != "manifest.json")
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", total - 1)
    _refused(good, f"at most {total - 1} bytes")
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", total)
    monkeypatch.setattr(bundle, "MAX_MEMBERS", 3)
    _refused(good, "5 members", "at most 3")


def test_a_huge_member_costs_no_memory(tmp_path):
    # 256 MiB of zeros deflate to a quarter of a MiB; its declared size refuses it unread
    huge = tmp_path / "huge.zip"
    with zipfile.ZipFile(huge, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("kernels/ab/" + "c" * 62 + ".cubin", "w", force_zip64=True) as f:
            for _ in range(256):
                f.write(bytes(1 << 20))
        z.writestr("manifest.json", "{}")
    assert huge.stat().st_size < 4 << 20
    code = (
        "import resource, sys\n"
        "from ge2jit.bundle import BundleError, import_bundle\n"
        "from ge2jit.jit.nvrtc import nvrtc_info\n"
        "nvrtc_info()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    import_bundle({str(huge)!r})\n"
        "except BundleError as e:\n"
        "    print(e)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GE2JIT_CACHE_DIR": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, check=True)
    message, grew_mib = r.stdout.strip().splitlines()
    assert "268435456 bytes" in message, message
    assert int(grew_mib) < 32, r.stdout


@pytest.mark.parametrize("how, words", [
    ("bzip2", ["compression method 12", "stored or deflated"]),
    ("encrypted", ["encrypted"]),
    ("duplicate", ["twice"]),
    ("outside", ["unexpected member", "../"]),
    ("not hex", ["unexpected member"]),
])
def test_members_are_checked_before_anything_is_read(good, tmp_path, how, words):
    members = _members(good)
    name = next(n for n in members if n.endswith(".cubin"))
    if how == "bzip2":
        bad = _zip(tmp_path / "bad.zip", members, compress=zipfile.ZIP_BZIP2)
    elif how == "encrypted":
        bad = _zip(tmp_path / "bad.zip", members)
        _patch_directory(bad, name, 8, b"\x01\x00")  # the "encrypted" flag
    elif how == "duplicate":
        bad = _zip(tmp_path / "bad.zip", members)
        with zipfile.ZipFile(bad, "a") as z, pytest.warns(UserWarning, match="Duplicate"):
            z.writestr(name, members[name])
    else:
        other = "kernels/../../" + name if how == "outside" else "kernels/ZZ/" + "x" * 62 + ".cubin"
        bad = _zip(tmp_path / "bad.zip", {**members, other: members[name]})
    _refused(bad, *words)


@pytest.mark.parametrize("edit, words", [
    ({"members": []}, ["members", "expected an object"]),
    ({"members": {"kernels/ab/x.cubin": 3}}, ["members", "sha256"]),
    ({"members": {"kernels/ab/x.cubin": "AB" * 32}}, ["members", "sha256"]),
    ({"format": 1}, ["format", "1"]),
    ({"format": "ge2jit-bundle-9"}, ["unknown bundle format", "ge2jit-bundle-9"]),
    ({"nvrtc": [13, 0]}, ["nvrtc", "[13, 0]"]),
])
def test_malformed_manifests_are_one_line_errors(good, tmp_path, edit, words):
    _refused(_zip(tmp_path / "bad.zip", _manifest(_members(good), **edit)), *words)


@pytest.mark.parametrize("manifest, words", [
    (b"[1, 2]", ["manifest.json", "JSON object"]),
    (b"\xff\xfe", ["manifest.json"]),
    (b"{" * 100000, ["manifest.json"]),
])
def test_a_manifest_that_is_no_json_object_is_refused(good, tmp_path, manifest, words):
    _refused(_zip(tmp_path / "bad.zip", {**_members(good), "manifest.json": manifest}), *words)


def test_a_member_the_manifest_does_not_list_is_refused(good, tmp_path):
    members = _members(good)
    name = next(n for n in members if n.endswith(".cubin"))
    _refused(_zip(tmp_path / "bad.zip", {n: d for n, d in members.items() if n != name}),
             "members do not match the manifest", name)


@pytest.mark.parametrize("target", ["file", "shard"])
def test_import_into_a_cache_that_cannot_store_is_a_failure_of_the_work(good, tmp_path, target):
    dst = tmp_path / "dst2"
    if target == "file":
        dst.write_text("")
    else:  # every shard name taken by a file: the first write fails
        dst.mkdir()
        for i in range(256):
            (dst / f"{i:02x}").write_text("")
    line = one_line_error(ge2jit(["cache", "import", str(good)], dst), "ge2jit cache import", 1)
    assert str(dst) in line, line


def test_bundle_help_says_what_the_exit_statuses_mean(tmp_path):
    for action in ("export", "import"):
        out = " ".join(ge2jit(["cache", action, "--help"], tmp_path).stdout.split())
        assert "Exit status: 0" in out and "2 " in out and "1 " in out, out


def _with_member(members: dict[str, bytes], name: str, data: bytes,
                 drop: str | None = None) -> dict[str, bytes]:
    """The bundle's members with ``name`` set to ``data`` (and ``drop`` left out), the
    manifest's checksums made to match."""
    out = {n: d for n, d in members.items() if n != drop}
    out[name] = data
    m = json.loads(out["manifest.json"])
    m["members"] = {n: hashlib.sha256(d).hexdigest() for n, d in out.items()
                    if n != "manifest.json"}
    out["manifest.json"] = json.dumps(m).encode()
    return out


@pytest.mark.parametrize("edit, words", [
    (lambda r: {**r, "value": {**r["value"], "config": 7}}, ["value.config"]),
    (lambda r: {**r, "value": {**r["value"], "ms": -1}}, ["value.ms"]),
    (lambda r: {**r, "checksum": "0" * 64}, ["checksum"]),
    (lambda r: [r], ["JSON object"]),
    (lambda r: {**r, "key": {**r["key"], "arch": "sm_90"}}, ["another key"]),
])
def test_tuning_records_are_validated_before_anything_is_imported(good, tmp_path, edit, words):
    members = _members(good)
    name = next(n for n in members if n.startswith("tuning/"))
    record = edit(json.loads(members[name]))
    if isinstance(record, dict) and record["checksum"] != "0" * 64:  # only the edit is wrong
        value = json.dumps(record["value"], sort_keys=True, separators=(",", ":"))
        record["checksum"] = hashlib.sha256(value.encode()).hexdigest()
    bad = _zip(tmp_path / "bad.zip", _with_member(members, name, json.dumps(record).encode()))
    _refused(bad, "damaged tuning record", name, *words)
    assert not (tmp_path / "dst").exists() or not list((tmp_path / "dst").rglob("*.json"))


def test_import_writes_by_the_cache_rules_never_through_a_symlinked_shard(good, tmp_path):
    from ge2jit.errors import CacheNotWritableError

    victim = tmp_path / "victim"
    victim.mkdir()
    dst = tmp_path / "dst"
    dst.mkdir(exist_ok=True)
    for i in range(256):   # whichever shard the bundle's kernels fall in
        (dst / f"{i:02x}").symlink_to(victim, target_is_directory=True)
    with pytest.raises(CacheNotWritableError, match="a symlink"):
        import_bundle(good)
    assert list(victim.iterdir()) == []


def test_import_holds_the_size_cap(good, tmp_path, monkeypatch):
    from ge2jit import settings

    # entries of a few hundred bytes: below the setting's floor of 1 MiB, lowered here
    monkeypatch.setattr(settings, "MIN_CACHE_MAX_SIZE", 0)
    monkeypatch.setenv("GE2JIT_CACHE_MAX_SIZE", "1000")   # about two of the three entries
    reload_settings()
    import_bundle(good)
    total = sum(p.stat().st_size for p in (tmp_path / "dst").glob("??/*.cubin"))
    assert 0 < total <= 1000


# --- aliases ----------------------------------------------------------------------------------


def test_aliases_travel_with_their_kernels(tmp_path, source, use_cache):
    """A kernel's alias (its spec's name for the entry) is exported with it and linked again
    on import, so that the importing machine finds the kernel without rendering; an alias of
    an entry that is not there stays behind."""
    cache = kernel_cache.default_cache()
    keys = [path.parent.name + path.name[:-len(".cubin")] for path, _ in cache.entries()]
    cache.link("ab" + "1" * 62, keys[0])
    cache.link("cd" + "2" * 62, "e" * 64)   # no such entry
    out = tmp_path / "b.zip"
    export_bundle(out)
    with zipfile.ZipFile(out) as z:
        assert [n for n in z.namelist() if n.startswith("aliases/")] == [
            "aliases/ab/" + "1" * 62 + ".key"]
    use_cache(tmp_path / "dst")
    import_bundle(out)
    assert kernel_cache.default_cache().resolve("ab" + "1" * 62) == keys[0]


def test_an_alias_of_a_kernel_the_bundle_lacks_is_refused(tmp_path, source):
    cache = kernel_cache.default_cache()
    key = next(path.parent.name + path.name[:-len(".cubin")] for path, _ in cache.entries())
    cache.link("ab" + "1" * 62, key)
    good = tmp_path / "good.zip"
    export_bundle(good)
    members = _members(good)
    kernel = f"kernels/{key[:2]}/{key[2:]}.cubin"   # the aliased kernel, taken out
    assert kernel in members and "aliases/ab/" + "1" * 62 + ".key" in members
    del members[kernel]
    m = json.loads(members["manifest.json"])
    del m["members"][kernel]
    members["manifest.json"] = json.dumps(m).encode()
    _refused(_zip(tmp_path / "bad.zip", members), "alias", "does not hold")
