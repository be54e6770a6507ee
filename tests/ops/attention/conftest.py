"""The attention tests' shared fixture."""

from __future__ import annotations

import pytest

from ge2jit.ops.attention import op
from ge2jit.runtime import arrays, checks, tools

from ...fake_cupy import make_module


@pytest.fixture
def fake_cupy(monkeypatch):
    """CuPy replaced by the stand-in module (device 0 current), for the call checks without a
    GPU; the tuning database holds nothing (its key names a device); the device an sm_80 one
    (a test that wants the Hopper kernel's choice patches ``op.device_arch_number``)."""
    module = make_module(0)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)
    monkeypatch.setattr(arrays, "current_device", lambda: 0)
    monkeypatch.setattr(tools, "tuned_config", lambda name, key: None)
    monkeypatch.setattr(op, "device_arch_number", lambda device_id: 80)


@pytest.fixture
def sm90():
    """Skips a test of the Hopper kernels elsewhere than on an sm_90 GPU."""
    import cupy

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("needs an sm_90 GPU")
