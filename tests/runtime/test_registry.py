"""The op registry and the tools built on it, without a GPU: look-ups and their errors, the
warm-up's tables, inspect by config, cache-list labels, and the generic tuner (on a toy op whose
calls and timings are stand-ins)."""

from __future__ import annotations

import json
import textwrap

import pytest

import ge2jit
from ge2jit.errors import ArgumentTypeError, ArgumentValueError, KernelLaunchError
from ge2jit.jit.loader import LoadedKernel, build
from ge2jit.ops.optim import UpdateSpec
from ge2jit.runtime import registry, tools
from ge2jit.runtime.dtypes import DType
from ge2jit.runtime.registry import ConfigChoice, Explanation, Op

from ..test_cli import fake_entries

TOY_SPEC = UpdateSpec("adam", DType.BF16)


class ToyTable:
    """A warm-up table of the toy op: ``copies`` (a list of booleans)."""

    def validate_entry(self, entry: dict) -> dict:
        for key in entry:
            if key != "copies":
                raise ArgumentValueError(f"{key}: unknown key; accepted keys: copies")
        return {"copies": entry.get("copies", [False])}

    def expand(self, entry: dict, arch: str, *, sms=None, tuned=()) -> list:
        return [UpdateSpec("adam", DType.BF16, DType.BF16 if c else None)
                for c in entry["copies"]]

    def tuned_entries(self, records, arch: str) -> list:
        return []


def toy(x, *, config=None):
    """The toy op's function: records its calls."""
    toy.calls.append(config)


toy.calls = []


def _toy_plan(x, *, config=None) -> Explanation:
    entry, _ = build(TOY_SPEC, "sm_80")
    kernel = LoadedKernel(TOY_SPEC, 0, entry, None, None)
    choice = ConfigChoice(config, "pinned") if config else ConfigChoice("fast")
    return Explanation(choice, (kernel,), (4, 1, 1), (256, 1, 1), 0, flops=2e9)


def _toy_specs(config, arch, *, copy=False):
    if config not in ("fast", "slow", None):
        raise ArgumentValueError(f"config: expected 'fast' or 'slow', got {config!r}")
    return (UpdateSpec("adam", DType.BF16, DType.BF16 if copy else None), TOY_SPEC)


cleared = []
TOY = Op(name="toy", function=toy, warmup={"toy_table": ToyTable()}, plan=_toy_plan,
         candidates=lambda x: ["slow", "fast", "broken"], tuning_key=lambda x: {"n": x},
         call_specs=lambda config, x: [UpdateSpec("sgd", DType.F16)] if config == "broken"
         else [TOY_SPEC],
         specs_for_config=_toy_specs, kernel_prefixes=("toy_",),
         clear_plans=lambda: cleared.append(True))


@pytest.fixture
def with_toy(monkeypatch):
    """The registry as it is, plus the toy op, for one test."""
    monkeypatch.setattr(registry, "_ops", dict(registry._ops))
    monkeypatch.setattr(registry, "_default", list(registry._default))
    registry.register(TOY)
    toy.calls.clear()
    cleared.clear()
    return TOY


# --- the registry ----------------------------------------------------------------------------


def test_the_ops_are_registered_once_each_gemm_the_default():
    names = [op.name for op in registry.ops()]
    assert names[:2] == ["gemm_bias_act", "gemm_bias_act_backward"]
    assert len(set(names)) == len(names)
    assert {"adam_update", "sgd_update", "softmax", "rms_norm", "layer_norm"} <= set(names)
    assert registry.default_op().name == "gemm_bias_act"
    tables = registry.warmup_tables()
    assert set(tables) >= set(names) and len(tables) == sum(len(o.warmup) for o in registry.ops())


@pytest.mark.parametrize("how", ["name", "function", "op"])
def test_get_by_name_function_or_op(how):
    op = registry.get("adam_update")
    key = {"name": "adam_update", "function": ge2jit.adam_update, "op": op}[how]
    assert registry.get(key) is op and registry.find(key) is op


@pytest.mark.parametrize("unknown", ["group_norm", len, 3])
def test_an_unknown_op_is_one_line_listing_the_registered(unknown):
    assert registry.find(unknown) is None
    with pytest.raises(ArgumentValueError) as e:
        registry.get(unknown)
    text = str(e.value)
    assert text.startswith("op: expected a registered op, one of gemm_bias_act, ") and "\n" \
        not in text
    assert all(op.name in text for op in registry.ops())
    assert text.endswith(f"got {getattr(unknown, '__name__', unknown)!r}")


def test_register_refuses_a_taken_name_table_or_default(with_toy):
    registry.register(TOY)   # the same op again: nothing to do
    with pytest.raises(ArgumentValueError, match="op: 'toy' is registered already"):
        registry.register(Op("toy", toy))
    with pytest.raises(ArgumentValueError,
                       match="^op: the warm-up table 'toy_table' of 'toy2' is taken already$"):
        registry.register(Op("toy2", toy, warmup={"toy_table": ToyTable()}))
    with pytest.raises(ArgumentValueError, match="warm-up table 'archs' of 'toy2' is taken"):
        registry.register(Op("toy2", toy, warmup={"archs": ToyTable()}))
    with pytest.raises(ArgumentValueError, match="'gemm_bias_act' is already"):
        registry.register(Op("toy2", toy), default=True)
    with pytest.raises(ArgumentTypeError, match="op: expected an Op, got function"):
        registry.register(toy)
    assert "toy2" not in [op.name for op in registry.ops()]


def test_the_toy_op_is_gone_after_its_test():
    assert registry.find("toy") is None and "toy_table" not in registry.warmup_tables()


def test_labels_take_the_longest_prefix(with_toy):
    assert registry.label("gemm_f32_rr_64x64x8_4x4_relu") == "gemm_bias_act"
    assert registry.label("gemm_splitk_reduce_f32_none_v4") == "gemm_bias_act"
    assert registry.label("transpose_bf16") == "gemm_bias_act"
    assert registry.label("gemm_dz_relu_zf32_gf32_none") == "gemm_bias_act_backward"
    assert registry.label("sgd_nesterov_update_gf16") == "sgd_update"
    assert registry.label("toy_kernel") == "toy"
    assert registry.label("softmax_f32") == "softmax"
    assert registry.label("group_norm_f32") is None


def test_bind_names_the_arguments_and_refuses_what_the_function_does_not_take():
    x = registry.bind(ge2jit.sgd_update, (1, 2, 3), {"lr": 0.1})
    assert x["param"] == 1 and x["momentum_buffer"] == 3 and x["nesterov"] is False
    with pytest.raises(ArgumentTypeError, match="^sgd_update: got an unexpected keyword"):
        registry.bind(ge2jit.sgd_update, (1, 2, 3), {"lr": 0.1, "speed": 2})


# --- the tools' dispatch -----------------------------------------------------------------------


@pytest.mark.parametrize("tool", [ge2jit.explain, ge2jit.tune, ge2jit.benchmark_configs])
def test_tools_refuse_an_unknown_op_name(tool):
    with pytest.raises(ArgumentValueError, match="^op: expected a registered op, one of"):
        tool("group_norm", None)


def test_tools_say_what_an_op_does_not_register():
    with pytest.raises(ArgumentValueError, match="^op: gemm_bias_act_backward registers no "
                                                 "plan to explain$"):
        ge2jit.explain(ge2jit.gemm_bias_act_backward, None, None, None)
    with pytest.raises(ArgumentValueError, match="^op: adam_update has no configs to tune$"):
        ge2jit.tune("adam_update", None, None, None, None, step=1)
    with pytest.raises(ArgumentValueError, match="^op: sgd_update has no configs to compare$"):
        ge2jit.benchmark_configs(ge2jit.sgd_update, None, None, None, lr=0.1)


def test_explain_of_an_op_is_its_plan(with_toy):
    for op in (toy, "toy", TOY):
        info = ge2jit.explain(op, 3)
        assert info.config == "fast" and info.reason == "heuristic"
        assert info.kernel_names == (TOY_SPEC.kernel_name,) and info.specs == (TOY_SPEC,)
        assert info.registers[0] > 0 and info.spill_bytes == (0,)
    lines = str(ge2jit.explain(toy, 3, config="slow")).splitlines()
    assert lines[0] == "config slow (pinned)"
    assert lines[1].startswith(f"  kernel {TOY_SPEC.kernel_name}: ") and "spill bytes" in lines[1]
    assert lines[2] == "  grid (4, 1, 1), block (256, 1, 1), 0 B shared"


# --- the warm-up --------------------------------------------------------------------------------


def _load(tmp_path, text: str):
    from ge2jit.precompile import load

    path = tmp_path / "w.toml"
    path.write_text(textwrap.dedent(text))
    return load(path, archs=["sm_80"])


def test_the_warmup_file_takes_every_registered_table(with_toy, tmp_path):
    from ge2jit.precompile import WarmupConfigError, top_keys

    assert top_keys() == ("archs", *registry.warmup_tables())
    plan = _load(tmp_path, """
        [[adam_update]]
        grad_dtypes = ["float16"]
        [[sgd_update]]
        nesterov = [true]
        [[toy_table]]
        copies = [true, false]
    """)
    assert [spec.kernel_name for spec, _ in plan.jobs] == [
        "adam_update_gf16", "sgd_nesterov_update_gf32", "adam_update_gbf16_copybf16",
        "adam_update_gbf16"]
    assert {arch for _, arch in plan.jobs} == {"sm_80"}
    with pytest.raises(WarmupConfigError) as e:
        _load(tmp_path, "[[group_norm]]\n")
    text = str(e.value)
    assert text.endswith(f"w.toml:1: group_norm: unknown key; accepted: "
                         f"{', '.join(top_keys())}")
    assert "toy_table" in text and "gemm_bias_act_backward" in text and "\n" not in text
    with pytest.raises(WarmupConfigError, match=r"w.toml:3: \[\[toy_table\]\] #1: speed: "
                                                "unknown key; accepted keys: copies"):
        _load(tmp_path, "\n[[toy_table]]\nspeed = 1\n")


def test_precompile_still_offers_its_tables_by_their_old_names(with_toy):
    from ge2jit import precompile

    assert precompile.OPS["toy_table"] is TOY.warmup["toy_table"]
    assert precompile.TOP_KEYS[0] == "archs" and "toy_table" in precompile.TOP_KEYS


# --- inspect by config ------------------------------------------------------------------------


@pytest.mark.parametrize("op", [ge2jit.gemm_bias_act, "gemm_bias_act"])
def test_inspect_a_config_of_the_default_op_named_or_not(op):
    named = ge2jit.inspect(op, "64x64x8_4x4", arch="sm_80", act="relu")
    plain = ge2jit.inspect("64x64x8_4x4", arch="sm_80", act="relu")
    assert named.kernel_name == plain.kernel_name and "relu" in named.kernel_name
    assert named.extra == plain.extra == {"config": "64x64x8_4x4"}


@pytest.mark.parametrize("op, kwargs, name", [
    (ge2jit.adam_update, {"grad_dtype": "bfloat16", "copy_dtype": "bfloat16"},
     "adam_update_gbf16_copybf16"),
    ("adam_update", {}, "adam_update_gf32"),
    ("sgd_update", {"nesterov": True, "grad_dtype": "float16"}, "sgd_nesterov_update_gf16"),
])
def test_inspect_an_optimizer_step_without_gpu(op, kwargs, name):
    info = ge2jit.inspect(op, arch="sm_90", **kwargs)
    assert info.kernel_name == name and info.arch == "sm_90"
    assert info.registers > 0 and info.spill_bytes == 0 and info.extra == {}


@pytest.mark.parametrize("args, kwargs, start", [
    (("adam_update", "fast"), {}, "config: adam_update has no configs, got 'fast'"),
    (("adam_update",), {"grad_dtype": "int8"},
     "grad_dtype: expected one of float32, float16, bfloat16, got 'int8'"),
    (("sgd_update",), {"copy_dtype": "float64"},
     "copy_dtype: expected one of none, float32, float16, bfloat16, got 'float64'"),
    (("adam_update",), {"nesterov": True}, "UpdateSpec: nesterov applies to sgd"),
    (("gemm_bias_act_backward",), {}, "op: gemm_bias_act_backward cannot be inspected without "
                                      "arrays"),
])
def test_inspect_by_config_errors_are_one_line(args, kwargs, start):
    with pytest.raises(ArgumentValueError) as e:
        ge2jit.inspect(*args, arch="sm_90", **kwargs)
    assert str(e.value).startswith(start) and "\n" not in str(e.value), str(e.value)


def test_inspect_a_config_of_a_registered_op(with_toy):
    info = ge2jit.inspect(toy, "slow", arch="sm_80", copy=True)
    assert info.kernel_name == "adam_update_gbf16_copybf16"
    assert info.extra == {"config": "slow", "also launches": TOY_SPEC.kernel_name}
    assert ge2jit.inspect("toy", arch="sm_80").kernel_name == "adam_update_gbf16"
    with pytest.raises(ArgumentValueError, match="^config: expected 'fast' or 'slow'"):
        ge2jit.inspect(TOY, "quick", arch="sm_80")


# --- ge2jit cache list ------------------------------------------------------------------------


def test_cache_list_labels_each_kernel_with_its_op(with_toy, tmp_path, monkeypatch, capsys):
    from ge2jit import cli
    from ge2jit.jit import cache

    monkeypatch.setattr(cache, "_default", cache.KernelCache(tmp_path / "c"))
    names = {"gemm_f32_rr_64x64x8_4x4_relu": "gemm_bias_act",
             "gemm_dbias_columns_f32": "gemm_bias_act_backward",
             "adam_update_gf32": "adam_update", "toy_kernel": "toy", "mystery_kernel": None}
    fake_entries(tmp_path / "c", list(names))
    assert cli.main(["cache", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["kernel"]: row["op"] for row in rows} == names
    assert cli.main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["kernel", "op", "arch"]
    for line in lines[1:]:
        kernel, op, arch = line.split()[:3]
        assert op == (names[kernel] or "?") and arch == "sm_80"
    assert cli.main(["cache", "list", "--op", "toy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("toy_kernel ")
    assert cli.main(["cache", "list", "--json", "--op", "adam_update"]) == 0
    assert [r["kernel"] for r in json.loads(capsys.readouterr().out)] == ["adam_update_gf32"]
    assert cli.main(["cache", "list", "--op", "group_norm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ge2jit cache list: op: expected a registered "
                                               "op, one of gemm_bias_act, "), err
    assert "toy" in err[0] and err[0].endswith("got 'group_norm'")


# --- the generic tuner --------------------------------------------------------------------------


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """Timings, compiles and the device of the generic tuner, without a GPU: "slow" takes 2
    ms, "fast" 1 ms; "broken"'s kernel fails to compile. Returns the jobs compiled."""
    from ge2jit.jit.parallel import CompileOutcome
    from ge2jit.tune import db, timing

    monkeypatch.setattr(db, "_default", db.TuningDB(tmp_path / "tuning"))
    monkeypatch.setattr(tools, "_device_key", lambda: {"device": "Toy GPU", "arch": "sm_90",
                                                       "version": ge2jit.__version__})

    def time_ms(fn, *, warmup, reps):
        fn()
        if toy.calls[-1] not in ("slow", "fast"):
            raise KernelLaunchError(f"cannot launch {toy.calls[-1]}")
        return {"slow": 2.0, "fast": 1.0}[toy.calls[-1]]

    monkeypatch.setattr(timing, "time_ms", time_ms)
    jobs = []

    def compile_many(js, processes=None):
        jobs.extend(js)
        return [CompileOutcome(s, a, s.kernel_name, "failed" if s.rule == "sgd" else "cached",
                               error="NVRTC failed\nthe log") for s, a in js]

    monkeypatch.setattr("ge2jit.jit.parallel.compile_many", compile_many)
    return jobs


def test_tune_times_every_candidate_and_stores_the_fastest(with_toy, stand_ins):
    result = ge2jit.tune(toy, 3, reps=5)
    assert set(stand_ins) == {(TOY_SPEC, "sm_90"), (UpdateSpec("sgd", DType.F16), "sm_90")}
    assert toy.calls == ["slow", "fast"]          # the broken one is never called
    assert result.best.name == "fast" and result.best.reason == "tuned"
    assert [r["config"] for r in result.records] == ["fast", "slow", "broken"]
    assert result.records[2] == {"config": "broken", "ms": None, "error": "NVRTC failed"}
    assert result.key == {"op": "toy", "device": "Toy GPU", "arch": "sm_90",
                          "version": ge2jit.__version__, "n": 3}
    from ge2jit.tune.db import default_db

    assert default_db().get(result.key) == {"config": "fast", "ms": 1.0,
                                            "table": [["fast", 1.0], ["slow", 2.0]]}
    assert tools.tuned_config("toy", {"n": 3}) == "fast"
    assert tools.tuned_config("toy", {"n": 4}) is None
    assert cleared == [True]
    text = repr(result).splitlines()
    assert text[0] == "TuneResult(best='fast', 3 candidates)"
    assert text[1].split() == ["config", "ms", "error"] and text[2].split()[:2] == ["fast", "1"]


def test_tune_fails_in_one_line_when_every_candidate_fails(with_toy, stand_ins, monkeypatch):
    from ge2jit.tune import timing

    def broken(fn, *, warmup, reps):
        raise KernelLaunchError("too many resources requested")

    monkeypatch.setattr(timing, "time_ms", broken)
    with pytest.raises(KernelLaunchError, match="^every candidate failed to compile or launch: "
                                                "too many resources requested; too many"):
        ge2jit.tune("toy", 3)
    assert cleared == []


def test_benchmark_configs_of_an_op(with_toy, stand_ins):
    records = ge2jit.benchmark_configs(toy, 3, reps=2)   # the candidates, fastest first
    assert [r["config"] for r in records] == ["fast", "slow", "broken"]
    assert records[0]["TFLOP/s"] == pytest.approx(2.0) and records[1]["ms"] == 2.0
    assert records[0]["kernels"] == TOY_SPEC.kernel_name
    assert records[2] == {"config": "broken", "ms": None, "error": "cannot launch broken"}
    records = ge2jit.benchmark_configs("toy", 3, configs=["slow"], reps=2)
    assert [r["config"] for r in records] == ["slow"]


def test_benchmark_configs_of_an_op_without_a_plan(with_toy, stand_ins):
    import dataclasses

    registry.register(dataclasses.replace(TOY, name="toy2", warmup={}, plan=None))
    records = ge2jit.benchmark_configs("toy2", 3, configs=["slow", "fast"], reps=2)
    assert records == [{"config": "fast", "ms": 1.0}, {"config": "slow", "ms": 2.0}]
