"""softmax reaches the tools through its registration alone: the warm-up file, inspect by
config, the registry; explain, tune and benchmark_configs on the GPU."""

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


def test_inspect_a_softmax_config_without_gpu():
    info = ge2jit.inspect(ge2jit.softmax, "block_1024_v16", arch="sm_90", dtype="bfloat16")
    assert info.spill_bytes == 0 and "softmax_block1024_v16" in str(info)
    with pytest.raises(ge2jit.ArgumentValueError, match="config"):
        ge2jit.inspect("softmax", "block_7_v16", arch="sm_90")


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
