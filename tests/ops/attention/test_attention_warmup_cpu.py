"""attention's warm-up table and configs without a GPU: an entry checked with its defaults,
expanded to the kernels it names, every bad key one line; the tools' kernels of a config."""

from __future__ import annotations

import pytest

import ge2jit
from ge2jit.errors import ArgumentTypeError, ArgumentValueError
from ge2jit.ops.attention.spec import (
    CONFIGS,
    SM90_CONFIGS,
    default_configs,
    make_sm90_spec,
    make_spec,
)
from ge2jit.ops.attention.warmup import BACKWARD_TABLE, TABLE, all_configs, parse_config
from ge2jit.runtime.dtypes import DType
from ge2jit.runtime.registry import get


def test_an_entry_takes_its_defaults_and_expands_to_the_architectures_default():
    entry = TABLE.validate_entry({})
    assert entry["dtypes"] == ["bfloat16"] and entry["head_dims"] == [128]
    assert TABLE.expand(entry, "sm_80") == [make_spec(DType.BF16, 128)]
    assert TABLE.expand(entry, "sm_90") == [make_sm90_spec(DType.BF16, 128)]


def test_every_combination_and_named_config_once():
    entry = TABLE.validate_entry({"dtypes": ["float16", "bfloat16"], "head_dims": [64, 256],
                                  "causal": [False, True], "lse": [True],
                                  "configs": [CONFIGS[64][1].name, CONFIGS[256][1].name]})
    specs = TABLE.expand(entry, "sm_80")
    # each tiling only for its own head dimension
    assert len(specs) == 2 * 2 * 2 and len(set(specs)) == len(specs)
    assert {(s.head_dim, s.config) for s in specs} == {(64, CONFIGS[64][1]),
                                                       (256, CONFIGS[256][1])}
    assert all(s.write_lse for s in specs)
    every = TABLE.validate_entry({"head_dims": [128], "configs": "all"})
    assert [s.config for s in TABLE.expand(every, "sm_80")] == list(CONFIGS[128])
    hopper = [s.config for s in TABLE.expand(every, "sm_90")]   # (in every_configs' order)
    assert len(hopper) == len(set(hopper)) and set(hopper) == set(SM90_CONFIGS[128]
                                                                  + CONFIGS[128])


@pytest.mark.parametrize("entry, message", [
    ({"dtypes": ["float32"]}, "dtypes: expected a list of ['bfloat16', 'float16']"),
    ({"head_dims": [96]}, "head_dims: expected a list of [64, 128, 256]"),
    ({"causal": [1]}, "causal: expected a list of booleans"),
    ({"configs": ["m1n1"]}, "config: expected one of"),
    ({"heads": [8]}, "heads: unknown key"),
])
def test_a_bad_entry_is_one_line_naming_its_key(entry, message):
    with pytest.raises(ArgumentValueError) as e:
        TABLE.validate_entry(entry)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_configs_by_name_or_object_and_the_tools_kernels():
    assert parse_config(CONFIGS[128][0].name) == CONFIGS[128][0]
    assert parse_config(CONFIGS[256][1]) == CONFIGS[256][1]
    assert len(all_configs()) == len(set(all_configs()))
    with pytest.raises(ArgumentTypeError, match="^config: expected a config name"):
        parse_config(3)
    op = get("attention")
    assert op.function is ge2jit.attention
    assert op.specs_for_config(CONFIGS[64][1].name, "sm_80", dtype="float16", head_dim=64,
                               causal=True) == [make_spec(DType.F16, 64, causal=True,
                                                          config=CONFIGS[64][1])]
    assert op.specs_for_config(None, "sm_80") == [make_spec(DType.BF16, 128)]
    assert op.specs_for_config(None, "sm_90") == [make_sm90_spec(DType.BF16, 128)]
    assert op.specs_for_config(SM90_CONFIGS[64][0].name, "sm_90", head_dim=64) == [
        make_sm90_spec(DType.BF16, 64)]
    # the defaults at head_dim 64: long sequences', and causal short ones'
    assert op.specs_for_config(None, "sm_90", head_dim=64, causal=True) == [
        make_sm90_spec(DType.BF16, 64, config=c, causal=True)
        for c in default_configs(64, 90, causal=True)]
    assert len(default_configs(64, 90, causal=True)) == 2
    assert op.specs_for_config(None, "sm_90", head_dim=64) == [make_sm90_spec(DType.BF16, 64)]
    assert len(TABLE.expand(TABLE.validate_entry({"head_dims": [64]}), "sm_90")) == 1
    assert len(TABLE.expand(TABLE.validate_entry({"head_dims": [64], "causal": [True]}),
                            "sm_90")) == 2


def test_the_backward_table_compiles_the_form_the_call_takes():
    entry = BACKWARD_TABLE.validate_entry({"head_dims": [128, 256]})
    assert entry["deterministic"] == [False]
    kinds = [(s.head_dim, s.kind) for s in BACKWARD_TABLE.expand(entry, "sm_90")]
    # sm_90: the one-kernel backward at 128, the two-kernel one at 256
    assert kinds == [(128, "dot"), (128, "dkvq"), (128, "dqout"),
                     (256, "dot"), (256, "dq"), (256, "dkv")]
    both = BACKWARD_TABLE.validate_entry({"deterministic": [False, True]})
    # each kernel once: the two forms share delta's; before sm_90 both forms are the same
    assert [s.kind for s in BACKWARD_TABLE.expand(both, "sm_90")] == [
        "dot", "dkvq", "dqout", "dq", "dkv"]
    assert [s.kind for s in BACKWARD_TABLE.expand(both, "sm_80")] == ["dot", "dq", "dkv"]
    with pytest.raises(ArgumentValueError, match="^deterministic: expected a list of booleans"):
        BACKWARD_TABLE.validate_entry({"deterministic": [1]})


def test_several_sequences_a_row_are_warmed_and_not_with_packed_sequences():
    """``segments``: the kernels that take seq_bounds, forward and backward (the row kernels
    without them); a combination with ``varlen`` (no call has both) compiles nothing."""
    entry = TABLE.validate_entry({"causal": [True], "segments": [False, True],
                                  "varlen": [False, True]})
    for arch in ("sm_80", "sm_90"):
        specs = TABLE.expand(entry, arch)
        assert sorted((s.varlen, s.segments) for s in specs) == [(False, False), (False, True),
                                                                 (True, False)]
    backward = BACKWARD_TABLE.validate_entry({"causal": [True], "segments": [True],
                                              "varlen": [False, True]})
    specs = BACKWARD_TABLE.expand(backward, "sm_90")
    assert [(s.kind, s.segments) for s in specs] == [("dot", False), ("dkvq", True),
                                                     ("dqout", False)]
    op = get("attention")
    assert op.specs_for_config(None, "sm_80", causal=True, segments=True) == [
        make_spec(DType.BF16, 128, causal=True, segments=True)]
