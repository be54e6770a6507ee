"""The Hopper primitives (``kernel_templates/common/sm90/``) are plain C++ headers, each
compiling on its own terms: a kernel that includes them all (with the common types) and calls
every wrapper compiles for sm_90a, and its machine code has the instructions they stand for;
the GEMM template takes them by include, not by copies. No GPU needed."""

from __future__ import annotations

import re

import pytest

from ge2jit.jit import nvrtc
from ge2jit.jit.render import template_dir
from ge2jit.jit.sass import dump_sass, find_cuobjdump

HEADERS = ("mbarrier", "tma", "wgmma", "warpgroup", "scheduler")

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256, 1)
every_wrapper(const __grid_constant__ TensorMap map, int* out, int tiles)
{
    __shared__ __align__(1024) char tile[8192];
    __shared__ __align__(8) unsigned long long bars[2];
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(bars));
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        mbar_init(bar + 8, 1);
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        warpgroup_registers_down<40>();
        if (threadIdx.x == 0) {
            mbar_expect_tx(bar, 8192);
            tma_load(base, &map, 0, 0, bar);
            tma_load_multicast(base, &map, 64, 0, bar, 1);
        }
        mbar_wait(bar, 0);
        fence_proxy_async();
        if (threadIdx.x == 0) {
            tma_store(&map, base, 0, 0);
            bulk_commit();
            bulk_wait_read<0>();
            bulk_wait<0>();
        }
        mbar_arrive(bar + 8);
    } else {
        warpgroup_registers_up<232>();
        wgmma_fence();
        wgmma_commit();
        wgmma_wait<0>();
        named_barrier(1, 128);
        int m0, n0;
        tile_origin<128, 256>(blockIdx.x, tiles, tiles, m0, n0);
        out[threadIdx.x] = m0 + n0 + static_cast<int>(descriptor(base, 16, 1024) & 0xFFFF);
    }
}
"""


def _source() -> str:
    parts = [(template_dir() / "common" / "types.cuh").read_text()]
    parts += [(template_dir() / "common" / "sm90" / f"{h}.cuh").read_text() for h in HEADERS]
    return "\n".join(parts) + KERNEL


def test_the_headers_are_plain_cpp():
    headers = sorted((template_dir() / "common").glob("sm*/*.cuh"))
    assert len(headers) >= len(HEADERS) + 2
    for path in headers:
        text = path.read_text()
        assert "{%" not in text and "{{" not in text, path.name


def test_the_sm80_primitives_compile_and_the_templates_take_them_by_include():
    source = "\n".join((template_dir() / "common" / name).read_text() for name in (
        "types.cuh", "sm80/cp_async.cuh", "sm80/ldmatrix.cuh")) + r"""
extern "C" __global__ void every_sm80_wrapper(const float* in, unsigned* out)
{
    __shared__ __align__(16) char tile[4096];
    cp_async_16(tile + threadIdx.x * 16, in + threadIdx.x * 4, 16);
    cp_async_8(tile + 2048 + threadIdx.x * 8, in, 8);
    cp_async_4(tile + 3072 + threadIdx.x * 4, in, 4);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned r[4], t[4];
    ldmatrix_x4(r, tile + (threadIdx.x % 32) * 16);
    ldmatrix_x4_trans(t, tile + (threadIdx.x % 32) * 16);
    out[threadIdx.x] = r[0] + r[1] + r[2] + r[3] + t[0] + t[1] + t[2] + t[3];
}
"""
    result = nvrtc.compile_to_cubin(source, "every_sm80_wrapper", "sm_80")
    assert result.resources.spill_stores == 0
    if find_cuobjdump() is not None:
        sass = dump_sass(result.cubin)
        assert "LDGSTS" in sass and "LDSM" in sass
    for family in ("mma.cu", "simt_pipelined.cu", "wgmma.cu"):
        text = (template_dir() / "gemm" / family).read_text()
        assert '{% include "common/sm80/cp_async.cuh" %}' in text, family
        assert '"cp.async.' not in text and '"ldmatrix' not in text, family


def test_every_wrapper_compiles_for_sm90a():
    result = nvrtc.compile_to_cubin(_source(), "every_wrapper", "sm_90a")
    assert result.resources.spill_stores == 0
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump to read the machine code")
    sass = dump_sass(result.cubin)
    for opcode in ("UTMALDG", "UTMASTG", "SYNCS", "USETMAXREG", "WARPGROUP"):
        assert opcode in sass, opcode
    assert re.search(r"UTMALDG\S*MULTICAST", sass), "the multicast load"


def test_the_gemm_template_includes_them_and_copies_none():
    text = (template_dir() / "gemm" / "wgmma.cu").read_text()
    for h in HEADERS:
        assert f'{{% include "common/sm90/{h}.cuh" %}}' in text, h
    for ptx in ("mbarrier.", "cp.async.bulk", "setmaxnreg", "wgmma.fence", "fence.proxy",
                "fence.mbarrier_init", "bar.sync"):
        assert f'"{ptx}' not in text, f"wgmma.cu still writes {ptx} itself"
