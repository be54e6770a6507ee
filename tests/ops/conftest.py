"""Fixtures the op tests share: a kernel cache for each compile-test module (the GPU memory
pool emptied after a GPU test is ``tests/conftest.py``'s ``free_gpu_memory``)."""

from __future__ import annotations

import pytest

from ge2jit.jit.cache import KernelCache


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A private kernel cache for one module's compile tests."""
    return KernelCache(tmp_path_factory.mktemp("compile-cache"))
