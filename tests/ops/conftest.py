"""Fixtures the op tests share: a kernel cache for each compile-test module, and the GPU memory
pool emptied after each GPU test."""

from __future__ import annotations

import pytest

from ge2jit.jit.cache import KernelCache


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A private kernel cache for one module's compile tests."""
    return KernelCache(tmp_path_factory.mktemp("compile-cache"))


@pytest.fixture
def free_gpu_memory():
    """CuPy's memory pool emptied after the test (its arrays are gone by then)."""
    yield
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
