"""softmax and softmax_backward reach the tools through their registrations alone: the warm-up
file, inspect by config, the registry; explain, tune and benchmark_configs on the GPU."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ge2jit
from ge2jit.runtime import registry


def test_softmax_is_registered_by_name_and_function():
    op = registry.get("softmax")
    assert registry.get(ge2jit.softmax) is op and op.function is ge2jit.softmax
    assert registry.label("softmax_block1024_v16_x8_bf16_bf16") == "softmax"
    back = registry.get("softmax_backward")
    assert registry.get(ge2jit.softmax_backward) is back and back is not op
    assert registry.label("softmax_backward_block1024_v16_x8_bf16_bf16") == "softmax_backward"


def test_a_warmup_file_compiles_softmax_kernels(tmp_path):
    from ge2jit.precompile import load

    path = tmp_path / "w.toml"
    path.write_text(textwrap.dedent("""
        [[softmax]]
        dtypes = ["bfloat16"]
        lengths = [128, 4096, 50000]
    """))
    plan = load(path, archs=["sm_90"])
    names = [spec.kernel_name for spec, _ in plan.jobs]
    assert names and all(n.startswith("softmax_") for n in names)
    assert any("block" in n for n in names) and any("loop" in n for n in names)
    path.write_text(textwrap.dedent("""
        [[softmax_backward]]
        dtypes = ["float32"]
        lengths = [100, 20000]
        strided = [true]
    """))
    names = [spec.kernel_name for spec, _ in load(path, archs=["sm_80"]).jobs]
    assert names and all(n.startswith("softmax_backward_") for n in names)
    assert any("loop" in n for n in names) and any("strided" in n for n in names)


def test_inspect_a_softmax_config_without_gpu():
    info = ge2jit.inspect(ge2jit.softmax, "block_1024_v16", arch="sm_90", dtype="bfloat16")
    assert info.spill_bytes == 0 and "softmax_block1024_v16" in str(info)
    with pytest.raises(ge2jit.ArgumentValueError, match="config"):
        ge2jit.inspect("softmax", "block_7_v16", arch="sm_90")
    back = ge2jit.inspect(ge2jit.softmax_backward, "loop_512", arch="sm_80", dtype="float16",
                          out_dtype="float32")
    assert back.spill_bytes == 0 and "softmax_backward_loop512_v8_x4_f16_f32" in str(back)
    with pytest.raises(ge2jit.ArgumentValueError, match="config: block_1024_v32 would hold"):
        ge2jit.inspect("softmax_backward", "block_1024_v32", arch="sm_90")


@pytest.mark.gpu
def test_explain_tune_and_benchmark_configs_on_the_gpu():
    cp = pytest.importorskip("cupy")
    x = cp.random.default_rng(4).standard_normal((512, 3000), dtype=cp.float32)
    e = ge2jit.explain(ge2jit.softmax, x)
    assert e.reason in ("heuristic", "tuned") and e.kernel_names[0].startswith("softmax_")
    assert ge2jit.explain("softmax", x, config="loop_256").reason == "pinned"
    rows = ge2jit.benchmark_configs(ge2jit.softmax, x)
    assert len(rows) >= 2
    result = ge2jit.tune(ge2jit.softmax, x, reps=3)
    assert ge2jit.explain(ge2jit.softmax, x).config == result.best.name
    y = ge2jit.softmax(x)
    ref = np.exp(cp.asnumpy(x).astype(np.float64))
    ref /= ref.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(cp.asnumpy(y), ref, rtol=4e-6, atol=1e-9)


@pytest.mark.gpu
def test_backward_explain_tune_and_benchmark_configs_on_the_gpu():
    cp = pytest.importorskip("cupy")
    from ge2jit.ops.softmax.reference import softmax_backward_ref

    rng = cp.random.default_rng(5)
    y = ge2jit.softmax(rng.standard_normal((512, 3000), dtype=cp.float32))
    dy = rng.standard_normal((512, 3000), dtype=cp.float32)
    e = ge2jit.explain(ge2jit.softmax_backward, dy, y)
    assert e.reason in ("heuristic", "tuned")
    assert e.kernel_names[0].startswith("softmax_backward_")
    assert ge2jit.explain("softmax_backward", dy, y, config="loop_256").reason == "pinned"
    rows = ge2jit.benchmark_configs(ge2jit.softmax_backward, dy, y)
    assert len(rows) >= 2 and all(r["ms"] is not None for r in rows)
    result = ge2jit.tune(ge2jit.softmax_backward, dy, y, reps=3)
    assert ge2jit.explain(ge2jit.softmax_backward, dy, y).config == result.best.name
    dx = ge2jit.softmax_backward(dy, y)
    ref = softmax_backward_ref(cp.asnumpy(dy), cp.asnumpy(y))
    np.testing.assert_allclose(cp.asnumpy(dx), ref, rtol=1e-4, atol=1e-7)
