"""Every bad argument of the optimizer steps is refused before a launch, with a message that
names the argument. Runs without a GPU (on stand-in arrays), through the shared checks alone."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.runtime import arrays, checks

from ...fake_cupy import FakeArray, make_module


@pytest.fixture(autouse=True)
def fake_cupy(monkeypatch):
    monkeypatch.setattr(checks, "_cupy", lambda: make_module(0))
    monkeypatch.setattr(arrays, "_cupy_mod", make_module(0))   # stand-ins are CuPy arrays
    monkeypatch.setattr(arrays, "current_device", lambda: 0)


def test_optimizer_steps_refuse_bad_arguments():
    p, z = FakeArray((4, 3)), FakeArray((4, 3))
    with pytest.raises(ValueError, match="step: expected an int >= 1"):
        ge2jit.adam_update(p, p, z, z, step=0)
    with pytest.raises(ValueError, match="betas: expected two floats"):
        ge2jit.adam_update(p, p, z, z, step=1, betas=(0.9,))
    with pytest.raises(ValueError,
                       match=r"grad: expected shape \(4, 3\) \(param's\), got \(2, 3\)"):
        ge2jit.adam_update(p, FakeArray((2, 3)), z, z, step=1)
    with pytest.raises(ValueError, match="param: expected dtype float32, got float16"):
        ge2jit.sgd_update(FakeArray((4, 3), np.float16), p, z, lr=0.1)
    with pytest.raises(ValueError, match="momentum_buffer: expected dtype float32"):
        ge2jit.sgd_update(p, p, FakeArray((4, 3), np.float16), lr=0.1)
    with pytest.raises(TypeError, match="lr: expected a real number"):
        ge2jit.sgd_update(p, p, z, lr="fast")
    with pytest.raises(ValueError, match="momentum_buffer: expected a C-contiguous array"):
        ge2jit.sgd_update(p, p, FakeArray((3, 4)).T, lr=0.1)
