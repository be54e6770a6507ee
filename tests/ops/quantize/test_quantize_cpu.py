"""quantize_fp8 without a GPU: config names, the heuristic and candidates, the kernels a call
runs, every kernel variant compiled for sm_90 without spilling, the warm-up table, the host
reference, and every argument check (on stand-in arrays, ``tests/fake_cupy.py``)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import ge2jit
from ge2jit.jit.render import render
from ge2jit.ops.quantize import op as qop
from ge2jit.ops.quantize import reference as ref
from ge2jit.ops.quantize import registration, warmup
from ge2jit.ops.quantize.spec import (
    QuantConfig,
    QuantSpec,
    Source,
    Stage,
    all_configs,
    candidates,
    heuristic,
    kernels,
    launch_shape,
    make_spec,
    parse_config,
)
from ge2jit.runtime import checks
from ge2jit.runtime.dtypes import FLOAT_DTYPES, DType, as_fp8

from ...fake_cupy import FakeArray, make_module
from ...kernel_checks import check_clean_build

E4M3, E5M2, BF16, F32 = DType.E4M3, DType.E5M2, DType.BF16, DType.F32


# ---- configs, heuristic, kernels

def test_config_names_round_trip():
    configs = all_configs()
    assert len({c.name for c in configs}) == len(configs)
    for c in configs:
        assert parse_config(c.name) == c and parse_config(c) is c
    assert {c.variant for c in configs} == {"warp", "block", "loop", "flat"}


@pytest.mark.parametrize("name, match", [
    ("warp32_v8_r2", r"rows per lane group \(_rR\) must be one of 1, got 2"),
    ("flat_128", r"threads \(flat_T\) must be one of 256, 512, 1024, got 128"),
    ("block_512_v4", r"values per thread \(_vV\) must be one of 8, 16, 32, got 4"),
    ("strided_256", "expected a quantize_fp8 variant name"),
    (7, "expected a quantize_fp8 variant name"),
])
def test_bad_config_names_are_refused_in_one_line(name, match):
    with pytest.raises(ge2jit.ArgumentValueError, match=match) as e:
        parse_config(name)
    assert str(e.value).startswith("config: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("n, dtype, want", [
    (1, BF16, "warp1_v8_r1"), (64, BF16, "warp8_v8_r1"), (256, BF16, "warp32_v8_r1"),
    (256, F32, "warp32_v8_r1"), (100, F32, "warp32_v4_r1"), (1024, BF16, "warp32_v32_r1"),
    (1025, BF16, "block_128_v16"), (4096, BF16, "block_256_v16"),
    (16384, F32, "block_1024_v16"), (16385, BF16, "loop_1024"), (10**6, F32, "loop_1024"),
])
def test_heuristic_per_row(n, dtype, want):
    c = heuristic(1000, n, dtype, flat=False)
    assert c.name == want
    assert c.capacity is None or n <= c.capacity
    assert c in candidates(n, flat=False)


def test_heuristic_flat_for_one_scale_on_rows_end_to_end():
    assert heuristic(8192, 4096, BF16, flat=True).name == "flat_512"
    assert {c.name for c in candidates(4096, flat=True)} >= {"flat_256", "flat_512",
                                                             "flat_1024", "loop_1024"}
    assert not any(c.flat for c in candidates(4096, flat=False))


def test_kernels_of_each_source():
    c = parse_config("block_256_v16")
    ks = kernels(c, 100, 4096, BF16, E4M3, Source.TENSOR, amax=True)
    assert ks.amax.stage is Stage.AMAX and ks.amax.fmt is None and not ks.quantize.amax
    assert ks.specs == (ks.quantize, ks.amax)
    assert ks.grid == ((100, 1, 1)) and ks.block == (256, 1, 1)
    for source in (Source.ROW, Source.DEVICE, Source.HOST):
        ks = kernels(c, 100, 4096, BF16, E5M2, source, amax=True)
        assert ks.amax is None and ks.quantize.amax and ks.quantize.source is source
    with pytest.raises(ge2jit.ArgumentValueError, match="per-row scales need a row variant"):
        kernels(parse_config("flat_512"), 1, 100, BF16, E4M3, Source.ROW)


def test_launch_shapes():
    assert launch_shape(parse_config("warp8_v8_r1"), 1000, 64, 8, 132)[0] == (63, 1, 1)
    assert launch_shape(parse_config("loop_1024"), 7, 10**6, 32, 132)[0] == (7, 1, 1)
    grid, block = launch_shape(parse_config("flat_512"), 8192, 4096, 32, 132)
    assert block == (512, 1, 1) and grid == (132 * 8, 1, 1)
    assert launch_shape(parse_config("flat_512"), 1, 100, 32, 132)[0] == (1, 1, 1)
    assert launch_shape(parse_config("flat_512"), 0, 100, 32, 132)[0] == (1, 1, 1)


def test_spec_refuses_what_the_kernel_cannot_take():
    with pytest.raises(ge2jit.ArgumentValueError, match="8-bit format"):
        QuantSpec(BF16, BF16, Stage.QUANTIZE, Source.ROW, False, "warp", 128, 8, 8)
    with pytest.raises(ge2jit.ArgumentValueError, match="amax stage takes no format"):
        QuantSpec(BF16, E4M3, Stage.AMAX, None, False, "warp", 128, 8, 8)
    with pytest.raises(ge2jit.ArgumentValueError, match="in_dtype"):
        QuantSpec(E4M3, E4M3, Stage.QUANTIZE, Source.ROW, False, "warp", 128, 8, 8)
    with pytest.raises(ge2jit.ArgumentValueError, match="vec"):
        QuantSpec(F32, E4M3, Stage.QUANTIZE, Source.ROW, False, "warp", 128, 8, 8)


def test_kernel_names_are_unique_per_specialization():
    specs = set()
    for c, d, f, src, amax, v in itertools.product(
            all_configs(), FLOAT_DTYPES, (E4M3, E5M2), list(Source), (False, True), (1, 8)):
        if c.flat and src is Source.ROW:
            continue
        specs.update(kernels(c, 1, 64, d, f, src, amax=amax, max_vec=v).specs)
    assert len({s.kernel_name for s in specs}) == len(specs)
    s = make_spec(parse_config("block_512_v16"), "bfloat16", E4M3, Stage.QUANTIZE, Source.ROW,
                  True)
    assert s.kernel_name == "quantize_fp8_row_block512_v16_x8_bf16_e4m3_amax"
    assert render(s).startswith("// quantize_fp8_row_block512_v16_x8_bf16_e4m3_amax")


# ---- compiles (no GPU): zero spills, zero stack

def _compile_cases():
    """Every kernel the heuristic takes for the row lengths below (each type, format and
    source, with and without amax, 16-byte and single-element accesses) and every config
    with 16-byte accesses of bfloat16 and float32 to e4m3 per-row and per-tensor."""
    specs = set()
    for d, f, src, amax, n, v in itertools.product(
            FLOAT_DTYPES, (E4M3, E5M2), list(Source), (False, True),
            (1, 7, 64, 300, 1024, 4096, 16384, 50000), (1, 8)):
        flat = src is not Source.ROW
        specs.update(kernels(heuristic(1000, n, d, flat and n > 1000), 1000, n, d, f, src,
                             amax=amax, max_vec=v).specs)
    for c, d, src in itertools.product(all_configs(), (BF16, F32),
                                       (Source.ROW, Source.TENSOR, Source.DEVICE)):
        if not (c.flat and src is Source.ROW):
            specs.update(kernels(c, 1, 64, d, E4M3, src, amax=src is Source.DEVICE).specs)
    return sorted(specs, key=lambda s: s.kernel_name)


CASES = _compile_cases()


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.kernel_name)
def test_compiles_without_spills(spec, compile_cache):
    check_clean_build(spec, "sm_90", compile_cache, max_registers=64)


# ---- the warm-up table and inspect

def test_warmup_entries_expand_to_the_heuristic_kernels():
    entry = warmup.validate_entry({"dtypes": ["bfloat16"], "formats": ["e4m3", "e5m2"],
                                   "scales": ["dynamic", "host"], "per_row": [False, True],
                                   "lengths": [4096]})
    specs = warmup.expand(entry, "sm_90")
    names = {s.kernel_name for s in specs}
    assert "quantize_fp8_amax_flat512_v32_x8_bf16" in names
    assert "quantize_fp8_tensor_flat512_v32_x8_bf16_e4m3" in names
    assert "quantize_fp8_row_block256_v16_x8_bf16_e5m2" in names
    assert "quantize_fp8_host_flat512_v32_x8_bf16_e4m3" in names
    assert not any(s.source is Source.HOST and s.variant != "flat" for s in specs)
    assert warmup.expand(entry, "sm_80") == []
    entry = warmup.validate_entry({"lengths": [100], "configs": "all", "per_row": [True]})
    assert all(not s.flat and (s.capacity is None or s.capacity >= 100)
               for s in (x.config for x in warmup.expand(entry, "sm_90")))


@pytest.mark.parametrize("entry, match", [
    ({}, "lengths: expected a non-empty list"),
    ({"lengths": [8], "formats": ["e4m3fn"]}, "formats: expected a list of"),
    ({"lengths": [8], "scales": ["static"]}, "scales: expected a list of"),
    ({"lengths": [8], "configs": ["strided_128"]}, "config: expected a quantize_fp8"),
    ({"lengths": [8], "per_rows": [True]}, "per_rows: unknown key"),
])
def test_bad_warmup_entries_are_refused(entry, match):
    with pytest.raises(ge2jit.ArgumentValueError, match=match):
        warmup.validate_entry(entry)


def test_inspect_a_config_without_gpu():
    op = registration.QUANTIZE_FP8
    specs = op.specs_for_config("loop_512", "sm_90", dtype="float32", fmt="e5m2",
                                scale="dynamic", per_row=True, amax=True)
    assert [s.kernel_name for s in specs] == ["quantize_fp8_row_loop512_v16_x4_f32_e5m2_amax"]
    specs = op.specs_for_config(None, "sm_90a")
    assert [s.stage for s in specs] == [Stage.QUANTIZE, Stage.AMAX]
    with pytest.raises(ge2jit.ArgumentValueError, match="arch: 8-bit float conversions need"):
        op.specs_for_config(None, "sm_80")
    with pytest.raises(ge2jit.ArgumentValueError, match="scale: expected 'dynamic'"):
        op.specs_for_config(None, "sm_90", scale="host", per_row=True)


def test_registered_by_name_and_function():
    from ge2jit.runtime import registry

    assert registry.get("quantize_fp8") is registry.get(ge2jit.quantize_fp8)
    assert registry.label("quantize_fp8_amax_flat512_v32_x8_bf16") == "quantize_fp8"


# ---- formats and the host reference

@pytest.mark.parametrize("name, want", [
    ("e4m3", E4M3), ("float8_e4m3fn", E4M3), (ml_dtypes.float8_e5m2, E5M2), ("e5m2", E5M2),
    (np.dtype(ml_dtypes.float8_e4m3fn), E4M3), ("torch.float8_e5m2", E5M2), (E4M3, E4M3),
])
def test_formats_by_any_name(name, want):
    assert as_fp8(name) is want


@pytest.mark.parametrize("bad", ["e4m3fnuz", "float8_e4m3fnuz", np.float16, None, BF16])
def test_other_formats_are_refused(bad):
    with pytest.raises(ge2jit.ArgumentValueError, match="fmt: expected 'e4m3' or 'e5m2'"):
        as_fp8(bad)


def test_reference_rounds_saturates_and_keeps_nan():
    x = np.array([[1.0, -3.0, 1000.0, np.nan], [0.0, 0.0, 0.0, 0.0]], np.float32)
    q, s = ref.quantize_fp8(x, "e4m3", per_row=True)
    assert s.dtype == np.float32 and np.isnan(s[0]) and s[1] == 1.0
    q, s = ref.quantize_fp8(x[:, :3], "e4m3", per_row=True)
    assert s[0] == np.float32(1000.0) / np.float32(448.0)
    assert float(q[0, 2]) == 448.0
    q = ref.quantize(np.array([1e6, -1e6, np.inf, np.nan], np.float32), 1.0, "e5m2")
    assert q.astype(np.float32).tolist()[:3] == [57344.0, -57344.0, 57344.0]
    assert np.isnan(q.astype(np.float32)[3])
    q, s = ref.quantize_fp8(np.zeros((0, 5), np.float32), "e4m3")
    assert q.shape == (0, 5) and s == 1.0


# ---- argument checks (stand-in arrays)

@pytest.fixture
def fake(monkeypatch):
    module = make_module(0)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(qop, "_cupy", lambda: module)


def _check(x, scale=None, per_row=False, amax_out=None, out=None, fmt="e4m3", config=None):
    return qop.checked(x, scale, per_row, amax_out, out, fmt, config)


def test_valid_arguments(fake):
    x = FakeArray((8, 64), ml_dtypes.bfloat16)
    prob, _, _ = _check(x)
    assert (prob.rows, prob.n, prob.xs, prob.source, prob.ss) == (8, 64, 64, Source.TENSOR, 0)
    prob, _, _ = _check(x, per_row=True, fmt="e5m2")
    assert prob.source is Source.ROW and prob.fmt is E5M2
    prob, _, _ = _check(x, scale=0.5)
    assert prob.source is Source.HOST
    prob, _, _ = _check(x, scale=FakeArray((8,), np.float32, strides=(8,)), per_row=True)
    assert prob.source is Source.DEVICE and prob.ss == 2
    prob, _, _ = _check(x, scale=FakeArray((1, 1), np.float32), amax_out=FakeArray((), np.float32))
    assert prob.ss == 0 and prob.amax
    wide = FakeArray((8, 64), np.float32, strides=(1024, 4))
    prob, y, _ = _check(wide, out=FakeArray((8, 64), np.uint8))
    assert (prob.xs, y is wide) == (256, True)
    prob, y, _ = _check(FakeArray((4, 8), np.float32).T)     # strided last axis: copied
    assert y.strides == (16, 4) and prob.rows == 8
    prob, _, _ = _check(FakeArray((), np.float32))
    assert (prob.rows, prob.n) == (1, 1)
    assert qop.is_flat(_check(x)[0], 64) and not qop.is_flat(_check(wide)[0], 64)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"x": FakeArray((4, 8), np.float64)}, ge2jit.ArgumentValueError, "x: dtype float64"),
    ({"x": np.zeros((4, 8), np.float32)}, ge2jit.ArgumentTypeError, "x: expected a GPU array"),
    ({"fmt": "int8"}, ge2jit.ArgumentValueError, "fmt: expected 'e4m3' or 'e5m2'"),
    ({"scale": 0.0}, ge2jit.ArgumentValueError, "scale: expected a positive finite scale"),
    ({"scale": float("inf")}, ge2jit.ArgumentValueError, "scale: expected a positive finite"),
    ({"scale": 2.0, "per_row": True}, ge2jit.ArgumentValueError,
     r"scale: per_row=True takes one scale per row, a float32 array of shape \(4,\)"),
    ({"scale": FakeArray((4,), np.float32)}, ge2jit.ArgumentValueError,
     r"scale: expected one float32 value \(per_row=False\), got shape \(4,\)"),
    ({"scale": FakeArray((8,), np.float32), "per_row": True}, ge2jit.ArgumentValueError,
     r"scale: expected shape \(4,\) \(one per row of x"),
    ({"scale": FakeArray((1,), np.float16)}, ge2jit.ArgumentValueError,
     "scale: expected a float32 array, got dtype float16"),
    ({"scale": "1"}, ge2jit.ArgumentTypeError, "scale: expected a GPU array"),
    ({"amax_out": FakeArray((2,), np.float32)}, ge2jit.ArgumentValueError,
     r"amax_out: expected a float32 array of one element, got dtype float32 and shape \(2,\)"),
    ({"out": FakeArray((4, 9), np.uint8)}, ge2jit.ArgumentValueError,
     r"out: expected shape \(4, 8\) \(x's\)"),
    ({"out": FakeArray((4, 8), ml_dtypes.float8_e5m2)}, ge2jit.ArgumentValueError,
     "out: expected dtype float8_e4m3fn or uint8, got float8_e5m2"),
    ({"out": FakeArray((8, 4), np.uint8).T}, ge2jit.ArgumentValueError,
     "out: expected rows along a unit-stride last axis"),
    ({"config": "strided_1"}, ge2jit.ArgumentValueError, "config: expected a quantize_fp8"),
])
def test_bad_arguments_are_refused_in_one_line(fake, kwargs, error, match):
    args = {"x": FakeArray((4, 8), np.float32)} | kwargs
    with pytest.raises(error, match=match) as e:
        if isinstance(args.get("scale"), float):
            checks.check_host_scale(args["scale"], "scale")
        _check(**args)
    assert "\n" not in str(e.value)


def test_out_overlapping_x_is_refused(fake):
    x = FakeArray((4, 8), np.float32)
    out = FakeArray((4, 8), np.uint8, base=x.base)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x"):
        _check(x, out=out)


def test_pinned_flat_needs_one_scale_on_rows_end_to_end():
    from ge2jit.ops.quantize.spec import check_fits

    with pytest.raises(ge2jit.ArgumentValueError, match="config: flat_512 takes one scale"):
        check_fits(parse_config("flat_512"), 64, flat=False)
    with pytest.raises(ge2jit.ArgumentValueError, match="holds rows of at most 256"):
        check_fits(parse_config("warp32_v8_r1"), 257, flat=False)
    check_fits(QuantConfig("loop", 256), 10**9, flat=False)
