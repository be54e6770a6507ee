"""The op registry without a GPU: look-ups and their errors, and the warm-up's tables (of a toy
op too)."""

from __future__ import annotations

import textwrap

import pytest

import ge2jit
from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.jit.loader import LoadedKernel, build
from ge2jit.ops.optim import UpdateSpec
from ge2jit.runtime import registry
from ge2jit.runtime.dtypes import DType
from ge2jit.runtime.registry import ConfigChoice, Explanation, Op

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
    assert names[:4] == ["gemm_bias_act", "gemm_bias_act_backward", "adam_update", "sgd_update"]
    assert registry.default_op().name == "gemm_bias_act"
    tables = registry.warmup_tables()
    assert set(tables) >= set(names) and len(tables) == sum(len(o.warmup) for o in registry.ops())


@pytest.mark.parametrize("how", ["name", "function", "op"])
def test_get_by_name_function_or_op(how):
    op = registry.get("adam_update")
    key = {"name": "adam_update", "function": ge2jit.adam_update, "op": op}[how]
    assert registry.get(key) is op and registry.find(key) is op


@pytest.mark.parametrize("unknown", ["softmax", len, 3])
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
    assert registry.label("softmax_f32") is None


def test_bind_names_the_arguments_and_refuses_what_the_function_does_not_take():
    x = registry.bind(ge2jit.sgd_update, (1, 2, 3), {"lr": 0.1})
    assert x["param"] == 1 and x["momentum_buffer"] == 3 and x["nesterov"] is False
    with pytest.raises(ArgumentTypeError, match="^sgd_update: got an unexpected keyword"):
        registry.bind(ge2jit.sgd_update, (1, 2, 3), {"lr": 0.1, "speed": 2})


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
        _load(tmp_path, "[[softmax]]\n")
    text = str(e.value)
    assert text.endswith(f"w.toml:1: softmax: unknown key; accepted: {', '.join(top_keys())}")
    assert "toy_table" in text and "gemm_bias_act_backward" in text and "\n" not in text
    with pytest.raises(WarmupConfigError, match=r"w.toml:3: \[\[toy_table\]\] #1: speed: "
                                                "unknown key; accepted keys: copies"):
        _load(tmp_path, "\n[[toy_table]]\nspeed = 1\n")


def test_precompile_still_offers_its_tables_by_their_old_names(with_toy):
    from ge2jit import precompile

    assert precompile.OPS["toy_table"] is TOY.warmup["toy_table"]
    assert precompile.TOP_KEYS[0] == "archs" and "toy_table" in precompile.TOP_KEYS


