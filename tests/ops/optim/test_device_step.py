"""Adam's step count read from the device (the form a captured CUDA graph replays): its kernels
compile for sm_80 and sm_90 without spills under their own names (the int-step kernels keep
theirs), and a bad counter is refused with a message naming ``step``. No GPU needed."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import ge2jit
from ge2jit.jit.loader import build
from ge2jit.jit.params import Kind
from ge2jit.jit.render import render
from ge2jit.ops import optim
from ge2jit.ops.optim import STEP_TYPES, UpdateSpec
from ge2jit.ops.optim.warmup import adam
from ge2jit.runtime import arrays, checks
from ge2jit.runtime.dtypes import DType

from ...fake_cupy import FakeArray, make_module


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("step_dtype", sorted(STEP_TYPES))
@pytest.mark.parametrize("grad,copy", [(DType.F32, None), (DType.BF16, DType.BF16),
                                       (DType.F16, DType.F32)])
def test_device_step_kernels_compile_without_spills(arch, step_dtype, grad, copy):
    spec = UpdateSpec("adam", grad, copy, step_dtype=step_dtype)
    entry, _ = build(spec, arch)
    assert entry.kernel_name == spec.kernel_name
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (entry.spill_stores,
                                                                entry.spill_loads)
    source = render(spec)
    ctype = STEP_TYPES[step_dtype][0]
    assert re.search(rf"const {ctype}\* __restrict__ step\)", source)
    assert "pow(h1_, t)" in source and "c1_)" not in source.split("extern")[1].split("{", 1)[1]


def test_names_and_parameters():
    assert UpdateSpec("adam", DType.F32).kernel_name == "adam_update_gf32"   # unchanged
    assert UpdateSpec("adam", DType.BF16, DType.BF16).kernel_name == "adam_update_gbf16_copybf16"
    names = {UpdateSpec("adam", DType.BF16, DType.BF16, step_dtype=t).kernel_name
             for t in STEP_TYPES}
    assert names == {"adam_update_gbf16_copybf16_stepi32", "adam_update_gbf16_copybf16_stepi64",
                     "adam_update_gbf16_copybf16_stepf32"}
    host = UpdateSpec("adam", DType.F32).params
    dev = UpdateSpec("adam", DType.F32, step_dtype="int32").params
    assert dev[:-1] == host and dev[-1].name == "step" and dev[-1].kind is Kind.POINTER
    assert "pow(" not in render(UpdateSpec("adam", DType.F32))
    with pytest.raises(ValueError, match="step_dtype: expected None or one of int32, int64, "
                                         "float32 \\(adam only\\), got 'int32' for sgd"):
        UpdateSpec("sgd", DType.F32, step_dtype="int32")
    with pytest.raises(ValueError, match="got 'int16' for adam"):
        UpdateSpec("adam", DType.F32, step_dtype="int16")


def test_warmup_tables_and_inspect_take_the_step_type():
    entry = adam.validate_entry({"step_dtypes": ["host", "int32", "float32"]})
    assert [s.kernel_name for s in adam.expand(entry, "sm_90")] == [
        "adam_update_gf32", "adam_update_gf32_stepi32", "adam_update_gf32_stepf32"]
    assert [s.kernel_name for s in adam.expand(adam.validate_entry({}), "sm_90")] == [
        "adam_update_gf32"]
    with pytest.raises(ValueError, match="^step_dtypes: expected a list of"):
        adam.validate_entry({"step_dtypes": ["int8"]})
    from ge2jit.runtime.registry import get

    op = get("adam_update")
    (spec,) = op.specs_for_config(None, "sm_90", grad_dtype="bfloat16", step_dtype="int64")
    assert spec.kernel_name == "adam_update_gbf16_stepi64"
    with pytest.raises(ValueError, match="^step_dtype: expected one of int32, int64, float32"):
        op.specs_for_config(None, "sm_90", step_dtype="uint8")


@pytest.fixture
def fake_cupy(monkeypatch):
    module = make_module(0)
    module.cuda.Device = lambda i: SimpleNamespace(attributes={"MultiProcessorCount": 4})
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(optim, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)   # stand-ins are CuPy arrays
    monkeypatch.setattr(arrays, "current_device", lambda: 0)


def test_a_device_step_is_checked_with_the_arrays(fake_cupy):
    p, z = FakeArray((4, 3)), FakeArray((4, 3))
    for shape in [(), (1,), (1, 1)]:
        for dtype in ("int32", "int64", "float32"):
            spec = optim._checked("adam", p, p, z, z, None, False, FakeArray(shape, dtype))[0]
            assert spec.step_dtype == dtype and spec.kernel_name.endswith(
                "_step" + STEP_TYPES[dtype][1])
    bad = [(FakeArray((2,), np.int32), ValueError, r"got an array of shape \(2,\)"),
           (FakeArray((), np.float16), ValueError, "got an array of dtype float16"),
           (FakeArray((), np.int32, device=1), ValueError, "step: on device 1, param on 0"),
           (np.ones((), np.int32), TypeError, r"got a numpy.ndarray of shape \(\); move it to "
                                              r"the GPU with cupy.asarray\(step\)"),
           ([1], TypeError, "got a list"),
           (1.0, ValueError, "got 1.0"), (0, ValueError, "got 0"), ("3", ValueError, "got '3'"),
           (True, ValueError, "got True")]
    for step, error, message in bad:
        with pytest.raises(error, match="^step: expected an int >= 1 .*" + message
                           if "device 1" not in message else message):
            ge2jit.adam_update(p, p, z, z, step=step)


def test_the_kernels_scalars_of_a_device_step():
    scalars = optim._adam_scalars(FakeArray((), np.int32), 1e-3, (0.9, 0.999), 1e-8, 0.0)
    assert scalars["c1_"] == scalars["c2_"] == 0.0   # unused: the kernel computes them
    host = optim._adam_scalars(3, 1e-3, (0.9, 0.999), 1e-8, 0.0)
    assert host["c1_"] == 1.0 - 0.9**3
