"""How kernels size their grids: ``set_num_sms`` and ``set_persistent`` (no GPU: the device's
attributes are stood in for)."""

from __future__ import annotations

import pytest

import ge2jit
from ge2jit import ArgumentValueError
from ge2jit.jit import device


@pytest.fixture
def gpu(monkeypatch):
    """A device of 132 SMs; the grid settings restored after the test; the plan caches'
    forgetting recorded."""
    monkeypatch.setattr(device, "device_attributes", lambda i: {"MultiProcessorCount": 132})
    forgotten = []
    monkeypatch.setattr(device, "_on_sm_change", [lambda: forgotten.append(1)])
    yield forgotten
    device._sm_limit, device._persistent = None, True


def test_num_sms_caps_every_grid_and_forgets_the_plans(gpu):
    assert device.sm_count(0) == 132 and ge2jit.get_num_sms(0) == 132
    ge2jit.set_num_sms(120)
    assert device.sm_count(0) == 120 and device.persistent_blocks(0, 1000) == 120
    assert device.persistent_blocks(0, 7) == 7
    ge2jit.set_num_sms(120)   # no change: nothing forgotten
    ge2jit.set_num_sms(500)   # more than the device has: the device's
    assert device.sm_count(0) == 132
    ge2jit.set_num_sms(None)
    assert device.sm_count(0) == 132 and len(gpu) == 3


def test_tile_grids_run_a_block_per_unit(gpu):
    ge2jit.set_persistent(False)
    assert device.persistent_blocks(0, 1000) == 1000 and len(gpu) == 1
    ge2jit.set_persistent(False)
    ge2jit.set_persistent(True)
    assert device.persistent_blocks(0, 1000) == 132 and len(gpu) == 2


@pytest.mark.parametrize("call, value, message", [
    (ge2jit.set_num_sms, 0, "count: expected None or a number of SMs >= 1, got 0"),
    (ge2jit.set_num_sms, True, "count: expected None or a number of SMs >= 1, got True"),
    (ge2jit.set_num_sms, 1.5, "count: expected None or a number of SMs >= 1, got 1.5"),
    (ge2jit.set_persistent, 1, "enabled: expected True or False, got 1"),
])
def test_bad_settings_are_one_line(gpu, call, value, message):
    with pytest.raises(ArgumentValueError) as info:
        call(value)
    assert str(info.value) == message and not gpu


def test_the_plan_caches_forget_on_a_change():
    """The GEMM's plans and every op's prepared calls are registered to be forgotten."""
    from ge2jit.ops.gemm import plans
    from ge2jit.runtime import prepared

    assert plans.clear_plans in device._on_sm_change
    assert prepared.clear_all in device._on_sm_change
