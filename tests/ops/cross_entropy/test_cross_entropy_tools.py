"""cross_entropy reaches the tools through its registration alone: the registry and cache
labels, a warm-up file, inspect by config without a GPU; explain, tune and benchmark_configs
on the GPU."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ge2jit
from ge2jit.runtime import registry


def test_registered_by_name_and_function_with_its_kernels_labelled():
    op = registry.get("cross_entropy")
    assert registry.get(ge2jit.cross_entropy) is op and op.function is ge2jit.cross_entropy
    for name in ("cross_entropy_block1024_v32_x8_bf16_t64_gbf16_mean",
                 "cross_entropy_targets_t32", "cross_entropy_reduce_sum",
                 "cross_entropy_scale_x8_bf16"):
        assert registry.label(name) == "cross_entropy"
    assert [o.name for o in registry.ops()][0] == "gemm_bias_act"     # still the first


def test_a_warmup_file_compiles_cross_entropy_kernels(tmp_path):
    from ge2jit.precompile import load

    path = tmp_path / "w.toml"
    path.write_text(textwrap.dedent("""
        [[cross_entropy]]
        dtypes = ["bfloat16"]
        grad = ["same"]
        classes = [32000, 128256]
        smoothing = [false, true]
    """))
    names = [spec.kernel_name for spec, _ in load(path, archs=["sm_90"]).jobs]
    assert "cross_entropy_block1024_v32_x8_bf16_t64_gbf16_mean" in names
    assert "cross_entropy_block1024_v32_x8_bf16_t64_gbf16_ls_mean" in names
    assert {"cross_entropy_targets_t64", "cross_entropy_reduce_mean",
            "cross_entropy_scale_x8_bf16"} <= set(names)
    path.write_text('[[cross_entropy]]\nclasses = [10]\nreductions = ["avg"]\n')
    with pytest.raises(ge2jit.ArgumentValueError, match="reductions: expected a list of"):
        load(path, archs=["sm_90"])


def test_inspect_a_config_without_gpu():
    info = ge2jit.inspect(ge2jit.cross_entropy, "block_512", arch="sm_90", dtype="bfloat16",
                          grad_dtype="bfloat16", smoothing=True)
    assert info.spill_bytes == 0
    assert "cross_entropy_block512_v32_x8_bf16_t64_gbf16_ls_mean" in str(info)
    loss_only = ge2jit.inspect("cross_entropy", "warp", arch="sm_80", target_dtype="int32",
                               reduction="none", check=False)
    assert "cross_entropy_warp_v16_x4_f32_t32" in str(loss_only)
    with pytest.raises(ge2jit.ArgumentValueError, match="config: block threads"):
        ge2jit.inspect("cross_entropy", "block_7", arch="sm_90")
    with pytest.raises(ge2jit.ArgumentValueError, match="smoothing, check: expected booleans"):
        ge2jit.inspect("cross_entropy", "warp", arch="sm_90", smoothing=0.1)


@pytest.mark.gpu
def test_explain_tune_and_benchmark_configs_on_the_gpu():
    cp = pytest.importorskip("cupy")
    from ge2jit.ops.cross_entropy.reference import cross_entropy_ref

    rng = cp.random.default_rng(8)
    logits = rng.standard_normal((256, 5000), dtype=cp.float32)
    targets = rng.integers(0, 5000, 256).astype(cp.int64)
    e = ge2jit.explain(ge2jit.cross_entropy, logits, targets, grad=True)
    assert e.reason in ("heuristic", "tuned")
    assert e.kernel_names[0].startswith("cross_entropy_block")
    assert "cross_entropy_targets_t64" in e.kernel_names
    assert "cross_entropy_reduce_mean" in e.kernel_names
    pinned = ge2jit.explain("cross_entropy", logits, targets, config="warp")
    assert pinned.reason == "pinned" and pinned.kernel_names[0].startswith("cross_entropy_warp")
    rows = ge2jit.benchmark_configs(ge2jit.cross_entropy, logits, targets, grad=True)
    assert len(rows) == 5 and all(r["ms"] is not None for r in rows)
    result = ge2jit.tune(ge2jit.cross_entropy, logits, targets, grad=True, reps=3)
    assert ge2jit.explain(ge2jit.cross_entropy, logits, targets, grad=True).config \
        == result.best.name
    loss = ge2jit.cross_entropy(logits, targets)
    want = cross_entropy_ref(cp.asnumpy(logits), cp.asnumpy(targets))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
