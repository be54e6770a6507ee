"""The softmax tests' stand-in for CuPy: validation runs on ``tests/fake_cupy.py`` arrays and
the launch is replaced by a recorder."""

from __future__ import annotations

import pytest

from ge2jit.ops.softmax import op as softmax_op
from ge2jit.runtime import arrays, checks

from ...fake_cupy import FakeArray, make_module


@pytest.fixture
def fake(monkeypatch):
    """The calls that reached the launch, each as (fw, inputs, out, axis, in dtype, out dtype,
    config, device, result, out given, kind); no kernel runs."""
    module = make_module(0)
    module.empty = lambda shape, dtype: FakeArray(shape, dtype)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(softmax_op, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)     # stand-ins are CuPy arrays
    monkeypatch.setattr(arrays, "current_device", lambda: 0)
    runs = []

    def execute(kind, *args):
        runs.append((*args, kind))
        return args[8], None

    monkeypatch.setattr(softmax_op, "_execute", execute)
    return runs
