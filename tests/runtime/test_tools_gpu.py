"""The tools through the registry on the GPU: explain, inspect, tune and benchmark_configs with
the op named first (by name, function) against the same calls without it (the default op),
the optimizer steps explained and inspected, and the generic tuner timing a registered op's
calls and storing the winner where ``tuned_config`` finds it."""

from __future__ import annotations

import numpy as np
import pytest

import ge2jit
from ge2jit.ops.optim import UpdateSpec
from ge2jit.runtime import registry, tools
from ge2jit.runtime.dtypes import DType
from ge2jit.runtime.registry import Op

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

_rng = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return cp.asarray(_rng.standard_normal(shape).astype(dtype))


@pytest.fixture
def tuning_db(tmp_path, monkeypatch):
    """A tuning database of this test's own; the GEMM plans forgotten before and after."""
    from ge2jit.tune import db

    monkeypatch.setattr(db, "_default", db.TuningDB(tmp_path / "tuning"))
    ge2jit.ops.gemm.clear_plans()
    yield
    ge2jit.ops.gemm.clear_plans()


def _facts(info) -> tuple:
    return (info.config, info.reason, info.kernel_names, info.grid, info.block,
            info.shared_bytes, info.registers, info.spill_bytes, str(info))


@pytest.mark.parametrize("op", [ge2jit.gemm_bias_act, "gemm_bias_act"], ids=["function", "name"])
def test_explain_with_the_default_op_named_is_as_without(op):
    a, b, bias = rand(300, 200), rand(200, 100), rand(100)
    named = ge2jit.explain(op, a, b, bias, act="gelu")
    plain = ge2jit.explain(a, b, bias, act="gelu")
    assert _facts(named) == _facts(plain)
    assert isinstance(plain.choice, ge2jit.ops.gemm.Choice)   # the op's own choice, detail
    assert named.flops == 2.0 * 300 * 100 * 200
    assert [k.spec for k in named.kernels] == list(named.specs)
    pinned = ge2jit.explain(op, a, b, config="64x64x8_w32x32_s3_k2")
    assert pinned.reason == "pinned" and len(pinned.kernel_names) == 2


def test_explain_an_optimizer_step_launches_nothing():
    p, g, m = rand(1000, 3), rand(1000, 3, dtype=np.float16), rand(1000, 3)
    v, copy = cp.abs(rand(1000, 3)), cp.zeros((1000, 3), cp.float16)
    before = cp.asnumpy(p)
    info = ge2jit.explain(ge2jit.adam_update, p, g, m, v, step=1, param_copy=copy)
    cp.cuda.Device().synchronize()
    assert (cp.asnumpy(p) == before).all() and not cp.asnumpy(copy).any()
    assert info.config == "none" and info.reason == "fixed"
    assert info.kernel_names == ("adam_update_gf16_copyf16",)
    assert info.grid == (12, 1, 1) and info.block == (256, 1, 1) and info.shared_bytes == 0
    assert info.registers[0] > 0 and info.spill_bytes == (0,)
    assert str(info).startswith("config none (fixed: adam_update has no configs)\n")
    with pytest.raises(ge2jit.ArgumentValueError, match="^step: expected an int >= 1"):
        ge2jit.explain("adam_update", p, g, m, v, step=0)
    empty = cp.zeros(0, cp.float32)
    with pytest.raises(ge2jit.ArgumentValueError, match="^param: an empty parameter launches "
                                                        "nothing$"):
        ge2jit.explain("sgd_update", empty, empty, empty, lr=0.1)


def test_inspect_a_call_of_an_optimizer_step():
    p, g, buf = rand(4096), rand(4096), rand(4096)
    info = ge2jit.inspect(ge2jit.sgd_update, p, g, buf, lr=0.1, nesterov=True)
    assert info.explanation.kernel_names == ("sgd_nesterov_update_gf32",)
    (kernel,) = info.kernels
    assert kernel.kernel_name == "sgd_nesterov_update_gf32" and kernel.threads == 256
    assert kernel.occupancy is not None and 0 < kernel.occupancy <= 1
    assert "theoretical occupancy" in str(info) and "<table>" in info._repr_html_()


def test_inspect_a_call_with_the_default_op_named():
    a, b = rand(500, 256), rand(256, 300)
    info = ge2jit.inspect("gemm_bias_act", a, b, act="relu", config="64x64x8_4x4")
    assert info.explanation.reason == "pinned" and info.explanation.config == "64x64x8_4x4"
    assert [k.kernel_name for k in info.kernels] == list(info.explanation.kernel_names)


def test_tune_with_the_default_op_named_uses_its_own_tuner(tuning_db):
    a, b = rand(96, 2048), rand(2048, 80)
    op = registry.get(ge2jit.gemm_bias_act)
    result = ge2jit.tune(ge2jit.gemm_bias_act, a, b, reps=3, processes=2)
    assert isinstance(result, ge2jit.ops.gemm.TuneResult)
    assert len(result.records) == len(op.candidates(a, b))
    assert result.key == op.tuning_key(a, b)
    assert tools.tuned_config("gemm_bias_act", op.tuning_key(a, b)) == result.best.name
    info = ge2jit.explain("gemm_bias_act", a, b)
    assert info.reason == "tuned" and info.config == result.best.name


def test_benchmark_configs_with_the_op_first_tries_its_candidates():
    a, b = rand(256, 64), rand(64, 256)
    names = registry.get("gemm_bias_act").candidates(a, b, act="relu")
    records = ge2jit.benchmark_configs("gemm_bias_act", a, b, act="relu", reps=2)
    assert len(records) == len(names) and all(r["ms"] is not None for r in records)
    timed = [r["ms"] for r in records]
    assert timed == sorted(timed) and all(r["TFLOP/s"] > 0 and r["kernels"] for r in records)
    pinned = ge2jit.benchmark_configs(ge2jit.gemm_bias_act, a, b, configs=["64x64x8_4x4",
                                                                           "nonsense"], reps=2)
    assert [r["config"] for r in pinned] == ["64x64x8_4x4", "nonsense"]
    assert pinned[1]["ms"] is None and pinned[1]["error"].startswith("config: expected a name")


def _steps(param, grad, m, v, *, config=None):
    """A registered toy op: config "one" runs one Adam step, "two" runs two."""
    for _ in range({"one": 1, "two": 2}[config or "one"]):
        ge2jit.adam_update(param, grad, m, v, step=1)


TOY = Op(name="toy_adam", function=_steps, candidates=lambda *args, **kw: ["two", "one"],
         tuning_key=lambda param, *args, **kw: {"size": param.size},
         call_specs=lambda config, *args, **kw: [UpdateSpec("adam", DType.F32)])


def test_the_generic_tuner_times_a_registered_op(tuning_db, monkeypatch):
    from ge2jit.jit.device import device_arch, device_name

    monkeypatch.setattr(registry, "_ops", dict(registry._ops))
    registry.register(TOY)
    n = 1 << 22
    p, g, m, v = rand(n), rand(n), rand(n), cp.abs(rand(n))
    result = ge2jit.tune("toy_adam", p, g, m, v, reps=5, processes=1)
    assert result.best.name == "one" and result.best.reason == "tuned"   # half the work
    assert [r["config"] for r in result.records] == ["one", "two"]
    assert result.records[0]["ms"] < result.records[1]["ms"]
    device = cp.cuda.runtime.getDevice()
    assert result.key == {"op": "toy_adam", "device": device_name(device),
                          "arch": device_arch(device), "version": ge2jit.__version__,
                          "size": n}
    assert tools.tuned_config("toy_adam", {"size": n}) == "one"
    assert tools.tuned_config("toy_adam", {"size": n + 1}) is None
    records = ge2jit.benchmark_configs(_steps, p, g, m, v, reps=2)   # no plan: times alone
    assert [r["config"] for r in records] == ["one", "two"] and "kernels" not in records[0]


def test_a_tuned_config_is_taken_by_the_next_call_of_a_pattern_already_run(tuning_db):
    """tune forgets every op's stored launches: a softmax pattern run before its tuning
    chooses again (here: the tuned config) instead of replaying the launch it stored."""
    from ge2jit.ops.softmax.op import FORWARD

    x = rand(64, 3000)
    ge2jit.softmax(x)                      # the heuristic's launch, stored for this pattern
    assert len(FORWARD.prepared) > 0
    result = ge2jit.tune(ge2jit.softmax, x, reps=3)
    assert len(FORWARD.prepared) == 0      # forgotten: the next call plans again
    ge2jit.softmax(x)
    assert ge2jit.explain(ge2jit.softmax, x).config == result.best.name
