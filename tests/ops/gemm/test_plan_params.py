"""The launch plans give each kernel parameter its value, by name (no GPU: the driver call and
the tensor maps are replaced)."""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import pytest

cupy = pytest.importorskip("cupy")

from ge2jit.ops.gemm import plans  # noqa: E402
from ge2jit.ops.gemm.epilogue import PARTIAL_SUMS, Act, BiasKind, Epilogue, Layout  # noqa: E402
from ge2jit.ops.gemm.spec import (  # noqa: E402
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    WGMMA_CONFIGS,
    DType,
    PipelinedGemmSpec,
    SplitKReduceSpec,
    Tf32SplitSpec,
    TiledGemmSpec,
    WgmmaGemmSpec,
)

# run()'s arguments, and the kernel parameters they go to
RUN = dict(a_ptr=0x1000, lda=33, b_ptr=0x2000, ldb=44, c_ptr=0x3000, ldc=55, bias_ptr=0x4000,
           bias_stride=3, y_ptr=0x5000, ldy=66, z_ptr=0x6000, ldz=77, m=100, n=200, k=300,
           alpha=1.5, beta=0.25, slope=0.01, stream_ptr=999)
PARAMS = dict(A=0x1000, lda=33, B=0x2000, ldb=44, C=0x3000, ldc=55, bias=0x4000, bias_stride=3,
              Y=0x5000, ldy=66, Z=0x6000, ldz=77, M_=100, N_=200, K_=300, alpha_=1.5,
              beta_=0.25, leaky_slope_=0.01, k_tiles_per_split=7)
WORKSPACE = 0x9000
RUN["alloc"] = lambda nbytes: SimpleNamespace(ptr=WORKSPACE)   # scratch: partials, staging


@pytest.fixture
def launches(monkeypatch):
    """Each launch as (stream, {parameter name: value}), read through the pointer array."""
    calls, kernels = [], {}

    def driver(fptr, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        spec = kernels[fptr]
        pointers = (ctypes.c_uint64 * len(spec.params)).from_address(params)
        calls.append((stream, {
            p.name: struct.unpack("<" + p.kind.code, ctypes.string_at(int(at), p.kind.size))[0]
            for p, at in zip(spec.params, pointers)}))

    monkeypatch.setattr(cupy.cuda.driver, "launchKernel", driver)
    monkeypatch.setattr(plans, "tensor_map_2d", lambda *args: repr(args).encode())

    def kernel(spec):
        kernels[len(kernels) + 1] = spec
        return SimpleNamespace(spec=spec, function=SimpleNamespace(ptr=len(kernels)))

    return calls, kernel


FIXED = plans.LaunchArgs(**{n: RUN[n] for n in ("m", "n", "k", "lda", "ldb", "ldc",
                                                 "bias_stride", "ldy", "ldz", "alloc")})
PER_CALL = ("a_ptr", "b_ptr", "c_ptr", "bias_ptr", "y_ptr", "z_ptr", "alpha", "beta", "slope",
            "stream_ptr")


def _run(plan, fp8=None):
    plan.run(FIXED, *(RUN[n] for n in PER_CALL), fp8=fp8)


def _run_and_bind(plan):
    _run(plan)
    plan.bind(FIXED)(*(RUN[n] for n in PER_CALL))


def test_plan_run_and_bind_pass_each_parameter(launches):
    calls, kernel = launches
    epilogue = Epilogue(out_dtype=DType.F32, act=Act.GELU, bias=BiasKind.COL,
                        bias_dtype=DType.F32, layout_c=Layout.ROW, c_dtype=DType.F32,
                        save_z=True)
    spec = TiledGemmSpec(DType.F32, Layout.ROW, Layout.COL, epilogue, TILED_CONFIGS[0])
    _run_and_bind(plans.Plan(None, kernel(spec), (2, 3, 1), (256, 1, 1), 0, 7))
    assert calls == [(999, PARAMS)] * 2


@pytest.mark.parametrize("dtype, out", [(DType.BF16, DType.BF16), (DType.F32, DType.F32),
                                        (DType.E4M3, DType.E5M2)])
def test_tma_plan_makes_maps_of_the_named_operands(launches, dtype, out):
    calls, kernel = launches
    if out.is_fp8:   # (8-bit Y: no Z; 64-byte rows, the 64-byte swizzle)
        epilogue = Epilogue(out_dtype=out, bias=BiasKind.COL, bias_dtype=DType.BF16)
    else:
        epilogue = Epilogue(out_dtype=out, bias=BiasKind.COL, bias_dtype=dtype, save_z=True)
    spec = WgmmaGemmSpec(dtype, Layout.ROW, Layout.COL, epilogue, WGMMA_CONFIGS[3])
    plan = plans.TmaPlan(None, kernel(spec), (132, 1, 1), (384, 1, 1), 5000, 7)
    fp8 = {}
    if dtype.is_fp8:   # (run() alone: prepared calls of 8-bit inputs bind their scales)
        fp8 = dict(scale_a=0x7000, scale_a_stride=0, scale_b=0x8000, scale_b_stride=0,
                   scale_y=0, amax=0, y_scale_=0.5)
        _run(plan, fp8)
        _run(plan, fp8)
    else:
        _run_and_bind(plan)
    name, es = dtype.value, dtype.itemsize
    bm, bn, bk = WGMMA_CONFIGS[3].bm, WGMMA_CONFIGS[3].bn, 128 // es
    maps = {"tma_a": (name, 0x1000, 300, 100, 33 * es, bk, bm),
            "tma_b": (name, 0x2000, 300, 200, 44 * es, bk, bn)}
    assert spec.tma_store == (out is not DType.F32)
    if out is DType.BF16:
        maps.update(tma_y=("bf16", 0x5000, 200, 100, 66 * 2, 64, 16, 128),
                    tma_z=("bf16", 0x6000, 200, 100, 77 * 2, 64, 16, 128))
    elif out.is_fp8:
        maps.update(tma_y=("e5m2", 0x5000, 200, 100, 66, 64, 16, 64),
                    tma_z=("e5m2", 0x6000, 200, 100, 77, 64, 16, 64))
    expected = {**{k: repr(v).encode().ljust(128, b"\0") for k, v in maps.items()}, **PARAMS,
                **fp8}
    expected = {p.name: expected[p.name] for p in spec.params}   # (in the kernel's order)
    assert [list(p) for _, p in calls] == [list(expected)] * 2
    assert calls == [(999, expected)] * 2


def test_split_k_plan_reduces_the_partials_with_the_epilogues_parameters(launches):
    calls, kernel = launches
    gemm = PipelinedGemmSpec(DType.F32, Layout.ROW, Layout.COL, PARTIAL_SUMS,
                             PIPELINED_F32_CONFIGS[0], vec_y=True, split_k=True)
    epilogue = Epilogue(out_dtype=DType.F32, act=Act.GELU, bias=BiasKind.COL,
                        bias_dtype=DType.F32, layout_c=Layout.ROW, c_dtype=DType.F32,
                        save_z=True)
    reduce = SplitKReduceSpec(DType.F32, epilogue, True)
    _run_and_bind(plans.Plan(None, kernel(gemm), (2, 3, 4), (256, 1, 1), 0, 7, kernel(reduce),
                          (5, 1, 1), splits=4))
    partials = {**PARAMS, "C": 0, "ldc": 0, "bias": 0, "bias_stride": 0, "Y": WORKSPACE,
                "ldy": 200, "Z": 0, "ldz": 0, "alpha_": 1.0, "beta_": 0.0, "leaky_slope_": 0.0}
    sums = dict(W=WORKSPACE, ldw=200, splits=4, C=0x3000, ldc=55, bias=0x4000, bias_stride=3,
                Y=0x5000, ldy=66, Z=0x6000, ldz=77, M=100, N=200, alpha_=1.5, beta_=0.25,
                leaky_slope_=0.01)
    assert calls == [(999, partials), (999, sums)] * 2


def test_staged_plan_reads_the_copies(launches):
    calls, kernel = launches
    gemm = TiledGemmSpec(DType.F32, Layout.ROW, Layout.COL, Epilogue(out_dtype=DType.F32),
                         TILED_CONFIGS[0])
    prep = (kernel(Tf32SplitSpec(False, "hhl")), kernel(Tf32SplitSpec(True, "hlh")))
    _run_and_bind(plans.Plan(None, kernel(gemm), (2, 3, 1), (256, 1, 1), 0, 7, prep=prep))
    ld = 900   # 3 segments of K, 16-byte rows
    size_a = -(-100 * ld * 4 // 256) * 256   # B starts 256-byte aligned
    copies = [dict(in_=0x1000, ld_in=33, out=WORKSPACE, ld_out=ld, R=100, C=300),
              dict(in_=0x2000, ld_in=44, out=WORKSPACE + size_a, ld_out=ld, R=300, C=200),
              {**PARAMS, "A": WORKSPACE, "lda": ld, "B": WORKSPACE + size_a, "ldb": ld,
               "K_": 900}]
    assert calls == [(999, p) for p in copies] * 2
