"""Notebook helpers: inspect a kernel (no GPU needed with an arch) and the record tables."""

from __future__ import annotations

import pytest

import ge2jit
from ge2jit.notebook import Records, kernel_info
from ge2jit.ops.gemm.spec import (
    PIPELINED_F32_CONFIGS,
    Act,
    BiasKind,
    DType,
    Layout,
    PipelinedGemmSpec,
)

SPEC = PipelinedGemmSpec(DType.F32, Layout.ROW, Layout.ROW, None, Act.SILU, BiasKind.COL, False,
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
    hopper = WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL, None, Act.GELU, BiasKind.COL,
                           False, WGMMA_CONFIGS[0])
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
