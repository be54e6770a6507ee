"""NVRTC: loading, compiling for named architectures without a GPU, errors, ptxas' report."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

import pytest

import ge2jit
from ge2jit.jit import nvrtc


def test_nvrtc_info_reports_version_and_path():
    info = ge2jit.nvrtc_info()
    assert info.version[0] >= 12
    assert info.path and "libnvrtc" in info.path
    assert len(info.fingerprint) == 16
    assert "sm_90" in info.supported_archs and "sm_80" in info.supported_archs
    assert str(info).startswith(f"NVRTC {info.version[0]}.{info.version[1]}")


def _elf_fits(cubin: bytes) -> bool:
    """Whether an ELF file's program and section header tables lie within it (a cubin whose
    last byte was dropped does not: cuobjdump refuses it)."""
    import struct

    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    return phoff + phentsize * phnum <= len(cubin) and shoff + shentsize * shnum <= len(cubin)


def test_the_library_named_is_the_one_compiling_and_its_cubins_are_whole():
    r = nvrtc.compile_to_cubin(SAXPY, "saxpy", "sm_90")
    assert _elf_fits(r.cubin)
    info = ge2jit.nvrtc_info()
    path, lib = nvrtc._loaded["in_use"]
    assert info.path == path and nvrtc._version_of(lib) == info.version


def test_the_library_in_use_is_found_by_its_version_among_the_loaded(monkeypatch):
    """Of the libraries in memory, the one of the binding's version; one that is not loaded
    (only listed) is never loaded to be asked."""
    real = ge2jit.nvrtc_info().path
    monkeypatch.setattr(nvrtc, "_loaded_nvrtc_paths", lambda: ["/nonexistent/libnvrtc.so.13",
                                                               real])
    found = nvrtc._library_in_use(ge2jit.nvrtc_info().version)
    assert found is not None and found[0] == real
    assert nvrtc._library_in_use((1, 0)) is None   # no library of that version


def test_with_a_second_libnvrtc_in_the_process_the_one_ge2jit_loaded_is_named(tmp_path):
    """Another package may load its own libnvrtc by its path after ge2jit (PyTorch does): the
    library named, fingerprinted and read for whole cubins stays the one CuPy's binding calls,
    not the first in memory."""
    real = ge2jit.nvrtc_info().path
    copy = tmp_path / "libnvrtc.so.13"
    copy.write_bytes(open(real, "rb").read())
    code = (
        "import ctypes, ge2jit\n"
        "from ge2jit.jit import nvrtc\n"
        f"ctypes.CDLL({str(copy)!r})\n"
        "assert len(nvrtc._loaded_nvrtc_paths()) == 2, nvrtc._loaded_nvrtc_paths()\n"
        f"r = nvrtc.compile_to_cubin({SAXPY!r}, 'saxpy', 'sm_90')\n"
        "print(ge2jit.nvrtc_info().path, len(r.cubin))\n")
    env = {k: v for k, v in os.environ.items() if k != "GE2JIT_NVRTC"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    path, size = out.stdout.split()
    assert path == real
    assert int(size) == len(nvrtc.compile_to_cubin(SAXPY, "saxpy", "sm_90").cubin)


@pytest.mark.parametrize("given, expected", [
    ("sm_90a", "sm_90a"), ("90a", "sm_90a"), (90, "sm_90"), ("compute_80", "sm_80"),
    ("SM_86", "sm_86"), ("sm_100f", "sm_100f"),
])
def test_normalize_arch(given, expected):
    assert nvrtc.normalize_arch(given) == expected


@pytest.mark.parametrize("given, number", [("sm_90a", 90), ("sm_80", 80), (86, 86),
                                           ("compute_100f", 100)])
def test_arch_number(given, number):
    assert nvrtc.arch_number(given) == number


@pytest.mark.parametrize("bad", ["hopper", "sm_9", "", "sm_90b"])
def test_normalize_arch_rejects(bad):
    with pytest.raises(ValueError, match="arch"):
        nvrtc.normalize_arch(bad)


SAXPY = ('extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {\n'
         '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
         '  if (i < n) y[i] = a * x[i] + y[i];\n}\n')


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_compile_without_gpu_gives_cubin_and_report(arch):
    r = nvrtc.compile_to_cubin(SAXPY, "saxpy", arch)
    assert r.cubin[:4] == b"\x7fELF"
    assert r.resources.registers > 0
    assert r.resources.spill_bytes == 0
    assert f"for '{arch}'" in r.log
    assert r.compile_seconds > 0


def test_lineinfo_is_a_compile_option_and_so_in_the_cache_key(monkeypatch):
    """GE2JIT_LINEINFO=1: the cubin carries source lines (for profilers and
    compute-sanitizer); its options, which the cache key hashes, say so."""
    from ge2jit.settings import reload_settings

    plain = nvrtc.compile_to_cubin(SAXPY, "saxpy", "sm_90")
    monkeypatch.setenv("GE2JIT_LINEINFO", "1")
    reload_settings()
    try:
        lined = nvrtc.compile_to_cubin(SAXPY, "saxpy", "sm_90")
        assert "--generate-line-info" in nvrtc.compile_options("sm_90")
    finally:
        monkeypatch.delenv("GE2JIT_LINEINFO")
        reload_settings()
    assert "--generate-line-info" not in nvrtc.compile_options("sm_90")
    assert lined.options == (*plain.options[:3], "--generate-line-info", *plain.options[3:])
    assert b".nv_debug_line_sass" in lined.cubin or b".debug_line" in lined.cubin
    assert b".debug_line" not in plain.cubin
    assert lined.resources.registers == plain.resources.registers


def test_compile_error_carries_name_log_and_source():
    bad = SAXPY.replace("a * x[i]", "a * undefined_thing[i]")
    with pytest.raises(ge2jit.KernelCompileError) as info:
        nvrtc.compile_to_cubin(bad, "saxpy_broken", "sm_80")
    err = info.value
    assert str(err).startswith("NVRTC failed to compile kernel 'saxpy_broken'")
    assert "undefined_thing" in str(err) and "error" in err.log
    buf = io.StringIO()
    err.dump(buf)
    assert "3 |   if (i < n) y[i] = a * undefined_thing[i] + y[i];" in buf.getvalue()
    assert isinstance(err, ge2jit.Ge2jitError)
    # it crosses a process boundary whole (a process pool's worker hands it back)
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), str(again), again.log, again.source, again.options) == \
        (type(err), str(err), err.log, err.source, err.options)


def test_resource_parse():
    log = ("ptxas info    : Function properties for k\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 8448 bytes smem, "
           "400 bytes cmem[0]\n")
    r = nvrtc.Resources.parse(log)
    assert (r.registers, r.shared_bytes, r.stack_bytes, r.spill_stores, r.spill_loads) == \
        (255, 8448, 16, 8, 12)
    assert r.spill_bytes == 20


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_ge2jit_nvrtc_chooses_the_library():
    path = ge2jit.nvrtc_info().path
    r = _run("import ge2jit; print(ge2jit.nvrtc_info().path)", GE2JIT_NVRTC=path)
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout.strip()) == os.path.realpath(path)


def test_ge2jit_nvrtc_bad_path_is_a_clear_error():
    r = _run("import ge2jit\ntry:\n ge2jit.nvrtc_info()\nexcept ge2jit.NvrtcError as e:\n"
             " print('ERR', e)", GE2JIT_NVRTC="/nonexistent/libnvrtc.so.13")
    assert r.returncode == 0, r.stderr
    assert "ERR GE2JIT_NVRTC='/nonexistent/libnvrtc.so.13'" in r.stdout


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = "import ge2jit\nprint('INFO', ge2jit.nvrtc_info())\n"


def _plant(folder) -> str:
    """A fake NVRTC wheel layout, newer than any real one, whose 'libraries' are text files:
    loading one would fail (and a real one would run the planter's code)."""
    lib = folder / "nvidia" / "planted" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.99").write_text("not a library\n")
    (lib / "libnvrtc-builtins.so.99.9").write_text("not a library\n")
    return str(folder)


@pytest.mark.parametrize("how", ["-c in the folder", "-m from the folder", "script in it"])
def test_nvrtc_in_the_working_or_script_directory_is_never_loaded(tmp_path, how):
    folder = tmp_path / "planted"
    planted = _plant(folder)
    (folder / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "GE2JIT_NVRTC"}
    env["PYTHONPATH"] = ROOT   # this checkout's ge2jit
    cmd, cwd = {"-c in the folder": ([sys.executable, "-c", PROBE], folder),
                "-m from the folder": ([sys.executable, "-m", "probe"], folder),
                "script in it": ([sys.executable, str(folder / "probe.py")], tmp_path)}[how]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert planted not in r.stdout + r.stderr
    assert r.stdout.startswith("INFO NVRTC ")


def test_nvrtc_info_says_why_this_library():
    info = ge2jit.nvrtc_info()
    if os.environ.get("GE2JIT_NVRTC"):
        assert info.reason == "GE2JIT_NVRTC"
    else:   # the test environment installs the nvidia-cuda-nvrtc wheel
        major, minor = info.version
        assert info.reason.startswith(f"nvidia-cuda-nvrtc {major}.{minor} wheel in ")
        assert os.path.realpath(info.path).startswith(
            os.path.realpath(info.reason.split(" wheel in ", 1)[1]))
    assert f"; {info.reason})" in str(info)


def test_ge2jit_nvrtc_is_the_reason():
    path = ge2jit.nvrtc_info().path
    r = _run("import ge2jit; print(ge2jit.nvrtc_info().reason)", GE2JIT_NVRTC=path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "GE2JIT_NVRTC"


@pytest.mark.parametrize("folder, used", [("deps/site-packages", True), ("deps", True),
                                          ("relative", False), ("cwd", False)])
def test_wheels_on_pythonpath_count_in_an_install_directory(tmp_path, folder, used):
    """An absolute folder named in PYTHONPATH (a ``pip install --target`` directory) is
    searched; a relative entry, or one that is the working directory, is not."""
    if folder == "cwd":
        folder = "."
    real = ge2jit.nvrtc_info().path
    lib = tmp_path / folder / "nvidia" / "cu99" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.99").symlink_to(real)
    for builtins in os.listdir(os.path.dirname(real)):
        if builtins.startswith("libnvrtc-builtins.so."):
            (lib / "libnvrtc-builtins.so.99.9").symlink_to(os.path.join(os.path.dirname(real),
                                                                        builtins))
            break
    env = {k: v for k, v in os.environ.items() if k != "GE2JIT_NVRTC"}
    entry = folder if folder == "relative" else str(tmp_path / folder)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, entry])
    r = subprocess.run([sys.executable, "-c", "import ge2jit; print(ge2jit.nvrtc_info().reason)"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    wanted = f"nvidia-cuda-nvrtc 99.9 wheel in {os.path.realpath(tmp_path / folder)}"
    assert (r.stdout.strip() == wanted) is used, r.stdout


# --- without a wheel, cuda.pathfinder (CuPy's own search) loads NVRTC and says how -----------

class _Loaded:
    """What cuda.pathfinder.load_nvidia_dynamic_lib returns (LoadedDL), as far as it is read."""

    def __init__(self, found_via: str):
        self.abs_path, self.found_via = "/usr/local/cuda/lib64/libnvrtc.so.13", found_via


@pytest.fixture
def no_wheel(monkeypatch):
    """A process where no NVRTC wheel is installed and none is loaded yet; returns the names
    cuda.pathfinder was asked to load."""
    from cuda import pathfinder

    asked = []
    monkeypatch.setattr(nvrtc, "_loaded", {})
    monkeypatch.setattr(nvrtc, "_wheel_candidates", lambda: [])
    monkeypatch.setattr(nvrtc, "_loaded_nvrtc_paths", lambda: [])
    monkeypatch.delenv("GE2JIT_NVRTC", raising=False)
    monkeypatch.setattr(pathfinder, "load_nvidia_dynamic_lib",
                        lambda name: asked.append(name) or _Loaded("system-search"))
    from ge2jit.settings import reload_settings

    reload_settings()
    yield asked
    monkeypatch.undo()
    reload_settings()


def test_without_a_wheel_pathfinder_loads_nvrtc_and_the_reason_says_so(no_wheel):
    nvrtc.preload()
    assert no_wheel == ["nvrtc"]
    assert nvrtc._loaded["reason"] == "found by cuda.pathfinder (system-search)"


def test_when_pathfinder_finds_none_cupy_is_left_to_try(no_wheel, monkeypatch):
    from cuda import pathfinder

    def not_found(name):
        raise pathfinder.DynamicLibNotFoundError(f'Failure finding "lib{name}.so.13"')

    monkeypatch.setattr(pathfinder, "load_nvidia_dynamic_lib", not_found)
    nvrtc.preload()                     # no error at import: the first compile reports it
    assert "reason" not in nvrtc._loaded and "preload_error" not in nvrtc._loaded


def test_a_wheel_comes_before_pathfinder(no_wheel, monkeypatch, tmp_path):
    lib = tmp_path / "libnvrtc.so.13"
    monkeypatch.setattr(nvrtc, "_wheel_candidates",
                        lambda: [((13, 5), lib, str(tmp_path))])
    loaded = []
    monkeypatch.setattr(nvrtc, "_preload", loaded.append)
    nvrtc.preload()
    assert loaded == [lib] and no_wheel == []
    assert nvrtc._loaded["reason"] == f"nvidia-cuda-nvrtc 13.5 wheel in {tmp_path}"
