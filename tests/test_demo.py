"""The quick-start demo: without a GPU it says so and compiles its kernels into the cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ge2jit.jit.cache import KernelCache
from ge2jit.jit.device import gpu_count


@pytest.mark.skipif(gpu_count() > 0, reason="the GPU path runs in the GPU suite's demo step")
def test_demo_without_gpu_compiles_its_kernels(tmp_path):
    env = {**os.environ, "GE2JIT_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "ge2jit.demo", "--arch", "sm_80"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("No CUDA GPU found: nothing to run.")
    assert f"Kernel cache: {tmp_path}" in r.stdout
    entries = [e for _, e in KernelCache(tmp_path).entries()]
    assert len(entries) == 3 and all(e is not None and e.arch == "sm_80" for e in entries)
    for act in ("gelu", "relu", "silu"):
        assert f"_{act}_colbias" in r.stdout
    assert r.stdout.count("0 spill bytes") == 3


def _demo(*args, prelude: str = "") -> subprocess.CompletedProcess:
    """``python -m ge2jit.demo ARGS`` after ``prelude`` (Python run first, in the process)."""
    code = f"{prelude}\nimport runpy, sys\nsys.argv = ['demo', *sys.argv[1:]]\n" \
           "runpy.run_module('ge2jit.demo', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300)


def test_an_architecture_nvrtc_cannot_compile_for_is_one_line_and_2():
    r = _demo("--arch", "sm_99")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("python -m ge2jit.demo: arch: sm_99: not supported by NVRTC ")
    assert "sm_90" in r.stderr   # the ones it can compile for
    r = _demo("--arch", "banana")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "python -m ge2jit.demo: arch: expected a CUDA architecture such as 'sm_80', 'sm_90' or "
        "'sm_90a', got 'banana'"], r.stderr


def test_without_cupy_the_demo_names_the_extras_in_one_line():
    # as after a plain `pip install .`: CuPy (and the NVRTC that comes with it) not there
    r = _demo(prelude="import sys; sys.modules['cupy'] = sys.modules['cupy_backends'] = None")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == [
        'python -m ge2jit.demo: cupy is not installed; install ge2jit with a CUDA extra: pip '
        'install "ge2jit[cuda13]" (CUDA 13 drivers) or "ge2jit[cuda12]" (CUDA 12 drivers)']


@pytest.mark.skipif(gpu_count() > 0, reason="the GPU path runs in the GPU suite's demo step")
def test_demo_says_kernels_stayed_in_memory_when_the_cache_cannot_store_them(tmp_path):
    """A cache directory that is a plain file: no path of a file that does not exist."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env = {**os.environ, "GE2JIT_CACHE_DIR": str(blocker)}
    r = subprocess.run([sys.executable, "-m", "ge2jit.demo", "--arch", "sm_80"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    kernels = [line for line in r.stdout.splitlines() if " regs, " in line]
    assert len(kernels) == 3 and all(line.endswith("-> memory only") for line in kernels)
    assert f"-> {blocker}" not in r.stdout
    assert r.stderr.count("CacheWarning") == 1 and "kept in memory" in r.stderr
