"""What distinguishes one GEMM kernel from another: enums, tile configs and the spec."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...errors import ArgumentValueError
from ...jit.nvrtc import arch_number
from ...jit.params import Param, array, double, int64, pointer, tensor_maps
from ...jit.spec import KernelSpec, check_field
from ...runtime.dtypes import DType
from .epilogue import ACTS_FROM_Y, PARTIAL_SUMS, Act, BiasKind, Epilogue, Layout, Scale


class Precision(Enum):
    """How float32 products are computed: exactly on the CUDA cores (IEEE), on the tf32
    tensor-core path (TF32), or on it three times over split operands (TF32X3: float32
    accuracy at tensor-core speed); how 8-bit products are summed (IEEE or FAST_ACCUM)."""

    IEEE = "ieee"
    TF32 = "tf32"
    TF32X3 = "tf32x3"
    #: 8-bit inputs: the products summed in the tensor cores' own accumulators alone, which
    #: keep fewer bits than float32 (IEEE, their default, adds every 128 of K into float32)
    FAST_ACCUM = "fast_accum"


@dataclass(frozen=True)
class TileConfig:
    """Block tile BM x BN x BK, computed by threads that each own a TM x TN sub-tile."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    def __post_init__(self):
        for name in ("bm", "bn", "bk", "tm", "tn"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ArgumentValueError(f"TileConfig.{name}: expected a positive int, got {v!r}")
        if self.bm % self.tm or self.bn % self.tn:
            raise ArgumentValueError(
                f"TileConfig: bm ({self.bm}) must be a multiple of tm ({self.tm}) and bn "
                f"({self.bn}) of tn ({self.tn})"
            )
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ArgumentValueError(
                f"TileConfig {self.name}: (bm/tm)*(bn/tn) = {self.threads} threads; expected a "
                "multiple of 32 between 32 and 1024"
            )

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}"

    @classmethod
    def parse(cls, text: str) -> TileConfig:
        """'128x128x8_8x8' -> TileConfig(128, 128, 8, 8, 8)."""
        try:
            block, thread = text.split("_")
            bm, bn, bk = (int(x) for x in block.split("x"))
            tm, tn = (int(x) for x in thread.split("x"))
        except ValueError:
            raise ArgumentValueError(
                f"config: expected a tile name like '128x128x8_8x8' (BMxBNxBK_TMxTN), got {text!r}"
            ) from None
        return cls(bm, bn, bk, tm, tn)


#: The configs of the plain tiled kernel (`TiledGemmSpec`, `gemm/tiled.cu`), largest first.
TILED_CONFIGS: tuple[TileConfig, ...] = (
    TileConfig(128, 128, 8, 8, 8),
    TileConfig(128, 64, 8, 8, 4),
    TileConfig(64, 64, 8, 4, 4),
)


@dataclass(frozen=True)
class GemmKernelSpec(KernelSpec):
    """The fields every fused GEMM kernel has: operand types and layouts, and the epilogue.
    Subclasses add their tile config after these fields."""

    dtype: DType
    layout_a: Layout
    layout_b: Layout
    epilogue: Epilogue

    def _check_fields(self) -> None:
        """The types of the shared fields; an epilogue's column sums only where the kernel
        makes them (``can_bgrad``)."""
        for name, typ in (("dtype", DType), ("layout_a", Layout), ("layout_b", Layout),
                          ("epilogue", Epilogue)):
            check_field(self, name, typ)
        if self.epilogue.bgrad and not self.can_bgrad:
            raise ArgumentValueError(f"{type(self).__name__}: bgrad sums a gated epilogue's "
                                     f"staged blocks: {self._bgrad_needs}")
        if self.dtype.is_fp8 and not self.reads_fp8:
            raise ArgumentValueError(f"{type(self).__name__}.dtype: 8-bit inputs run on the "
                                     f"Hopper kernel (WgmmaGemmSpec); got {self.dtype!r}")
        ep = self.epilogue
        if (ep.scaled or ep.out_dtype.is_fp8) and not self.dtype.is_fp8:
            raise ArgumentValueError(
                f"{type(self).__name__}.epilogue: scales, amax and 8-bit outputs belong to "
                f"8-bit inputs; the inputs are {self.dtype.numpy_name}")

    #: Whether the kernel can sum its gated output's columns (``Epilogue.bgrad``).
    can_bgrad = False
    #: Whether the kernel reads 8-bit inputs.
    reads_fp8 = False
    #: What those sums need, for the error of a spec that asks for them where they cannot be.
    _bgrad_needs = ("only the Hopper kernel (WgmmaGemmSpec) stages them; expected an "
                    "epilogue without bgrad")

    @property
    def in_ctype(self) -> str:
        return self.dtype.ctype

    @property
    def params(self) -> tuple[Param, ...]:
        """A and B, the epilogue's arrays, the sizes, the scalars and the K tiles of a slice
        (split-K). The kernel reads M, N, K, alpha, beta and leaky_slope through locals."""
        t = self.in_ctype
        return (*array("A", t, "lda", const=True), *array("B", t, "ldb", const=True),
                *self.epilogue.params(self.dtype),
                *int64("M_", "N_", "K_"), *double("alpha_", "beta_", "leaky_slope_"),
                *int64("k_tiles_per_split"))

    #: Whether the epilogue may use the fast (approximate) activations: the tensor-core
    #: families do when Y is 16-bit, whose rounding is coarser than the approximations.
    fast_activations = False

    @property
    def fast_act(self) -> bool:
        return self.fast_activations and self.epilogue.out_dtype is not DType.F32


def _check_slices(spec: GemmKernelSpec) -> None:
    """A kernel with ``split_k`` stores raw partial products: the epilogue belongs to the
    reduction."""
    if spec.split_k and spec.epilogue != PARTIAL_SUMS:
        raise ArgumentValueError(
            f"{type(spec).__name__}.epilogue: split-K slices store raw float32 partial "
            f"products (SplitKReduceSpec applies the epilogue); expected PARTIAL_SUMS, got "
            f"{spec.epilogue!r}")


@dataclass(frozen=True)
class TiledGemmSpec(GemmKernelSpec):
    """One fused GEMM kernel: Y = act(alpha * A @ B + beta * C + bias), optionally saving Z.

    The plain tiled kernel: float32 arithmetic on the CUDA cores for every input type, any
    architecture, any alignment (the fallback of every family)."""

    tile: TileConfig

    template = "gemm/tiled.cu"
    vec_y = False   # Y and Z stored element by element

    def __post_init__(self):
        check_field(self, "tile", TileConfig)
        self._check_fields()

    @property
    def kernel_name(self) -> str:
        return (f"gemm_{self.dtype.value}_{self.layout_a.value}{self.layout_b.value}_"
                f"{self.tile.name}" + self.epilogue.name(self.dtype))


def _check_positive_ints(cfg, names) -> None:
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ArgumentValueError(f"{type(cfg).__name__}.{name}: expected a positive int, "
                                     f"got {v!r}")


def _refuse(cfg, problems: list[str]) -> None:
    """Raise naming every problem of a config, if it has any."""
    if problems:
        raise ArgumentValueError(f"{type(cfg).__name__} {cfg.name}: " + "; ".join(problems))


def _parse_name(pattern: str, text: str, example: str, form: str) -> list[int | None]:
    """The integer groups of a config name, or an error that shows the expected form."""
    import re

    m = re.fullmatch(pattern, text)
    if not m:
        raise ArgumentValueError(f"config: expected a name like {example!r} ({form}), "
                                 f"got {text!r}")
    return [int(x) if x else None for x in m.groups()]


@dataclass(frozen=True)
class WarpTiledConfig:
    """Block tile BM x BN x BK split into WM x WN warp tiles, with ``stages`` shared-memory
    buffers fed by cp.async: what the pipelined configs have in common."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int

    def _check(self, problems: list[str]) -> None:
        """Raise naming every problem: the shared ones, and ``problems`` of the subclass."""
        shared = []
        if self.bm % self.wm or self.bn % self.wn:
            shared.append("bm, bn must be multiples of wm, wn")
        if self.stages < 2:
            shared.append("stages must be at least 2")
        if not 32 <= self.threads <= 1024:
            shared.append(f"{self.threads} threads (1 to 32 warps allowed)")
        _refuse(self, shared + problems)

    def __post_init__(self):
        _check_positive_ints(self, self.__dataclass_fields__)

    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * 32


@dataclass(frozen=True)
class PipelineConfig(WarpTiledConfig):
    """Tile config of the pipelined float32 kernel (sm_80+).

    Block tile BM x BN x BK; each warp computes a WM x WN warp tile with its 32 lanes laid out as
    (32 / lanes_n) x lanes_n, each lane a (WM * lanes_n / 32) x (WN / lanes_n) thread tile made of
    4 x 4 sub-tiles; ``stages`` shared-memory buffers fed by cp.async; ``min_blocks`` is the
    occupancy asked of the compiler (``__launch_bounds__``).
    """

    lanes_n: int = 8
    min_blocks: int = 1

    def __post_init__(self):
        super().__post_init__()
        problems = []
        if self.lanes_n not in (1, 2, 4, 8, 16, 32):
            problems.append("lanes_n must divide 32")
        elif self.tm % 4 or self.tn % 4 or self.tm == 0 or self.tn == 0:
            problems.append(f"thread tile {self.tm}x{self.tn} must be made of 4x4 sub-tiles")
        if self.bk % 8:
            problems.append("bk must be a multiple of 8")
        self._check(problems)

    @property
    def tm(self) -> int:
        return self.wm * self.lanes_n // 32

    @property
    def tn(self) -> int:
        return self.wn // self.lanes_n

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.bk * (self.bm + 4 + self.bn + 4) * 4

    @property
    def name(self) -> str:
        name = f"{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_s{self.stages}"
        if self.lanes_n != 8:
            name += f"_l{self.lanes_n}"
        if self.min_blocks != 1:
            name += f"_b{self.min_blocks}"
        return name

    @classmethod
    def parse(cls, text: str) -> PipelineConfig:
        """'128x128x8_w32x64_s3' (optionally '_l4', '_b2') -> PipelineConfig."""
        g = _parse_name(r"(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_s(\d+)(?:_l(\d+))?(?:_b(\d+))?",
                        text, "128x128x8_w32x64_s3", "BMxBNxBK_wWMxWN_sSTAGES")
        return cls(*g[:6], lanes_n=g[6] or 8, min_blocks=g[7] or 1)


#: Candidates of the pipelined float32 kernel, for the heuristic and the autotuner.
PIPELINED_F32_CONFIGS: tuple[PipelineConfig, ...] = (
    PipelineConfig(128, 128, 8, 32, 64, 3),
    PipelineConfig(128, 128, 8, 32, 64, 4),
    PipelineConfig(128, 128, 16, 32, 64, 3),
    PipelineConfig(128, 128, 16, 32, 64, 2),
    PipelineConfig(128, 64, 8, 32, 64, 3),
    PipelineConfig(64, 128, 8, 32, 64, 3),
    PipelineConfig(64, 64, 8, 32, 32, 3),
    PipelineConfig(64, 64, 16, 32, 32, 3),
)


class CpAsyncKernel:
    """Mixin of the kernel families with a cp.async pipeline and a ``config``: sm_80 or newer,
    one block of ``config.threads`` threads."""

    @property
    def threads(self) -> int:
        return self.config.threads


@dataclass(frozen=True)
class PipelinedGemmSpec(CpAsyncKernel, GemmKernelSpec):
    """The fast float32 GEMM (sm_80+): cp.async pipeline, register-blocked outer products.

    ``vec_a``/``vec_b`` select 16-byte copies of an operand whose contiguous dimension matches
    the shared tile's (column-major A, row-major B) and whose pointer and leading dimension are
    16-byte aligned; ``vec_y`` 16-byte stores of Y and Z. ``split_k`` makes the kernel write raw
    partial sums of one K slice to a workspace (no epilogue); the reduction kernel finishes.
    """

    config: PipelineConfig
    vec_a: bool = False
    vec_b: bool = False
    vec_y: bool = False
    split_k: bool = False

    template = "gemm/simt_pipelined.cu"

    def __post_init__(self):
        check_field(self, "config", PipelineConfig)
        self._check_fields()
        ep = self.epilogue
        if {self.dtype, ep.out_dtype, ep.c_dtype, ep.bias_dtype} - {None} != {DType.F32}:
            raise TypeError("PipelinedGemmSpec: the CUDA-core kernel is float32 only")
        for name in ("vec_a", "vec_b", "vec_y", "split_k"):
            check_field(self, name, bool)
        if self.vec_a and self.layout_a is not Layout.COL:
            raise ArgumentValueError("PipelinedGemmSpec.vec_a: 16-byte copies of A need it "
                                     "column-major (m contiguous); expected False with "
                                     "row-major A, got True")
        if self.vec_b and self.layout_b is not Layout.ROW:
            raise ArgumentValueError("PipelinedGemmSpec.vec_b: 16-byte copies of B need it "
                                     "row-major (n contiguous); expected False with "
                                     "column-major B, got True")
        _check_slices(self)
        if self.split_k and not self.vec_y:
            raise ArgumentValueError("PipelinedGemmSpec.vec_y: split-K slices go to a "
                                     "workspace of 16-byte rows in 16-byte stores; expected "
                                     "True with split_k, got False")

    @property
    def kernel_name(self) -> str:
        vec = "".join("4" if v else "1" for v in (self.vec_a, self.vec_b, self.vec_y))
        name = (f"gemm_{self.dtype.value}_{self.layout_a.value}{self.layout_b.value}_"
                f"{self.config.name}_v{vec}")
        if self.split_k:
            return name + "_splitk"
        return name + self.epilogue.name(self.dtype)

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes


@dataclass(frozen=True)
class SplitKReduceSpec(KernelSpec):
    """Sums split-K partial products (float32) and applies the fused epilogue once. ``dtype``
    is the GEMM's input type; ``vec_y``: 4-element stores of Y and Z."""

    dtype: DType
    epilogue: Epilogue
    vec_y: bool

    template = "gemm/splitk_reduce.cu"
    threads = 256
    smem_bytes = 0

    def __post_init__(self):
        check_field(self, "dtype", DType)
        check_field(self, "epilogue", Epilogue)
        check_field(self, "vec_y", bool)
        if self.epilogue.bgrad:
            raise ArgumentValueError("SplitKReduceSpec.epilogue: bgrad sums a gated "
                                     "epilogue's staged blocks, which only the Hopper kernel "
                                     "stages; expected an epilogue without bgrad")

    @property
    def fast_act(self) -> bool:
        """The fast activations where Y is 16-bit, as the tensor-core kernels use them."""
        return self.epilogue.out_dtype is not DType.F32

    @property
    def kernel_name(self) -> str:
        name = f"gemm_splitk_reduce_{self.dtype.value}" + self.epilogue.name(self.dtype)
        return name + ("_v4" if self.vec_y else "_v1")

    @property
    def params(self) -> tuple[Param, ...]:
        """The partial products W (``splits`` slices of M rows), the epilogue's arrays, the
        sizes and the scalars."""
        return (*array("W", "float", "ldw", "splits", const=True),
                *self.epilogue.params(self.dtype),
                *int64("M", "N"), *double("alpha_", "beta_", "leaky_slope_"))


@dataclass(frozen=True)
class MmaConfig(WarpTiledConfig):
    """Tile config of the tensor-core kernel (``mma.sync``, sm_80+).

    Block tile BM x BN x BK (BK in elements: one shared-memory row of a K-contiguous tile is
    64 or 128 bytes, so BK is 32 or 64 for 16-bit inputs and 16 or 32 for tf32); each warp
    computes a WM x WN warp tile from m16n8 accumulator fragments; ``stages`` shared-memory
    buffers fed by cp.async.
    """

    def __post_init__(self):
        super().__post_init__()
        problems = []
        if self.bm % 64 or self.bn % 64:
            problems.append("bm, bn must be multiples of 64")
        if self.wm % 16 or self.wn % 16:
            problems.append("wm, wn must be multiples of 16")
        if self.bk not in (16, 32, 64):
            problems.append("bk must be 16, 32 or 64")
        self._check(problems)

    @property
    def can_promote(self) -> bool:
        """Whether ``MmaGemmSpec.promote`` fits: at most 64 accumulators a thread."""
        return self.wm * self.wn <= 2048

    def supports(self, dtype: DType) -> bool:
        """Whether the config's K tile fits ``dtype`` (64- or 128-byte shared rows)."""
        return self.bk * dtype.itemsize in (64, 128)

    def smem_bytes_for(self, dtype: DType) -> int:
        return self.stages * self.bk * (self.bm + self.bn) * dtype.itemsize

    @property
    def name(self) -> str:
        return f"mma_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_s{self.stages}"

    @classmethod
    def parse(cls, text: str) -> MmaConfig:
        """'mma_128x128x32_w64x64_s4' -> MmaConfig."""
        return cls(*_parse_name(r"mma_(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_s(\d+)", text,
                                "mma_128x128x32_w64x64_s4", "mma_BMxBNxBK_wWMxWN_sSTAGES"))


#: Candidates of the tensor-core kernel for 16-bit inputs (BK = 32 or 64 halves).
MMA_16BIT_CONFIGS: tuple[MmaConfig, ...] = (
    MmaConfig(128, 256, 32, 64, 64, 3),
    MmaConfig(256, 128, 32, 64, 64, 3),
    MmaConfig(128, 128, 32, 64, 64, 4),
    MmaConfig(128, 128, 64, 64, 64, 3),
    MmaConfig(128, 64, 32, 64, 32, 4),
    MmaConfig(64, 128, 32, 32, 64, 4),
    MmaConfig(64, 64, 64, 32, 32, 4),
)

#: Candidates of the tensor-core kernel for tf32 (BK = 16 or 32 floats).
MMA_TF32_CONFIGS: tuple[MmaConfig, ...] = (
    MmaConfig(128, 256, 16, 64, 64, 4),
    MmaConfig(128, 128, 16, 64, 64, 4),
    MmaConfig(128, 128, 32, 64, 64, 3),
    MmaConfig(128, 64, 16, 64, 32, 4),
    MmaConfig(64, 128, 16, 32, 64, 4),
    MmaConfig(64, 64, 32, 32, 32, 4),
)


#: Candidates for 3xTF32: warp tiles of at most 2048 outputs (64 accumulators a thread), so
#: that the products of each mma have registers of their own before they are added.
MMA_X3_CONFIGS: tuple[MmaConfig, ...] = tuple(c for c in MMA_TF32_CONFIGS if c.can_promote)


def mma_configs(dtype: DType, precision: Precision = Precision.IEEE) -> tuple[MmaConfig, ...]:
    if precision is Precision.TF32X3:
        return MMA_X3_CONFIGS
    return MMA_TF32_CONFIGS if dtype is DType.F32 else MMA_16BIT_CONFIGS


@dataclass(frozen=True)
class MmaGemmSpec(CpAsyncKernel, GemmKernelSpec):
    """The tensor-core GEMM (sm_80+): ``mma.sync`` on fragments read by ``ldmatrix`` from
    swizzled shared tiles, fed by a cp.async pipeline; the fused epilogue on the accumulator
    fragments. float16/bfloat16 inputs use m16n8k16, float32 inputs the tf32 m16n8k8.

    ``copy_a``/``copy_b`` are the cp.async widths in bytes (16, 8 or 4) that the operand's
    pointer and leading dimension allow; ``vec_y`` stores Y/Z two elements at a time.
    """

    config: MmaConfig
    copy_a: int = 16
    copy_b: int = 16
    vec_y: bool = True
    #: each mma's products go to fresh registers and are added to the accumulators with
    #: rounded float32 adds (3xTF32: the tensor cores' accumulation truncates)
    promote: bool = False

    template = "gemm/mma.cu"
    fast_activations = True

    def __post_init__(self):
        check_field(self, "config", MmaConfig)
        check_field(self, "vec_y", bool)
        check_field(self, "promote", bool)
        self._check_fields()
        if not self.config.supports(self.dtype):
            raise ArgumentValueError(
                f"config: {self.config.name} has BK = {self.config.bk}, which does not fit "
                f"{self.dtype.numpy_name} (64- or 128-byte rows: BK = "
                f"{64 // self.dtype.itemsize} or {128 // self.dtype.itemsize})")
        for name in ("copy_a", "copy_b"):
            if getattr(self, name) not in (4, 8, 16):
                raise TypeError(f"MmaGemmSpec.{name}: expected 4, 8 or 16 (bytes)")
        if self.promote and not self.config.can_promote:
            raise ArgumentValueError(
                f"config: {self.config.name} has {self.config.wm}x{self.config.wn} warp tiles, "
                f"too large for the separate product registers that precision='tf32x3' needs "
                f"(at most 2048 outputs a warp: {', '.join(c.name for c in MMA_X3_CONFIGS)})")

    @property
    def kernel_name(self) -> str:
        return (f"gemm_{self.dtype.value}_{self.layout_a.value}{self.layout_b.value}_"
                f"{self.config.name}_a{self.copy_a}b{self.copy_b}{'y2' if self.vec_y else 'y1'}"
                + ("_p" if self.promote else "") + self.epilogue.name(self.dtype))

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes_for(self.dtype)


@dataclass(frozen=True)
class WgmmaConfig:
    """Tile config of the Hopper kernel (``wgmma`` + TMA, sm_90a).

    Output tiles of BM x BN; K tiles of 128 bytes per row (64 16-bit values or 32 floats);
    ``stages`` TMA buffers in a ring. Cooperative (default): BM / 64 consumer warpgroups split
    each tile's rows. ``pingpong``: two consumer warpgroups take turns on whole tiles (BM = 64
    or 128 rows each), so that one's epilogue overlaps the other's main loop.
    """

    bm: int
    bn: int
    stages: int
    pingpong: bool = False

    def __post_init__(self):
        _check_positive_ints(self, ("bm", "bn", "stages"))
        if not isinstance(self.pingpong, bool):
            raise ArgumentValueError(f"WgmmaConfig.pingpong: expected a bool, "
                                     f"got {self.pingpong!r}")
        problems = []
        if self.pingpong and self.bm not in (64, 128):
            problems.append("bm must be 64 or 128 rows per ping-pong consumer")
        if not self.pingpong and self.bm not in (64, 128, 192):
            problems.append("bm must be 64, 128 or 192 (64 rows per consumer warpgroup)")
        if self.bn % 64 or not 64 <= self.bn <= 256:
            problems.append("bn must be 64, 128, 192 or 256")
        if self.accumulators > 128:
            problems.append(f"{self.wg_m}x{self.bn} accumulators per warpgroup (at most 128 "
                            "registers a thread)")
        if self.stages < 2:
            problems.append("stages must be at least 2")
        if self.smem_bytes > 227 * 1024:
            problems.append(f"{self.smem_bytes} B of shared memory (227 KiB allowed)")
        _refuse(self, problems)

    @property
    def consumers(self) -> int:
        return 2 if self.pingpong else self.bm // 64

    @property
    def accumulators(self) -> int:
        """float32 accumulator registers a consumer thread holds."""
        return self.wg_m // 64 * self.bn // 2

    @property
    def can_promote(self) -> bool:
        """Whether a second set of accumulators fits (``WgmmaGemmSpec.promote``): at most 96
        a thread (the 128x192 tile: 192 registers of the 232 a consumer has)."""
        return self.accumulators <= 96

    @property
    def wg_m(self) -> int:
        """Rows of a tile one consumer warpgroup computes."""
        return self.bm if self.pingpong else 64

    @property
    def threads(self) -> int:
        return (self.consumers + 1) * 128

    @property
    def smem_bytes(self) -> int:
        # the tiles, 16 bytes of mbarriers per stage and 16 for the turns, slack to align the
        # tiles to 1 KiB, the epilogue's staging (16 x 64 outputs of at most 4 bytes per consumer
        # warp) and the bias of a tile's rows or columns in floats (one per ping-pong consumer)
        return (self.stages * ((self.bm + self.bn) * 128 + 16) + 16 + 1024
                + self.consumers * 4 * 16 * 64 * 4
                + (2 if self.pingpong else 1) * max(self.bm, self.bn) * 4)

    @property
    def name(self) -> str:
        return f"wgmma_{self.bm}x{self.bn}_s{self.stages}" + ("_pp" if self.pingpong else "")

    @classmethod
    def parse(cls, text: str) -> WgmmaConfig:
        """'wgmma_128x256_s4' (or '..._pp' for ping-pong) -> WgmmaConfig."""
        g = _parse_name(r"wgmma_(\d+)x(\d+)_s(\d+)(?:_pp)?", text, "wgmma_128x256_s4",
                        "wgmma_BMxBN_sSTAGES[_pp]")
        return cls(g[0], g[1], g[2], pingpong=text.endswith("_pp"))


#: Candidates of the Hopper kernel (any dtype: K tiles are 128 bytes).
WGMMA_CONFIGS: tuple[WgmmaConfig, ...] = (
    WgmmaConfig(128, 256, 4),
    WgmmaConfig(128, 128, 6, pingpong=True),
    WgmmaConfig(64, 256, 4, pingpong=True),
    WgmmaConfig(128, 128, 6),
    WgmmaConfig(128, 64, 8),
    WgmmaConfig(64, 128, 8),
)

#: Candidates of the Hopper kernel for 8-bit inputs with float32 sums (``promote``): the
#: 128x192 tile keeps the most accumulators that leave room for the second set (on an H200,
#: 8192^3 with bias + GELU: 0.94 ms against 1.04 on 128x128 tiles); the 192x128 tile's three
#: consumer warpgroups (64 + 64 accumulators a thread, 160 registers each) keep the tensor
#: cores busier while each waits for its chunk's products (8192^3: 0.991 ms against 1.007 on
#: 128x192; 4096^3: 0.142 against 0.152).
WGMMA_FP8_CONFIGS: tuple[WgmmaConfig, ...] = (
    WgmmaConfig(128, 192, 4),
    WgmmaConfig(128, 128, 6),
    WgmmaConfig(128, 64, 8),
    WgmmaConfig(64, 128, 8),
    WgmmaConfig(192, 128, 4),
)

#: Candidates of the Hopper kernel for 8-bit inputs summed by the tensor cores alone
#: (``fast_accum``): the 16-bit inputs' and the 128x192 tile.
WGMMA_FP8_FAST_CONFIGS: tuple[WgmmaConfig, ...] = WGMMA_CONFIGS + (WgmmaConfig(128, 192, 4),)

#: Candidates of the Hopper kernel for 3xTF32: at most 64 accumulators a thread, so that the
#: second, rounded set fits.
WGMMA_X3_CONFIGS: tuple[WgmmaConfig, ...] = (
    WgmmaConfig(128, 128, 6),
    WgmmaConfig(64, 128, 7, pingpong=True),
    WgmmaConfig(128, 64, 8),
    WgmmaConfig(64, 128, 8),
)


@dataclass(frozen=True)
class WgmmaGemmSpec(GemmKernelSpec):
    """The Hopper GEMM (sm_90a): TMA copies into a ring of shared-memory stages guarded by
    mbarriers, one producer warpgroup and ``config.consumers`` consumer warpgroups issuing
    ``wgmma`` from shared memory, a persistent grid over the output tiles, and the fused
    epilogue on the accumulator registers. ``c_tma``: a row-major C with 16-byte aligned rows
    arrives by TMA through the same ring, after each tile's k-tiles, and the epilogue reads
    it from shared memory. ``store16`` (Y and Z rows 16-byte aligned; with a C term only when
    it comes through the ring, else its reads need the registers, except a gate's, applied to
    the staged block with C read in whole rows): each warp stages 16 x 64 blocks of results in
    shared memory; 16- and 8-bit outputs leave by TMA stores (``tma_store``: two staging buffers a
    warp, the store of one overlapping the filling of the other), float32 ones as whole
    16-byte segments, so rows go out in full lines; else pairs (``vec_y``) or single
    elements go straight from the registers. tf32 needs K-major operands (row-major A,
    column-major B): wgmma transposes only 16-bit types.
    """

    config: WgmmaConfig
    vec_y: bool = True
    store16: bool = True
    #: chunks of K go to fresh accumulators, added to a second set with rounded float32 adds
    #: (3xTF32: the tensor cores' accumulation truncates); needs a config with at most 64
    #: accumulators a thread (``WgmmaConfig.can_promote``)
    promote: bool = False
    #: work units are (tile, slice of K); each writes raw float32 partial products to its
    #: slice of a workspace (the epilogue ``PARTIAL_SUMS``), and ``SplitKReduceSpec`` applies
    #: the problem's epilogue
    split_k: bool = False
    #: C (row-major, 16-byte aligned rows) arrives by TMA through the ring after each tile's
    #: k-tiles, and the staged epilogue reads it from shared memory (a gate's input, or beta's
    #: term: then C needs no registers, and a C term can be staged)
    c_tma: bool = False

    template = "gemm/wgmma.cu"
    fast_activations = True
    reads_fp8 = True
    _bgrad_needs = ("it needs a gate and store16, not split-K, and C through the ring or a "
                    "config narrower than 256 columns (the 256-wide ones reading C from memory "
                    "spill registers)")

    def __post_init__(self):
        check_field(self, "config", WgmmaConfig)
        check_field(self, "vec_y", bool)
        check_field(self, "store16", bool)
        check_field(self, "promote", bool)
        check_field(self, "split_k", bool)
        check_field(self, "c_tma", bool)
        if self.promote and not self.config.can_promote:
            raise ArgumentValueError(
                f"config: {self.config.name} keeps {self.config.accumulators} accumulators a "
                f"thread, too many for the second set that float32 sums need (precision="
                f"'tf32x3', or 8-bit inputs without precision='fast_accum'; at most 96: "
                f"{', '.join(c.name for c in WGMMA_FP8_CONFIGS)})")
        self._check_fields()
        _check_slices(self)
        ep = self.epilogue
        if self.c_tma and not (ep.layout_c is Layout.ROW and self.store16 and not self.split_k):
            raise ArgumentValueError(
                "WgmmaGemmSpec.c_tma: C arrives by TMA for the staged epilogue of a row-major "
                "C; expected False unless layout_c is 'r', store16 is True and split_k False, "
                f"got True with layout_c {ep.layout_c and ep.layout_c.value!r}, store16 "
                f"{self.store16}, split_k {self.split_k}")
        if self.c_tma and (why := self.c_tma_unfit(self.config, ep)):
            raise ArgumentValueError(f"WgmmaGemmSpec.c_tma: {why}; expected False, got True")
        if (self.store16 and ep.layout_c is not None and ep.gate is None
                and ep.glu_grad is None and not self.c_tma):
            raise ArgumentValueError(
                "WgmmaGemmSpec.store16: reading C with the accumulators leaves too few "
                "registers for the staging (unless C arrives by TMA, c_tma; a gate reads C "
                "after staging, from whole rows); expected False with layout_c "
                f"{ep.layout_c.value!r}, no gate and no c_tma, got True")
        if self.store16 and (why := self.staging_spills(self.config, ep, self.c_tma)):
            raise ArgumentValueError(f"WgmmaGemmSpec.store16: {why}; expected False, got True")
        if self.store16 and not self.vec_y:
            raise ArgumentValueError("WgmmaGemmSpec.vec_y: store16 stores whole 16-byte "
                                     "segments; expected True with store16, got False")
        if ((self.dtype is DType.F32 or self.dtype.is_fp8)
                and (self.layout_a, self.layout_b) != (Layout.ROW, Layout.COL)):
            raise ArgumentValueError(
                f"config: the {'tf32' if self.dtype is DType.F32 else '8-bit'} wgmma kernel "
                "needs row-major A and column-major B (K-major operands); got layouts "
                f"{self.layout_a.value}{self.layout_b.value}")
        if self.split_k and self.dtype.is_fp8:
            raise ArgumentValueError("WgmmaGemmSpec.split_k: 8-bit inputs take no split of K; "
                                     "expected False, got True")

    @property
    def kernel_name(self) -> str:
        return (f"gemm_{self.dtype.value}_{self.layout_a.value}{self.layout_b.value}_"
                f"{self.config.name}_"
                + ("yt" if self.tma_store else "y16" if self.store16 else
                   "y2" if self.vec_y else "y1")
                + ("_p" if self.promote else "")
                + ("_ct" if self.c_tma else "")
                + ("_splitk" if self.split_k else self.epilogue.name(self.dtype)))

    @staticmethod
    def staging_spills(config: WgmmaConfig, epilogue: Epilogue, c_tma: bool = False
                       ) -> str | None:
        """Why the staged epilogue (``store16``) of ``config`` spills registers with
        ``epilogue`` (and C through the ring or not, ``c_tma``), or None where it fits (found
        by compiling every combination for sm_90a: the 64x256 ping-pong tile keeps 128
        accumulators a thread, and a gate's C values read from memory, or these stores'
        addresses, on top of them do not fit). A gated linear unit stages 128 columns of
        accumulators (64 pairs) a block: a config narrower than that stores unstaged; staging
        its Y and Z, the 256-wide ping-pong tile spills, the 128x256 one does for float32
        outputs, a bias or the erf GELU, and the ping-pong 128x128 one for float32 outputs
        with a bias. Its backward (``glu_grad``) copies its Z into the staging blocks and
        forms dZ there: that needs a row-major Z of the 16-bit output type (and spills on the
        ping-pong 128x128 tile with the erf GELU)."""
        if epilogue.glu_grad is not None:
            if not (epilogue.layout_c is Layout.ROW and epilogue.out_dtype.itemsize == 2
                    and epilogue.c_dtype is epilogue.out_dtype):
                return ("a gated linear unit's backward stages its dZ in place of its Z: that "
                        "takes a row-major Z of the 16-bit output type")
            if config.pingpong and config.bn == 128 and epilogue.glu_grad is Act.GELU:
                return (f"{config.name} spills registers when it stages a gated linear unit's "
                        "dZ with the erf GELU")
            return None
        if epilogue.glu and config.bn < 128:
            return (f"a gated linear unit stages blocks of 128 accumulator columns; "
                    f"{config.name} has {config.bn}")
        if epilogue.glu and epilogue.save_z:
            if config.bn == 256 and (config.pingpong or epilogue.out_dtype.itemsize == 4):
                return (f"{config.name} spills registers when it stages a gated linear "
                        f"unit's Y and Z" + ("" if config.pingpong else " in float32"))
            if config.bn == 256 and (epilogue.bias is not BiasKind.NONE
                                     or epilogue.act is Act.GELU):
                return (f"{config.name} spills registers when it stages a gated linear "
                        "unit's Y and Z with a bias or the erf GELU")
            if (config.pingpong and epilogue.out_dtype.itemsize == 4
                    and epilogue.bias is BiasKind.COL):
                return (f"{config.name} spills registers when it stages a gated linear "
                        "unit's Y and Z in float32 with a bias")
        if not (config.pingpong and config.bn == 256):
            return None
        if epilogue.gate is not None and not c_tma:
            return (f"{config.name} with a gate spills registers when staged (the gate's C "
                    "values on top of 128 accumulators a thread)")
        if (epilogue.out_dtype.itemsize == 4 and epilogue.save_z
                and epilogue.bias in (BiasKind.SCALAR, BiasKind.ROW)):
            return (f"{config.name} spills registers when it stages float32 Y and Z with a "
                    f"{epilogue.bias.value[:-4]} bias")
        return None

    @staticmethod
    def c_tma_unfit(config: WgmmaConfig, epilogue: Epilogue) -> str | None:
        """Why a row-major C cannot arrive through ``config``'s ring (``c_tma``), or None
        where it can: its tile must take at most two ring positions, and a C term (not a
        gate's) with Z saved spills registers (found by compiling every combination for
        sm_90a: both passes, Z's and Y's, read C)."""
        if epilogue.glu_grad is not None:
            return "a gated linear unit's backward reads C (its Z) twice as wide as the tile"
        positions = -(-(config.bm // 64) * (config.bn * epilogue.c_dtype.itemsize // 128)
                      // ((config.bm + config.bn) // 64))
        if positions > 2:
            return (f"a {epilogue.c_dtype.numpy_name} C tile of {config.name} takes "
                    f"{positions} ring positions (at most 2)")
        if epilogue.gate is None and epilogue.save_z:
            return f"{config.name} spills registers reading C from the ring for both Z and Y"
        return None

    @property
    def can_bgrad(self) -> bool:
        """Whether this kernel can sum its gated output's columns (``Epilogue.bgrad``): not
        the 256-wide tiles reading C from memory (they spill registers)."""
        return (self.epilogue.gate is not None and self.store16 and not self.split_k
                and (self.config.bn < 256 or self.c_tma))

    @property
    def tma_store(self) -> bool:
        """16-bit Y (and Z) and 8-bit Y leave shared memory by TMA stores; the kernel takes
        their maps."""
        return self.store16 and self.epilogue.out_dtype.itemsize <= 2

    @property
    def params(self) -> tuple[Param, ...]:
        """The tensor maps of A and B (and, ``tma_store``, of Y and Z; ``c_tma``, of C), then
        the GEMM's."""
        maps = (("tma_a", "tma_b") + (("tma_y", "tma_z") if self.tma_store else ())
                + (("tma_c",) if self.c_tma else ()))
        return (*tensor_maps(*maps), *super().params)

    def target_arch(self, device_arch: str) -> str:
        return f"sm_{arch_number(device_arch)}a"

    @property
    def threads(self) -> int:
        return self.config.threads

    @property
    def _scale_bytes(self) -> int:
        """Shared memory for a tile's per-row and per-column scales, in floats (one block per
        ping-pong consumer)."""
        return (2 if self.config.pingpong else 1) * (self.config.bm + self.config.bn) * 4

    @property
    def scale_tile(self) -> bool:
        """Per-row scales of A and per-column scales of B are staged in shared memory for the
        epilogue (loaded when a tile starts, under its main loop) where the config leaves
        room for them; else the epilogue reads them from memory, element by element."""
        ep = self.epilogue
        return ((ep.scale_a is Scale.ROW or ep.scale_b is Scale.COL)
                and self.config.smem_bytes + self._scale_bytes <= 227 * 1024)

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes + (self._scale_bytes if self.scale_tile else 0)

    # The template's preamble (gemm/wgmma.cu): the variant's constants and types.

    @property
    def scale_rows(self) -> bool:
        """A's per-row scales are staged with the tile (``scale_tile``)."""
        return self.scale_tile and self.epilogue.scale_a is Scale.ROW

    @property
    def scale_cols(self) -> bool:
        """B's per-column scales are staged with the tile (``scale_tile``)."""
        return self.scale_tile and self.epilogue.scale_b is Scale.COL

    @property
    def c_ctype(self) -> str:
        """The element type of the kernel parameter C (the inputs' where there is no C)."""
        return (self.epilogue.c_dtype or self.dtype).ctype

    @property
    def bias_ctype(self) -> str:
        """The element type of the kernel parameter ``bias``, ``const`` where it is read:
        ``bgrad`` writes float32 column sums in its place."""
        ep = self.epilogue
        return "float" if ep.bgrad else f"const {(ep.bias_dtype or self.dtype).ctype}"

    @property
    def wgmma_type(self) -> str:
        """The inputs' type in the wgmma instruction: tf32 for float32 inputs."""
        return "tf32" if self.dtype is DType.F32 else self.dtype.value

    @property
    def wgmma_k(self) -> int:
        """K of one wgmma: 32 bytes of the inputs."""
        return 32 // self.dtype.itemsize

    @property
    def wgmma_transposes(self) -> str:
        """The wgmma operands that say whether A and B are transposed (M- or N-major): 16-bit
        inputs only (``", 0, 1"``: K-major A, N-major B); empty for the others, K-major."""
        if self.dtype.itemsize != 2:
            return ""
        return (f", {0 if self.layout_a is Layout.ROW else 1}, "
                f"{0 if self.layout_b is Layout.COL else 1}")


class StagingCopy:
    """The parameters of the copies ``gemm/stage.cu`` makes (``ctype`` elements)."""

    @property
    def params(self) -> tuple[Param, ...]:
        """The R x C input, the output, each with its leading dimension, and R and C."""
        return (*array("in_", self.ctype, "ld_in", const=True),
                *array("out", self.ctype, "ld_out"), *int64("R", "C"))


@dataclass(frozen=True)
class TransposeSpec(StagingCopy, KernelSpec):
    """Copies an R x C row-major matrix into its C x R transpose (row-major): stages an operand
    into the K-major layout the tf32 and 8-bit wgmma kernels read. ``transpose`` False: a
    plain copy (an 8-bit operand K-major already, into rows TMA can read: 16-byte aligned)."""

    dtype: DType
    #: what the copy does to an operand: transposes it (or copies it as it is); 1 segment of K
    #: per row
    transpose: bool = True

    template = "gemm/stage.cu"
    threads = 256
    smem_bytes = 0
    parts = 1

    def __post_init__(self):
        check_field(self, "dtype", DType)
        check_field(self, "transpose", bool)

    @property
    def ctype(self) -> str:
        return self.dtype.ctype

    @property
    def kernel_name(self) -> str:
        return f"{'transpose' if self.transpose else 'copy'}_{self.dtype.value}"


@dataclass(frozen=True)
class Tf32SplitSpec(StagingCopy, KernelSpec):
    """Splits a float32 operand for the 3xTF32 GEMM into a K-major copy whose rows hold three
    segments of K: ``order`` "hhl" (A: hi, hi, lo) or "hlh" (B: hi, lo, hi), where hi is the
    value rounded to tf32 and lo the rest rounded to tf32. ``transpose``: the operand's R x C
    row-major view has K as its rows (column-major A, row-major B)."""

    transpose: bool
    order: str

    template = "gemm/stage.cu"
    threads = 256
    smem_bytes = 0
    parts = 3
    ctype = "float"

    def __post_init__(self):
        if not isinstance(self.transpose, bool):
            raise ArgumentValueError(f"Tf32SplitSpec.transpose: expected a bool, got "
                                     f"{self.transpose!r}")
        if self.order not in ("hhl", "hlh"):
            raise ArgumentValueError(f"Tf32SplitSpec.order: expected 'hhl' or 'hlh', got "
                                     f"{self.order!r}")

    @property
    def kernel_name(self) -> str:
        return f"tf32x3_split_{self.order}{'_t' if self.transpose else ''}"


@dataclass(frozen=True)
class DzSpec(KernelSpec):
    """The backward's elementwise pass: dZ = gY * act'(Z) (or act' from Y, ``from_y``, for
    ``ACTS_FROM_Y``), stored as dZ (``write_dz``, type ``dz_dtype``) and/or dC = beta * dZ
    (``write_dc``, ``dc_dtype``), with the sums of dZ that dBias needs (``bias``: per column,
    per row or in total) as float32 partial sums per block. ``vec``: 16-byte accesses of 8
    columns a thread (unit column strides, 16-byte aligned rows and pointers, N % 8 == 0).
    What is not read or written has one value, so that equal kernels have equal specs: with
    act none (act' is 1) ``from_y`` is False and ``src_dtype`` is ``grad_dtype``; without dC,
    ``dc_dtype`` is float32."""

    act: Act
    from_y: bool
    bias: BiasKind
    grad_dtype: DType
    src_dtype: DType
    dz_dtype: DType
    write_dz: bool = True
    write_dc: bool = False
    dc_dtype: DType = DType.F32
    vec: bool = False
    #: a gated linear unit's backward (``Epilogue.glu``): gY has half of Z's columns, and each
    #: (gate, linear) pair of Z gives d(gate) = gY * linear * act'(gate) and d(linear) =
    #: gY * act(gate); dZ and its sums have Z's columns (N, the kernel's, counts those)
    glu: bool = False

    template = "gemm/dz.cu"
    threads = 256
    smem_bytes = 0

    def __post_init__(self):
        for name, typ in (("act", Act), ("from_y", bool), ("bias", BiasKind),
                          ("grad_dtype", DType), ("src_dtype", DType), ("dz_dtype", DType),
                          ("write_dz", bool), ("write_dc", bool), ("dc_dtype", DType),
                          ("vec", bool), ("glu", bool)):
            check_field(self, name, typ)
        if self.glu and (self.from_y or self.write_dc
                         or self.bias in (BiasKind.SCALAR, BiasKind.ROW)):
            raise ArgumentValueError(
                "DzSpec.glu: a gated linear unit's backward reads Z (not Y), writes no dC and "
                "sums dZ by columns or not at all; expected glu False, got True with from_y "
                f"{self.from_y}, write_dc {self.write_dc}, bias {self.bias.value!r}")
        if self.from_y and self.act not in ACTS_FROM_Y:
            raise ArgumentValueError(f"DzSpec: act {self.act.value!r} needs Z, not Y")
        if not self.write_dc and self.dc_dtype is not DType.F32:
            raise ArgumentValueError(f"DzSpec.dc_dtype: no dC is written (write_dc False); "
                                     f"expected DType.F32, got {self.dc_dtype!r}")
        if self.act is Act.NONE and self.from_y and not self.glu:
            raise ArgumentValueError("DzSpec.from_y: act 'none' reads neither Z nor Y; "
                                     "expected False, got True")
        if self.act is Act.NONE and not self.glu and self.src_dtype is not self.grad_dtype:
            raise ArgumentValueError(f"DzSpec.src_dtype: act 'none' reads neither Z nor Y; "
                                     f"expected the grad_dtype {self.grad_dtype!r}, got "
                                     f"{self.src_dtype!r}")

    @property
    def kernel_name(self) -> str:
        src = "y" if self.from_y else "z"
        outs = (f"_dz{self.dz_dtype.value}" if self.write_dz else "") + \
            (f"_dc{self.dc_dtype.value}" if self.write_dc else "")
        return (f"gemm_dz_{'glu_' if self.glu else ''}{self.act.value}_{src}"
                f"{self.src_dtype.value}_g"
                f"{self.grad_dtype.value}{outs}_{self.bias.value}{'_v8' if self.vec else ''}"
                f"{'_fast' if self.fast_act else ''}")

    @property
    def fast_act(self) -> bool:
        """act' by the special-function unit's approximations (errors a few float32 ulp, or
        2^-11 relative for tanh.approx) where the GEMMs read dZ in a 16-bit type: below its
        rounding (2^-8 or 2^-11), as the forward's fast activations."""
        return self.dz_dtype is not DType.F32 and self.reads_src

    @property
    def params(self) -> tuple[Param, ...]:
        """gY, Z (or Y), dZ and dC with their (row, column) strides; the partial sums; the
        sizes and rows a block; beta and the leaky slope."""
        return (*array("gy", self.grad_dtype.ctype, "gy_r", "gy_c", const=True),
                *array("src", self.src_dtype.ctype, "src_r", "src_c", const=True),
                *array("dz", self.dz_dtype.ctype, "dz_r", "dz_c"),
                *array("dc", self.dc_dtype.ctype, "dc_r", "dc_c"), pointer("partial", "float"),
                *int64("M_", "N_", "rows_"), *double("beta_", "slope_"))

    @property
    def reads_src(self) -> bool:
        """Whether Z (or Y) is read: act' of "none" is 1 (a gated linear unit reads Z's
        linear half whatever its activation)."""
        return self.act is not Act.NONE or self.glu

    @property
    def cols(self) -> int:
        """Adjacent columns a thread handles (a block: 32 threads across, 8 down)."""
        return 8 if self.vec else 4


@dataclass(frozen=True)
class DbiasSpec(KernelSpec):
    """Adds up float32 partial sums (the dZ pass's, or a gated GEMM's ``bgrad``) into dBias of
    type ``out_dtype``: column sums of a chunk of rows of a rows x cols array per row of
    blocks, or (``total``) the sum of all of it."""

    out_dtype: DType
    total: bool

    template = "gemm/dbias.cu"
    threads = 256
    smem_bytes = 0

    def __post_init__(self):
        if not isinstance(self.out_dtype, DType) or not isinstance(self.total, bool):
            raise TypeError(f"DbiasSpec: expected (DType, bool), got ({self.out_dtype!r}, "
                            f"{self.total!r})")

    @property
    def kernel_name(self) -> str:
        return f"gemm_dbias_{'total' if self.total else 'columns'}_{self.out_dtype.value}"

    @property
    def params(self) -> tuple[Param, ...]:
        """The partial sums (rows x cols), dBias, and the rows a block adds up."""
        return (*array("partial", "float", "rows", "cols", const=True),
                pointer("out", self.out_dtype.ctype), *int64("chunk"))
