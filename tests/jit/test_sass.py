"""The compiled kernels run on the instructions they are written for: SASS read with cuobjdump
(from the test extra's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels), no GPU needed."""

from __future__ import annotations

import struct

import pytest

from ge2jit.jit.cache import KernelCache
from ge2jit.jit.loader import build
from ge2jit.jit.sass import dump_sass, find_cuobjdump, instruction_mix
from ge2jit.ops.gemm.epilogue import Epilogue, Scale
from ge2jit.ops.gemm.spec import (
    MMA_16BIT_CONFIGS,
    MMA_X3_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_X3_CONFIGS,
    Act,
    BiasKind,
    DType,
    Layout,
    MmaGemmSpec,
    WgmmaGemmSpec,
)


def _epilogue(dtype: DType, act: Act, bias: BiasKind, save_z: bool = False) -> Epilogue:
    """Y in the inputs' type, the bias too."""
    return Epilogue(out_dtype=dtype, act=act, bias=bias,
                    bias_dtype=None if bias is BiasKind.NONE else dtype, save_z=save_z)


CASES = {
    "wgmma_bf16": (WgmmaGemmSpec(DType.BF16, Layout.ROW, Layout.COL,
                                 _epilogue(DType.BF16, Act.GELU_TANH, BiasKind.COL),
                                 WGMMA_CONFIGS[0]), "sm_90a", "HGMMA.64x256x16.F32.BF16"),
    "wgmma_f16_mn_major": (WgmmaGemmSpec(DType.F16, Layout.COL, Layout.ROW,
                                         _epilogue(DType.F16, Act.SILU, BiasKind.COL, True),
                                         WGMMA_CONFIGS[1]), "sm_90a", "HGMMA.64x128x16.F32"),
    "wgmma_tf32x3": (WgmmaGemmSpec(DType.F32, Layout.ROW, Layout.COL,
                                   _epilogue(DType.F32, Act.GELU, BiasKind.ROW),
                                   WGMMA_X3_CONFIGS[0], promote=True),
                     "sm_90a", "HGMMA.64x128x8.F32.TF32"),
    # 8-bit inputs: the FP8 form (QGMMA), with float32 sums, scales, an amax and 8-bit Y
    "wgmma_e4m3": (WgmmaGemmSpec(DType.E4M3, Layout.ROW, Layout.COL,
                                 Epilogue(out_dtype=DType.BF16, act=Act.GELU,
                                          bias=BiasKind.COL, bias_dtype=DType.BF16,
                                          scale_a=Scale.ROW, scale_b=Scale.COL, amax=True),
                                 WGMMA_X3_CONFIGS[0], promote=True),
                   "sm_90a", "QGMMA.64x128x32.F32.E4M3.E4M3"),
    "wgmma_e5m2_fp8_out": (WgmmaGemmSpec(DType.E5M2, Layout.ROW, Layout.COL,
                                         Epilogue(out_dtype=DType.E4M3, act=Act.SILU,
                                                  scale_a=Scale.TENSOR, scale_b=Scale.TENSOR,
                                                  scale_y=True, amax=True),
                                         WGMMA_CONFIGS[0], store16=False),
                           "sm_90a", "QGMMA.64x256x32.F32.E5M2.E5M2"),
    "mma_bf16": (MmaGemmSpec(DType.BF16, Layout.ROW, Layout.ROW,
                             _epilogue(DType.BF16, Act.RELU, BiasKind.COL), MMA_16BIT_CONFIGS[0]),
                 "sm_80", "HMMA.16816.F32.BF16"),
    "mma_tf32x3": (MmaGemmSpec(DType.F32, Layout.ROW, Layout.COL,
                               _epilogue(DType.F32, Act.NONE, BiasKind.NONE), MMA_X3_CONFIGS[0],
                               promote=True), "sm_80", "HMMA.1688.F32.TF32"),
}


@pytest.fixture(scope="module")
def tool():
    found = find_cuobjdump()
    assert found, "cuobjdump not found: install the test extra (nvidia-cuda-cuobjdump)"
    return found


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(tmp_path_factory.mktemp("sass-cache"))


def _elf_end(cubin: bytes) -> int:
    """Where the ELF's program and section header tables end: the least length of the file."""
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    return max(phoff + phentsize * phnum, shoff + shentsize * shnum)


@pytest.mark.parametrize("case", CASES)
def test_kernels_run_on_the_matrix_units(case, tool, cache):
    spec, arch, mma_op = CASES[case]
    entry, _ = build(spec, arch, cache=cache)
    assert entry.cubin[:4] == b"\x7fELF" and len(entry.cubin) >= _elf_end(entry.cubin), \
        "the whole cubin, with its last byte"
    sass = dump_sass(entry.cubin, tool)
    ops = instruction_mix(sass)
    assert mma_op in sass, (mma_op, ops.most_common(12))
    assert ops["LDL"] == 0 and ops["STL"] == 0, "no local-memory traffic"
    if isinstance(spec, WgmmaGemmSpec):
        gmma = "QGMMA" if spec.dtype.is_fp8 else "HGMMA"   # (8-bit inputs: QGMMA)
        assert ops[gmma] > 0 and ops["UTMALDG"] > 0 and ops["HMMA"] == 0
        # 16-bit outputs leave shared memory by TMA stores
        assert (ops["UTMASTG"] > 0) == spec.tma_store, ops["UTMASTG"]
    else:
        assert ops["HMMA"] > 0 and ops["LDSM"] > 0 and ops["HGMMA"] == 0
    if spec.promote:   # chunks of products added with rounded float32 adds
        assert ops["FADD"] > 0
