"""GE2JIT_* variables: a bad value never breaks ``import ge2jit``; it raises SettingsError, one
line naming the variable, where the value is needed. GE2JIT_VERBOSE drives the logger."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ge2jit.errors import SettingsError
from ge2jit.settings import get_settings, parse_size, reload_settings


@pytest.fixture
def env(monkeypatch):
    """Sets GE2JIT_* variables for one test and re-reads them."""

    def set_vars(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        reload_settings()

    yield set_vars
    monkeypatch.undo()
    reload_settings()


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


PROBE = """
import ge2jit
from ge2jit.errors import SettingsError
try:
    {call}
except SettingsError as e:
    print("SettingsError:", e)
else:
    print("no error")
"""


@pytest.mark.parametrize("name, value, call, expected", [
    ("GE2JIT_CACHE_MAX_SIZE", "lots", "ge2jit.cache_info()",
     "expected a size such as 2GB (2 * 10**9 bytes), 2GiB (2 * 2**30) or 1048576 (bytes), "
     "got 'lots'"),
    ("GE2JIT_FLOAT32_PRECISION", "half",
     "from ge2jit.settings import get_settings; get_settings().float32_precision",
     "expected one of ieee, tf32, tf32x3, got 'half'"),
    ("GE2JIT_DISABLE_CACHE", "maybe", "ge2jit.cache_info()",
     "expected 1, 0, true, false, yes, no, on or off (empty: unset), got 'maybe'"),
    ("GE2JIT_VERBOSE", "loud", "ge2jit.cache_info()",
     "expected 0, 1 or 2 (or false, true, debug; also no, yes, off, on; empty: unset), "
     "got 'loud'"),
])
def test_a_bad_variable_does_not_break_import_and_is_reported_at_use(name, value, call,
                                                                     expected):
    r = _python(PROBE.format(call=call), **{name: value})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout.strip() == f"SettingsError: {name}: {expected}"


def test_bad_values_raise_settings_error_naming_the_variable(env):
    env(GE2JIT_CACHE_MAX_SIZE="12 parsecs", GE2JIT_FLOAT32_PRECISION="fp8")
    s = get_settings()                                   # reading the rest works
    assert s.cache_dirs and s.disable_cache is False
    with pytest.raises(SettingsError, match=r"^GE2JIT_CACHE_MAX_SIZE: expected a size") as e:
        _ = s.cache_max_size
    assert "\n" not in str(e.value) and "'12 parsecs'" in str(e.value)
    with pytest.raises(SettingsError, match=r"^GE2JIT_FLOAT32_PRECISION: expected one of"):
        _ = s.float32_precision


def test_good_values(env):
    env(GE2JIT_CACHE_MAX_SIZE=" 1.5GiB ", GE2JIT_FLOAT32_PRECISION="TF32")
    s = get_settings()
    assert s.cache_max_size == int(1.5 * 1024 ** 3) and s.float32_precision == "tf32"
    env(GE2JIT_CACHE_MAX_SIZE="2GB")
    assert get_settings().cache_max_size == 2 * 10 ** 9


@pytest.mark.parametrize("text, size", [
    ("1024", 1024), ("1024B", 1024), ("1 b", 1),
    ("1MB", 10 ** 6), ("1M", 10 ** 6), ("1mb", 10 ** 6), ("1MiB", 2 ** 20), ("1mib", 2 ** 20),
    ("1K", 1000), ("1KB", 1000), ("1kB", 1000), ("1KiB", 1024),
    ("2G", 2 * 10 ** 9), ("2GB", 2 * 10 ** 9), ("2GiB", 2 * 2 ** 30), ("1TB", 10 ** 12),
    ("1.5GiB", 3 * 2 ** 29), (" 1.1GB ", 1_100_000_000), ("500M", 500 * 10 ** 6),
])
def test_sizes_are_read_honestly(text, size):
    """MB is 10**6 bytes and MiB 2**20: one parser, for GE2JIT_CACHE_MAX_SIZE and --max-size."""
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["-1GB", "lots", "1iB", "1.5.5", "", "2 parsecs", "1e9"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ValueError, match=r"^expected a size such as 2GB \(2 \* 10\*\*9 bytes\), "
                                         r"2GiB .*, got '"):
        parse_size(text)


@pytest.mark.parametrize("value", ["0", "10KB", "1MB", "1048575"])
def test_a_cap_smaller_than_a_kernel_is_refused(env, value):
    """A cap below 1 MiB would evict each kernel right after writing it: refused, naming the
    variable, what it takes and what it holds (2**20 bytes is the least)."""
    env(GE2JIT_CACHE_MAX_SIZE=value)
    with pytest.raises(SettingsError) as e:
        _ = get_settings().cache_max_size
    msg = str(e.value)
    assert msg.startswith("GE2JIT_CACHE_MAX_SIZE: expected at least 1MiB") and "\n" not in msg
    assert f"got '{value}'" in msg
    env(GE2JIT_CACHE_MAX_SIZE="1MiB")
    assert get_settings().cache_max_size == 2 ** 20


@pytest.mark.parametrize("name", ["GE2JIT_DISABLE_CACHE", "GE2JIT_SAVE_SOURCE",
                                  "GE2JIT_LINEINFO"])
@pytest.mark.parametrize("value, on", [
    ("1", True), ("true", True), ("YES", True), ("On", True), (" 1 ", True),
    ("0", False), ("false", False), ("No", False), ("OFF", False), ("", False), ("  ", False),
])
def test_switches_take_the_documented_values(env, name, value, on):
    env(**{name: value})
    attribute = name.removeprefix("GE2JIT_").lower()
    assert getattr(get_settings(), attribute) is on


@pytest.mark.parametrize("name", ["GE2JIT_DISABLE_CACHE", "GE2JIT_SAVE_SOURCE",
                                  "GE2JIT_LINEINFO"])
@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "y", "-1"])
def test_a_switch_with_another_value_is_an_error_not_on(env, name, value):
    env(**{name: value})
    attribute = name.removeprefix("GE2JIT_").lower()
    with pytest.raises(SettingsError) as e:
        getattr(get_settings(), attribute)
    assert str(e.value) == (f"{name}: expected 1, 0, true, false, yes, no, on or off (empty: "
                            f"unset), got '{value}'")


@pytest.mark.parametrize("value, level", [("", 0), ("0", 0), ("off", 0), ("1", 1), ("TRUE", 1),
                                          ("yes", 1), ("2", 2), ("debug", 2)])
def test_verbose_levels(env, value, level):
    env(GE2JIT_VERBOSE=value)
    assert get_settings().verbose == level


def test_a_bad_verbose_is_an_error_at_the_first_cache_use_and_logs_nothing(env, tmp_path):
    from ge2jit.jit.cache import KernelCache

    env(GE2JIT_VERBOSE="loud")
    settings = get_settings()                          # reading the environment never fails
    assert _our_handlers() == []                       # not taken as "on"
    with pytest.raises(SettingsError, match=r"^GE2JIT_VERBOSE: expected 0, 1 or 2 .*'loud'$"):
        KernelCache(tmp_path)
    with pytest.raises(SettingsError, match="GE2JIT_VERBOSE"):
        settings.check()


def test_a_bad_disable_cache_is_an_error_where_the_cache_is_made(env, tmp_path):
    from ge2jit.jit.cache import KernelCache
    from ge2jit.tune.db import TuningDB

    env(GE2JIT_DISABLE_CACHE="maybe")
    for make in (KernelCache, TuningDB):
        with pytest.raises(SettingsError, match=r"^GE2JIT_DISABLE_CACHE: expected 1, 0, "):
            make(tmp_path)


def test_nvrtc_naming_no_file_is_a_settings_error(env, tmp_path):
    env(GE2JIT_NVRTC=str(tmp_path / "libnvrtc.so.13"))
    with pytest.raises(SettingsError, match=r"^GE2JIT_NVRTC='.*libnvrtc.so.13': expected the "
                                            r"path of a libnvrtc.so.\* file"):
        get_settings().check()
    lib = tmp_path / "libnvrtc.so.13"
    lib.write_bytes(b"")
    env(GE2JIT_NVRTC=str(lib))
    assert get_settings().nvrtc_library == lib


def test_unset_values_take_their_defaults(env, monkeypatch):
    for name in ("GE2JIT_CACHE_MAX_SIZE", "GE2JIT_FLOAT32_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    env()
    assert get_settings().cache_max_size is None
    assert get_settings().float32_precision == "ieee"


def test_cache_dir_lists_directories(env, tmp_path):
    env(GE2JIT_CACHE_DIR=f"{tmp_path}/a:{tmp_path}/b")
    assert get_settings().cache_dirs == (tmp_path / "a", tmp_path / "b")
    assert get_settings().cache_dir == tmp_path / "a"
    env(GE2JIT_CACHE_DIR="~/x")
    assert get_settings().cache_dirs == (Path("~/x").expanduser(),)


# --- logging --------------------------------------------------------------------------------

def _our_handlers() -> list:
    from ge2jit import settings

    return [h for h in logging.getLogger("ge2jit").handlers
            if isinstance(h, settings._StderrHandler)]


def test_verbose_attaches_one_stderr_handler(env, monkeypatch, capsys):
    env(GE2JIT_VERBOSE="1")
    get_settings()
    reload_settings()
    assert len(_our_handlers()) == 1
    assert logging.getLogger("ge2jit").getEffectiveLevel() == logging.INFO
    logging.getLogger("ge2jit.cache").info("hello %s", "there")
    logging.getLogger("ge2jit.cache").debug("not shown at 1")
    err = capsys.readouterr().err
    assert "hello there" in err and "ge2jit.cache" in err and "not shown" not in err
    env(GE2JIT_VERBOSE="2")
    assert len(_our_handlers()) == 1
    assert logging.getLogger("ge2jit").getEffectiveLevel() == logging.DEBUG
    monkeypatch.delenv("GE2JIT_VERBOSE")
    reload_settings()
    assert _our_handlers() == []


def test_compiles_are_logged(tmp_path, caplog):
    from ge2jit.jit.cache import KernelCache
    from ge2jit.jit.loader import build
    from ge2jit.ops.gemm.epilogue import Act, Epilogue, Layout
    from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec

    spec = TiledGemmSpec(DType.F32, Layout.ROW, Layout.ROW,
                         Epilogue(out_dtype=DType.F32, act=Act.SILU), TILED_CONFIGS[0])
    with caplog.at_level(logging.DEBUG, logger="ge2jit"):
        build(spec, "sm_80", cache=KernelCache(tmp_path))
        build(spec, "sm_80", cache=KernelCache(tmp_path))
    compiled = [r for r in caplog.records if r.getMessage().startswith("compiled ")]
    assert len(compiled) == 1 and compiled[0].levelno == logging.INFO
    assert spec.kernel_name in compiled[0].getMessage() and str(tmp_path) in \
        compiled[0].getMessage()
    assert compiled[0].name.startswith("ge2jit.")


def test_a_refused_entry_is_logged_with_its_reason(tmp_path, caplog):
    from ge2jit.jit.cache import KernelCache

    path = tmp_path / "ab" / ("c" * 62 + ".cubin")
    path.parent.mkdir()
    path.write_bytes(b"not an entry")
    with caplog.at_level(logging.DEBUG, logger="ge2jit.cache"):
        assert KernelCache(tmp_path).get("ab" + "c" * 62) is None
    assert any("bad magic" in r.getMessage() for r in caplog.records)


def test_verbose_program_logs_to_stderr(tmp_path):
    code = ("from ge2jit.jit.loader import build\n"
            "from ge2jit.ops.gemm.epilogue import Epilogue, Layout\n"
            "from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec\n"
            "build(TiledGemmSpec(DType.F32, Layout.ROW, Layout.ROW, Epilogue(out_dtype=DType.F32), "
            "TILED_CONFIGS[0]), 'sm_80')\n")
    r = _python(code, GE2JIT_VERBOSE="1", GE2JIT_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "compiled gemm_f32" in r.stderr and r.stderr.count("compiled ") == 1
