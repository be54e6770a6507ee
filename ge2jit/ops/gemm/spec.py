"""What distinguishes one GEMM kernel from another: enums, tile configs and the spec."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...errors import ArgumentValueError
from ...jit.nvrtc import arch_number
from ...jit.spec import KernelSpec


class DType(Enum):
    F32 = "f32"


class Layout(Enum):
    """How a 2-D operand is stored: row-major (strides (ld, 1)) or column-major ((1, ld))."""

    ROW = "r"
    COL = "c"


class Act(Enum):
    NONE = "none"
    RELU = "relu"
    LEAKY_RELU = "leaky_relu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    SILU = "silu"


class BiasKind(Enum):
    """Shape class of the bias: none, one scalar, one value per column (N), one per row (M)."""

    NONE = "nobias"
    SCALAR = "scalarbias"
    COL = "colbias"
    ROW = "rowbias"


ACT_NAMES: dict[str, Act] = {a.value: a for a in Act}


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


#: The tile configs of the float32 CUDA-core kernel, largest first.
SIMT_F32_TILES: tuple[TileConfig, ...] = (
    TileConfig(128, 128, 8, 8, 8),
    TileConfig(128, 64, 8, 8, 4),
    TileConfig(64, 64, 8, 4, 4),
)


@dataclass(frozen=True)
class GemmSpec(KernelSpec):
    """One fused GEMM kernel: Y = act(alpha * A @ B + beta * C + bias), optionally saving Z."""

    dtype: DType
    layout_a: Layout
    layout_b: Layout
    layout_c: Layout | None  # None: no C term (beta == 0)
    act: Act
    bias: BiasKind
    save_z: bool
    tile: TileConfig

    template = "gemm/simt.cu"

    def __post_init__(self):
        checks = (("dtype", DType), ("layout_a", Layout), ("layout_b", Layout),
                  ("act", Act), ("bias", BiasKind), ("tile", TileConfig))
        for name, typ in checks:
            if not isinstance(getattr(self, name), typ):
                raise TypeError(f"GemmSpec.{name}: expected {typ.__name__}, "
                                f"got {getattr(self, name)!r}")
        if self.layout_c is not None and not isinstance(self.layout_c, Layout):
            raise TypeError(f"GemmSpec.layout_c: expected Layout or None, got {self.layout_c!r}")
        if not isinstance(self.save_z, bool):
            raise TypeError(f"GemmSpec.save_z: expected bool, got {self.save_z!r}")

    @property
    def has_c(self) -> bool:
        return self.layout_c is not None

    @property
    def kernel_name(self) -> str:
        name = (f"gemm_{self.dtype.value}_{self.layout_a.value}{self.layout_b.value}_"
                f"{self.tile.name}_{self.act.value}_{self.bias.value}")
        if self.layout_c is not None:
            name += f"_c{self.layout_c.value}"
        if self.save_z:
            name += "_z"
        return name


@dataclass(frozen=True)
class PipelineConfig:
    """Tile config of the pipelined float32 kernel (sm_80+).

    Block tile BM x BN x BK; each warp computes a WM x WN warp tile with its 32 lanes laid out as
    (32 / lanes_n) x lanes_n, each lane a (WM * lanes_n / 32) x (WN / lanes_n) thread tile made of
    4 x 4 sub-tiles; ``stages`` shared-memory buffers fed by cp.async; ``min_blocks`` is the
    occupancy asked of the compiler (``__launch_bounds__``).
    """

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int
    lanes_n: int = 8
    min_blocks: int = 1

    def __post_init__(self):
        for name in ("bm", "bn", "bk", "wm", "wn", "stages", "lanes_n", "min_blocks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ArgumentValueError(f"PipelineConfig.{name}: expected a positive int, "
                                         f"got {v!r}")
        problems = []
        if self.bm % self.wm or self.bn % self.wn:
            problems.append("bm, bn must be multiples of wm, wn")
        if self.lanes_n not in (1, 2, 4, 8, 16, 32):
            problems.append("lanes_n must divide 32")
        elif self.tm % 4 or self.tn % 4 or self.tm == 0 or self.tn == 0:
            problems.append(f"thread tile {self.tm}x{self.tn} must be made of 4x4 sub-tiles")
        if self.bk % 8:
            problems.append("bk must be a multiple of 8")
        if self.stages < 2:
            problems.append("stages must be at least 2")
        if not 32 <= self.threads <= 1024:
            problems.append(f"{self.threads} threads (1 to 32 warps allowed)")
        if problems:
            raise ArgumentValueError(f"PipelineConfig {self.name}: " + "; ".join(problems))

    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

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
        import re

        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_s(\d+)(?:_l(\d+))?(?:_b(\d+))?", text)
        if not m:
            raise ArgumentValueError(
                f"config: expected a name like '128x128x8_w32x64_s3' (BMxBNxBK_wWMxWN_sSTAGES), "
                f"got {text!r}"
            )
        g = [int(x) if x else None for x in m.groups()]
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


@dataclass(frozen=True)
class PipelinedGemmSpec(KernelSpec):
    """The fast float32 GEMM (sm_80+): cp.async pipeline, register-blocked outer products.

    ``vec_a``/``vec_b`` select 16-byte copies of an operand whose contiguous dimension matches
    the shared tile's (column-major A, row-major B) and whose pointer and leading dimension are
    16-byte aligned; ``vec_y`` 16-byte stores of Y and Z. ``split_k`` makes the kernel write raw
    partial sums of one K slice to a workspace (no epilogue); the reduction kernel finishes.
    """

    dtype: DType
    layout_a: Layout
    layout_b: Layout
    layout_c: Layout | None
    act: Act
    bias: BiasKind
    save_z: bool
    config: PipelineConfig
    vec_a: bool = False
    vec_b: bool = False
    vec_y: bool = False
    split_k: bool = False

    template = "gemm/simt_pipelined.cu"

    def __post_init__(self):
        if not isinstance(self.config, PipelineConfig):
            raise TypeError(f"PipelinedGemmSpec.config: expected PipelineConfig, "
                            f"got {self.config!r}")
        for name in ("vec_a", "vec_b", "vec_y", "split_k", "save_z"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"PipelinedGemmSpec.{name}: expected bool")
        if self.vec_a and self.layout_a is not Layout.COL:
            object.__setattr__(self, "vec_a", False)  # 16-byte copies need m contiguous
        if self.vec_b and self.layout_b is not Layout.ROW:
            object.__setattr__(self, "vec_b", False)
        if self.split_k:  # the epilogue belongs to the reduction kernel
            for name, value in (("layout_c", None), ("act", Act.NONE),
                                ("bias", BiasKind.NONE), ("save_z", False), ("vec_y", True)):
                object.__setattr__(self, name, value)

    @property
    def has_c(self) -> bool:
        return self.layout_c is not None

    @property
    def kernel_name(self) -> str:
        vec = "".join("4" if v else "1" for v in (self.vec_a, self.vec_b, self.vec_y))
        name = (f"gemm_{self.dtype.value}_{self.layout_a.value}{self.layout_b.value}_"
                f"{self.config.name}_v{vec}")
        if self.split_k:
            return name + "_splitk"
        name += f"_{self.act.value}_{self.bias.value}"
        if self.layout_c is not None:
            name += f"_c{self.layout_c.value}"
        if self.save_z:
            name += "_z"
        return name

    def supports_arch(self, arch: str) -> bool:
        return arch_number(arch) >= 80

    @property
    def threads(self) -> int:
        return self.config.threads

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes


@dataclass(frozen=True)
class SplitKReduceSpec(KernelSpec):
    """Sums split-K partial products and applies the fused epilogue once."""

    dtype: DType
    layout_c: Layout | None
    act: Act
    bias: BiasKind
    save_z: bool
    vec_y: bool

    template = "gemm/splitk_reduce.cu"
    threads = 256
    smem_bytes = 0

    @property
    def has_c(self) -> bool:
        return self.layout_c is not None

    @property
    def kernel_name(self) -> str:
        name = f"gemm_splitk_reduce_{self.dtype.value}_{self.act.value}_{self.bias.value}"
        if self.layout_c is not None:
            name += f"_c{self.layout_c.value}"
        if self.save_z:
            name += "_z"
        return name + ("_v4" if self.vec_y else "_v1")
