"""The launch plans take one problem's sizes, leading dimensions and scratch allocator as one
frozen ``LaunchArgs``, made once per pattern (no GPU: the driver call is replaced)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

cupy = pytest.importorskip("cupy")

from ge2jit.ops.gemm import plans  # noqa: E402
from ge2jit.ops.gemm.epilogue import Epilogue, Layout  # noqa: E402
from ge2jit.ops.gemm.problem import Problem  # noqa: E402
from ge2jit.ops.gemm.spec import TILED_CONFIGS, DType, TiledGemmSpec  # noqa: E402

from ...fake_cupy import FakeArray  # noqa: E402


def test_launch_args_are_frozen():
    fixed = plans.LaunchArgs(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert fixed.alloc is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        fixed.m = 2


def test_launch_args_of_a_problem():
    y, z = FakeArray((10, 40), strides=(48 * 4, 4)), FakeArray((10, 40), strides=(64 * 4, 4))
    p = Problem(m=10, n=40, k=30, lda=30, ldb=40, ldc=0, bias_stride=1,
                epilogue=Epilogue(out_dtype=DType.F32))
    assert plans.launch_args(p, y, z, "alloc") == plans.LaunchArgs(10, 40, 30, 30, 40, 0, 1, 48,
                                                                   64, "alloc")
    assert plans.launch_args(p, y, None).ldz == 0


def test_run_and_bind_launch_the_same(monkeypatch):
    calls = []
    monkeypatch.setattr(cupy.cuda.driver, "launchKernel", lambda *args: calls.append(args[:8]))
    spec = TiledGemmSpec(DType.F32, Layout.ROW, Layout.COL, Epilogue(out_dtype=DType.F32),
                         TILED_CONFIGS[0])
    kernel = SimpleNamespace(spec=spec, function=SimpleNamespace(ptr=1))
    plan = plans.Plan(None, kernel, (2, 3, 1), (256, 1, 1), 0, 7)
    fixed = plans.LaunchArgs(100, 200, 300, 33, 44, 55, 3, 66, 77, alloc=None)
    ptrs = (0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 1.5, 0.25, 0.01, 999)
    plan.run(fixed, *ptrs)
    plan.bind(fixed)(*ptrs)
    assert len(calls) == 2 and calls[0] == calls[1]
