"""What distinguishes one GEMM kernel from another: enums, tile configs and the spec."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...errors import ArgumentValueError
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
