"""Notebook helpers: inspect a kernel (no GPU needed with an arch) and the record tables."""

from __future__ import annotations

import pytest

import ge2jit
from ge2jit.notebook import KernelInfo, Records, kernel_info
from ge2jit.ops.gemm.epilogue import Act, BiasKind, Epilogue, Layout
from ge2jit.ops.gemm.spec import PIPELINED_F32_CONFIGS, DType, PipelinedGemmSpec

SPEC = PipelinedGemmSpec(DType.F32, Layout.ROW, Layout.ROW,
                         Epilogue(out_dtype=DType.F32, act=Act.SILU, bias=BiasKind.COL,
                                  bias_dtype=DType.F32),
                         PIPELINED_F32_CONFIGS[0], False, True, True)


def test_inspect_a_spec_without_gpu():
    info = ge2jit.inspect(SPEC, arch="sm_90")
    assert info.kernel_name == SPEC.kernel_name and info.arch == "sm_90"
    assert info.registers > 0 and info.spill_bytes == 0
    assert info.dynamic_shared_bytes == SPEC.config.smem_bytes
    assert info.threads == SPEC.config.threads
    assert f'void __launch_bounds__(THREADS, 1)\n{SPEC.kernel_name}(' in info.source
    text = str(info)
    assert "registers / thread" in text and "theoretical occupancy" in text
    page = info._repr_html_()
    assert "<table>" in page and "<details>" in page
    assert "&lt;Layout.ROW" in page, "reprs and source are escaped"


def test_sass_of_an_inspected_kernel():
    from ge2jit.ops.gemm.spec import WGMMA_CONFIGS, WgmmaGemmSpec

    info = ge2jit.inspect(SPEC, arch="sm_90")
    mix = info.instruction_mix()
    assert mix["FFMA"] > 1000 and "LDL" not in mix and "HMMA" not in mix
    assert "FFMA" in info.sass()
    hopper = WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL,
                           Epilogue(out_dtype=DType.BF16, act=Act.GELU, bias=BiasKind.COL,
                                    bias_dtype=DType.BF16), WGMMA_CONFIGS[0])
    info = ge2jit.inspect(hopper, arch="sm_90")
    assert info.arch == "sm_90a" and info.instruction_mix()["HGMMA"] > 0


def test_inspect_needs_an_arch_without_gpu():
    if ge2jit.jit.device.gpu_count():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="arch: no GPU here"):
        kernel_info(SPEC)


def test_records_print_as_a_table():
    r = Records([{"config": "a", "ms": 1.23456, "TFLOP/s": 40.0},
                 {"config": "b", "ms": None, "error": "failed"}])
    text = repr(r).splitlines()
    assert text[0].split() == ["config", "ms", "TFLOP/s", "error"]
    assert text[1].split()[:3] == ["a", "1.235", "40"] and "failed" in text[2]
    assert r._repr_html_().count("<tr>") == 3


def test_star_import_keeps_the_standard_inspect_module():
    import inspect as stdlib_inspect

    scope: dict = {}
    exec("import inspect\nfrom ge2jit import *", scope)
    assert scope["inspect"] is stdlib_inspect
    assert "gemm_bias_act" in scope and ge2jit.inspect.__module__ == "ge2jit.notebook"


@pytest.mark.parametrize("name, arch, kwargs, fragments", [
    ("128x128x16_w32x64_s3", "sm_80", {}, ("128x128x16", "f32")),
    ("128x128x16_w32x64_s3_k4", "sm_90", {"act": "gelu", "bias": "col"}, ("splitk",)),
    ("mma_128x128x32_w64x64_s4", "sm_80", {"dtype": "bfloat16", "act": "silu"}, ("silu",)),
    ("wgmma_128x256_s4", "sm_90", {"dtype": "bfloat16", "act": "gelu_tanh", "bias": "col",
                                   "bias_dtype": "float32"}, ("gelu_tanh", "colbias")),
    ("64x64x8_4x4", "sm_90", {"dtype": "float16", "layouts": "rc", "bias": "row"},
     ("64x64x8", "rowbias")),
])
def test_inspect_a_config_by_name_without_gpu(name, arch, kwargs, fragments):
    info = ge2jit.inspect(name, arch=arch, **kwargs)
    assert isinstance(info, KernelInfo)
    assert info.registers > 0 and info.spill_bytes == 0
    assert info.arch == (f"{arch}a" if name.startswith("wgmma") else arch)
    assert info.kernel_name == info.spec.kernel_name
    assert f"{info.kernel_name}(" in info.source
    assert all(f in info.kernel_name for f in fragments), info.kernel_name
    assert info.extra["config"] == name
    if name.endswith("_k4"):   # split K: the GEMM writes partial sums, a second kernel reduces
        assert "reduce_f32_gelu_colbias" in info.extra["also launches"]   # ... and applies


def test_inspect_by_name_takes_config_objects_and_numpy_dtypes():
    np = pytest.importorskip("numpy")
    info = ge2jit.inspect(ge2jit.TileConfig.parse("64x64x8_4x4"), arch="sm_80",
                          dtype=np.float32, out_dtype=np.float32, act="relu")
    assert info.extra["config"] == "64x64x8_4x4" and "relu" in info.kernel_name


@pytest.mark.parametrize("name, kwargs, start", [
    ("bogus", {}, "op or config: no op or config named 'bogus' (not a config of "
                  "gemm_bias_act: expected a name like '128x128x8_w32x64_s3'"),
    ("128x128x16_w32x64_s3", {"dtype": "int8"}, "dtype: expected one of float32, float16, "
                                                "bfloat16, got 'int8'"),
    ("128x128x16_w32x64_s3", {"act": "swish"}, "act: unknown activation 'swish'"),
    ("128x128x16_w32x64_s3", {"bias": "diag"}, "bias: expected None, 'scalar', 'col' or 'row'"),
    ("128x128x16_w32x64_s3", {"layouts": "rx"}, "layouts: expected 'rr', 'rc', 'cr' or 'cc'"),
    ("128x128x16_w32x64_s3", {"c_layout": "x"}, "c_layout: expected None, 'r' or 'c'"),
    ("128x128x16_w32x64_s3", {"bias_dtype": "float16"}, "bias_dtype: expected float32"),
    ("128x128x16_w32x64_s3", {"arch": "hopper"}, "arch: expected a CUDA architecture"),
    ("wgmma_128x256_s4", {"dtype": "bfloat16", "arch": "sm_80"},
     "arch: wgmma_128x256_s4 is a wgmma config, which runs on sm_90"),
    ("mma_128x128x32_w64x64_s4", {}, "config: mma_128x128x32_w64x64_s4 runs on the tensor cores"),
    ("128x128x16_w32x64_s3", {"dtype": "bfloat16"}, "config: 128x128x16_w32x64_s3 is a float32"),
])
def test_inspect_by_name_bad_arguments_are_one_line(name, kwargs, start):
    kwargs = {"arch": "sm_90", **kwargs}
    with pytest.raises(ge2jit.ArgumentValueError) as e:
        ge2jit.inspect(name, **kwargs)
    assert str(e.value).startswith(start) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("args, kwargs", [((), {"arch": "sm_90"}), ((), {}),
                                          ((object(),), {})])
def test_inspect_of_a_misspelt_op_names_no_config_and_lists_the_ops(args, kwargs):
    # with or without an arch (and without a GPU), or with arrays after the name
    with pytest.raises(ge2jit.ArgumentValueError) as e:
        ge2jit.inspect("softmaxx", *args, **kwargs)
    text = str(e.value)
    assert text.startswith("op or config: no op or config named 'softmaxx' (did you mean "
                           "'softmax'?); the ops: gemm_bias_act, ")
    assert "rms_norm, " in text and "\n" not in text and "128x128" not in text


def test_inspect_of_a_name_that_is_no_op_nor_config_lists_the_ops():
    with pytest.raises(ge2jit.ArgumentValueError) as e:
        ge2jit.inspect("nothing_like_it", object())
    assert str(e.value) == ("op or config: no op or config named 'nothing_like_it'; the ops: "
                            + ", ".join(op.name for op in ge2jit.runtime.registry.ops()))


@pytest.mark.parametrize("call, missing", [
    (lambda: ge2jit.benchmark_configs(["128x128x16_w32x64_s3", "64x64x8_4x4"]),
     "gemm_bias_act (its arrays and keywords) to time each config on; missing a required "
     "argument: 'a'"),
    (lambda: ge2jit.benchmark_configs("softmax", configs=["x"]),
     "softmax (its arrays and keywords) to time each config on; missing a required argument: "
     "'x'"),
    (lambda: ge2jit.benchmark_configs("softmax", 1, 2, 3, 4, configs=["x"]),
     "softmax (its arrays and keywords) to time each config on; too many positional "
     "arguments"),
])
def test_benchmark_configs_without_a_call_to_time_raises(call, missing):
    # rather than a table with the same TypeError for every config
    with pytest.raises(ge2jit.ArgumentTypeError) as e:
        call()
    assert str(e.value) == f"args: expected the arguments of a call of {missing}"


@pytest.mark.parametrize("missing", ["cuobjdump", "nvdisasm"])
def test_sass_without_cuobjdump_names_the_extra(monkeypatch, tmp_path, missing):
    from ge2jit.errors import MissingDependencyError
    from ge2jit.jit import sass

    lonely = tmp_path / "cuobjdump"   # a cuobjdump with no nvdisasm beside it (never run)
    lonely.write_text("")
    monkeypatch.setattr(sass, "_find", lambda tool: None if tool == missing else str(lonely))
    info = ge2jit.inspect("64x64x8_4x4", arch="sm_80")
    with pytest.raises(MissingDependencyError) as e:
        info.sass()
    text = str(e.value)
    assert text.startswith(f"{missing} not found") and "\n" not in text
    assert 'pip install "ge2jit[tools]"' in text and "nvidia-cuda-cuobjdump" in text
