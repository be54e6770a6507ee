"""softmax without a GPU: every kernel the heuristic can choose and every candidate config
compiles for sm_80 and sm_90 without spilling; the config names, the heuristic, the
candidates and the launch shapes; the layout analysis; and every argument check (on stand-in
arrays, ``tests/fake_cupy.py``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ge2jit
from ge2jit.jit.render import render
from ge2jit.ops.softmax import (
    SoftmaxConfig,
    SoftmaxSpec,
    all_configs,
    candidates,
    choose,
    heuristic,
    make_spec,
    parse_config,
    softmax,
)
from ge2jit.ops.softmax.op import axis_layout, rows_fast
from ge2jit.ops.softmax.spec import access_width
from ge2jit.runtime.dtypes import FLOAT_DTYPES, DType
from ge2jit.runtime.rows import vector_width

from ...fake_cupy import FakeArray
from ...kernel_checks import check_clean_build

ARCHS = ["sm_80", "sm_90"]
SAME = [(DType.F32, DType.F32), (DType.BF16, DType.BF16), (DType.F16, DType.F16)]
MIXED = [(DType.F32, DType.BF16), (DType.F32, DType.F16), (DType.BF16, DType.F32),
         (DType.F16, DType.F32), (DType.BF16, DType.F16)]
# the row lengths of the GPU tests and the benchmark, and the edges of every variant
LENGTHS = sorted({1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 64, 65, 127, 128, 129, 256, 257,
                  512, 513, 777, 1000, 1024, 1025, 2048, 2049, 4096, 4097, 8192, 8193, 12345,
                  16384, 16385, 32768, 32769, 40000, 65536, 131072})
ROW_COUNTS = [1, 7, 1000, 100_000]


# ---- configs and names

def test_config_names_round_trip():
    configs = all_configs()
    assert len({c.name for c in configs}) == len(configs)
    for c in configs:
        assert parse_config(c.name) == c
        assert parse_config(c) is c
        assert str(c) == c.name
    assert {c.variant for c in configs} == {"warp", "block", "loop", "strided"}


@pytest.mark.parametrize("name, match", [
    ("", "expected a softmax variant name"),
    ("warp", "expected a softmax variant name"),
    ("warp32_v4", "expected a softmax variant name"),
    ("Block_1024_v16", "expected a softmax variant name"),
    (" block_1024_v16", "expected a softmax variant name"),
    ("block_1024_v16 ", "expected a softmax variant name"),
    ("warp32_v64_r1", r"values per thread \(_vV\) must be one of 4, 8, 16, 32, got 64"),
    ("warp3_v4_r1", r"lanes per row \(warpG\) must be one of 1, 2, 4, 8, 16, 32, got 3"),
    ("warp32_v4_r3", r"rows per lane group \(_rR\) must be one of 1, 2, 4, got 3"),
    ("warp32_v32_r2", "holds 64 values per thread; at most 32"),
    ("block_100_v16", r"threads \(block_T\) must be one of 128, 256, 512, 1024, got 100"),
    ("block_1024_v64", r"values per thread \(_vV\) must be one of 8, 16, 32, got 64"),
    ("loop_64", r"threads \(loop_T\) must be one of 256, 512, 1024, got 64"),
    ("strided_1024", r"threads \(strided_T\) must be one of 128, 256, got 1024"),
    (5, "expected a softmax variant name such as 'warp32_v4_r2'"),
    (("block", 1024), "expected a softmax variant name"),
])
def test_bad_config_names_are_refused_in_one_line(name, match):
    with pytest.raises(ge2jit.ArgumentValueError, match=match) as e:
        parse_config(name)
    assert str(e.value).startswith("config: ") and "\n" not in str(e.value)


def test_pinned_config_must_fit():
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: warp32_v32_r1 holds rows of at most 1024 elements, got "
                             "rows of 1025"):
        choose(10, 1025, "float32", config="warp32_v32_r1")
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: block_1024_v16 reads rows along a unit-stride last axis"):
        choose(10, 100, "float32", strided=True, config="block_1024_v16")
    # the loop fits any length, the strided variant any layout
    assert choose(1, 10**9, "float32", config="loop_256").spec.variant == "loop"
    assert choose(3, 10**6, "bfloat16", strided=True, config="strided_128").spec.strided
    assert choose(3, 5, "bfloat16", config="strided_128").spec.strided
    assert choose(3, 1024, "float32", config="warp32_v32_r1").spec.variant == "warp"


# ---- the heuristic

@pytest.mark.parametrize("n, variant", [(1, "warp"), (33, "warp"), (1024, "warp"),
                                        (1025, "block"), (32768, "block"), (32769, "loop"),
                                        (10**7, "loop")])
def test_heuristic_variant_by_length(n, variant):
    for dt in FLOAT_DTYPES:
        assert heuristic(1000, n, dt).variant == variant
    assert heuristic(1000, n, DType.F32, strided=True).name == "strided_256"


@pytest.mark.parametrize("in_dt, out_dt", SAME + MIXED, ids=str)
def test_heuristic_choices_fit_and_are_candidates(in_dt, out_dt):
    width = access_width(in_dt, out_dt)
    for n, rows in itertools.product(LENGTHS, ROW_COUNTS):
        c = choose(rows, n, in_dt, 132, out_dtype=out_dt)
        cfg = c.config
        assert cfg.fits(n, False), (n, cfg)
        assert cfg in candidates(n, in_dt, out_dt), (n, cfg)
        assert c.spec.vec == min(width, c.spec.vpt)
        assert c.spec.in_dtype is in_dt and c.spec.out_dtype is out_dt
        # the grid covers every row (the kernels loop past a grid of 2**31 - 1 blocks)
        per_block = (c.block[0] // cfg.lanes * cfg.rows) if cfg.variant == "warp" else 1
        assert c.grid[0] * per_block >= rows and c.grid[0] <= 2**31 - 1
        assert (c.grid[0] - 1) * per_block < rows
        assert c.block == (cfg.threads, 1, 1)
        # narrower accesses when the alignment asks for them
        for v in (1, 2, 4):
            assert choose(rows, n, in_dt, 132, out_dtype=out_dt, max_vec=v).spec.vec \
                == min(v, width, c.spec.vpt if cfg.variant != "loop" else v)


def test_warp_rows_per_group_leave_every_multiprocessor_8_blocks():
    # 128-element float32 rows: one 16-byte access per lane, up to 4 rows per lane group
    assert heuristic(10**6, 128, DType.F32, sm_count=132).name == "warp32_v4_r4"
    assert heuristic(8 * 132 * 16, 128, DType.F32, sm_count=132).name == "warp32_v4_r4"
    assert heuristic(8 * 132 * 16 - 16, 128, DType.F32, sm_count=132).name == "warp32_v4_r2"
    assert heuristic(2000, 128, DType.F32, sm_count=132).name == "warp32_v4_r1"
    assert heuristic(10**6, 128, DType.BF16, sm_count=132).name == "warp16_v8_r2"
    assert heuristic(10**6, 1000, DType.F32).name == "warp32_v32_r1"
    assert heuristic(10**6, 3, DType.F32).name == "warp1_v4_r4"


def test_block_and_loop_shapes():
    assert heuristic(1000, 2048, DType.F32).name == "block_128_v16"
    assert heuristic(1000, 4096, DType.BF16).name == "block_256_v16"
    assert heuristic(1000, 8192, DType.F32).name == "block_256_v32"
    assert heuristic(1000, 16384, DType.F32).name == "block_512_v32"
    assert heuristic(1000, 32768, DType.BF16).name == "block_1024_v32"
    assert heuristic(1000, 65536, DType.F32, sm_count=132).name == "loop_1024"
    assert heuristic(100, 10**6, DType.BF16, sm_count=132).name == "loop_1024"
    assert choose(3, 10**6, DType.BF16).spec.vpt == 32
    assert choose(3, 10**6, DType.BF16, max_vec=2).spec.vpt == 16
    assert choose(3, 10**6, DType.F32).spec.vpt == 16


def test_candidates_fit_and_include_every_loop():
    for n in LENGTHS:
        for dt in FLOAT_DTYPES:
            cands = candidates(n, dt)
            assert all(c.fits(n, False) for c in cands)
            assert {c.name for c in cands if c.variant == "loop"} == {
                "loop_256", "loop_512", "loop_1024"}
    assert [c.name for c in candidates(100, DType.F32, strided=True)] == [
        "strided_128", "strided_256"]
    # no candidate leaves most of its slots empty
    assert all(c.capacity <= 4096 for c in candidates(1000, DType.F32) if c.capacity)


def test_spec_refuses_what_the_kernel_cannot_take():
    with pytest.raises(ge2jit.ArgumentValueError, match="vec"):
        SoftmaxSpec(DType.F32, DType.F32, "block", 256, 16, vec=8)        # 32-byte access
    with pytest.raises(ge2jit.ArgumentValueError, match="vpt"):
        SoftmaxSpec(DType.F32, DType.F32, "block", 256, 6, vec=4)
    with pytest.raises(ge2jit.ArgumentValueError, match="power of two"):
        SoftmaxSpec(DType.F32, DType.F32, "block", 96, 16, vec=4)
    with pytest.raises(ge2jit.ArgumentValueError, match="vec=1"):
        SoftmaxSpec(DType.F32, DType.F32, "strided", 256, 4, vec=4)
    with pytest.raises(TypeError):
        SoftmaxSpec("float32", DType.F32, "block", 256, 16, vec=4)


def test_kernel_names_are_unique_per_specialization():
    specs = {make_spec(c, i, o, v) for c in all_configs() for i, o in SAME + MIXED
             for v in (1, 2, 4, 8)}
    assert len({s.kernel_name for s in specs}) == len(specs)
    s = make_spec(parse_config("block_1024_v32"), "bfloat16", "float32", 8)
    assert (s.vec, s.kernel_name) == (4, "softmax_block1024_v32_x4_bf16_f32")
    assert render(s).startswith("// softmax_block1024_v32_x4_bf16_f32")


# ---- compiles (no GPU): zero spills, zero stack

def _compile_cases():
    """Every kernel the heuristic chooses (every dtype pair, 16-byte accesses); every config
    with 16-byte accesses of float32 and bfloat16 and with single-element accesses of float16;
    the 4- and 8-byte accesses of 16-bit types on one config of each variant; the same for the
    backward (its heuristic's kernels, its configs). (Every config x every dtype pair x every
    width, both directions: ``-m slow``.)"""
    specs = set()
    for (i, o), n, rows in itertools.product(SAME + MIXED, LENGTHS, [7, 100_000]):
        specs.add(choose(rows, n, i, 132, out_dtype=o).spec)
        specs.add(choose(rows, n, i, 132, out_dtype=o, strided=True).spec)
    for c in all_configs():
        specs.add(make_spec(c, DType.F32, DType.F32, 8))
        specs.add(make_spec(c, DType.BF16, DType.BF16, 8))
        specs.add(make_spec(c, DType.F16, DType.F16, 1))
    for name, (i, o), v in itertools.product(
            ["warp8_v8_r4", "warp32_v32_r1", "block_1024_v32", "loop_1024"],
            [(DType.BF16, DType.BF16), (DType.F16, DType.BF16)], (2, 4)):
        specs.add(make_spec(parse_config(name), i, o, v))
    # the backward's: every kernel its heuristic chooses, every config it accepts
    for (i, o), n, rows in itertools.product(SAME + MIXED, LENGTHS, [7, 100_000]):
        specs.add(choose(rows, n, i, 132, out_dtype=o, backward=True).spec)
        specs.add(choose(rows, n, i, 132, out_dtype=o, strided=True, backward=True).spec)
    for c, (d, v) in itertools.product(all_configs(backward=True),
                                       [(DType.F32, 8), (DType.BF16, 8), (DType.F16, 1)]):
        specs.add(make_spec(c, d, d, v, backward=True))
    return sorted(specs, key=lambda s: s.kernel_name)


CASES = _compile_cases()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.kernel_name)
def test_compiles_without_spills(spec, arch, compile_cache):
    # at least 1024 threads per multiprocessor (the kernels' launch bounds): 64 registers
    check_clean_build(spec, arch, compile_cache)


@pytest.mark.slow
def test_every_spec_compiles_without_spills(tmp_path):
    """Every config x every dtype pair x every access width, both directions, for both
    architectures."""
    from ge2jit.jit.parallel import compile_many

    specs = {make_spec(c, i, o, v, backward=b) for b in (False, True)
             for c in all_configs(b) for i, o in SAME + MIXED for v in (1, 2, 4, 8)}
    jobs = [(s, a) for s in sorted(specs, key=lambda s: s.kernel_name) for a in ARCHS]
    outcomes = compile_many(jobs, cache_root=tmp_path)
    bad = [o for o in outcomes if o.status == "failed" or o.spill_bytes or o.stack_bytes]
    assert not bad, [(o.kernel_name, o.arch, o.error or o.spill_bytes) for o in bad[:20]]


# ---- layouts

def _el(a: np.ndarray) -> tuple:
    return tuple(s // a.itemsize for s in a.strides)


def test_axis_layout_of_contiguous_arrays():
    a = np.zeros((3, 4, 5), np.float32)
    assert axis_layout(a.shape, _el(a), 2) == (12, 5, 1, 5, 1, 0)
    assert axis_layout(a.shape, _el(a), 1) == (3, 4, 5, 20, 5, 1)
    assert axis_layout(a.shape, _el(a), 0) == (1, 3, 20, 0, 20, 1)
    b = np.zeros(7, np.float32)
    assert axis_layout(b.shape, _el(b), 0) == (1, 7, 1, 0, 1, 0)
    c = np.zeros((5, 1, 1), np.float32)
    assert axis_layout(c.shape, _el(c), 0) == (1, 5, 1, 0, 1, 0)   # unit dims drop out
    assert rows_fast(axis_layout(c.shape, _el(c), 0), axis_layout(c.shape, _el(c), 0))


def test_axis_layout_of_views():
    big = np.zeros((6, 40), np.float32)
    s = big[:, 3:20]                                   # rows of a wider array
    ls = axis_layout(s.shape, _el(s), 1)
    assert ls == (6, 17, 1, 40, 1, 0) and rows_fast(ls, ls)
    r = big[::-2, :17]                                 # negative row stride
    assert axis_layout(r.shape, _el(r), 1) == (3, 17, 1, -80, 1, 0)
    t = big.T                                          # last axis with stride 40: strided
    lt = axis_layout(t.shape, _el(t), 1)
    assert lt == (40, 6, 1, 1, 40, 0) and not rows_fast(lt, lt)
    cube = np.zeros((4, 8, 10), np.float32)
    q = cube[:, ::2, :]                                # outer dims still walk as one
    assert axis_layout(q.shape, _el(q), 2) == (16, 10, 1, 20, 1, 0)
    p = cube[:, :5, :]                                 # they do not: the call copies
    assert axis_layout(p.shape, _el(p), 2) is None
    assert axis_layout(p.shape, _el(p), 0) == (1, 4, 50, 0, 80, 1)  # the inner ones do
    assert axis_layout(p.shape, _el(p), 1) == (4, 5, 10, 80, 10, 1)
    one = cube[:, :1, :]
    assert axis_layout(one.shape, _el(one), 2) == (4, 10, 1, 80, 1, 0)


def max_vec(x_ptr, x_row, y_ptr, y_row, in_dtype, out_dtype, rows):
    return vector_width(access_width(in_dtype, out_dtype),
                        [(x_ptr, x_row, in_dtype.itemsize), (y_ptr, y_row, out_dtype.itemsize)],
                        rows)


def test_vector_width_follows_pointers_and_row_strides():
    f32, bf16 = DType.F32, DType.BF16
    assert max_vec(4096, 1024, 8192, 1024, f32, f32, 10) == 4
    assert max_vec(4096 + 8, 1024, 8192, 1024, f32, f32, 10) == 2
    assert max_vec(4096, 1026, 8192, 1024, f32, f32, 10) == 2
    assert max_vec(4096, 1025, 8192, 1024, f32, f32, 10) == 1
    assert max_vec(4096, 1025, 8192, 1025, f32, f32, 1) == 4      # one row: strides unused
    assert max_vec(4096, 1024, 8192, 1024, bf16, bf16, 10) == 8
    assert max_vec(4096, 1024, 8192 + 8, 1024, bf16, bf16, 10) == 4
    assert max_vec(4096, 1024, 8192, 1024, bf16, f32, 10) == 4
    assert max_vec(4096, -1024, 8192, 1024, f32, f32, 10) == 4    # negative row stride
    # three arrays (the backward's dy, y and dx): the narrowest allowance wins
    assert vector_width(8, [(4096, 1024, 2), (8192 + 4, 1024, 2), (0, 1024, 2)], 3) == 2
    assert vector_width(8, [(4096, 1024, 2), (8192, 1028, 2), (0, 1024, 2)], 3) == 4


# ---- argument checks, on stand-in arrays

def test_non_cupy_inputs_are_refused(fake):
    with pytest.raises(ge2jit.ArgumentTypeError,
                       match=r"x: expected a GPU array .*, got a numpy.ndarray of "
                             r"shape \(4, 3\); move it to the GPU with cupy.asarray\(x\)"):
        softmax(np.zeros((4, 3), np.float32))
    with pytest.raises(ge2jit.ArgumentTypeError, match="x: expected a GPU array .*, got list"):
        softmax([1.0, 2.0])
    with pytest.raises(ge2jit.ArgumentTypeError, match="out: expected a GPU array .*, got"):
        softmax(FakeArray((4, 3)), out=np.zeros((4, 3), np.float32).tolist())


@pytest.mark.parametrize("kwargs, error, match", [
    ({"x": FakeArray((4, 3), np.float64)}, ge2jit.ArgumentValueError,
     "x: dtype float64 is not supported; supported dtypes: float32, float16, bfloat16"),
    ({"x": FakeArray((4, 3), np.int32)}, ge2jit.ArgumentValueError,
     "x: dtype int32 is not supported"),
    ({"axis": 2}, ge2jit.ArgumentValueError,
     r"axis: expected an int in \[-2, 2\) for an array of 2 dimensions, got 2"),
    ({"axis": -3}, ge2jit.ArgumentValueError, r"axis: expected an int in \[-2, 2\)"),
    ({"axis": 1.0}, ge2jit.ArgumentTypeError, "axis: expected an int, got 1.0"),
    ({"axis": True}, ge2jit.ArgumentTypeError, "axis: expected an int, got True"),
    ({"axis": None}, ge2jit.ArgumentTypeError, "axis: expected an int, got None"),
    ({"out": FakeArray((3, 4))}, ge2jit.ArgumentValueError,
     r"out: expected shape \(4, 3\) \(x's\), got \(3, 4\)"),
    ({"out": FakeArray((4, 3), np.float64)}, ge2jit.ArgumentValueError,
     "out: dtype float64 is not supported"),
    ({"out": FakeArray((4, 3), device=1)}, ge2jit.DeviceMismatchError,
     r"out: expected an array on the current device \(GPU 0\), got one on GPU 1"),
    ({"x": FakeArray((4, 3), device=1)}, ge2jit.DeviceMismatchError,
     r"x: expected an array on the current device \(GPU 0\), got one on GPU 1"),
    ({"x": FakeArray((4, 3), offset=2)}, ge2jit.ArgumentValueError,
     "x: expected a pointer aligned to its 4-byte elements"),
    ({"out": FakeArray((4, 3), np.float16, offset=1)}, ge2jit.ArgumentValueError,
     "out: expected a pointer aligned to its 2-byte elements"),
    ({"out": FakeArray((4, 3), strides=(0, 4))}, ge2jit.ArgumentValueError,
     r"out: expected an array that holds each element once, got strides \(0, 4\)"),
    ({"config": "block_1024"}, ge2jit.ArgumentValueError,
     "config: expected a softmax variant name such as"),
    ({"config": "warp32_v64_r1"}, ge2jit.ArgumentValueError, "config: values per thread"),
])
def test_bad_arguments_are_refused_in_one_line(fake, kwargs, error, match):
    args = {"x": FakeArray((4, 3))} | kwargs
    x = args.pop("x")
    with pytest.raises(error, match=match) as e:
        softmax(x, **args)
    assert "\n" not in str(e.value)
    assert not fake


def test_partial_overlap_is_refused_exact_overlap_runs_in_place(fake):
    x = FakeArray((4, 3))
    shifted = FakeArray((4, 3), base=x.base, offset=4)
    with pytest.raises(ge2jit.ArgumentValueError,
                       match=r"out: overlaps x without being x; pass out=x \(in place\) or a "
                             r"separate array \(out's bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\) meet "
                             r"x's \[0x[0-9a-f]+, 0x[0-9a-f]+\)"):
        softmax(x, out=shifted)
    transposed = FakeArray((3, 4), base=x.base).T                  # same bytes, other strides
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        softmax(x, out=transposed)
    as_half = FakeArray((4, 3), np.float16, base=x.base)          # same start, other dtype
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps x without being x"):
        softmax(x, out=as_half)
    assert not fake
    assert softmax(x, out=x) is x
    alias = FakeArray((4, 3), base=x.base)                          # another view of x
    assert softmax(x, out=alias) is alias
    apart = FakeArray((4, 3), base=x.base, offset=48)              # right after x's bytes
    assert softmax(x, out=apart) is apart
    assert len(fake) == 3


def test_valid_calls_reach_the_launch(fake):
    x = FakeArray((4, 3), np.float16)
    y = softmax(x)
    assert y.shape == (4, 3) and y.dtype == np.float16
    out = FakeArray((4, 3), np.float32)
    assert softmax(x, axis=0, out=out, config="strided_256") is out
    (axis, in_dt, out_dt, cfg, dev) = fake[-1][3:8]
    assert (axis, in_dt, out_dt, cfg.name, dev) == (0, DType.F16, DType.F32, "strided_256", 0)
    softmax(x, axis=np.int64(-1))
    assert fake[-1][3] == 1
    softmax(FakeArray(()), axis=0)                 # 0-d: one vector of one element
    softmax(FakeArray(()), axis=-1)
    with pytest.raises(ge2jit.ArgumentValueError,
                       match=r"axis: expected an int in \[-1, 1\) for an array of 0 dimensions"):
        softmax(FakeArray(()), axis=1)


def test_empty_arrays_launch_nothing(fake):
    for shape, axis in [((0, 5), -1), ((5, 0), -1), ((0,), 0), ((3, 0, 4), 1), ((3, 0, 4), 0)]:
        y = softmax(FakeArray(shape), axis=axis)
        assert y.shape == shape
        out = FakeArray(shape, np.float16)
        assert softmax(FakeArray(shape), axis=axis, out=out, config="loop_256") is out
    assert not fake


def test_config_objects_are_accepted(fake):
    cfg = SoftmaxConfig("block", 256, vpt=16)
    softmax(FakeArray((4, 3)), config=cfg)
    assert fake[-1][6] is cfg


# ---- the warm-up table (ops/softmax/warmup.py)

def test_warmup_entries_expand_to_the_heuristic_kernels():
    from ge2jit.ops.softmax import warmup

    entry = warmup.validate_entry({"dtypes": ["bfloat16", "float32"], "lengths": [128, 50000],
                                   "strided": [False, True]})
    specs = warmup.expand(entry, "sm_90", sms=132)
    names = [s.kernel_name for s in specs]
    assert "softmax_warp16_v8_r1_t128_x8_bf16_bf16" in names
    assert "softmax_warp16_v8_r2_t128_x8_bf16_bf16" in names
    assert "softmax_warp32_v4_r4_t128_x4_f32_f32" in names
    assert "softmax_loop1024_v32_x8_bf16_bf16" in names
    assert "softmax_strided256_v4_x1_f32_f32" in names
    assert len(names) == len(set(names))
    # every kernel the call would take on aligned rows of these lengths is among them
    for dt in ("bfloat16", "float32"):
        for n in (128, 50000):
            for rows in (1, 1000, 10**6):
                assert choose(rows, n, dt, 132).spec in specs
    pinned = warmup.expand(warmup.validate_entry(
        {"lengths": [100, 5000], "configs": ["block_256_v32", "warp32_v4_r1"],
         "out_dtypes": ["bfloat16"]}), "sm_80")
    assert [s.kernel_name for s in pinned] == ["softmax_block256_v32_x4_f32_bf16",
                                               "softmax_warp32_v4_r1_t128_x4_f32_bf16"]
    every = warmup.expand(warmup.validate_entry({"lengths": [1000], "configs": "all"}), "sm_90")
    assert {s.config for s in every} == {c for c in all_configs() if c.fits(1000, False)}


@pytest.mark.parametrize("entry, match", [
    ({}, "lengths: expected a non-empty list of row lengths"),
    ({"lengths": [0]}, "lengths: expected"),
    ({"lengths": [True]}, "lengths: expected"),
    ({"lengths": [5], "dtypes": ["float64"]}, "dtypes: expected a list of"),
    ({"lengths": [5], "out_dtypes": "same"}, "out_dtypes: expected a list of"),
    ({"lengths": [5], "configs": "fast"}, "configs: expected 'heuristic', 'all' or a list"),
    ({"lengths": [5], "configs": ["block_1000_v8"]}, "config: threads"),
    ({"lengths": [5], "strided": [1]}, "strided: expected a list of booleans"),
    ({"lengths": [5], "rows": [5]}, "rows: unknown key"),
])
def test_bad_warmup_entries_are_refused(entry, match):
    from ge2jit.ops.softmax import warmup

    with pytest.raises(ge2jit.ArgumentValueError, match=match):
        warmup.validate_entry(entry)
