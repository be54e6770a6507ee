"""cross_entropy without a GPU: the config names, the heuristic and the candidates, which
kernels a call runs, every kernel variant compiling for sm_80 and sm_90 without spilling or
stack, every argument check (stand-in arrays, ``tests/fake_cupy.py``), the warm-up table, and
the float64 reference: its gradient against central finite differences of its loss, and
PyTorch's semantics (ignored rows, the mean of nothing, label smoothing)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.cross_entropy import (
    XentConfig,
    XentSpec,
    all_configs,
    candidates,
    choose,
    cross_entropy,
    heuristic,
    kernels,
    parse_config,
    scale_gradient,
    scale_spec,
)
from ge2jit.ops.cross_entropy import op as xent_op
from ge2jit.ops.cross_entropy.reference import (
    count,
    cross_entropy_grad_ref,
    cross_entropy_ref,
    row_losses,
)
from ge2jit.runtime import arrays, checks
from ge2jit.runtime.dtypes import FLOAT_DTYPES, DType

from ...fake_cupy import FakeArray, make_module
from ...kernel_checks import check_clean_build

ARCHS = ["sm_80", "sm_90"]
#: the class counts of the GPU tests and the benchmark, and the heuristic's edges
CLASSES = [1, 31, 33, 1000, 2048, 2049, 4097, 8192, 8193, 32000, 32768, 32769, 128256,
           262144, 2**31 + 7]


# ---- configs and the heuristic

def test_config_names_round_trip():
    configs = all_configs()
    assert [c.name for c in configs] == ["warp", "block_128", "block_256", "block_512",
                                         "block_1024"]
    for c in configs:
        assert parse_config(c.name) == c and parse_config(c) is c and str(c) == c.name
    assert parse_config("warp").rows_per_block == 4
    assert parse_config("block_256").rows_per_block == 1


@pytest.mark.parametrize("name, match", [
    ("", "expected a cross_entropy config name such as 'warp'"),
    ("warp_128", "expected a cross_entropy config name"),
    ("block", "expected a cross_entropy config name"),
    ("Block_256", "expected a cross_entropy config name"),
    ("block_300", "config: block threads must be one of 128, 256, 512, 1024, got 300"),
    ("block_2048", "config: block threads must be one of"),
    (256, "expected a cross_entropy config name such as"),
    (None, "expected a cross_entropy config name such as"),
])
def test_bad_config_names_are_refused_in_one_line(name, match):
    with pytest.raises(ge2jit.ArgumentValueError, match=match) as e:
        parse_config(name)
    assert str(e.value).startswith("config: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("n, name", [(1, "warp"), (2048, "warp"), (2049, "block_256"),
                                     (8192, "block_256"), (8193, "block_512"),
                                     (32768, "block_512"), (32769, "block_1024"),
                                     (262144, "block_1024"), (2**40, "block_1024")])
def test_heuristic_by_class_count(n, name):
    for dt in FLOAT_DTYPES:
        assert heuristic(n, dt).name == name
        assert heuristic(n, dt) in candidates(n)


def test_candidates():
    assert [c.name for c in candidates(100)] == [c.name for c in all_configs()]
    assert "warp" not in [c.name for c in candidates(262144)]
    assert all(heuristic(n) in candidates(n) for n in CLASSES)


@pytest.mark.parametrize("reduction, grad, check, want", [
    ("mean", None, False, ("targets", "reduce")),
    ("mean", "float32", False, ("targets", "reduce")),
    ("sum", None, False, ("reduce",)),
    ("sum", None, True, ("targets", "reduce")),
    ("none", "bfloat16", False, ()),
    ("none", None, True, ("targets",)),
])
def test_the_kernels_a_call_runs(reduction, grad, check, want):
    ks = choose(100, 50000, "bfloat16", "int32", grad, reduction=reduction, check=check)
    assert ks.rows.variant == "block" and ks.rows.threads == 1024
    assert ks.grid == (100, 1, 1) and ks.block == (1024, 1, 1)
    assert tuple(n for n in ("targets", "reduce") if getattr(ks, n) is not None) == want
    assert ks.specs[0] is ks.rows
    assert ks.rows.mean == (reduction == "mean" and grad is not None)
    if ks.reduce is not None:
        assert ks.reduce.mean == (reduction == "mean")
    assert ks.targets is None or ks.targets.target_dtype == "int32"


def test_launch_shapes_and_access_widths():
    ks = choose(1001, 100, "float32")                      # a warp per row, 4 rows a block
    assert ks.grid == (251, 1, 1) and ks.block == (128, 1, 1)
    assert choose(2**33, 50000, "float32").grid == (2**31 - 1, 1, 1)    # the kernel loops
    assert choose(0, 10, "float32").grid == (1, 1, 1)
    assert choose(5, 100, "bfloat16").rows.vec == 8
    assert choose(5, 100, "bfloat16").rows.vpt == 32
    assert choose(5, 100, "bfloat16", grad_dtype="float32").rows.vec == 4
    assert choose(5, 100, "float16", max_vec=1).rows.vec == 1
    assert choose(5, 100, "float16", max_vec=1).rows.vpt == 8
    assert choose(5, 100, "float32", smoothing=True).rows.smoothing


def test_kernel_names_and_parameters():
    s = choose(7, 128256, "bfloat16", "int64", "bfloat16", reduction="mean",
               smoothing=True).rows
    assert s.kernel_name == "cross_entropy_block1024_v32_x8_bf16_t64_gbf16_ls_mean"
    assert [p.name for p in s.params] == ["logits", "targets", "grad", "losses", "ws", "rows",
                                          "n", "ld", "gld", "ts", "ignore_index", "smoothing",
                                          "grad_scale"]
    assert "__restrict__" not in s.params[0].ctype and "__restrict__" not in s.params[2].ctype
    specs = {spec for c, d, t, g, r, sm, ck, v in itertools.product(
        all_configs(), FLOAT_DTYPES, ("int32", "int64"), (None, DType.F32, DType.BF16),
        ("none", "sum", "mean"), (False, True), (False, True), (1, 8))
        for spec in kernels(c, 3, d, t, g, reduction=r, smoothing=sm, check=ck,
                            max_vec=v).specs}
    assert len({s.kernel_name for s in specs}) == len(specs)
    with pytest.raises(ge2jit.ArgumentValueError, match="XentSpec.mean"):
        XentSpec(DType.F32, "int64", None, "warp", 128, 16, 4, mean=True)
    with pytest.raises(ge2jit.ArgumentValueError, match="XentSpec.vec"):
        XentSpec(DType.F32, "int64", DType.F32, "warp", 128, 16, 8)
    with pytest.raises(ge2jit.ArgumentValueError, match="target_dtype"):
        XentSpec(DType.F32, "int16", None, "warp", 128, 16, 4)
    with pytest.raises(ge2jit.ArgumentValueError, match="reduction: expected one of"):
        choose(3, 10, "float32", reduction="avg")


# ---- compiles (no GPU): zero spills, zero stack

def _compile_cases():
    """Every config x logits type x gradient (none, the logits' type, float32) x smoothing,
    with int64 indices, the mean and 16-byte accesses; the gradient of a sum (no division)
    with and without smoothing; int32 indices, the sum and the loss alone on each config;
    single-element accesses (unaligned rows) of every 16-bit case; the targets, reduce and
    scale kernels."""
    specs = set()
    for c, d, g, sm in itertools.product(all_configs(), FLOAT_DTYPES, ("none", "same", "f32"),
                                         (False, True)):
        grad = {"none": None, "same": d, "f32": DType.F32}[g]
        specs.update(kernels(c, 3, d, "int64", grad, reduction="mean", smoothing=sm).specs)
        if d is not DType.F32:
            specs.update(kernels(c, 3, d, "int64", grad, reduction="mean", smoothing=sm,
                                 max_vec=1).specs)
    for c, sm in itertools.product(all_configs(), (False, True)):
        specs.update(kernels(c, 3, DType.F32, "int64", DType.F32, reduction="sum",
                             smoothing=sm).specs)
    for d, v in itertools.product(FLOAT_DTYPES, (1, 2, 8)):
        specs.add(scale_spec(d, v))
    for c in all_configs():
        specs.update(kernels(c, 3, DType.F16, "int32", None, reduction="sum").specs)
        specs.update(kernels(c, 3, DType.BF16, "int32", DType.BF16, reduction="none",
                             check=False).specs)
    return sorted(specs, key=lambda s: s.kernel_name)


CASES = _compile_cases()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.kernel_name)
def test_compiles_without_spills(spec, arch, compile_cache):
    # 64 registers: the launch bounds of the rows kernels (1024 threads per multiprocessor);
    # shared memory: three 32-float buffers (rows), 32 doubles (reduce) or 2 x 32 int64
    check_clean_build(spec, arch, compile_cache, max_shared=512)


def test_compile_cases_cover_every_template_and_flag():
    assert {s.template for s in CASES} == {"cross_entropy/cross_entropy.cu",
                                           "cross_entropy/targets.cu", "cross_entropy/reduce.cu",
                                           "cross_entropy/scale.cu"}
    rows = [s for s in CASES if isinstance(s, XentSpec)]
    assert {(s.smoothing, s.mean, s.grad_dtype is None, s.target_dtype) for s in rows} >= {
        (a, b, c, "int64") for a in (False, True) for b in (False, True) for c in (False,)}
    assert {s.vec for s in rows} == {1, 4, 8}


# ---- argument checks, on stand-in arrays

@pytest.fixture
def fake(monkeypatch):
    module = make_module(0)
    monkeypatch.setattr(checks, "_cupy", lambda: module)
    monkeypatch.setattr(arrays, "_cupy_mod", module)     # stand-ins are CuPy arrays
    monkeypatch.setattr(arrays, "current_device", lambda: 0)
    runs = []

    def decide(prob, logits, grad_ptr, grad_row):
        return choose(prob.rows, prob.n, prob.dtype, prob.target_dtype, prob.grad_dtype,
                      reduction=prob.reduction, smoothing=prob.smoothing > 0,
                      check=prob.check, config=prob.config), "heuristic"

    def runner(fw, device_id, prob, ks, ld, gld, ts):
        def run(lp, tp, gp, loss, scale):
            runs.append({"prob": prob, "kernels": ks, "ld": ld, "gld": gld, "ts": ts,
                         "logits": lp, "targets": tp, "grad": gp, "loss": loss,
                         "scale": scale})
        return run

    monkeypatch.setattr(xent_op, "decide", decide)
    monkeypatch.setattr(xent_op, "_runner", runner)
    xent_op._prepared.clear()
    yield runs
    xent_op._prepared.clear()


def _args(**kw):
    args = {"logits": FakeArray((4, 10)), "targets": FakeArray((4,), np.int64)}
    args.update(kw)
    return args.pop("logits"), args.pop("targets"), args


@pytest.mark.parametrize("kwargs, error, match", [
    ({"logits": np.zeros((4, 10), np.float32)}, ge2jit.ArgumentTypeError,
     r"logits: expected a GPU array .*numpy.ndarray of shape \(4, 10\); move it"),
    ({"targets": [1, 2, 3, 4]}, ge2jit.ArgumentTypeError,
     "targets: expected a GPU array .*, got list"),
    ({"logits": FakeArray((4, 10), np.float64)}, ge2jit.ArgumentValueError,
     "logits: dtype float64 is not supported; supported dtypes: float32, float16, bfloat16"),
    ({"logits": FakeArray((4, 10), np.int32)}, ge2jit.ArgumentValueError,
     "logits: dtype int32 is not supported"),
    ({"logits": FakeArray((40,))}, ge2jit.ArgumentValueError,
     r"logits: expected a 2-D array \(rows, classes\), got shape \(40,\)"),
    ({"logits": FakeArray((2, 2, 10))}, ge2jit.ArgumentValueError,
     r"logits: expected a 2-D array \(rows, classes\), got shape \(2, 2, 10\)"),
    ({"logits": FakeArray((4, 0))}, ge2jit.ArgumentValueError,
     r"logits: expected at least one class, got shape \(4, 0\)"),
    ({"targets": FakeArray((5,), np.int64)}, ge2jit.ArgumentValueError,
     r"targets: expected shape \(4,\) \(one class index per row of logits\), got \(5,\)"),
    ({"targets": FakeArray((4, 1), np.int64)}, ge2jit.ArgumentValueError,
     r"targets: expected shape \(4,\) .*got \(4, 1\)"),
    ({"targets": FakeArray((4,), np.float32)}, ge2jit.ArgumentValueError,
     "targets: expected dtype int32 or int64, got float32"),
    ({"targets": FakeArray((4,), np.int16)}, ge2jit.ArgumentValueError,
     "targets: expected dtype int32 or int64, got int16"),
    ({"targets": FakeArray((4,), np.uint8)}, ge2jit.ArgumentValueError,
     "targets: expected dtype int32 or int64, got uint8"),
    ({"reduction": "avg"}, ge2jit.ArgumentValueError,
     "reduction: expected one of 'none', 'sum', 'mean', got 'avg'"),
    ({"reduction": None}, ge2jit.ArgumentValueError, "reduction: expected one of"),
    ({"reduction": "Mean"}, ge2jit.ArgumentValueError, "reduction: expected one of"),
    ({"label_smoothing": 1.5}, ge2jit.ArgumentValueError,
     r"label_smoothing: expected a number in \[0, 1\], got 1.5"),
    ({"label_smoothing": -0.1}, ge2jit.ArgumentValueError,
     r"label_smoothing: expected a number in \[0, 1\], got -0.1"),
    ({"label_smoothing": float("nan")}, ge2jit.ArgumentValueError,
     r"label_smoothing: expected a number in \[0, 1\], got nan"),
    ({"label_smoothing": "0.1"}, ge2jit.ArgumentTypeError,
     "label_smoothing: expected a real number, got '0.1'"),
    ({"ignore_index": 1.5}, ge2jit.ArgumentTypeError, "ignore_index: expected an int, got 1.5"),
    ({"ignore_index": True}, ge2jit.ArgumentTypeError, "ignore_index: expected an int"),
    ({"ignore_index": 2**63}, ge2jit.ArgumentValueError,
     "ignore_index: expected a 64-bit integer"),
    ({"grad": 1}, ge2jit.ArgumentTypeError, "grad: expected True or False, got 1"),
    ({"inplace": "yes"}, ge2jit.ArgumentTypeError, "inplace: expected True or False"),
    ({"check_targets": None}, ge2jit.ArgumentTypeError, "check_targets: expected True or"),
    ({"grad_scale": 2.0}, ge2jit.ArgumentValueError,
     "grad_scale: applies to the gradient; pass grad=True, or leave grad_scale out"),
    ({"out": FakeArray((4, 10))}, ge2jit.ArgumentValueError,
     "out: applies to the gradient; pass grad=True"),
    ({"inplace": True}, ge2jit.ArgumentValueError,
     "inplace: writes the gradient over logits; pass grad=True"),
    ({"grad": True, "grad_scale": "2"}, ge2jit.ArgumentTypeError,
     "grad_scale: expected a real number, got '2'"),
    ({"grad": True, "out": FakeArray((4, 11))}, ge2jit.ArgumentValueError,
     r"out: expected shape \(4, 10\) \(logits'\), got \(4, 11\)"),
    ({"grad": True, "out": FakeArray((4, 10), np.float64)}, ge2jit.ArgumentValueError,
     "out: dtype float64 is not supported"),
    ({"grad": True, "out": FakeArray((4, 10), strides=(4, 16))}, ge2jit.ArgumentValueError,
     r"out: expected rows along a unit-stride last axis, got strides \(4, 16\)"),
    ({"grad": True, "out": FakeArray((4, 10), strides=(0, 4))}, ge2jit.ArgumentValueError,
     "out: expected an array that holds each element once"),
    ({"grad": True, "out": FakeArray((4, 10), strides=(20, 4))}, ge2jit.ArgumentValueError,
     r"out: expected rows that do not overlap \(a row stride of at least 10 elements\)"),
    ({"grad": True, "out": FakeArray((4, 10), device=1)}, ge2jit.DeviceMismatchError,
     r"out: expected an array on the current device \(GPU 0\), got one on GPU 1"),
    ({"targets": FakeArray((4,), np.int64, device=1)}, ge2jit.DeviceMismatchError,
     "targets: expected an array on the current device"),
    ({"logits": FakeArray((4, 10), offset=2)}, ge2jit.ArgumentValueError,
     "logits: expected a pointer aligned to its 4-byte elements"),
    ({"targets": FakeArray((4,), np.int64, offset=4)}, ge2jit.ArgumentValueError,
     "targets: expected a pointer aligned to its 8-byte elements"),
    ({"grad": True, "inplace": True, "logits": FakeArray((4, 10), strides=(4, 16))},
     ge2jit.ArgumentValueError, "logits: expected rows along a unit-stride last axis"),
    ({"grad": True, "inplace": True, "out": FakeArray((4, 10))}, ge2jit.ArgumentValueError,
     r"out: inplace=True writes the gradient over logits; pass out=None \(or out=logits\)"),
    ({"config": "block_100"}, ge2jit.ArgumentValueError, "config: block threads must be"),
    ({"config": "fast"}, ge2jit.ArgumentValueError, "config: expected a cross_entropy config"),
])
def test_bad_arguments_are_refused_in_one_line(fake, kwargs, error, match):
    logits, targets, kw = _args(**kwargs)
    with pytest.raises(error, match=match) as e:
        cross_entropy(logits, targets, **kw)
    assert "\n" not in str(e.value)
    assert not fake


def test_overlapping_out_is_refused_and_out_logits_is_in_place(fake):
    logits, targets, _ = _args()
    shifted = FakeArray((4, 10), base=logits.base, offset=4)
    with pytest.raises(ge2jit.ArgumentValueError,
                       match=r"out: overlaps logits without being logits; pass out=logits .*"
                             r"out's bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\) meet logits's"):
        cross_entropy(logits, targets, grad=True, out=shifted)
    into_targets = FakeArray((1, 4), np.float32, base=targets.base)
    with pytest.raises(ge2jit.ArgumentValueError, match="out: overlaps targets"):
        cross_entropy(FakeArray((1, 4)), FakeArray((1,), np.int64, base=targets.base),
                      grad=True, out=into_targets)
    assert not fake
    loss, g = cross_entropy(logits, targets, grad=True, out=logits)
    assert g is logits and fake[-1]["prob"].inplace and fake[-1]["grad"] == logits.data.ptr
    loss, g = cross_entropy(logits, targets, grad=True, inplace=True, grad_scale=0.5)
    assert g is logits and fake[-1]["scale"] == 0.5
    assert cross_entropy(logits, targets, grad=True, inplace=True, out=logits)[1] is logits


def test_valid_calls_reach_the_launch(fake):
    logits = FakeArray((6, 1000), np.float16)
    targets = FakeArray((6,), np.int32)
    loss = cross_entropy(logits, targets)
    assert loss.shape == () and loss.dtype == np.float32
    r = fake[-1]
    prob = r["prob"]
    assert (prob.rows, prob.n, prob.dtype, prob.target_dtype, prob.grad_dtype) == (
        6, 1000, DType.F16, "int32", None)
    assert (prob.reduction, prob.ignore_index, prob.smoothing, prob.check) == (
        "mean", -100, 0.0, True)
    assert (r["ld"], r["ts"], r["grad"], r["scale"]) == (1000, 1, 0, 1.0)
    losses = cross_entropy(logits, targets, reduction="none", label_smoothing=0.1,
                           ignore_index=np.int64(3), check_targets=False)
    assert losses.shape == (6,) and fake[-1]["prob"].ignore_index == 3
    assert fake[-1]["prob"].smoothing == 0.1 and not fake[-1]["prob"].check
    loss, g = cross_entropy(logits, targets, grad=True, reduction="sum", grad_scale=3)
    assert g.shape == (6, 1000) and g.dtype == np.float16 and fake[-1]["scale"] == 3.0
    assert fake[-1]["gld"] == 1000 and fake[-1]["grad"] == g.data.ptr
    out = FakeArray((6, 1000), np.float32)
    loss, g = cross_entropy(logits, targets, grad=True, out=out, config="block_256")
    assert g is out and fake[-1]["prob"].grad_dtype is DType.F32
    assert fake[-1]["kernels"].rows.threads == 256
    wide = FakeArray((6, 1200), np.float16)                       # rows of a wider array
    view = FakeArray((6, 1000), np.float16, strides=(2400, 2), base=wide.base)
    cross_entropy(view, FakeArray((6,), np.int64, strides=(16,)))   # every other index
    assert fake[-1]["ld"] == 1200 and fake[-1]["ts"] == 2
    cross_entropy(logits, targets, config=XentConfig("warp", 128))
    assert fake[-1]["kernels"].rows.variant == "warp"


def test_prepared_calls_take_the_per_call_scale_and_check_it(fake):
    logits, targets, _ = _args()
    for scale in (None, 2.0, 0.25, np.float32(4.0)):
        cross_entropy(logits, targets, grad=True, grad_scale=scale)
        assert fake[-1]["scale"] == (1.0 if scale is None else float(scale))
    assert len(xent_op._prepared) == 2          # grad_scale None, and a number
    with pytest.raises(ge2jit.ArgumentTypeError, match="grad_scale: expected a real number"):
        cross_entropy(logits, targets, grad=True, grad_scale="x")


def test_a_strided_class_axis_is_copied(fake):
    logits = FakeArray((4, 10), strides=(80, 8))
    _, targets, _ = _args()
    cross_entropy(logits, targets)
    assert fake[-1]["logits"] != logits.data.ptr and fake[-1]["ld"] == 10
    assert not xent_op._prepared                  # a copy: not prepared


def test_empty_rows(fake):
    loss = cross_entropy(FakeArray((0, 10)), FakeArray((0,), np.int64), reduction="none")
    assert loss.shape == (0,)
    loss, g = cross_entropy(FakeArray((0, 10)), FakeArray((0,), np.int64), grad=True)
    assert loss.shape == () and g.shape == (0, 10)


@pytest.mark.parametrize("grad, factor, match", [
    (FakeArray((4, 10), np.float64), FakeArray(()), "grad: dtype float64 is not supported"),
    (FakeArray((40,)), FakeArray(()), r"grad: expected a 2-D array \(rows, classes\)"),
    (FakeArray((4, 10), strides=(80, 8)), FakeArray(()),
     "grad: expected rows along a unit-stride last axis"),
    (FakeArray((4, 10)), FakeArray((), np.float16),
     r"factor: expected a float32 array of shape \(\), \(1,\) or \(4,\), got float16"),
    (FakeArray((4, 10)), FakeArray((5,)), r"factor: expected a float32 array .* shape \(5,\)"),
    (FakeArray((4, 10)), np.float32(2.0), "factor: expected a GPU array"),
])
def test_scale_gradient_checks_its_arguments(fake, grad, factor, match):
    with pytest.raises((ge2jit.ArgumentValueError, ge2jit.ArgumentTypeError), match=match):
        scale_gradient(grad, factor)


def test_scale_kernels():
    assert scale_spec("bfloat16").kernel_name == "cross_entropy_scale_x8_bf16"
    assert scale_spec(DType.F32).vec == 4 and scale_spec(DType.F32, 1).vec == 1
    assert [p.name for p in scale_spec("float16").params] == ["grad", "f", "rows", "n", "gld",
                                                               "fs"]


# ---- the warm-up table

def test_warmup_entries_expand_to_the_kernels_a_call_runs():
    from ge2jit.ops.cross_entropy import warmup

    entry = warmup.validate_entry({"dtypes": ["bfloat16"], "grad": ["same", "none"],
                                   "classes": [1000, 128256], "smoothing": [False, True]})
    specs = warmup.expand(entry, "sm_90")
    for n, grad, sm in itertools.product((1000, 128256), ("bfloat16", None), (False, True)):
        for s in choose(4096, n, "bfloat16", "int64", grad, smoothing=sm).specs:
            assert s in specs, s.kernel_name
    assert len(specs) == len(set(specs))
    assert scale_spec("bfloat16") in specs                  # PyTorch's backward
    every = warmup.expand(warmup.validate_entry({"classes": [10], "configs": "all",
                                                 "reductions": ["none"], "check": [False]}),
                          "sm_80")
    assert {s.config.name for s in every} == {c.name for c in all_configs()}
    pinned = warmup.expand(warmup.validate_entry({"classes": [10], "configs": ["block_128"],
                                                  "reductions": ["sum"], "check": [False],
                                                  "target_dtypes": ["int32"]}), "sm_80")
    assert [s.kernel_name for s in pinned] == ["cross_entropy_block128_v16_x4_f32_t32",
                                               "cross_entropy_reduce_sum"]


@pytest.mark.parametrize("entry, match", [
    ({}, "classes: expected a non-empty list of class counts"),
    ({"classes": [0]}, "classes: expected"),
    ({"classes": [True]}, "classes: expected"),
    ({"classes": [5], "dtypes": ["float64"]}, "dtypes: expected a list of"),
    ({"classes": [5], "target_dtypes": ["int16"]}, "target_dtypes: expected a list of"),
    ({"classes": [5], "grad": "same"}, "grad: expected a list of"),
    ({"classes": [5], "reductions": ["avg"]}, "reductions: expected a list of"),
    ({"classes": [5], "smoothing": [0.1]}, "smoothing: expected a list of booleans"),
    ({"classes": [5], "configs": "fast"}, "configs: expected 'heuristic', 'all' or a list"),
    ({"classes": [5], "configs": ["block_7"]}, "config: block threads"),
    ({"classes": [5], "lengths": [5]}, "lengths: unknown key"),
])
def test_bad_warmup_entries_are_refused(entry, match):
    from ge2jit.ops.cross_entropy import warmup

    with pytest.raises(ge2jit.ArgumentValueError, match=match):
        warmup.validate_entry(entry)


# ---- the float64 reference

def _problem(rows=7, n=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * 2
    t = rng.integers(0, n, rows)
    t[1] = -100                                         # an ignored row
    return x, t


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_reference_gradient_matches_finite_differences(reduction, smoothing):
    x, t = _problem()
    w = np.random.default_rng(1).standard_normal(x.shape[0])   # weights the rows' losses

    def loss(x_):
        value = cross_entropy_ref(x_, t, -100, reduction, smoothing)
        return float(np.sum(w * value) if reduction == "none" else 2.5 * value)

    scale = 1.0 if reduction == "none" else 2.5
    g = cross_entropy_grad_ref(x, t, -100, reduction, smoothing, grad_scale=scale)
    if reduction == "none":    # the reference's "none" gradient is that of the losses' sum
        g = g * w[:, None]
    h = 1e-6
    for idx in np.ndindex(*x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        fd = (loss(up) - loss(down)) / (2 * h)
        assert abs(fd - g[idx]) <= 1e-6 * max(1.0, abs(fd)), (idx, fd, g[idx])
    assert (g[1] == 0).all()                            # the ignored row


def test_reference_semantics():
    x, t = _problem()
    ls = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    nll = -ls[np.arange(7), np.where(t >= 0, t, 0)]
    losses = row_losses(x, t)
    np.testing.assert_allclose(losses[t >= 0], nll[t >= 0], rtol=1e-14)
    assert losses[1] == 0.0 and count(t) == 6
    np.testing.assert_allclose(cross_entropy_ref(x, t), nll[t >= 0].mean(), rtol=1e-14)
    np.testing.assert_allclose(cross_entropy_ref(x, t, reduction="sum"), nll[t >= 0].sum(),
                               rtol=1e-14)
    # label smoothing: (1 - e) nll + e mean_j(-log_softmax_j), ignored rows 0
    e = 0.1
    smooth = (1 - e) * nll - e * ls.mean(axis=1)
    got = row_losses(x, t, label_smoothing=e)
    np.testing.assert_allclose(got[t >= 0], smooth[t >= 0], rtol=1e-14)
    assert got[1] == 0.0
    # every row ignored: the mean of nothing is NaN, the sum 0, the gradient 0
    every = np.full(7, -100)
    assert np.isnan(cross_entropy_ref(x, every))
    assert cross_entropy_ref(x, every, reduction="sum") == 0.0
    assert (cross_entropy_grad_ref(x, every) == 0).all()
    # a class outside [0, V) that is not ignored: NaN loss and gradient row
    bad = t.copy()
    bad[0] = 5
    assert np.isnan(row_losses(x, bad)[0]) and np.isnan(cross_entropy_grad_ref(x, bad)[0]).all()
    assert np.isnan(cross_entropy_ref(x, bad))
    # special values: -inf at the target: infinite loss; +inf or NaN in the row: NaN
    y = x.copy()
    y[0, t[0]] = -np.inf
    y[2, 0] = np.inf
    y[3, 1] = np.nan
    special = row_losses(y, t)
    assert special[0] == np.inf and np.isnan(special[2]) and np.isnan(special[3])
