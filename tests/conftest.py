"""Test set-up: a private kernel cache, and the `gpu` marker that skips without a GPU."""

from __future__ import annotations

import os
import tempfile

# GE2JIT_TEST_GPUS=n spreads pytest-xdist's workers over n GPUs (worker i sees GPU i % n alone,
# set before CUDA starts): a machine of several GPUs runs the one-GPU suite on all of them.
# The tests of several GPUs run without it.
if os.environ.get("GE2JIT_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER", "").startswith(
        "gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(os.environ["PYTEST_XDIST_WORKER"][2:])
                                             % int(os.environ["GE2JIT_TEST_GPUS"]))

# Tests never touch the user's own cache; the GPU suite shares one cache for the whole session.
os.environ.setdefault("GE2JIT_CACHE_DIR", tempfile.mkdtemp(prefix="ge2jit-test-cache-"))

import pytest  # noqa: E402

from ge2jit.jit.device import gpu_count  # noqa: E402

HAVE_GPU = gpu_count() > 0

if os.environ.get("GE2JIT_LAYOUT_NO_POOL") and HAVE_GPU:
    # each array its own cudaMalloc, so that compute-sanitizer's memcheck sees an access past
    # its end (in a pool's block it would land in a neighbour's memory, unseen); PyTorch's
    # tensors likewise with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (bench/sanitize.sh sets both)
    import cupy

    cupy.cuda.set_allocator(None)


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- fixtures of the PyTorch tests (torch imported when one is used) ----------------------

@pytest.fixture(scope="module")
def gt():
    """``ge2jit.torch``."""
    import ge2jit.torch as gt

    return gt


@pytest.fixture
def matmul_precision():
    """``torch.set_float32_matmul_precision``, the setting restored after the test."""
    import torch

    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.fixture
def free_gpu_memory():
    """CuPy's memory pool emptied after the test (its arrays are gone by then)."""
    yield
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
