"""Bundles (``ge2jit cache export/import``): written through a private temporary file, read as
bounded streams, refused whole when anything in them is wrong."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from ge2jit import bundle
from ge2jit.bundle import BundleError, export_bundle, import_bundle
from ge2jit.jit.cache import KernelCache, reset_default_cache
from ge2jit.settings import reload_settings
from ge2jit.tune.db import TuningDB, reset_default_db

from .test_cli import ROOT, SMALL, fake_entries, ge2jit, one_line_error, valid_entries, write


@pytest.fixture
def use_cache(monkeypatch):
    """use_cache(path): GE2JIT_CACHE_DIR for the bundle functions of this process."""

    def use(path: Path) -> Path:
        monkeypatch.setenv("GE2JIT_CACHE_DIR", str(path))
        reload_settings()
        reset_default_cache()
        reset_default_db()
        return path

    yield use
    monkeypatch.undo()
    reload_settings()
    reset_default_cache()
    reset_default_db()


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
