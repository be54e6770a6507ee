"""The compiled launch path's C module on the CPU: signatures, parameter packing, outputs
allocated, overlap refused, misses for what it cannot decide, and the Python path taken and
reported where the module is off or cannot be built. Arrays here are stand-ins with CuPy's
attributes (``data.ptr``, ``data.device_id``, ``shape``, ``strides``, ``dtype``); the GPU
tests run it on real arrays (tests/ops/gemm/test_compiled_launch_gpu.py)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ge2jit.jit import fastlaunch as fl
from ge2jit.jit.params import double, int64, pointer, tensor_maps

ROOT = Path(__file__).resolve().parents[2]


class _Memory:
    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


class Array:
    """An array as CuPy's reads: its pointer under ``data``."""

    def __init__(self, ptr, shape=(4, 4), strides=(16, 4), dtype="float32"):
        self.data = _Memory(ptr)
        self.shape, self.strides, self.dtype = shape, strides, dtype


class _Launcher:
    """What ``fastlaunch.step`` reads of a ``ge2jit.jit.launch.Launcher``."""

    def __init__(self, params):
        from ge2jit.jit.params import layout

        self.name, self.fptr, self.params = "k", 0x1234, tuple(params)
        self.offsets, self.size, _ = layout(self.params)


PARAMS = (pointer("A", "float", const=True), pointer("Y", "float"), *int64("n"),
          *double("alpha_", "fixed_"), *tensor_maps("tma_a", "tma_const"))
BLOB = bytes(range(128))


@pytest.fixture
def compiled():
    if not fl.available():
        pytest.fail(f"the C module should build on this machine: {fl.launch_path()}")
    return fl


def _table(roles="AAVT"):
    return fl.Table("test", roles)


def _program(allocs=(), pairs=(), overlap=None, returns=(1,)):
    values = {"A": fl.Ptr(0), "Y": fl.Ptr(1, 8), "n": -5, "alpha_": fl.Scalar(3),
              "fixed_": 0.25, "tma_a": fl.Map(0, BLOB, 0x1000), "tma_const": bytes(128)}
    st = fl.step(_Launcher(PARAMS), (2, 1, 1), (128, 1, 1), 0, values)
    return fl.program("cupy", [st], allocs, pairs, overlap, lambda: 0, None, returns)


def _unpack(raw: bytes):
    return struct.unpack_from("<QQqdd", raw, 0), raw[40:168], raw[168:296]


def test_a_call_finds_its_program_by_signature(compiled):
    table = _table()
    a, y = Array(0x1000), Array(0x2000)
    assert table.call(a, y, "x", 2.0) is fl.MISS        # no program yet
    assert table.put((a, y, "x", 2.0), _program(), "cupy")
    (raw,) = table.pack(Array(0x1000), Array(0x3000), "x", 3.5)
    words, tma_a, tma_const = _unpack(raw)
    assert words == (0x1000, 0x3008, -5, 3.5, 0.25)
    assert tma_a == BLOB and tma_const == bytes(128)     # the map's own address: unmoved
    assert len(table) == 1 and table.stats()["programs"] == 1


@pytest.mark.parametrize("change", ["shape", "strides", "dtype", "alignment", "value", "type",
                                    "absent", "device"])
def test_what_changes_the_signature(compiled, change):
    table = _table()
    a, y = Array(0x1000), Array(0x2000)
    table.put((a, y, "x", 2.0), _program(), "cupy")
    other = {"shape": (Array(0x1000, shape=(4, 5)), y, "x", 2.0),
             "strides": (Array(0x1000, strides=(4, 16)), y, "x", 2.0),
             "dtype": (Array(0x1000, dtype="float16"), y, "x", 2.0),
             "alignment": (Array(0x1008), y, "x", 2.0),
             "value": (a, y, "z", 2.0),
             "type": (a, y, "x", 2),
             "absent": (a, None, "x", 2.0),
             "device": (a, Array(0x2000), "x", 2.0)}[change]
    if change == "device":
        other[1].data.device_id = 1
    assert table.pack(*other) is fl.MISS
    assert table.pack(Array(0x1000), Array(0x4000), "x", -1.0) is not fl.MISS  # same pattern


def test_a_value_keys_its_type_too(compiled):
    """Equal values of other types (hashed alike) find no program stored for the value: the
    Python path checks them (a flag given as 1 is refused there, not run as True's)."""
    import numpy as np

    table = _table()
    a, y = Array(0x1000), Array(0x2000)
    table.put((a, y, True, 2.0), _program(), "cupy")
    assert table.pack(a, y, True, 2.0) is not fl.MISS
    for other in (1, 1.0, np.True_):
        assert table.pack(a, y, other, 2.0) is fl.MISS, other
    table.put((a, y, 1, 2.0), _program(), "cupy")   # each type its own program
    assert table.pack(a, y, 1, 2.0) is not fl.MISS and len(table) == 2


def test_the_zero_role_keys_whether_a_number_is_zero(compiled):
    table = _table("AAVZ")
    a, y = Array(0x1000), Array(0x2000)
    table.put((a, y, "x", 0.0), _program(), "cupy")
    assert table.pack(a, y, "x", 0.0) is not fl.MISS
    assert table.pack(a, y, "x", 0.5) is fl.MISS


def test_unknown_types_and_unhashable_values_miss(compiled):
    table = _table()
    a, y = Array(0x1000), Array(0x2000)
    table.put((a, y, "x", 2.0), _program(), "cupy")

    class Other(Array):
        pass

    assert table.pack(Other(0x1000), y, "x", 2.0) is None   # a type no call registered
    assert table.key(a, y, ["x"], 2.0) is None                # not hashable: no signature
    assert table.call(a, y, ["x"], 2.0) is fl.MISS


def test_a_scalar_no_double_holds_misses(compiled):
    """The Python path says what is wrong with it."""
    table = _table()
    a, y = Array(0x1000), Array(0x2000)
    table.put((a, y, "x", 2), _program(), "cupy")
    assert table.pack(a, y, "x", 3) is not fl.MISS
    assert table.pack(a, y, "x", 10**400) is fl.MISS


def test_outputs_not_given_are_allocated(compiled):
    made = []

    def alloc(shape):
        made.append(Array(0x9000 + 0x100 * len(made), shape=shape))
        return made[-1]

    table = _table()
    a = Array(0x1000)
    table.put((a, None, "x", 2.0), _program(allocs=[(1, alloc, (4, 4))]), "cupy")
    (raw,) = table.pack(a, None, "x", 2.0)
    words = _unpack(raw)[0]
    assert made[0].shape == (4, 4) and words[1] == 0x9000 + 8
    # a given output is another signature (the allocation is part of the pattern)
    assert table.pack(a, Array(0x5000), "x", 2.0) is fl.MISS


def test_slots_past_the_arguments_hold_what_a_program_allocates(compiled):
    """A program of several launches keeps its intermediates in slots after the call's
    arguments: allocated at each call, read by later launches; a slot never filled reads as
    a pointer of 0."""
    made = []

    def alloc(shape):
        made.append(Array(0x9000 + 0x100 * len(made), shape=shape))
        return made[-1]

    launcher = _Launcher(PARAMS)
    values = {"A": fl.Ptr(0), "Y": fl.Ptr(4), "n": 3, "alpha_": fl.Scalar(3), "fixed_": 0.5,
              "tma_a": fl.Map(0, BLOB, 0x1000), "tma_const": bytes(128)}
    first = fl.step(launcher, (1, 1, 1), (32, 1, 1), 0, values)
    second = fl.step(launcher, (1, 1, 1), (32, 1, 1), 0,
                     {**values, "A": fl.Ptr(4), "Y": fl.Ptr(5)})
    program = fl.program("cupy", [first, second], [(4, alloc, (2, 2))], returns=(4, 5, 1),
                         stream=lambda: 0, slots=6)
    table = _table()
    a = Array(0x1000)
    table.put((a, None, "x", 2.0), program, "cupy")
    one, two = table.pack(a, None, "x", 2.0)
    assert made[0].shape == (2, 2)
    assert _unpack(one)[0][:2] == (0x1000, 0x9000)    # Y: the slot allocated
    assert _unpack(two)[0][:2] == (0x9000, 0)         # the slot read, and one never filled
    with pytest.raises(ValueError, match="slots"):
        fl.program("cupy", [first], slots=fl.MAX_STEPS * 10)


def test_an_output_over_an_input_is_refused(compiled):
    seen = []

    def overlap(ptrs):
        seen.append(ptrs)
        raise ValueError("out: overlaps a")

    table = _table()
    a, y = Array(0x1000), Array(0x2000)
    # out spans [0, 64) of its pointer, a the same: they meet when the pointers are close
    program = _program(pairs=[(1, 0, 64, 0, 0, 64, False)], overlap=overlap)
    table.put((a, y, "x", 2.0), program, "cupy")
    assert table.pack(a, Array(0x1040), "x", 2.0) is not fl.MISS   # adjacent: fine
    with pytest.raises(ValueError, match="out: overlaps a"):
        table.pack(a, Array(0x1010), "x", 2.0)
    assert seen[0][:2] == (0x1000, 0x1010)


def test_in_place_is_allowed_where_the_pair_says_so(compiled):
    table = _table()
    a = Array(0x1000)
    program = _program(pairs=[(1, 0, 64, 0, 0, 64, True)])
    table.put((a, Array(0x2000), "x", 2.0), program, "cupy")
    assert table.pack(a, Array(0x1000), "x", 2.0) is not fl.MISS
    with pytest.raises(RuntimeError, match="overlaps"):
        table.pack(a, Array(0x1010), "x", 2.0)


def test_step_checks_every_parameter_by_name():
    launcher = _Launcher(PARAMS)
    base = {"A": fl.Ptr(0), "Y": fl.Ptr(1), "n": 1, "alpha_": fl.Scalar(3), "fixed_": 1.0,
            "tma_a": fl.Map(0, BLOB, 0), "tma_const": bytes(128)}
    fl.step(launcher, (1, 1, 1), (1, 1, 1), 0, base)
    with pytest.raises(TypeError, match=r"missing \['n'\]"):
        fl.step(launcher, (1, 1, 1), (1, 1, 1), 0, {k: v for k, v in base.items() if k != "n"})
    with pytest.raises(TypeError, match=r"unknown \['m'\]"):
        fl.step(launcher, (1, 1, 1), (1, 1, 1), 0, {**base, "m": 1})
    with pytest.raises(TypeError, match="parameter n .INT64. cannot take"):
        fl.step(launcher, (1, 1, 1), (1, 1, 1), 0, {**base, "n": fl.Scalar(0)})
    with pytest.raises(TypeError, match="parameter tma_a .TENSOR_MAP. cannot take"):
        fl.step(launcher, (1, 1, 1), (1, 1, 1), 0, {**base, "tma_a": b"short"})


def test_a_program_refuses_a_description_out_of_range(compiled):
    module = fl._state["module"]
    good = fl.step(_Launcher(PARAMS), (1, 1, 1), (1, 1, 1), 0,
                   {"A": fl.Ptr(0), "Y": fl.Ptr(1), "n": 1, "alpha_": fl.Scalar(3),
                    "fixed_": 1.0, "tma_a": fl.Map(0, BLOB, 0), "tma_const": bytes(128)})
    fptr, grid, block, smem, size, offsets, ops = good
    with pytest.raises(ValueError, match="out of range"):
        module.Program(1, [(fptr, grid, block, smem, size, offsets,
                            ((size - 4, 0, 0, 0),))], [], [], None, None, None, (0,))
    with pytest.raises(ValueError, match="steps: expected 1 to"):
        module.Program(1, [], [], [], None, None, None, (0,))
    with pytest.raises(ValueError, match="returns"):
        module.Program(1, [good], [], [], None, None, None, ())


def test_tables_are_cleared_with_the_prepared_calls(compiled):
    from ge2jit.runtime.prepared import clear_all

    table = _table()
    table.put((Array(0x1000), Array(0x2000), "x", 2.0), _program(), "cupy")
    assert len(table) == 1
    clear_all()
    assert len(table) == 0


def _report(env: dict, tmp_path) -> dict:
    code = textwrap.dedent("""
        import json
        from ge2jit.jit import fastlaunch
        table = fastlaunch.Table("t", "AV")
        print(json.dumps({**fastlaunch.launch_path(),
                          "miss": table.call(None, 1) is fastlaunch.MISS}))
    """)
    full = {k: v for k, v in os.environ.items() if not k.startswith("GE2JIT_")}
    full.update(PYTHONPATH=str(ROOT), GE2JIT_CACHE_DIR=str(tmp_path / "cache"), **env)
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_the_python_path_when_turned_off(tmp_path):
    report = _report({"GE2JIT_LAUNCH": "python"}, tmp_path)
    assert report == {"path": "python", "module": None, "reason": "GE2JIT_LAUNCH=python",
                      "miss": True}


def test_the_python_path_without_a_compiler_says_why(tmp_path):
    report = _report({"CC": str(tmp_path / "no-such-cc")}, tmp_path)
    if report["path"] == "compiled":   # an install with the module prebuilt needs no compiler
        assert Path(report["module"]).parent == ROOT / "ge2jit" / "jit"
        return
    assert report["path"] == "python" and report["miss"] is True
    assert report["reason"].startswith("no C compiler: ")


def test_the_module_is_built_once_into_the_cache(tmp_path):
    first = _report({}, tmp_path)
    assert first["path"] == "compiled", first
    if Path(first["module"]).parent == ROOT / "ge2jit" / "jit":
        return   # prebuilt in this install
    assert Path(first["module"]).parent == tmp_path / "cache" / "launch"
    again = _report({"CC": str(tmp_path / "no-such-cc")}, tmp_path)   # found, not rebuilt
    assert again["path"] == "compiled" and again["module"] == first["module"]


def test_a_bad_launch_setting_is_one_line(tmp_path):
    from ge2jit.errors import SettingsError
    from ge2jit.settings import Settings

    with pytest.raises(SettingsError, match="^GE2JIT_LAUNCH: expected compiled or python, "
                                            "got 'fast'$"):
        Settings(cache_dirs=(tmp_path,), nvrtc_path=None, launch_text="fast").check()


def test_a_program_called_directly_reads_its_frameworks_arrays_only(compiled):
    """``program(*args)``: for a caller whose own signature fixed the pattern. It refuses an
    argument it cannot read a pointer from, rather than launch on a null pointer."""
    seen = []

    def overlap(ptrs):
        seen.append(ptrs)
        raise ValueError("out: overlaps a")

    program = _program(pairs=[(1, 0, 64, 0, 0, 64, False)], overlap=overlap)
    fl.register(Array, "cupy")

    class Unknown:
        pass

    with pytest.raises(TypeError, match="program argument 1: expected an array of the "
                                        "program's framework, got Unknown"):
        program(Array(0x1000), Unknown(), "x", 2.0)
    with pytest.raises(ValueError, match="out: overlaps a"):
        program(Array(0x1000), Array(0x1020), "x", 2.0)
    assert seen[0][:2] == (0x1000, 0x1020)
    if fl._state["module"].driver() is not None:   # no GPU driver here: up to the launch
        with pytest.raises(RuntimeError, match="CUDA driver could not be loaded"):
            program(Array(0x1000), Array(0x3000), "x", 2.0)


def test_a_stack_without_a_program_is_not_tried_again(compiled, monkeypatch):
    """A stack whose layers give no program (split K, staged operands) is remembered by its
    signature: its later calls do not rebuild anything, until the prepared calls are
    cleared."""
    from types import SimpleNamespace

    from ge2jit.ops.gemm import chain
    from ge2jit.runtime import prepared

    tried = []
    monkeypatch.setattr(chain, "framework_of_type", lambda t: SimpleNamespace(name="cupy"))
    monkeypatch.setattr(chain.op, "prepared_call", lambda *a, **k: tried.append(1))
    from collections import namedtuple

    pattern = namedtuple("Pattern", "names kinds bias_at leaky_slope")(
        ("gelu", "none"), ("z", "none"), (-1, -1), 0.01)   # as torch_ops._Chain
    class Weight(Array):
        T = property(lambda self: self)   # (only pointers and the signature matter here)

    x, w1, w2 = Array(0x1000, (8, 4)), Weight(0x2000, (6, 4)), Weight(0x3000, (4, 6))
    fl.register(Array, "cupy")
    fl.register(Weight, "cupy")
    prepared.clear_all()
    args = (x, [w1, w2], [], pattern, None, True, [x, None], [True, False])
    assert chain.store(*args) is False and tried == [1]
    assert chain.store(*args) is False and tried == [1]           # remembered
    other = Array(0x1000, (16, 4))                                 # another signature
    assert chain.store(other, *args[1:]) is False and tried == [1, 1]
    prepared.clear_all()
    assert chain.store(*args) is False and tried == [1, 1, 1]     # cleared: tried again
