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
