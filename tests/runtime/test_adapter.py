"""runtime.adapter.declare (an op's tool functions derived from its check and its choice) and
runtime.tables.Table (a warm-up table declared by its keys), on toy ops and on the softmax,
without a GPU (``tests/fake_cupy.py`` arrays)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from ge2jit.errors import ArgumentValueError
from ge2jit.runtime import arrays, checks
from ge2jit.runtime.adapter import Configs, Planned, declare
from ge2jit.runtime.dtypes import as_dtype
from ge2jit.runtime.tables import Key, Table

from ..fake_cupy import FakeArray, make_module


@pytest.fixture
def fake_arrays(monkeypatch):
    module = make_module(0)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)
    monkeypatch.setattr(arrays, "current_device", lambda: 0)
    return module


# --- declare ----------------------------------------------------------------------------------

class ToyConfig(NamedTuple):
    name: str


def parse(c):
    if isinstance(c, ToyConfig):
        return c
    if c not in ("small", "large"):
        raise ArgumentValueError(f"config: expected 'small' or 'large', got {c!r}")
    return ToyConfig(c)


class ToyCall(NamedTuple):
    x: object
    scale: float
    out: object
    config: ToyConfig | None


def toy(x, scale=2.0, *, out=None, config=None):
    """A toy op's public function (never run here)."""


def toy_op(**kw):
    seen = []

    def check(args):
        seen.append(args)
        if args["x"].ndim != 2:
            raise ArgumentValueError(f"x: expected 2 dimensions, got {args['x'].ndim}")
        return ToyCall(args["x"], float(args["scale"]), args["out"],
                       None if args["config"] is None else parse(args["config"]))

    def choose(call, device_id):
        cfg = call.config or ToyConfig("small" if call.x.size < 100 else "large")
        return Planned((("spec", cfg.name, call.scale),), cfg.name,
                       "pinned" if call.config else "heuristic", (call.x.shape[0], 1, 1),
                       (128, 1, 1), flops=float(call.x.size))

    fields = dict(arrays=("x", "out"), check=check, choose=choose,
                  key=lambda call: {"rows": call.x.shape[0]},
                  configs=Configs(lambda cfg, arch, width=1: [(arch, cfg, width)], parse,
                                  lambda call: [ToyConfig("small"), ToyConfig("large")],
                                  (ToyConfig,)),
                  kernel_prefixes=("toy_",))
    fields.update(kw)
    return declare("toy", toy, **fields), seen


def test_the_tools_functions_come_from_check_and_choose(fake_arrays):
    op, seen = toy_op()
    x = FakeArray((4, 8), np.float32)
    assert op.name == "toy" and op.function is toy and op.kernel_prefixes == ("toy_",)
    assert op.tuning_key(x) == {"rows": 4}
    assert op.candidates(x, 3.0) == ["small", "large"]
    assert op.call_specs("large", x) == [("spec", "large", 2.0)]   # config= pinned
    assert op.call_specs(None, x) == [("spec", "small", 2.0)]   # the call's choice
    args = seen[-1]
    assert args.device == 0 and args["scale"] == 2.0 and args["out"] is None
    assert op.config_types == (ToyConfig,)


def test_a_bad_call_is_refused_by_the_ops_own_check(fake_arrays):
    op, _ = toy_op()
    with pytest.raises(ArgumentValueError, match="x: expected 2 dimensions, got 1"):
        op.tuning_key(FakeArray((4,), np.float32))
    with pytest.raises(ArgumentValueError, match="config: expected 'small' or 'large'"):
        op.call_specs("huge", FakeArray((4, 8), np.float32))
    with pytest.raises(TypeError, match="toy"):
        op.tuning_key(FakeArray((4, 8), np.float32), 1.0, 2.0)


def test_an_argument_of_several_arrays_is_split_into_named_array_arguments(fake_arrays):
    def pair(out):
        if out is None:
            return None, None
        if not isinstance(out, tuple) or len(out) != 2:
            raise ArgumentValueError(f"out: expected None or a pair, got {out!r}")
        return out

    op, seen = toy_op(parts={"out": (pair, ("y", "z"))})
    x, y, z = (FakeArray((4, 8), np.float32) for _ in range(3))
    op.tuning_key(x, out=(y, z))
    args = seen[-1]
    # the parts as array arguments of their own (viewed like x), the argument kept as it came
    assert args["y"].shape == (4, 8) and args["z"].shape == (4, 8) and args["out"] == (y, z)
    op.tuning_key(x)
    assert seen[-1]["y"] is None and seen[-1]["z"] is None
    with pytest.raises(ArgumentValueError, match="out: expected None or a pair"):
        op.tuning_key(x, out=y)


def test_specs_for_config_parses_and_normalizes_the_arch():
    op, _ = toy_op()
    assert op.specs_for_config("large", "sm_90a", width=4) == [
        ("sm_90a", ToyConfig("large"), 4)]
    assert op.specs_for_config(None, "90") == [("sm_90", None, 1)]
    with pytest.raises(ArgumentValueError, match="config: expected 'small' or 'large'"):
        op.specs_for_config("huge", "sm_90")


def test_an_op_without_configs():
    op, _ = toy_op(key=None, configs=Configs(lambda cfg, arch: [(arch, cfg)]))
    assert op.candidates is None and op.tuning_key is None and op.config_types == ()
    assert op.specs_for_config(None, "sm_80") == [("sm_80", None)]
    with pytest.raises(ArgumentValueError, match="toy's kernels are not named by configs"):
        op.specs_for_config("small", "sm_80")
    with pytest.raises(ArgumentValueError, match="key: toy has no configs to tune"):
        toy_op(configs=None)


def test_softmax_is_declared_so(fake_arrays, monkeypatch):
    import ge2jit
    from ge2jit.ops.softmax import op as softmax_op
    from ge2jit.ops.softmax import registration
    from ge2jit.ops.softmax.spec import candidates

    monkeypatch.setattr(softmax_op, "sm_count", lambda device_id: 132)
    monkeypatch.setattr(softmax_op, "tuned_config", lambda name, key: None)
    x = FakeArray((64, 1000), np.float32)
    op = registration.SOFTMAX
    assert op.function is ge2jit.softmax
    assert op.tuning_key(x) == softmax_op.tuning_key(x, -1)
    f32 = as_dtype("float32")
    assert op.candidates(x) == [c.name for c in candidates(1000, f32, f32)]
    assert len(op.candidates(x)) > 1
    (spec,) = op.call_specs("loop_256", x)
    assert spec.config.name == "loop_256"
    (heuristic,) = op.call_specs(None, x)
    assert heuristic.kernel_name.startswith("softmax_")
    with pytest.raises(ArgumentValueError, match="axis"):
        op.tuning_key(x, 5)


# --- Table ------------------------------------------------------------------------------------

KEYS = {"dtypes": Key("a list of 'a' or 'b'", ["a"], ("a", "b")),
        "flags": Key("a list of booleans", [False], (False, True)),
        "lengths": Key("a non-empty list of lengths (integers >= 1)", sizes=1000)}


def kernels(v, config, *, arch, sms):
    return [(v.dtypes, v.flags, v.lengths, config, sms)] + ([("shared",)] if v.flags else [])


def test_a_table_checks_its_keys_with_defaults():
    table = Table(KEYS, kernels, configs=(parse, lambda: [ToyConfig("small"),
                                                          ToyConfig("large")]),
                  config_example="small")
    assert table.validate_entry({"lengths": [3]}) == {
        "dtypes": ["a"], "flags": [False], "lengths": [3], "configs": "heuristic"}
    for entry, message in [
            ({"lengths": [3], "sizes": [1]}, "sizes: unknown key; accepted keys: dtypes, flags, "
                                             "lengths, configs"),
            ({}, r"lengths: expected a non-empty list of lengths \(integers >= 1\), got None"),
            ({"lengths": [0]}, "lengths: expected"),
            ({"lengths": [1001]}, "lengths: expected"),
            ({"lengths": [3], "dtypes": ["c"]}, r"dtypes: expected a list of 'a' or 'b', got "
                                                r"\['c'\]"),
            ({"lengths": [3], "flags": [1]}, "flags: expected a list of booleans"),
            ({"lengths": [3], "configs": "most"}, "configs: expected 'heuristic', 'all' or a "
                                                  "list of config names such as 'small'"),
            ({"lengths": [3], "configs": ["huge"]}, "config: expected 'small' or 'large'")]:
        with pytest.raises(ArgumentValueError, match=message):
            table.validate_entry(entry)


def test_a_table_expands_every_combination_and_config_once():
    table = Table(KEYS, kernels, configs=(parse, lambda: [ToyConfig("small"),
                                                          ToyConfig("large")]))
    entry = table.validate_entry({"dtypes": ["a", "b"], "flags": [False, True],
                                  "lengths": [3]})
    specs = table.expand(entry, "sm_90", sms=8)
    assert len(specs) == 4 + 1 and specs.count(("shared",)) == 1
    assert {s[3] for s in specs if len(s) > 1} == {None}
    entry = table.validate_entry({"lengths": [3, 5], "configs": "all"})
    assert [s[2:4] for s in table.expand(entry, "sm_80")] == [
        (3, ToyConfig("small")), (3, ToyConfig("large")), (5, ToyConfig("small")),
        (5, ToyConfig("large"))]
    entry = table.validate_entry({"lengths": [3], "configs": ["large"]})
    assert table.expand(entry, "sm_80") == [("a", False, 3, ToyConfig("large"), 132)]
    assert table.tuned_entries([], "sm_90") == []


def test_a_table_without_configs_and_with_a_least_arch():
    table = Table(KEYS, kernels, min_arch=89)
    entry = table.validate_entry({"lengths": [7]})
    assert "configs" not in entry
    with pytest.raises(ArgumentValueError, match="configs: unknown key"):
        table.validate_entry({"lengths": [7], "configs": "all"})
    assert table.expand(entry, "sm_80") == []
    assert table.expand(entry, "sm_90") == [("a", False, 7, None, 132)]
