"""The FP8 quantization kernels (``kernel_templates/quantize/quantize.cu``), their
configuration names and the choice among them. Everything here is pure: no GPU, no CuPy.

A quantization stores ``q = x * (1 / scale)`` rounded to nearest-even in an 8-bit format,
saturated at its largest finite value (448 for e4m3, 57344 for e5m2; NaN stays NaN), where a
dynamic ``scale`` is ``amax / largest`` of the values it covers (1 where their amax is 0).

One template, two stages:

``amax`` (per-tensor dynamic scaling, first kernel)
    max |x| of the whole tensor, as the largest float32 bit pattern of |x| (NaN wins over
    infinity, infinity over any number) kept with ``atomicMax`` in a zeroed word.
``quantize``
    Stores q; where the scale comes from (``Source``): the row's own amax (per-row dynamic,
    one read of a row held in registers), the amax word of the first stage (its blocks turn it
    into the scale, the first also stores it), a float32 device array (one value, or one per
    row), or a host number. ``amax``: also keeps max |x| in a zeroed word (delayed scaling).

Variants (``RowConfig`` names, ``runtime.rows``):

``warp{G}_v{V}_r1``, ``block_{T}_v{V}``
    A row held in registers (``G`` lanes or ``T`` threads, ``V`` values each): one read.
``loop_{T}``
    A block per row of any length, stepping over it; per-row dynamic scaling reads it twice
    (its amax, then the quantization: the second read mostly from L2).
``flat_{T}``
    The whole tensor as one run of elements shared by every block (rows laid end to end):
    per-tensor scales on arrays whose rows are contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from ...errors import ArgumentValueError
from ...jit.params import Param, double, int64, pointer
from ...jit.spec import KernelSpec
from ...runtime.dtypes import FLOAT_DTYPES, DType, as_dtype
from ...runtime.rows import (
    GRID_MAX,
    RowConfig,
    RowShapes,
    access_width,
    check_accesses,
    check_block,
    check_capacity,
    one_of,
    pow2_at_least,
)

VARIANTS = ("warp", "block", "loop", "flat")
ROW_VARIANTS = VARIANTS[:3]
WARP_THREADS = 128
WARP_LANES = (1, 2, 4, 8, 16, 32)
WARP_VPT = (4, 8, 16, 32)
BLOCK_THREADS = (128, 256, 512, 1024)
BLOCK_VPT = (8, 16, 32)
LOOP_THREADS = (256, 512, 1024)
FLAT_THREADS = (256, 512, 1024)
#: blocks of the flat variant per multiprocessor (it strides over the tensor)
FLAT_BLOCKS_PER_SM = 4

#: The longest rows a warp and a block hold (above: loop).
WARP_MAX_N = max(WARP_LANES) * max(WARP_VPT)          # 1024
BLOCK_MAX_N = max(BLOCK_THREADS) * max(BLOCK_VPT)     # 32768


class Stage(Enum):
    AMAX = "amax"
    QUANTIZE = "quantize"


class Source(Enum):
    """Where the quantize stage finds the scale."""

    ROW = "row"          # each row's own amax (per-row dynamic)
    TENSOR = "tensor"    # the amax stage's word (per-tensor dynamic)
    DEVICE = "device"    # a float32 device array: one value (stride 0) or one per row
    HOST = "host"        # a host number: 1 / scale passed as a parameter


#: how a call gives its scale: computed from x, a device array, a host number
SCALE_KINDS = ("dynamic", "device", "host")


def source_of(kind: str, per_row: bool) -> Source | None:
    """The Source of a scale given as ``kind`` (one of ``SCALE_KINDS``); None for a host
    number per row (a call refuses it: per-row scales are arrays)."""
    if kind == "dynamic":
        return Source.ROW if per_row else Source.TENSOR
    if kind == "device":
        return Source.DEVICE
    return None if per_row else Source.HOST


def step_vpt(vec: int) -> int:
    """Values per thread and step of the loop and flat variants: four accesses of ``vec``
    elements, at least 16."""
    return max(16, 4 * vec)


@dataclass(frozen=True)
class QuantConfig(RowConfig):
    """One variant with its shape (see the module's docstring); ``name`` is what
    ``quantize_fp8(config=...)`` takes."""

    def __post_init__(self):
        SHAPES.check(self, VARIANTS)
        if self.variant == "flat":
            one_of("threads (flat_T)", self.threads, FLAT_THREADS)

    @property
    def flat(self) -> bool:
        return self.variant == "flat"


SHAPES = RowShapes(WARP_VPT, (1,), max(WARP_VPT), BLOCK_THREADS, BLOCK_VPT, LOOP_THREADS,
                   WARP_THREADS, WARP_LANES)
NAME_EXAMPLES = "'warp32_v8_r1', 'block_512_v16', 'loop_1024' or 'flat_512'"


def parse_config(config) -> QuantConfig:
    """A ``QuantConfig`` from its name (or the config itself); one line naming what is wrong
    for anything else."""
    return SHAPES.parse(config, QuantConfig, VARIANTS,
                        f"a quantize_fp8 variant name such as {NAME_EXAMPLES}")


def all_configs() -> list[QuantConfig]:
    """Every configuration ``quantize_fp8(config=...)`` accepts."""
    out = [QuantConfig("warp", WARP_THREADS, vpt=v, lanes=g) for g in WARP_LANES
           for v in WARP_VPT]
    out += [QuantConfig("block", t, vpt=v) for t in BLOCK_THREADS for v in BLOCK_VPT]
    out += [QuantConfig("loop", t) for t in LOOP_THREADS]
    out += [QuantConfig("flat", t) for t in FLAT_THREADS]
    return out


def candidates(n: int, flat: bool) -> list[QuantConfig]:
    """The configurations worth timing for rows of ``n`` elements: those holding a row in at
    most 4x its length rounded up to a power of two, and every loop variant; ``flat``: a
    per-tensor scale on rows laid end to end, where the flat variants run too."""
    most = max(4 * pow2_at_least(max(n, 1)), 64)
    out = [c for c in all_configs() if c.variant == "loop"
           or (c.capacity is not None and n <= c.capacity <= most)]
    return out + [c for c in all_configs() if c.flat] if flat else out


def heuristic(rows: int, n: int, dtype, flat: bool) -> QuantConfig:
    """The configuration a call takes for ``rows`` rows of ``n`` elements of ``dtype``.

    - ``flat`` (one scale for the whole tensor, rows laid end to end): ``flat_512``, four
      blocks per multiprocessor striding over the elements.
    - ``n`` <= 1024: a warp, or part of one: rows of at most 32 accesses of 16 bytes get one
      access per lane and the lanes they need (a power of two); longer rows 32 lanes of
      n / 32 values (a power of two).
    - ``n`` <= 16384: a block of n / 16 threads (at least 128, a power of two), 16 values each.
    - longer rows: ``loop_1024``.
    """
    if flat:
        return QuantConfig("flat", 512)
    width = access_width(as_dtype(dtype))
    if n <= WARP_MAX_N:
        if n <= 32 * width:
            return QuantConfig("warp", WARP_THREADS, vpt=width,
                               lanes=pow2_at_least(-(-n // width)))
        return QuantConfig("warp", WARP_THREADS, vpt=pow2_at_least(-(-n // 32)), lanes=32)
    if n <= 16384:
        return QuantConfig("block", max(128, pow2_at_least(-(-n // 16))), vpt=16)
    return QuantConfig("loop", 1024)


@dataclass(frozen=True)
class QuantSpec(KernelSpec):
    """One quantization kernel: the input type, the 8-bit format (None for the amax stage,
    which stores no q), the stage, the scale's source (quantize stage), ``amax``: the quantize
    stage keeps max |x| too, and the variant's shape (``threads``, ``vpt`` values per thread:
    per row for warp and block, per step for loop and flat; ``vec`` elements per access;
    ``lanes`` per row of the warp variant)."""

    in_dtype: DType
    fmt: DType | None
    stage: Stage
    source: Source | None
    amax: bool
    variant: str
    threads: int
    vpt: int
    vec: int = 1
    lanes: int = 32

    template = "quantize/quantize.cu"
    smem_bytes = 0

    def __post_init__(self):
        if self.in_dtype not in FLOAT_DTYPES:
            raise ArgumentValueError(f"QuantSpec.in_dtype: expected one of "
                                     f"{[d.numpy_name for d in FLOAT_DTYPES]}, got "
                                     f"{self.in_dtype!r}")
        if self.stage is Stage.AMAX:
            if self.fmt is not None or self.source is not None or self.amax:
                raise ArgumentValueError("QuantSpec: the amax stage takes no format, source "
                                         "or amax flag")
        elif self.fmt is None or not self.fmt.is_fp8 or not isinstance(self.source, Source):
            raise ArgumentValueError("QuantSpec: the quantize stage needs an 8-bit format and "
                                     "a Source")
        if self.variant not in VARIANTS:
            raise ArgumentValueError(f"QuantSpec.variant: expected one of {VARIANTS}, got "
                                     f"{self.variant!r}")
        if self.variant == "flat" and self.source is Source.ROW:
            raise ArgumentValueError("QuantSpec: per-row scales need a row variant (warp, "
                                     "block, loop), not flat")
        check_accesses("QuantSpec", self.vec, access_width(self.in_dtype), self.vpt)
        check_block("QuantSpec", self.threads, self.lanes, WARP_LANES,
                    self.variant in ("block", "loop", "flat"))

    @property
    def variant_code(self) -> int:
        return VARIANTS.index(self.variant)

    @property
    def q_ctype(self) -> str:
        return self.fmt.ctype if self.fmt is not None else "unsigned char"

    @property
    def config(self) -> QuantConfig:
        if self.variant == "warp":
            return QuantConfig("warp", self.threads, vpt=self.vpt, lanes=self.lanes)
        if self.variant == "block":
            return QuantConfig("block", self.threads, vpt=self.vpt)
        return QuantConfig(self.variant, self.threads)

    @property
    def params(self) -> tuple[Param, ...]:
        """x, q, the scales (read for a device source; written for a dynamic one: per row, or
        the first element), the amax word read (tensor source) and the one kept (amax stage,
        ``amax``), the sizes, the element strides of x's and q's rows and of the scales, and
        1 / scale of a host source."""
        return (pointer("x", self.in_dtype.ctype, const=True), pointer("q", self.q_ctype),
                pointer("scale", "float"), pointer("amax_in", "unsigned", const=True),
                pointer("amax", "unsigned"), *int64("rows", "n", "xs", "qs", "ss"),
                *double("host_inv"))

    @property
    def kernel_name(self) -> str:
        if self.variant == "warp":
            shape = f"warp{self.lanes}_v{self.vpt}_t{self.threads}"
        elif self.variant == "block":
            shape = f"block{self.threads}_v{self.vpt}"
        else:
            shape = f"{self.variant}{self.threads}_v{self.vpt}"
        if self.stage is Stage.AMAX:
            return f"quantize_fp8_amax_{shape}_x{self.vec}_{self.in_dtype.value}"
        flags = "_amax" if self.amax else ""
        return (f"quantize_fp8_{self.source.value}_{shape}_x{self.vec}_{self.in_dtype.value}_"
                f"{self.fmt.value}{flags}")


def make_spec(config: QuantConfig, in_dtype, fmt, stage: Stage, source: Source | None,
              amax: bool = False, max_vec: int = 8) -> QuantSpec:
    """The kernel of ``config`` for these types, stage and source, with accesses of at most
    ``max_vec`` elements (what the arrays' alignment allows)."""
    in_dt = as_dtype(in_dtype)
    vec = max(1, min(access_width(in_dt), max_vec))
    if config.variant in ("warp", "block"):
        vpt = config.vpt
        vec = min(vec, vpt)
    else:
        vpt = step_vpt(vec)
    if stage is Stage.AMAX:
        fmt, source, amax = None, None, False
    return QuantSpec(in_dt, fmt, stage, source, amax, config.variant, config.threads, vpt, vec,
                     config.lanes)


def check_fits(config: QuantConfig, n: int, flat: bool) -> None:
    """One line saying why a pinned configuration cannot run this call."""
    if config.flat and not flat:
        raise ArgumentValueError(
            f"config: {config.name} takes one scale for a tensor whose rows lie end to end; "
            f"this call's scales are per row or its rows are strided: use a warp, block or "
            f"loop variant")
    check_capacity(config, n)


def launch_shape(config: QuantConfig, rows: int, n: int, vpt: int, sms: int
                 ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) for ``rows`` rows of ``n`` elements (flat: rows * n elements); every
    variant loops over what its grid does not cover."""
    if config.variant == "warp":
        blocks = -(-rows // config.rows_per_block)
    elif config.variant == "flat":
        steps = -(-(rows * n) // (config.threads * vpt))
        blocks = min(steps, FLAT_BLOCKS_PER_SM * 1024 // config.threads * sms)
    else:
        blocks = rows
    return (max(1, min(blocks, GRID_MAX)), 1, 1), (config.threads, 1, 1)


class Kernels(NamedTuple):
    """What a call launches: the amax stage (per-tensor dynamic scaling) or None, then the
    quantize stage, each with its grid and block."""

    amax: QuantSpec | None
    quantize: QuantSpec
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def config(self) -> QuantConfig:
        return self.quantize.config

    @property
    def specs(self) -> tuple[QuantSpec, ...]:
        """Every kernel, the quantize stage first."""
        return (self.quantize,) if self.amax is None else (self.quantize, self.amax)


def kernels(config: QuantConfig, rows: int, n: int, in_dtype, fmt, source: Source, *,
            amax: bool = False, max_vec: int = 8, sms: int = 132) -> Kernels:
    """The kernels of a call of ``config``: rows of ``n`` elements of ``in_dtype`` to ``fmt``
    with the scale from ``source`` (TENSOR: an amax stage of the same variant first);
    ``amax``: the quantize stage keeps max |x| too (not with TENSOR, whose amax stage keeps
    it)."""
    stage_amax = None
    if source is Source.TENSOR:
        stage_amax = make_spec(config, in_dtype, None, Stage.AMAX, None, max_vec=max_vec)
        amax = False
    q = make_spec(config, in_dtype, fmt, Stage.QUANTIZE, source,
                  amax, max_vec)
    grid, block = launch_shape(config, rows, n, q.vpt, sms)
    return Kernels(stage_amax, q, grid, block)
