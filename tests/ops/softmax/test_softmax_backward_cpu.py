"""softmax_backward without a GPU: the backward's configs (those that hold at most 16 values
of each of dy and y per thread), its heuristic and candidates, its warm-up table, every
argument check (stand-in arrays, ``tests/fake_cupy.py``), and the float64 reference against
finite differences of the forward's. (Its kernels' compile tests are the forward's, in
``test_softmax_cpu.py``.)"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.softmax import op as softmax_op
from ge2jit.ops.softmax import softmax_backward
from ge2jit.ops.softmax import spec as sm
from ge2jit.ops.softmax.reference import softmax_backward_ref, softmax_ref
from ge2jit.runtime.dtypes import FLOAT_DTYPES, DType

from ...fake_cupy import FakeArray

PAIRS = [(DType.F32, DType.F32), (DType.BF16, DType.BF16), (DType.F16, DType.F16),
         (DType.F32, DType.BF16), (DType.BF16, DType.F32), (DType.F16, DType.BF16)]
LENGTHS = sorted({1, 2, 3, 5, 31, 32, 33, 127, 128, 129, 256, 257, 511, 512, 513, 1000, 1024,
                  1025, 4096, 4097, 12345, 16384, 16385, 32768, 32769, 131072})
ROW_COUNTS = [1, 7, 1000, 100_000]


# ---- configs and the heuristic

def test_backward_configs_hold_at_most_32_values():
    forward, backward = sm.all_configs(), sm.all_configs(backward=True)
    assert set(backward) < set(forward)
    dropped = {c.name for c in forward} - {c.name for c in backward}
    assert {"block_1024_v32", "warp32_v32_r1", "warp32_v16_r2", "warp8_v4_r4"} & dropped == {
        "block_1024_v32", "warp32_v32_r1", "warp32_v16_r2"}
    assert all(c.held(True) <= 32 for c in backward)
    assert {c.variant for c in backward} == {"warp", "block", "loop", "strided"}


def test_forward_only_configs_are_refused_in_one_line():
    for name in ("block_1024_v32", "warp32_v32_r1", "warp8_v8_r4"):
        with pytest.raises(ge2jit.ArgumentValueError,
                           match=rf"config: {name} would hold \d+ values per thread in the "
                                 "backward \\(dy's and y's\\); at most 32") as e:
            sm.choose(10, 60, "float32", config=name, backward=True)
        assert "\n" not in str(e.value)
        with pytest.raises(ge2jit.ArgumentValueError, match="would hold"):
            sm.make_spec(sm.parse_config(name), "float32", backward=True)
        sm.choose(10, 60, "float32", config=name)     # the forward takes them
    with pytest.raises(ge2jit.ArgumentValueError,
                       match="config: warp32_v16_r1 holds rows of at most 512 elements, got "
                             "rows of 513"):
        sm.choose(10, 513, "float32", config="warp32_v16_r1", backward=True)


@pytest.mark.parametrize("n, variant", [(1, "warp"), (33, "warp"), (512, "warp"),
                                        (513, "block"), (16384, "block"), (16385, "loop"),
                                        (10**7, "loop")])
def test_heuristic_variant_by_length(n, variant):
    for dt in FLOAT_DTYPES:
        assert sm.heuristic(1000, n, dt, backward=True).variant == variant
    assert sm.heuristic(1000, n, DType.F32, strided=True, backward=True).name == "strided_256"


def test_heuristic_shapes():
    assert sm.heuristic(10**6, 128, DType.F32, backward=True).name == "warp32_v4_r4"
    assert sm.heuristic(10**6, 128, DType.BF16, backward=True).name == "warp16_v8_r2"
    assert sm.heuristic(10**6, 500, DType.F32, backward=True).name == "warp32_v16_r1"
    assert sm.heuristic(1000, 8192, DType.F32, backward=True).name == "block_512_v16"
    assert sm.heuristic(1000, 16384, DType.BF16, backward=True).name == "block_1024_v16"
    assert sm.choose(3, 10**6, DType.BF16, backward=True).spec.vpt == 16
    assert sm.choose(3, 10**6, DType.F32, backward=True).spec.vpt == 8
    assert sm.choose(3, 10**6, DType.BF16, max_vec=1, backward=True).spec.vpt == 8


@pytest.mark.parametrize("in_dt, out_dt", PAIRS, ids=str)
def test_heuristic_choices_fit_and_are_candidates(in_dt, out_dt):
    width = sm.access_width(in_dt, out_dt)
    for n, rows in itertools.product(LENGTHS, ROW_COUNTS):
        c = sm.choose(rows, n, in_dt, 132, out_dtype=out_dt, backward=True)
        cfg = c.config
        assert cfg.fits(n, False, True), (n, cfg)
        assert cfg in sm.candidates(n, in_dt, out_dt, backward=True), (n, cfg)
        assert c.spec.backward and c.spec.kernel_name.startswith("softmax_backward_")
        assert c.spec.vec == min(width, c.spec.vpt)
        per_block = (c.block[0] // cfg.lanes * cfg.rows) if cfg.variant == "warp" else 1
        assert c.grid[0] * per_block >= rows and (c.grid[0] - 1) * per_block < rows
    assert all(c.held(True) <= 32 for n in LENGTHS for c in sm.candidates(n, in_dt, backward=True))


def test_spec_parameters_name_each_array():
    spec = sm.make_spec(sm.parse_config("loop_256"), "bfloat16", "float32", backward=True)
    names = [p.name for p in spec.params]
    assert names == ["dy", "y", "dx", "rows", "n", "inner", "dyo", "dyn", "dyi", "yo", "yn",
                     "yi", "dxo", "dxn", "dxi"]
    assert spec.kernel_name == "softmax_backward_loop256_v8_x4_bf16_f32"
    fwd = sm.make_spec(sm.parse_config("loop_256"), "bfloat16", "float32")
    assert [p.name for p in fwd.params] == ["x", "y", "rows", "n", "inner", "xo", "xn", "xi",
                                            "yo", "yn", "yi"]
    specs = {sm.make_spec(c, i, o, v, backward=b) for b in (False, True)
             for c in sm.all_configs(b) for i, o in PAIRS for v in (1, 2, 4, 8)}
    assert len({s.kernel_name for s in specs}) == len(specs)


# ---- argument checks, on stand-in arrays

@pytest.mark.parametrize("kwargs, error, match", [
    ({"dy": np.zeros((4, 3), np.float32)}, ge2jit.ArgumentTypeError,
     r"dy: expected a GPU array .*numpy.ndarray of shape \(4, 3\)"),
    ({"y": [1.0]}, ge2jit.ArgumentTypeError, "y: expected a GPU array .*, got list"),
    ({"dy": FakeArray((4, 3), np.float64)}, ge2jit.ArgumentValueError,
     "dy: dtype float64 is not supported"),
    ({"y": FakeArray((4, 3), np.int32)}, ge2jit.ArgumentValueError,
     "y: dtype int32 is not supported"),
    ({"y": FakeArray((3, 4))}, ge2jit.ArgumentValueError,
     r"y: expected shape \(4, 3\) \(dy's\), got \(3, 4\)"),
    ({"y": FakeArray((4, 3), np.float16)}, ge2jit.ArgumentValueError,
     r"y: expected dtype float32 \(dy's\), got float16"),
    ({"axis": 2}, ge2jit.ArgumentValueError, r"axis: expected an int in \[-2, 2\)"),
    ({"out": FakeArray((4, 4))}, ge2jit.ArgumentValueError,
     r"out: expected shape \(4, 3\) \(dy's\), got \(4, 4\)"),
    ({"out": FakeArray((4, 3), strides=(0, 4))}, ge2jit.ArgumentValueError,
     "out: expected an array that holds each element once"),
    ({"y": FakeArray((4, 3), device=1)}, ge2jit.DeviceMismatchError,
     r"y: expected an array on the current device \(GPU 0\), got one on GPU 1"),
    ({"y": FakeArray((4, 3), offset=2)}, ge2jit.ArgumentValueError,
     "y: expected a pointer aligned to its 4-byte elements"),
    ({"config": "block_1024_v32"}, ge2jit.ArgumentValueError,
     "config: block_1024_v32 would hold 64 values per thread in the backward"),
])
def test_bad_arguments_are_refused_in_one_line(fake, kwargs, error, match):
    args = {"dy": FakeArray((4, 3)), "y": FakeArray((4, 3))} | kwargs
    dy, y = args.pop("dy"), args.pop("y")
    with pytest.raises(error, match=match) as e:
        softmax_backward(dy, y, **args)
    assert "\n" not in str(e.value)
    assert not fake


def test_in_place_with_dy_or_y_and_partial_overlaps(fake):
    dy, y = FakeArray((4, 3)), FakeArray((4, 3))
    assert softmax_backward(dy, y, out=dy) is dy
    assert softmax_backward(dy, y, out=y) is y
    assert softmax_backward(dy, dy) is not dy          # dy and y may be one array (both read)
    shifted = FakeArray((4, 3), base=y.base, offset=4)
    with pytest.raises(ge2jit.ArgumentValueError,
                       match=r"out: overlaps y without being y; pass out=y \(in place\) or a "
                             r"separate array \(out's bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\) meet y's"):
        softmax_backward(dy, y, out=shifted)
    as_half = FakeArray((4, 3), np.float16, base=dy.base)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps dy without being dy"):
        softmax_backward(dy, y, out=as_half)
    assert len(fake) == 3
    _, ins, out, axis, in_dt, out_dt, cfg, *_, kind = fake[0]
    assert kind is softmax_op.BACKWARD and ins == [dy, y] and out is dy
    assert (axis, in_dt, out_dt, cfg) == (1, DType.F32, DType.F32, None)


def test_valid_calls_reach_the_launch(fake):
    dy, y = FakeArray((2, 5, 7), np.float16), FakeArray((2, 5, 7), np.float16)
    r = softmax_backward(dy, y, axis=1)
    assert r.shape == (2, 5, 7) and r.dtype == np.float16
    out = FakeArray((2, 5, 7), np.float32)
    assert softmax_backward(dy, y, 0, out=out, config="strided_128") is out
    assert fake[-1][3:7] == (0, DType.F16, DType.F32, sm.parse_config("strided_128"))
    for shape in [(0, 5), (5, 0), (0,)]:                # empty: no launch
        assert softmax_backward(FakeArray(shape), FakeArray(shape)).shape == shape
    assert len(fake) == 2


# ---- the warm-up table

def test_backward_warmup_table():
    from ge2jit.ops.softmax import warmup

    table = warmup.BACKWARD
    entry = table.validate_entry({"dtypes": ["bfloat16"], "lengths": [128, 1000, 50000],
                                  "strided": [True, False]})
    names = [s.kernel_name for s in table.expand(entry, "sm_90", sms=132)]
    assert all(n.startswith("softmax_backward_") for n in names)
    assert "softmax_backward_block128_v16_x8_bf16_bf16" in names
    assert "softmax_backward_loop1024_v16_x8_bf16_bf16" in names
    assert "softmax_backward_strided256_v4_x1_bf16_bf16" in names
    for n in (128, 1000, 50000):
        for rows in (1, 1000, 10**6):
            assert sm.choose(rows, n, "bfloat16", 132, backward=True).spec in table.expand(
                entry, "sm_90", sms=132)
    every = table.expand(table.validate_entry({"lengths": [100], "configs": "all"}), "sm_80")
    assert {s.config for s in every} == {c for c in sm.all_configs(True)
                                         if c.fits(100, False, True)}
    with pytest.raises(ge2jit.ArgumentValueError, match="config: block_1024_v32 would hold"):
        table.validate_entry({"lengths": [100], "configs": ["block_1024_v32"]})
    warmup.FORWARD.validate_entry({"lengths": [100], "configs": ["block_1024_v32"]})


# ---- the float64 reference

@pytest.mark.parametrize("shape, axis", [((3, 7), -1), ((4, 5, 6), 1), ((9,), 0), ((2, 3), 0)])
def test_backward_reference_matches_finite_differences(shape, axis):
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(shape) * 2, rng.standard_normal(shape)

    def loss(x_):
        return float((w * softmax_ref(x_, axis)).sum())

    grad = softmax_backward_ref(w, softmax_ref(x, axis), axis)
    h = 1e-6
    for idx in np.ndindex(*shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        fd = (loss(up) - loss(down)) / (2 * h)
        assert abs(fd - grad[idx]) <= 1e-7 * max(1.0, abs(fd)), (idx, fd, grad[idx])


def test_reference_special_values():
    y = softmax_ref(np.array([[0.0, -np.inf, 1.0], [np.nan, 0.0, 0.0], [-np.inf] * 3]))
    assert y[0, 1] == 0.0 and np.isnan(y[1:]).all()
    dx = softmax_backward_ref(np.array([[1.0, np.nan, 0.0], [np.inf, 0.0, 0.0]]),
                              np.array([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]))
    assert np.isnan(dx[0]).all() and np.isnan(dx[1, 0]) and (dx[1, 1:] == -np.inf).all()
