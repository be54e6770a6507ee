"""What the GPU tests of the training examples share (``tests/test_train_gpt_block.py``,
``tests/test_train_llama_block.py``, ``tests/test_train_gpt_block_distributed.py``): PyTorch
and the GPU marks, loading an example as a module, exact float32 matmuls,
comparing losses, the lines a training run prints, the one line without a GPU. Imports torch
only when called."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def torch_on_gpu():
    """PyTorch and the marks (``pytestmark``) of a module whose tests need it with a CUDA
    GPU; skips the module without PyTorch or CuPy."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    return torch, [pytest.mark.gpu,
                   pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="needs a CUDA GPU (PyTorch sees none)")]


def load_example(name: str):
    """``examples/<name>.py`` as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 matmuls exact (ge2jit's "ieee", cuBLAS without TF32), whatever ran before (an
    autouse fixture of the modules that import it)."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def close(got, want, rtol):
    """Two lists of losses equal within ``rtol``."""
    import torch

    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64),
                               torch.tensor(want, dtype=torch.float64), rtol=rtol, atol=0.0)


def check_printed(lines: list) -> None:
    """A training run's last two lines: the final loss and accuracy, the step time."""
    assert re.fullmatch(r"final loss \d+\.\d{4}, copy accuracy \d+\.\d%", lines[-2]), lines
    assert re.fullmatch(r"step time: \d+\.\d{3} ms \(median of the last half of the steps\)",
                        lines[-1]), lines


def check_without_gpu(example) -> None:
    """The example, run as a script where PyTorch sees no GPU, prints its one line (NO_GPU)
    and exits with status 2."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",   # PyTorch then sees no GPU
           "PYTHONPATH": str(EXAMPLES.parent)}        # this checkout's ge2jit
    r = subprocess.run([sys.executable, example.__file__, "--steps", "1"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.splitlines() == [example.NO_GPU], r.stderr
