"""rms_norm, layer_norm and their backward reach the tools through their registrations alone:
the registry, the warm-up file, inspect by config (no GPU); explain, tune and
benchmark_configs on the GPU."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ge2jit
from ge2jit.runtime import registry

NAMES = ("rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward")


def test_the_ops_are_registered_by_name_and_function():
    for name in NAMES:
        op = registry.get(name)
        assert registry.get(getattr(ge2jit, name)) is op and op.function is getattr(ge2jit, name)
        assert name in registry.warmup_tables()
    assert registry.label("rms_norm_block512_v8_x8_bf16_ybf16_wbf16") == "rms_norm"
    assert registry.label("layer_norm_backward_sums_wf32_bf32") == "layer_norm_backward"
    assert registry.label("rms_norm_backward_loop1024_v8_x8_dybf16_hbf16_dxbf16_nw") == \
        "rms_norm_backward"


def test_a_warmup_file_compiles_norm_kernels(tmp_path):
    from ge2jit.precompile import load

    path = tmp_path / "w.toml"
    path.write_text(textwrap.dedent("""
        [[rms_norm]]
        dtypes = ["bfloat16"]
        residual_dtypes = ["none", "float32"]
        lengths = [128, 4096, 50000]
        [[layer_norm_backward]]
        dtypes = ["bfloat16"]
        weight_dtypes = ["float32"]
        lengths = [4096]
    """))
    plan = load(path, archs=["sm_90"])
    names = [spec.kernel_name for spec, _ in plan.jobs]
    assert any(n.startswith("rms_norm_warp") for n in names)
    assert any(n.startswith("rms_norm_block") for n in names)
    assert any(n.startswith("rms_norm_loop") for n in names)
    assert "layer_norm_backward_block512_v8_x8_dybf16_hbf16_dxbf16_wf32_bbf16" in names
    assert "layer_norm_backward_sums_wf32_bbf16" in names
    path.write_text("[[layer_norm]]\nlengths = [5]\nsave = [true]\n")
    with pytest.raises(ge2jit.ArgumentValueError, match="save: unknown key"):
        load(path, archs=["sm_90"])


def test_inspect_a_norm_config_without_gpu():
    info = ge2jit.inspect(ge2jit.layer_norm, "block_1024_v16", arch="sm_90", dtype="bfloat16",
                          weight_dtype="float32", residual_dtype="float32", save_stats=True)
    assert info.spill_bytes == 0
    assert info.kernel_name == "layer_norm_block1024_v16_x4_bf16_rf32hf32_ybf16_wf32_bbf16_stats"
    back = ge2jit.inspect("rms_norm_backward", "warp32_v8_r1", arch="sm_80", dtype="bfloat16",
                          dh_dtype="same")
    assert back.kernel_name == "rms_norm_backward_warp32_v8_r1_x8_dybf16_hbf16_dxbf16_wbf16_dhbf16"
    assert back.extra["also launches"] == "rms_norm_backward_sums_wbf16"
    with pytest.raises(ge2jit.ArgumentValueError, match="config"):
        ge2jit.inspect("rms_norm", "block_7_v16", arch="sm_90")
    with pytest.raises(ge2jit.ArgumentValueError, match="bias_dtype: rms_norm has no bias"):
        ge2jit.inspect("rms_norm", "block_128_v8", arch="sm_90", bias_dtype="float32")
    with pytest.raises(ge2jit.ArgumentValueError, match="weight_dtype: expected None, 'same'"):
        ge2jit.inspect("layer_norm", "block_128_v8", arch="sm_90", weight_dtype="int8")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_explain_tune_and_benchmark_configs_on_the_gpu(kind):
    cp = pytest.importorskip("cupy")
    rng = cp.random.default_rng(4)
    x = rng.standard_normal((512, 3000), dtype=cp.float32)
    w = rng.standard_normal(3000, dtype=cp.float32)
    fn = getattr(ge2jit, f"{kind}_norm")
    args = (x, w) if kind == "rms" else (x, w, w)
    e = ge2jit.explain(fn, *args)
    assert e.reason in ("heuristic", "tuned") and e.kernel_names[0].startswith(f"{kind}_norm_")
    assert ge2jit.explain(fn, *args, config="loop_256").reason == "pinned"
    rows = ge2jit.benchmark_configs(fn, *args)
    assert len(rows) >= 2 and all(r["ms"] is not None for r in rows)
    result = ge2jit.tune(fn, *args, reps=3)
    assert ge2jit.explain(fn, *args).config == result.best.name
    from ge2jit.ops.norm.reference import layer_norm_ref, rms_norm_ref

    h = cp.asnumpy(x)
    ref = (rms_norm_ref(h, cp.asnumpy(w)) if kind == "rms"
           else layer_norm_ref(h, cp.asnumpy(w), cp.asnumpy(w)))[0]
    np.testing.assert_allclose(cp.asnumpy(fn(*args)), ref, rtol=2e-5, atol=2e-5)
    # the backward: its own configs, two kernels
    out = fn(*args, save_stats=True)
    dy = rng.standard_normal((512, 3000), dtype=cp.float32)
    back = getattr(ge2jit, f"{kind}_norm_backward")
    bargs = (dy, x, w, out.rstd) if kind == "rms" else (dy, x, w, out.mean, out.rstd)
    be = ge2jit.explain(back, *bargs)
    assert len(be.kernel_names) == 2 and be.kernel_names[1].startswith(f"{kind}_norm_backward_sums")
    assert ge2jit.explain(back, *bargs, config="loop_512").config == "loop_512"
    assert len(ge2jit.benchmark_configs(back, *bargs)) >= 2
    assert ge2jit.tune(back, *bargs, reps=3).best.name
