"""Every kernel variant compiles with NVRTC for sm_80 and sm_90, without spilling (no GPU needed).

CI compiles a pairwise covering set of each kernel family: every value of each parameter meets
every value of every other parameter at least once. The full products run with ``-m slow``.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from allpairspy import AllPairs

from ge2jit.jit.cache import KernelCache
from ge2jit.jit.loader import build
from ge2jit.jit.parallel import compile_many
from ge2jit.ops.gemm.epilogue import PARTIAL_SUMS, Epilogue, Scale
from ge2jit.ops.gemm.select import kernel_set
from ge2jit.ops.gemm.spec import (
    ACTS_FROM_Y,
    MMA_16BIT_CONFIGS,
    MMA_TF32_CONFIGS,
    MMA_X3_CONFIGS,
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_FP8_CONFIGS,
    WGMMA_FP8_FAST_CONFIGS,
    WGMMA_X3_CONFIGS,
    Act,
    BiasKind,
    DbiasSpec,
    DType,
    DzSpec,
    Layout,
    MmaGemmSpec,
    PipelinedGemmSpec,
    Precision,
    SplitKReduceSpec,
    Tf32SplitSpec,
    TiledGemmSpec,
    TransposeSpec,
    WgmmaGemmSpec,
)
from ge2jit.ops.optim import UpdateSpec

ARCHS = ["sm_80", "sm_90"]
#: the 16- and 32-bit types (8-bit inputs have a family of their own)
FLOATS = [DType.F32, DType.F16, DType.BF16]
FP8 = [DType.E4M3, DType.E5M2]
EPILOGUE = {
    "layout_c": [None, *Layout],
    "act": list(Act),
    "bias": list(BiasKind),
    "save_z": [False, True],
}
# Types of Y, C and the bias: the inputs' own, or float32.
TYPES = {"out": ["input", "f32"], "c_type": ["input", "f32"], "bias_type": ["input", "f32"]}


# The backward's gating epilogue (Y = alpha * A @ B * act'(C)): C is Z, or Y for the
# activations whose derivative is a function of their output.
GATES = [(a, False) for a in Act] + [(a, True) for a in ACTS_FROM_Y if a is not Act.NONE]
GATED = {"layout_c": list(Layout), "act": [Act.NONE], "bias": [BiasKind.NONE],
         "save_z": [False], "gate": GATES}
# the tiled tensor-core and pipelined families: the costliest derivatives (registers), and
# both sources
GATED_FEW = {**GATED, "gate": [(Act.GELU, False), (Act.GELU_TANH, False), (Act.SILU, False),
                               (Act.SIGMOID, True), (Act.LEAKY_RELU, True)]}


# The gated linear unit's epilogue (Y = act(Z[:, 0::2]) * Z[:, 1::2]): no C, no bias or one
# per column; the gates of the units (SwiGLU, GeGLU, ReGLU, GLU) and a bilinear one.
GLU = {"layout_c": [None], "act": [Act.SILU, Act.GELU, Act.GELU_TANH, Act.RELU, Act.SIGMOID,
                                   Act.NONE],
       "bias": [BiasKind.NONE, BiasKind.COL], "save_z": [False, True], "glu": [True]}
GLU_FEW = {**GLU, "act": [Act.SILU, Act.GELU, Act.SIGMOID]}
# That unit's backward in the next layer's dA GEMM: C its Z, Y its dZ (twice as wide)
GLU_GRAD = {"layout_c": list(Layout), "act": [Act.NONE], "bias": [BiasKind.NONE],
            "save_z": [False], "c_type": ["input", "f32"],
            "glu_grad": [Act.SILU, Act.GELU, Act.GELU_TANH, Act.RELU]}


def _epilogue(p: dict, dtype: DType) -> Epilogue:
    """A row's epilogue: the types of Y, C and the bias are the inputs' ("input", the
    default) or float32; a C or bias that is not there has none."""
    pick = {"input": dtype, "f32": DType.F32}
    gate, from_y = p.get("gate", (None, False))
    layout_c, bias = p["layout_c"], p["bias"]
    return Epilogue(
        out_dtype=pick[p.get("out", "input")], act=p["act"], bias=bias,
        bias_dtype=None if bias is BiasKind.NONE else pick[p.get("bias_type", "input")],
        layout_c=layout_c, c_dtype=None if layout_c is None else pick[p.get("c_type", "input")],
        save_z=p["save_z"], gate=gate, gate_from_y=from_y, glu=p.get("glu", False),
        glu_grad=p.get("glu_grad"))


def _tiled(p: dict) -> TiledGemmSpec:
    return TiledGemmSpec(p["dtype"], p["layout_a"], p["layout_b"], _epilogue(p, p["dtype"]),
                         p["tile"])


def _mma(p: dict) -> MmaGemmSpec:
    return MmaGemmSpec(p["dtype"], p["layout_a"], p["layout_b"], _epilogue(p, p["dtype"]),
                       p["config"], p["copy_a"], p["copy_b"], p["vec_y"],
                       promote=p.get("promote", False))


def _wgmma(p: dict) -> WgmmaGemmSpec:
    """The fields as kernel_set chooses them: split-K slices store ``PARTIAL_SUMS``; a
    row-major C through the ring where it fits, else no staging with a C term (a gate's
    and a gated unit's Z excepted); staged results leave as vectors; the column
    sums of a gated output where the kernel can make them."""
    epilogue = PARTIAL_SUMS if p["split_k"] else _epilogue(p, p["dtype"])
    c_tma = (p["store16"] and epilogue.layout_c is Layout.ROW
             and WgmmaGemmSpec.c_tma_unfit(p["config"], epilogue) is None)
    staging = WgmmaGemmSpec.staging_spills(p["config"], epilogue, c_tma) is None
    c_tma = c_tma and staging
    store16 = (p["store16"] and staging
               and (epilogue.layout_c is None or epilogue.gate is not None or c_tma
                    or epilogue.glu_grad is not None))
    spec = WgmmaGemmSpec(p["dtype"], p["layout_a"], p["layout_b"], epilogue, p["config"],
                         p["vec_y"] or store16, store16, promote=p.get("promote", False),
                         split_k=p["split_k"], c_tma=c_tma)
    if p.get("bgrad") and spec.can_bgrad:
        return replace(spec, epilogue=replace(epilogue, bgrad=True))
    return spec


def _wgmma_fp8(p: dict) -> WgmmaGemmSpec:
    """The kernel ``kernel_set`` makes for 8-bit inputs with these scales, outputs and
    alignment of Y (16 bytes: staged 16- and 32-bit outputs); Z only for outputs that are
    not 8-bit, float32 sums only on the configs that keep a second set."""
    out, bias, layout_c = p["out"], p["bias"], p["layout_c"]
    precision = p["precision"]
    if not p["config"].can_promote:
        precision = Precision.FAST_ACCUM
    epilogue = Epilogue(
        out_dtype=out, act=p["act"], bias=bias,
        bias_dtype=None if bias is BiasKind.NONE else p["bias_type"], layout_c=layout_c,
        c_dtype=None if layout_c is None else p["c_type"], save_z=p["save_z"] and not out.is_fp8,
        scale_a=p["scale_a"], scale_b=p["scale_b"], scale_y=out.is_fp8, amax=p["amax"])
    return kernel_set(p["dtype"], Layout.ROW, Layout.COL, epilogue, p["config"], 1, 4096,
                      (16, 16, p["align_y"], 16), precision).main


def _pipelined(p: dict) -> PipelinedGemmSpec:
    """The fields as kernel_set chooses them: 16-byte copies of an operand whose contiguous
    dimension is the shared tile's; split-K slices store ``PARTIAL_SUMS`` as vectors."""
    split = p["split_k"]
    la, lb = p["layout_a"], p["layout_b"]
    return PipelinedGemmSpec(DType.F32, la, lb, PARTIAL_SUMS if split else _epilogue(p, DType.F32),
                             p["config"], p["vec_a"] and la is Layout.COL,
                             p["vec_b"] and lb is Layout.ROW, p["vec_y"] or split, split)


def _splitk_reduce(p: dict) -> SplitKReduceSpec:
    return SplitKReduceSpec(p["dtype"], _epilogue(p, p["dtype"]), p["vec_y"])


def _dz(p: dict) -> DzSpec:
    """The fields as the backward chooses them: act none reads neither Z nor Y (not from Y,
    its type gY's); without dC, dC's type is float32."""
    glu = p.get("glu", False)   # (reads Z's linear half whatever its activation)
    reads = p["act"] is not Act.NONE or glu
    return DzSpec(p["act"], p["from_y"] and reads, p["bias"], p["grad"],
                  p["src"] if reads else p["grad"], p["dz"], write_dz=p["write_dz"],
                  write_dc=p["write_dc"], dc_dtype=p["dc"] if p["write_dc"] else DType.F32,
                  vec=p["vec"], glu=glu)


MMA_COMMON = {"layout_a": list(Layout), "layout_b": list(Layout), **EPILOGUE, **TYPES,
              "copy_a": [4, 8, 16], "copy_b": [4, 8, 16], "vec_y": [False, True],
              "arch": ARCHS}
FAMILIES = {
    "tiled": (
        {"dtype": FLOATS, "layout_a": list(Layout), "layout_b": list(Layout), **EPILOGUE,
         **TYPES, "tile": list(TILED_CONFIGS), "arch": ARCHS},
        _tiled,
    ),
    "mma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "config": list(MMA_16BIT_CONFIGS), **MMA_COMMON},
        _mma,
    ),
    "mma_tf32": (
        {"dtype": [DType.F32], "config": list(MMA_TF32_CONFIGS), **MMA_COMMON},
        _mma,
    ),
    # The Hopper kernel: sm_90a only; tf32 reads K-major operands only (row-major A,
    # column-major B).
    "wgmma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "layout_a": list(Layout), "layout_b": list(Layout),
         **EPILOGUE, **TYPES, "config": list(WGMMA_CONFIGS), "vec_y": [False, True],
         "store16": [False, True], "split_k": [False, True], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "wgmma_tf32": (
        {"dtype": [DType.F32], "layout_a": [Layout.ROW], "layout_b": [Layout.COL], **EPILOGUE,
         **TYPES, "config": list(WGMMA_CONFIGS), "vec_y": [False, True],
         "store16": [False, True], "split_k": [False, True], "arch": ["sm_90a"]},
        _wgmma,
    ),
    # 3xTF32: split K-major operands, products added to the accumulators in rounded float32
    "mma_tf32x3": (
        {"dtype": [DType.F32], "config": list(MMA_X3_CONFIGS), "layout_a": [Layout.ROW],
         "layout_b": [Layout.COL], **EPILOGUE, "out": ["input"], "c_type": ["input"],
         "bias_type": ["input"], "copy_a": [16], "copy_b": [16], "vec_y": [False, True],
         "promote": [True], "arch": ARCHS},
        _mma,
    ),
    "wgmma_tf32x3": (
        {"dtype": [DType.F32], "layout_a": [Layout.ROW], "layout_b": [Layout.COL], **EPILOGUE,
         "out": ["input"], "c_type": ["input"], "bias_type": ["input"],
         "config": list(WGMMA_X3_CONFIGS), "vec_y": [False, True], "store16": [False, True],
         "promote": [True], "split_k": [False, True], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "pipelined": (
        {"layout_a": list(Layout), "layout_b": list(Layout), **EPILOGUE,
         "config": list(PIPELINED_F32_CONFIGS), "vec_a": [False, True], "vec_b": [False, True],
         "vec_y": [False, True], "split_k": [False, True], "arch": ARCHS},
        _pipelined,
    ),
    "transpose": (
        {"dtype": FLOATS, "arch": ARCHS},
        lambda p: TransposeSpec(p["dtype"]),
    ),
    # 8-bit inputs: every epilogue with the scales, the amax and every output type, as
    # kernel_set makes their kernels (float32 sums on the tiles that can keep them, the
    # tensor cores' own on any), and their operands' copies into K-major rows
    "wgmma_fp8": (
        {"dtype": FP8, **EPILOGUE, "out": [DType.BF16, DType.F16, DType.F32, *FP8],
         "c_type": FLOATS, "bias_type": FLOATS, "scale_a": [Scale.NONE, Scale.TENSOR, Scale.ROW],
         "scale_b": [Scale.NONE, Scale.TENSOR, Scale.COL], "amax": [False, True],
         "config": list(dict.fromkeys(WGMMA_FP8_FAST_CONFIGS + WGMMA_FP8_CONFIGS)),
         "precision": [Precision.IEEE, Precision.FAST_ACCUM], "align_y": [2, 16],
         "arch": ["sm_90a"]},
        _wgmma_fp8,
    ),
    "copy_fp8": (
        {"dtype": FP8, "transpose": [False, True], "arch": ["sm_90"]},
        lambda p: TransposeSpec(p["dtype"], p["transpose"]),
    ),
    "tf32x3_split": (
        {"transpose": [False, True], "order": ["hhl", "hlh"], "arch": ARCHS},
        lambda p: Tf32SplitSpec(p["transpose"], p["order"]),
    ),
    "splitk_reduce": (
        {"dtype": FLOATS, **EPILOGUE, **TYPES, "vec_y": [False, True], "arch": ARCHS},
        _splitk_reduce,
    ),
    # the backward's dZ pass: act' from Z (any activation) or from Y (those it allows)
    "dz": (
        {"act": list(Act), "from_y": [False], "bias": list(BiasKind), "grad": FLOATS,
         "src": FLOATS, "dz": FLOATS, "write_dz": [False, True],
         "write_dc": [False, True], "dc": FLOATS, "vec": [False, True], "arch": ARCHS},
        _dz,
    ),
    "dbias": (
        {"out": FLOATS, "total": [False, True], "arch": ARCHS},
        lambda p: DbiasSpec(p["out"], p["total"]),
    ),
    # the optimizers' fused steps
    "update": (
        {"rule": ["adam", "sgd"], "grad": FLOATS, "copy": [None, *FLOATS],
         "nesterov": [False], "arch": ARCHS},
        lambda p: UpdateSpec(p["rule"], p["grad"], p["copy"], p["nesterov"]),
    ),
    "update_nesterov": (
        {"rule": ["sgd"], "grad": FLOATS, "copy": [None, DType.BF16], "nesterov": [True],
         "arch": ARCHS},
        lambda p: UpdateSpec(p["rule"], p["grad"], p["copy"], p["nesterov"]),
    ),
    # the gating epilogue in every GEMM family (Y's type is the inputs': dA)
    "gated_tiled": (
        {"dtype": FLOATS, "layout_a": list(Layout), "layout_b": list(Layout), **GATED,
         "out": ["input"], "c_type": ["input", "f32"], "bias_type": ["input"],
         "tile": list(TILED_CONFIGS), "arch": ARCHS},
        _tiled,
    ),
    "gated_mma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "config": list(MMA_16BIT_CONFIGS),
         **{**MMA_COMMON, **GATED_FEW}, "out": ["input"], "bias_type": ["input"]},
        _mma,
    ),
    "gated_mma_tf32x3": (
        {"dtype": [DType.F32], "config": list(MMA_X3_CONFIGS), "layout_a": [Layout.ROW],
         "layout_b": [Layout.COL], **GATED_FEW, "out": ["input"], "c_type": ["input"],
         "bias_type": ["input"], "copy_a": [16], "copy_b": [16], "vec_y": [False, True],
         "promote": [True], "arch": ARCHS},
        _mma,
    ),
    "gated_wgmma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "layout_a": list(Layout), "layout_b": list(Layout),
         **GATED_FEW, "out": ["input"], "c_type": ["input", "f32"], "bias_type": ["input"],
         "config": list(WGMMA_CONFIGS), "vec_y": [False, True], "store16": [False, True],
         "split_k": [False], "bgrad": [False, True], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "gated_wgmma_tf32x3": (
        {"dtype": [DType.F32], "layout_a": [Layout.ROW], "layout_b": [Layout.COL], **GATED_FEW,
         "out": ["input"], "c_type": ["input"], "bias_type": ["input"],
         "config": list(WGMMA_X3_CONFIGS), "vec_y": [False, True], "store16": [False, True],
         "promote": [True], "split_k": [False], "bgrad": [False, True], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "gated_pipelined": (
        {"layout_a": list(Layout), "layout_b": list(Layout), **GATED_FEW,
         "config": list(PIPELINED_F32_CONFIGS), "vec_a": [False, True], "vec_b": [False, True],
         "vec_y": [False, True], "split_k": [False], "arch": ARCHS},
        _pipelined,
    ),
    "gated_splitk_reduce": (
        {"dtype": FLOATS, **GATED, "out": ["input"], "c_type": ["input", "f32"],
         "bias_type": ["input"], "vec_y": [False, True], "arch": ARCHS},
        _splitk_reduce,
    ),
    # the gated linear unit's epilogue in every GEMM family, and its backward's dZ pass
    "glu_tiled": (
        {"dtype": FLOATS, "layout_a": list(Layout), "layout_b": list(Layout), **GLU_FEW,
         "out": ["input", "f32"], "bias_type": ["input", "f32"], "tile": list(TILED_CONFIGS),
         "arch": ARCHS},
        _tiled,
    ),
    "glu_mma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "config": list(MMA_16BIT_CONFIGS),
         **{**MMA_COMMON, **GLU_FEW}},
        _mma,
    ),
    "glu_mma_tf32": (
        {"dtype": [DType.F32], "config": list(MMA_TF32_CONFIGS), **{**MMA_COMMON, **GLU_FEW}},
        _mma,
    ),
    "glu_wgmma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "layout_a": list(Layout), "layout_b": list(Layout),
         **GLU, "out": ["input", "f32"], "bias_type": ["input", "f32"],
         "config": list(WGMMA_CONFIGS), "vec_y": [False, True], "store16": [False, True],
         "split_k": [False], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "glu_wgmma_tf32": (
        {"dtype": [DType.F32], "layout_a": [Layout.ROW], "layout_b": [Layout.COL], **GLU_FEW,
         "out": ["input"], "bias_type": ["input"], "config": list(WGMMA_CONFIGS),
         "vec_y": [False, True], "store16": [False, True], "split_k": [False],
         "promote": [False], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "glu_wgmma_tf32x3": (
        {"dtype": [DType.F32], "layout_a": [Layout.ROW], "layout_b": [Layout.COL], **GLU_FEW,
         "out": ["input"], "bias_type": ["input"], "config": list(WGMMA_X3_CONFIGS),
         "vec_y": [False, True], "store16": [False, True], "promote": [True],
         "split_k": [False], "arch": ["sm_90a"]},
        _wgmma,
    ),
    "glu_pipelined": (
        {"layout_a": list(Layout), "layout_b": list(Layout), **GLU_FEW,
         "config": list(PIPELINED_F32_CONFIGS), "vec_a": [False, True], "vec_b": [False, True],
         "vec_y": [False, True], "split_k": [False], "arch": ARCHS},
        _pipelined,
    ),
    "glu_splitk_reduce": (
        {"dtype": FLOATS, **GLU, "out": ["input", "f32"], "bias_type": ["input", "f32"],
         "vec_y": [False, True], "arch": ARCHS},
        _splitk_reduce,
    ),
    "glu_grad_mma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "config": list(MMA_16BIT_CONFIGS),
         **{**MMA_COMMON, **GLU_GRAD}},
        _mma,
    ),
    "glu_grad_wgmma_16bit": (
        {"dtype": [DType.F16, DType.BF16], "layout_a": list(Layout), "layout_b": list(Layout),
         **GLU_GRAD, "out": ["input"], "bias_type": ["input"], "config": list(WGMMA_CONFIGS),
         "vec_y": [False, True], "store16": [False, True], "split_k": [False, True],
         "arch": ["sm_90a"]},
        _wgmma,
    ),
    "glu_grad_splitk_reduce": (
        {"dtype": FLOATS, **GLU_GRAD, "out": ["input"], "bias_type": ["input"],
         "vec_y": [False, True], "arch": ARCHS},
        _splitk_reduce,
    ),
    "glu_grad_tiled": (
        {"dtype": FLOATS, "layout_a": list(Layout), "layout_b": list(Layout), **GLU_GRAD,
         "out": ["input"], "bias_type": ["input"], "tile": list(TILED_CONFIGS), "arch": ARCHS},
        _tiled,
    ),
    "glu_dz": (
        {"act": list(Act), "from_y": [False], "bias": [BiasKind.NONE, BiasKind.COL],
         "grad": FLOATS, "src": FLOATS, "dz": FLOATS, "write_dz": [True],
         "write_dc": [False], "dc": [DType.F32], "vec": [False, True], "glu": [True],
         "arch": ARCHS},
        _dz,
    ),
    "dz_from_y": (
        {"act": list(ACTS_FROM_Y), "from_y": [True], "bias": list(BiasKind),
         "grad": FLOATS, "src": FLOATS, "dz": FLOATS, "write_dz": [True],
         "write_dc": [False, True], "dc": FLOATS, "vec": [False, True], "arch": ARCHS},
        _dz,
    ),
}


def covering_set(params: dict) -> list[dict]:
    # The parameter with the most values first gives allpairspy its smallest sets.
    order = sorted(params, key=lambda k: -len(params[k]))
    return [dict(zip(order, row)) for row in AllPairs([params[k] for k in order])]


def full_product(params: dict) -> list[dict]:
    return [dict(zip(params, row)) for row in itertools.product(*params.values())]


COVERING = {family: covering_set(params) for family, (params, _) in FAMILIES.items()}


def _cases(sets):
    return [pytest.param(family, p, id=f"{FAMILIES[family][1](p).kernel_name}-{p['arch']}")
            for family, rows in sets.items() for p in rows]


@pytest.mark.parametrize("family", FAMILIES)
def test_covering_set_covers_every_pair(family):
    params = FAMILIES[family][0]
    rows = COVERING[family]
    for x, y in itertools.combinations(params, 2):
        seen = {(row[x], row[y]) for row in rows}
        for pair in itertools.product(params[x], params[y]):
            assert pair in seen, (x, y, pair)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(tmp_path_factory.mktemp("compile-cache"))


def _compile_and_check(family, params, cache):
    spec = FAMILIES[family][1](params)
    arch = params["arch"]
    entry, _ = build(spec, arch, cache=cache)
    assert entry.kernel_name == spec.kernel_name
    assert entry.arch == arch
    assert entry.cubin[:4] == b"\x7fELF"
    assert 0 < entry.registers <= 255
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (spec.kernel_name, entry.log)
    assert entry.stack_bytes == 0, (spec.kernel_name, entry.log)


@pytest.mark.parametrize("family, params", _cases(COVERING))
def test_covering_set_compiles_without_spills(family, params, cache):
    _compile_and_check(family, params, cache)


@pytest.mark.slow
def test_full_product_compiles_without_spills(tmp_path):
    """Every distinct kernel of every family (about 50,000 compiles: hours on 2 cores; it uses
    all cores)."""
    jobs = []
    for params, make in FAMILIES.values():
        for p in full_product(params):
            jobs.append((make(p), p["arch"]))
    outcomes = compile_many(jobs, cache_root=tmp_path)
    bad = [o for o in outcomes if o.status == "failed" or o.spill_bytes != 0 or o.stack_bytes]
    assert not bad, [(o.kernel_name, o.arch, o.error or o.spill_bytes) for o in bad[:20]]


def _wide_staging_cases() -> list:
    """The 64x256 ping-pong tile's epilogues that spilled when staged (a gate; float32 Y and
    Z with a scalar or row bias: found by compiling every combination for sm_90a), and the
    256-wide tiles with the column sums, as kernel_set now makes them."""
    from ge2jit.ops.gemm.select import kernel_set

    pp256 = next(c for c in WGMMA_CONFIGS if c.pingpong and c.bn == 256)
    co256 = next(c for c in WGMMA_CONFIGS if not c.pingpong and c.bn == 256)
    bf16, f16, row = DType.BF16, DType.F16, Layout.ROW
    cases = []
    for dtype in (bf16, f16):
        for gate in GATES[1:]:
            cases.append((pp256, dtype, Epilogue(out_dtype=dtype, layout_c=row, c_dtype=dtype,
                                                 gate=gate[0], gate_from_y=gate[1])))
            cases.append((co256, dtype, Epilogue(out_dtype=dtype, layout_c=row, c_dtype=dtype,
                                                 gate=gate[0], gate_from_y=gate[1],
                                                 bgrad=True)))
        for act in (Act.NONE, Act.RELU, Act.LEAKY_RELU, Act.GELU):
            for bias in (BiasKind.SCALAR, BiasKind.ROW):
                cases.append((pp256, dtype, Epilogue(out_dtype=DType.F32, act=act, bias=bias,
                                                     bias_dtype=dtype, save_z=True)))
    specs = {}
    for cfg, dtype, epilogue in cases:
        main = kernel_set(dtype, row, row, epilogue, cfg, 1, 4096, (16, 16, 16, 16)).main
        specs[main.kernel_name] = main
    return [pytest.param(s, id=name) for name, s in sorted(specs.items())]


@pytest.mark.parametrize("layouts", ["rr", "cr"])
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F16], ids=["bf16", "f16"])
def test_a_float32_accumulator_compiles_staged_on_the_tile_the_heuristic_gives(dtype, layouts,
                                                                                cache):
    """A 16-bit GEMM adding into a row-major float32 C, Y float32 (a gradient summed over
    chunks, ``out=c``): the heuristic's tile brings C in by TMA and stages Y, without spills
    and without serialized wgmma."""
    from ge2jit.ops.gemm.select import heuristic

    from ...compiled import check_compiled

    acc = Epilogue(out_dtype=DType.F32, layout_c=Layout.ROW, c_dtype=DType.F32)
    ch = heuristic(128256, 2048, 2048, 132, 90, layouts, dtype, wide_c=True)
    spec = kernel_set(dtype, Layout(layouts[0]), Layout(layouts[1]), acc, ch.config, 1, 2048,
                      (16, 16, 16, 16)).main
    assert spec.c_tma and spec.store16, spec.kernel_name
    check_compiled(spec, "sm_90a", cache)


@pytest.mark.parametrize("spec", _wide_staging_cases())
def test_the_wide_tiles_epilogues_that_spilled_staged_compile_without_spills(spec, cache):
    # staged now only with C through the ring (a gate's), which leaves the registers they need
    assert not spec.store16 or spec.epilogue.gate is not None and (
        spec.c_tma or not spec.config.pingpong)
    assert not spec.epilogue.bgrad or spec.c_tma
    entry, _ = build(spec, "sm_90a", cache=cache)
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (spec.kernel_name, entry.log)


def _gated_unit_staging_cases() -> list:
    """The staged epilogues of gated linear units at the edge of what fits (found by compiling
    every combination for sm_90a), as kernel_set makes them: the cooperative 128x256 tile
    staging 16-bit Y and Z without a bias, and every tile forming the unit's dZ (its
    backward) in the staging blocks, with the erf GELU (which spills on the ping-pong 128x128
    tile, left unstaged there) and SiLU."""
    from ge2jit.ops.gemm.select import kernel_set

    co256 = next(c for c in WGMMA_CONFIGS if not c.pingpong and c.bn == 256)
    row, col = Layout.ROW, Layout.COL
    specs = {}
    for dtype in (DType.BF16, DType.F16):
        for act in (Act.SILU, Act.GELU_TANH, Act.SIGMOID, Act.RELU, Act.NONE):
            ep = Epilogue(out_dtype=dtype, act=act, save_z=True, glu=True)
            main = kernel_set(dtype, row, col, ep, co256, 1, 4096, (16, 16, 16, 16)).main
            specs[main.kernel_name] = main
    for cfg in WGMMA_CONFIGS:
        for act in (Act.GELU, Act.SILU):
            ep = Epilogue(out_dtype=DType.BF16, layout_c=row, c_dtype=DType.BF16, glu_grad=act)
            main = kernel_set(DType.BF16, row, row, ep, cfg, 1, 4096, (16, 16, 16, 16)).main
            specs[main.kernel_name] = main
    return [pytest.param(s, id=name) for name, s in sorted(specs.items())]


@pytest.mark.parametrize("spec", _gated_unit_staging_cases())
def test_gated_units_staged_epilogues_compile_without_spills(spec, cache):
    assert spec.store16 == (spec.epilogue.glu_grad is not Act.GELU
                            or spec.config.name != "wgmma_128x128_s6_pp")
    entry, _ = build(spec, "sm_90a", cache=cache)
    assert entry.spill_stores == 0 and entry.spill_loads == 0, (spec.kernel_name, entry.log)
    assert entry.stack_bytes == 0, (spec.kernel_name, entry.log)
