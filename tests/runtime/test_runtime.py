"""The op runtime's pieces that need no GPU: which framework a call's arrays belong to, the
prepared-call tables and the per-call overlap guard. (On the GPU: test_arrays_gpu.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ge2jit
from ge2jit.runtime import arrays
from ge2jit.runtime.prepared import OverlapGuard, PreparedCalls, check_spans, clear_all

from ..fake_cupy import FakeArray, make_module


@pytest.fixture(autouse=True)
def fake_cupy(monkeypatch):
    monkeypatch.setattr(arrays, "_cupy_mod", make_module(0))
    monkeypatch.setattr(arrays, "current_device", lambda: 0)


class Interface:
    """An object that only has ``__cuda_array_interface__``."""

    __cuda_array_interface__ = {"shape": (2, 2), "typestr": "<f4", "data": (1 << 20, False),
                                "version": 3, "strides": None}


def test_cupy_arrays_and_absent_arguments():
    a = FakeArray((2, 3))
    fw, out = arrays.framework_of({"a": a, "bias": None})
    assert fw is arrays.CUPY and out == {"a": a, "bias": None}
    assert arrays.framework_of_type(FakeArray) is arrays.CUPY


def test_interface_objects_are_read_through_cupy(monkeypatch):
    module = make_module(0)
    module.asarray = lambda x: FakeArray(x.__cuda_array_interface__["shape"])
    monkeypatch.setattr(arrays, "_cupy_mod", module)
    fw, out = arrays.framework_of({"a": Interface(), "b": FakeArray((2, 2))})
    assert fw is arrays.CUPY and isinstance(out["a"], FakeArray)
    assert arrays.framework_of_type(Interface) is None   # checked on every call


@pytest.mark.parametrize("x, got", [(np.ones((2, 2)), "numpy.ndarray of shape (2, 2); move it "
                                                      "to the GPU with cupy.asarray(b)"),
                                    ([1.0], "got list"), (3, "got int")])
def test_other_objects_are_one_line_type_errors(x, got):
    with pytest.raises(ge2jit.ArgumentTypeError) as info:
        arrays.framework_of({"a": FakeArray((2, 2)), "b": x})
    msg = str(info.value)
    assert msg.startswith("b: expected a GPU array (cupy.ndarray, torch.Tensor") and got in msg
    assert "\n" not in msg


def test_torch_is_not_imported_for_cupy_arrays():
    code = ("import sys, ge2jit; from ge2jit.runtime import arrays; "
            "from tests.fake_cupy import FakeArray, make_module; "
            "arrays._cupy_mod = make_module(0); arrays.framework_of({'a': FakeArray((2, 2))}); "
            "print('torch' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)


def test_prepared_calls_are_bounded_and_cleared():
    table = PreparedCalls("test", limit=3)
    for i in range(3):
        table.put(i, str(i))
    assert table.get(2) == "2" and len(table) == 3
    table.put(3, "3")   # full: cleared, then stored
    assert len(table) == 1 and table.get(0) is None and table.get(3) == "3"
    clear_all()
    assert len(table) == 0


def test_overlap_guard_uses_spans_fixed_by_the_signature():
    x = FakeArray((4, 4))          # 64 bytes
    out = FakeArray((4, 4))
    guard = OverlapGuard(("x", "out"), (x, out), (1,))
    assert guard
    guard((1000, 1064))            # touching, not overlapping
    guard((1064, 1000))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x; pass a separate array"):
        guard((1000, 1063))
    assert not OverlapGuard(("x", "out"), (x, None), (1,))   # no output given: nothing to do


def test_check_spans_names_the_first_overlapping_pair():
    check_spans(("a", "b", "out"), [(0, 10), (10, 20), (20, 30)], (2,))
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps b"):
        check_spans(("a", "b", "out"), [(0, 10), (10, 20), (19, 30)], (2,))


def test_overlap_guard_allows_in_place_only_where_asked_and_layouts_match():
    x = FakeArray((4, 4))
    same = OverlapGuard(("x", "out"), (x, FakeArray((4, 4))), (1,), in_place={(1, 0)})
    same((1000, 1000))             # out is x: in place
    with pytest.raises(ge2jit.ArgumentValueError,
                       match=r"^out: overlaps x without being x; pass out=x \(in place\) or a "
                             r"separate array \(out's bytes \[0x3ec, 0x42c\) meet x's \[0x3e8, "
                             r"0x428\): outputs are kept apart from inputs by their byte "
                             r"ranges\)$"):
        same((1000, 1004))
    other_layout = OverlapGuard(("x", "out"), (x, FakeArray((4, 4)).T), (1,), in_place={(1, 0)})
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        other_layout((1000, 1000))
    not_asked = OverlapGuard(("x", "out"), (x, FakeArray((4, 4))), (1,))
    with pytest.raises(ge2jit.ArgumentValueError, match="^out: overlaps x; pass a separate"):
        not_asked((1000, 1000))


# --- arrays on the CPU: refused before the device is asked for, on every call --------------

def _op_calls(x) -> dict:
    """A call of every registered op with ``x`` for each array argument (a 4 x 8 array)."""
    return {
        "gemm_bias_act": lambda: ge2jit.gemm_bias_act(x, x.T),
        "gemm_bias_act_backward": lambda: ge2jit.gemm_bias_act_backward(x, x, x),
        "gemm_gated": lambda: ge2jit.gemm_gated(x, x.T),
        "gemm_gated_backward": lambda: ge2jit.gemm_gated_backward(x, x, x, z=x),
        "adam_update": lambda: ge2jit.adam_update(x, x, x, x, step=1),
        "sgd_update": lambda: ge2jit.sgd_update(x, x, x, lr=0.1),
        "softmax": lambda: ge2jit.softmax(x),
        "softmax_backward": lambda: ge2jit.softmax_backward(x, x),
        "cross_entropy": lambda: ge2jit.cross_entropy(x, x),
        "rms_norm": lambda: ge2jit.rms_norm(x, x),
        "layer_norm": lambda: ge2jit.layer_norm(x, x, x),
        "rms_norm_backward": lambda: ge2jit.rms_norm_backward(x, x, x, x),
        "layer_norm_backward": lambda: ge2jit.layer_norm_backward(x, x, x, x, x),
        "quantize_fp8": lambda: ge2jit.quantize_fp8(x),
        "rope": lambda: ge2jit.rope(x, x, x, x),
        "rope_backward": lambda: ge2jit.rope_backward(x, x, x, x),
        "attention": lambda: ge2jit.attention(x, x, x),
        "attention_backward": lambda: ge2jit.attention_backward(x, x, x, x, x, x),
    }


def test_the_cpu_array_calls_cover_every_registered_op():
    from ge2jit.runtime import registry

    assert set(_op_calls(None)) == {op.name for op in registry.ops()}


class CpuTensor:
    """What the cached path reads of a PyTorch tensor on the CPU (``TorchFramework.key``)."""

    shape, dtype, device = (4, 8), np.float32, "cpu"
    T = property(lambda self: self)

    def stride(self):
        return (8, 1)

    def get_device(self):
        return -1

    def data_ptr(self):
        return 0


def test_a_cpu_tensor_is_refused_before_the_device_is_asked_for(monkeypatch):
    # A type the cached path knows (as torch.Tensor is after one call on tensors) whose
    # instance is on the CPU: its key, not the current device, ends the signature.
    monkeypatch.setitem(arrays._by_type, CpuTensor, object.__new__(arrays.TorchFramework))

    def no_device():
        raise AssertionError("the current device was asked for")

    monkeypatch.setattr(arrays, "current_device", no_device)
    for name, call in _op_calls(CpuTensor()).items():
        for _ in range(2):   # the first call, then one that could find a prepared call
            with pytest.raises(ge2jit.ArgumentTypeError) as info:
                call()
            assert "\n" not in str(info.value), name


_CPU_CALLS = """
import sys
import numpy as np
import ge2jit
from tests.runtime.test_runtime import _op_calls
if sys.argv[1] == "torch":
    import torch
    x = torch.ones(4, 8)
else:
    x = np.ones((4, 8), np.float32)
for name, call in list(_op_calls(x).items()) * 2:
    try:
        call()
    except ge2jit.ArgumentTypeError as e:
        print(name, str(e).replace(chr(10), "|"))
"""


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_every_op_refuses_cpu_arrays_in_one_line_without_a_device(kind):
    # In a process that can see no GPU (CUDA_VISIBLE_DEVICES=""), so that asking for the
    # device would fail here as on a machine without one: every call is an ArgumentTypeError
    # naming the array, the second of each too (where a prepared call could be looked up).
    if kind == "torch":
        pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", _CPU_CALLS, kind], capture_output=True,
                       text=True, cwd=root, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 * len(_op_calls(None)), r.stdout + r.stderr
    where = "numpy.ndarray" if kind == "numpy" else "a tensor on a CUDA device, got one on cpu"
    for line in lines:
        name, msg = line.split(" ", 1)
        assert where in msg and msg.split(":")[0] in ("a", "gy", "x", "dy", "logits",
                                                      "param", "q", "do"), line


def test_prepared_calls_key_the_other_arguments_types():
    """1, 1.0 and True are equal and hash alike; a call with causal=1 must not find the call
    prepared for causal=True (only True passes a flag's check, on the first call's path)."""
    table = PreparedCalls("test")
    firsts = []

    def first(fw, device_id, views, native):
        firsts.append(len(firsts))
        return len(firsts), (lambda *a: "prepared")

    a = FakeArray((2, 2))
    assert table.run({"a": a}, (True,), first) == 1
    assert table.run({"a": a}, (True,), first) == "prepared"
    assert table.run({"a": a}, (1,), first) == 2          # not True's
    assert table.run({"a": a}, (1.0,), first) == 3
    assert table.run({"a": a}, (1,), first) == "prepared" and len(firsts) == 3
