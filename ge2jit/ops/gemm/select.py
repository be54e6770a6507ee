"""Choosing a kernel for a problem: candidates, the shape heuristic, pinned configs, fallback."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ArgumentTypeError, ArgumentValueError
from .spec import (
    PIPELINED_F32_CONFIGS,
    SIMT_F32_TILES,
    Act,
    BiasKind,
    DType,
    GemmSpec,
    Layout,
    PipelineConfig,
    PipelinedGemmSpec,
    SplitKReduceSpec,
    TileConfig,
)

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
#: The fallback: the plain tiled kernel, correct for every size and alignment, on any arch.
FALLBACK_TILE = SIMT_F32_TILES[-1]


@dataclass(frozen=True)
class Choice:
    """A kernel configuration and why it was chosen ("heuristic", "tuned", "pinned", "fallback")."""

    config: PipelineConfig | TileConfig
    split_k: int = 1
    reason: str = "heuristic"
    detail: str = ""

    @property
    def family(self) -> str:
        return "pipelined" if isinstance(self.config, PipelineConfig) else "basic"

    @property
    def name(self) -> str:
        return self.config.name + (f"_k{self.split_k}" if self.split_k > 1 else "")

    def __str__(self) -> str:
        return f"{self.name} ({self.reason}{': ' + self.detail if self.detail else ''})"


def parse_config(config) -> tuple[PipelineConfig | TileConfig, int]:
    """A pinned ``config=``: a config object, or a name, optionally with '_k<splits>'."""
    if isinstance(config, Choice):
        return config.config, config.split_k
    if isinstance(config, (PipelineConfig, TileConfig)):
        return config, 1
    if not isinstance(config, str):
        raise ArgumentTypeError(
            f"config: expected a PipelineConfig, a TileConfig or a name such as "
            f"'128x128x8_w32x64_s3' or '128x128x8_w32x64_s3_k4', got {config!r}"
        )
    text, split = config, 1
    head, sep, tail = config.rpartition("_k")
    if sep and tail.isdigit():
        text, split = head, int(tail)
        if split < 1:
            raise ArgumentValueError(f"config: split-K must be at least 1, got {config!r}")
    if "_w" in text:
        return PipelineConfig.parse(text), split
    if split != 1:
        raise ArgumentValueError(f"config: split-K needs a pipelined config, got {config!r}")
    try:
        return TileConfig.parse(text), 1
    except ValueError:
        raise ArgumentValueError(
            f"config: expected a name like '128x128x8_w32x64_s3' (pipelined, sm_80+), "
            f"'128x128x8_w32x64_s3_k4' (with split-K) or '64x64x8_4x4' (basic), got {config!r}"
        ) from None


def candidates(m: int, n: int, k: int, arch_number: int) -> list[tuple[object, int]]:
    """Every (config, split_k) the autotuner tries for this problem on this architecture."""
    if arch_number < 80:
        return [(t, 1) for t in SIMT_F32_TILES]
    out = []
    for cfg in PIPELINED_F32_CONFIGS:
        k_tiles = -(-k // cfg.bk)
        for s in SPLITS:
            if s == 1 or (k_tiles >= 4 * s and m * n <= 8 * 1024 * 1024):
                out.append((cfg, s))
    return out


def _tiles(m: int, n: int, cfg) -> int:
    return -(-m // cfg.bm) * -(-n // cfg.bn)


def heuristic(m: int, n: int, k: int, sms: int, arch_number: int,
              layouts: str = "rr") -> Choice:
    """A good config from the shape and operand layouts ("rc": row-major A, column-major B)
    alone, with no tuning run.

    Bigger tiles move fewer bytes per flop, so take the biggest tile that still fills the GPU
    (about one block per multiprocessor); when even the smallest tile leaves most of the
    multiprocessors idle and K is long, split K so that the slices fill them.
    """
    if arch_number < 80:
        for t in SIMT_F32_TILES:
            if _tiles(m, n, t) >= sms:
                return Choice(t, 1, "fallback", f"sm_{arch_number} has no cp.async")
        return Choice(FALLBACK_TILE, 1, "fallback", f"sm_{arch_number} has no cp.async")
    by_name = {c.name: c for c in PIPELINED_F32_CONFIGS}
    # Measured on an H200 (bench/NOTES.md): with both operands on 16-byte copies ("cr") BK = 16
    # wins; where one is copied 4 bytes at a time BK = 8 does, with a 4th stage for "rc".
    big = by_name[{"cr": "128x128x16_w32x64_s2", "rc": "128x128x8_w32x64_s4"}.get(
        layouts, "128x128x8_w32x64_s3")]
    wide, tall, small = (by_name["64x128x8_w32x64_s3"], by_name["128x64x8_w32x64_s3"],
                         by_name["64x64x16_w32x32_s3"])
    if _tiles(m, n, big) >= sms:
        return Choice(big, 1, "heuristic",
                      f"{_tiles(m, n, big)} tiles of 128x128 fill {sms} SMs ({layouts})")
    for cfg in ((wide, tall) if n >= m else (tall, wide)):
        if _tiles(m, n, cfg) >= sms:
            return Choice(cfg, 1, "heuristic",
                          f"{_tiles(m, n, cfg)} tiles of {cfg.bm}x{cfg.bn} fill {sms} SMs")
    tiles = _tiles(m, n, small)
    k_tiles = -(-k // small.bk)
    # A CUDA-core GEMM needs several blocks per SM to hide latency: aim for about 4 per SM.
    if tiles < 2 * sms and k >= 512:
        split = max(s for s in SPLITS if s == 1 or (s * tiles <= 4 * sms and k_tiles >= 8 * s))
        if split > 1:
            return Choice(small, split, "heuristic",
                          f"{tiles} tiles of 64x64 for {sms} SMs, K = {k} split {split} ways")
    return Choice(small, 1, "heuristic", f"{tiles} tiles of 64x64 for {sms} SMs")


@dataclass(frozen=True)
class KernelSet:
    """The kernels one config launches for a problem, with its split of K."""

    main: GemmSpec | PipelinedGemmSpec
    reduce: SplitKReduceSpec | None
    splits: int
    k_tiles_per_split: int

    @property
    def specs(self) -> tuple:
        return (self.main,) if self.reduce is None else (self.main, self.reduce)


def kernel_set(dtype: DType, layout_a: Layout, layout_b: Layout, layout_c: Layout | None,
               act: Act, bias: BiasKind, save_z: bool, config, split_k: int, k: int,
               vecs: tuple[bool, bool, bool]) -> KernelSet:
    """The specs that ``config`` (split ``split_k`` ways) launches for a problem with this K
    and these alignments (vec_a, vec_b, vec_y). Needs no GPU: the warm-up uses it too."""
    if isinstance(config, PipelineConfig):
        k_tiles = -(-k // config.bk) if k else 0
        per_split = max(-(-k_tiles // split_k), 1)
        splits = max(-(-k_tiles // per_split), 1) if split_k > 1 else 1
        vec_a, vec_b, vec_y = vecs
        main = PipelinedGemmSpec(dtype, layout_a, layout_b, layout_c, act, bias, save_z, config,
                                 vec_a, vec_b, vec_y, splits > 1)
        reduce = None
        if splits > 1:
            reduce = SplitKReduceSpec(dtype, layout_c, act, bias, save_z, vec_y)
        return KernelSet(main, reduce, splits, per_split)
    return KernelSet(GemmSpec(dtype, layout_a, layout_b, layout_c, act, bias, save_z, config),
                     None, 1, 0)
