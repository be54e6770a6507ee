"""Choosing a kernel for a problem: candidates, the shape heuristic, pinned configs, fallback."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit.nvrtc import arch_number as number_of_arch
from .epilogue import PARTIAL_SUMS, Epilogue
from .spec import (
    PIPELINED_F32_CONFIGS,
    TILED_CONFIGS,
    WGMMA_CONFIGS,
    WGMMA_FP8_CONFIGS,
    WGMMA_FP8_FAST_CONFIGS,
    WGMMA_X3_CONFIGS,
    DType,
    Layout,
    MmaConfig,
    MmaGemmSpec,
    PipelineConfig,
    PipelinedGemmSpec,
    Precision,
    SplitKReduceSpec,
    Tf32SplitSpec,
    TileConfig,
    TiledGemmSpec,
    TransposeSpec,
    WgmmaConfig,
    WgmmaGemmSpec,
    mma_configs,
)

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
#: The fallback: the plain tiled kernel, correct for every size and alignment, on any arch.
FALLBACK_TILE = TILED_CONFIGS[-1]


@dataclass(frozen=True)
class Choice:
    """A kernel configuration and why it was chosen ("heuristic", "tuned", "pinned", "fallback")."""

    config: PipelineConfig | MmaConfig | WgmmaConfig | TileConfig
    split_k: int = 1
    reason: str = "heuristic"
    detail: str = ""

    @property
    def family(self) -> str:
        if isinstance(self.config, MmaConfig):
            return "mma"
        if isinstance(self.config, WgmmaConfig):
            return "wgmma"
        return "pipelined" if isinstance(self.config, PipelineConfig) else "tiled"

    @property
    def name(self) -> str:
        return self.config.name + (f"_k{self.split_k}" if self.split_k > 1 else "")

    def __str__(self) -> str:
        return f"{self.name} ({self.reason}{': ' + self.detail if self.detail else ''})"


def parse_config(config) -> tuple[PipelineConfig | MmaConfig | WgmmaConfig | TileConfig, int]:
    """A pinned ``config=``: a config object, or a name, optionally with '_k<splits>'."""
    if isinstance(config, Choice):
        return config.config, config.split_k
    if isinstance(config, (PipelineConfig, MmaConfig, WgmmaConfig, TileConfig)):
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
    if text.startswith("wgmma_"):
        return WgmmaConfig.parse(text), split
    if text.startswith("mma_"):
        if split != 1:
            raise ArgumentValueError(f"config: the mma.sync configs have no split-K, got "
                                     f"{config!r}")
        return MmaConfig.parse(text), 1
    if "_w" in text:
        return PipelineConfig.parse(text), split
    if split != 1:
        raise ArgumentValueError(f"config: split-K needs a pipelined config, got {config!r}")
    try:
        return TileConfig.parse(text), 1
    except ValueError:
        raise ArgumentValueError(
            f"config: expected a name like '128x128x8_w32x64_s3' (pipelined, sm_80+), "
            f"'128x128x8_w32x64_s3_k4' (with split-K), 'mma_128x128x32_w64x64_s4' (tensor "
            f"cores, sm_80+), 'wgmma_128x256_s4' (Hopper) or '64x64x8_4x4' (tiled), "
            f"got {config!r}"
        ) from None


def uses_tensor_cores(dtype: DType, precision: Precision = Precision.IEEE) -> bool:
    return dtype is not DType.F32 or precision is not Precision.IEEE


def check_config(config, arch: str, dtype: DType, precision: Precision, *,
                 who: str = "config", target: str = "the target") -> None:
    """Refuse, in one line, a config that cannot run on ``arch`` (``sm_XX``) for these inputs.

    ``who`` names the argument at fault (the config of a call on a GPU, the arch asked of
    ``inspect``) and ``target`` what ``arch`` is ("this GPU")."""
    number = number_of_arch(arch)
    family = Choice(config, 1, "").family
    if dtype.is_fp8 and number != 90:
        raise ArgumentValueError(f"a: {dtype.numpy_name} inputs run on Hopper's tensor cores "
                                 f"(sm_90); {target} is {arch}")
    if dtype.is_fp8 and not isinstance(config, WgmmaConfig):
        raise ArgumentValueError(f"{who}: {config.name} is a {family} config; "
                                 f"{dtype.numpy_name} inputs run on the Hopper kernel's "
                                 f"('wgmma_' configs)")
    need = ("sm_90 (Hopper)" if isinstance(config, WgmmaConfig) and number != 90 else
            "sm_80 or newer" if isinstance(config, (PipelineConfig, MmaConfig)) and number < 80
            else None)
    if need is not None:
        raise ArgumentValueError(f"{who}: {config.name} is a {family} config, which runs on "
                                 f"{need}; {target} is {arch}")
    if isinstance(config, (MmaConfig, WgmmaConfig)) and not uses_tensor_cores(dtype, precision):
        raise ArgumentValueError(
            f"config: {config.name} runs on the tensor cores: float32 inputs need "
            f"precision='tf32' or 'tf32x3' (or bfloat16 or float16 inputs)")


def promotes(dtype: DType, precision: Precision) -> bool:
    """Whether the Hopper kernel adds its accumulators into a float32 second set every 128
    of K (``WgmmaGemmSpec.promote``): for 3xTF32, and for 8-bit inputs unless
    ``fast_accum``."""
    return precision is Precision.TF32X3 or (dtype.is_fp8 and precision is Precision.IEEE)


def wgmma_configs(precision: Precision, dtype: DType = DType.F32) -> tuple[WgmmaConfig, ...]:
    """The Hopper kernel's candidates: those with room for a second set of accumulators where
    it promotes them (``promotes``), all of them otherwise; 8-bit inputs' own lists."""
    if dtype.is_fp8:
        return WGMMA_FP8_CONFIGS if promotes(dtype, precision) else WGMMA_FP8_FAST_CONFIGS
    return WGMMA_X3_CONFIGS if promotes(dtype, precision) else WGMMA_CONFIGS


def k_parts(precision: Precision) -> int:
    """How many times the tensor-core GEMM runs over K: 3 for 3xTF32 (hi*hi + hi*lo + lo*hi,
    over operands split into K-major copies three segments long), else 1."""
    return 3 if precision is Precision.TF32X3 else 1


def candidates(m: int, n: int, k: int, arch_number: int, dtype: DType = DType.F32,
               precision: Precision = Precision.IEEE) -> list[tuple[object, int]]:
    """Every (config, split_k) the autotuner tries for this problem on this architecture."""
    if dtype.is_fp8:   # the Hopper kernel alone, whole K (no split)
        return [(cfg, 1) for cfg in wgmma_configs(precision, dtype)] if arch_number == 90 else []
    if arch_number < 80:
        return [(t, 1) for t in TILED_CONFIGS]
    if uses_tensor_cores(dtype, precision):
        hopper = []
        if arch_number == 90:
            k_tiles = -(-k * k_parts(precision) // (128 // dtype.itemsize))
            for cfg in wgmma_configs(precision):
                hopper.append((cfg, 1))
                # a few tiles and a long K: slices of K fill the GPU (the tuner decides)
                hopper += [(cfg, s) for s in (2, 4)
                           if _tiles(m, n, cfg) * s <= 256 and k_tiles >= 8 * s]
        return hopper + [(cfg, 1) for cfg in mma_configs(dtype, precision)]
    out = []
    for cfg in PIPELINED_F32_CONFIGS:
        k_tiles = -(-k // cfg.bk)
        for s in SPLITS:
            if s == 1 or (k_tiles >= 4 * s and m * n <= 8 * 1024 * 1024):
                out.append((cfg, s))
    return out


#: 3xTF32 problems with M or N at most this take the exact float32 kernel (bench/NOTES.md:
#: 8192 x 64 x 4096 ran 0.27 ms on the split path, 0.15 ms exact, on an H200).
X3_MIN_SIDE = 64
#: 3xTF32 runs its tensor-core GEMM over 3K (three segments), counted in 32 bits.
X3_MAX_3K = 2**31 - 1


def _tiles(m: int, n: int, cfg) -> int:
    return -(-m // cfg.bm) * -(-n // cfg.bn)


def adds_wide_c(epilogue, dtype: DType) -> bool:
    """Whether a GEMM of 16-bit ``dtype`` inputs adds a row-major C of 4-byte elements (a
    float32 accumulator): ``heuristic``'s ``wide_c``."""
    return (epilogue.layout_c is Layout.ROW and epilogue.c_dtype is not None
            and epilogue.c_dtype.itemsize == 4 and epilogue.gate is None and not epilogue.glu
            and dtype.itemsize == 2)


def glu_kind(epilogue) -> str | None:
    """The heuristic's ``glu``: a gated linear unit storing Y ("y") or Y and Z ("yz", or
    "yz_wide" where the cooperative 128x256 tile stages them without spilling); its backward's
    staged dZ ("dz", or "dz_256" where the ping-pong 128x128 tile would spill staging it: the
    erf GELU)."""
    if epilogue.glu_grad is None and not epilogue.glu:
        return None
    wide = next(c for c in WGMMA_CONFIGS if c.name == "wgmma_128x256_s4")
    if epilogue.glu_grad is not None:
        if WgmmaGemmSpec.staging_spills(wide, epilogue):   # Z's layout or type: no tile stages
            return None
        pingpong = next(c for c in WGMMA_CONFIGS if c.name == "wgmma_128x128_s6_pp")
        return "dz_256" if WgmmaGemmSpec.staging_spills(pingpong, epilogue) else "dz"
    if not epilogue.save_z:
        return "y"
    return "yz" if WgmmaGemmSpec.staging_spills(wide, epilogue) else "yz_wide"


def heuristic(m: int, n: int, k: int, sms: int, arch_number: int,
              layouts: str = "rr", dtype: DType = DType.F32,
              precision: Precision = Precision.IEEE, gated: bool = False,
              glu: str | None = None, wide_c: bool = False) -> Choice:
    """A good config from the shape, operand layouts ("rc": row-major A, column-major B) and
    types alone, with no tuning run. ``gated``: the backward's gating epilogue (it reads C),
    whose cost a ping-pong schedule hides where the output is wide for its K. ``glu``: a
    gated linear unit's epilogue storing Y ("y"), or Y and Z ("yz"; "yz_wide" where the
    128x256 tile can stage them), or its backward's dZ ("dz"; "dz_256" where the ping-pong
    128x128 tile cannot stage it); see ``glu_kind``. ``wide_c``: a row-major C of 4-byte
    elements beside 16-bit inputs (adding into a float32 accumulator), which a 128x256 tile
    cannot take through its TMA ring (``WgmmaGemmSpec.c_tma_unfit``): it reads C with the
    accumulators and stores unstaged, so the 128x128 tile, which stages it, is taken instead.

    Bigger tiles move fewer bytes per flop, so take the biggest tile that still fills the GPU
    (about one block per multiprocessor); when even the smallest tile leaves most of the
    multiprocessors idle and K is long, split K so that the slices fill them.
    """
    if dtype.is_fp8:
        return _wgmma_fp8_heuristic(m, n, k, sms, precision)
    if arch_number < 80:
        why = f"sm_{arch_number} has no cp.async"
        for t in TILED_CONFIGS:
            if _tiles(m, n, t) >= sms:
                return Choice(t, 1, "fallback", why)
        return Choice(FALLBACK_TILE, 1, "fallback", why)
    if precision is Precision.TF32X3 and (min(m, n) <= X3_MIN_SIDE or 3 * k > X3_MAX_3K):
        # The split copies of A and B cost 16 bytes of traffic per input element; with an
        # output this narrow there are too few products per element to pay for them, and the
        # exact float32 kernel (at least as accurate) is faster. A K whose three segments
        # overflow the kernels' 32-bit K takes the exact kernel too.
        ch = heuristic(m, n, k, sms, arch_number, layouts, dtype, Precision.IEEE)
        why = (f"3xTF32 runs over 3K, at most {X3_MAX_3K}" if 3 * k > X3_MAX_3K else
               f"3xTF32 pays for its split copies from M, N > {X3_MIN_SIDE}")
        return Choice(ch.config, ch.split_k, ch.reason, f"{why}: exact float32; {ch.detail}")
    if uses_tensor_cores(dtype, precision):
        if arch_number == 90:
            if precision is Precision.TF32X3:
                return _wgmma_x3_heuristic(m, n, k, sms)
            return _wgmma_heuristic(m, n, k, sms, gated, glu, wide_c)
        return _mma_heuristic(m, n, sms, dtype, precision)
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


def _mma_heuristic(m: int, n: int, sms: int, dtype: DType,
                   precision: Precision = Precision.IEEE) -> Choice:
    configs = mma_configs(dtype, precision)
    wide = [c for c in configs if c.bn >= c.bm]
    tall = [c for c in configs if c.bm > c.bn]
    # Largest tiles first; of two equal areas the one shaped like the output.
    order = sorted(wide + tall, key=lambda c: (-(c.bm * c.bn), (c.bn >= c.bm) != (n >= m),
                                               -c.stages))
    for cfg in order:
        if _tiles(m, n, cfg) >= sms:
            return Choice(cfg, 1, "heuristic",
                          f"{_tiles(m, n, cfg)} tiles of {cfg.bm}x{cfg.bn} fill {sms} SMs")
    cfg = order[-1]
    return Choice(cfg, 1, "heuristic", f"{_tiles(m, n, cfg)} tiles of {cfg.bm}x{cfg.bn} for "
                  f"{sms} SMs")


def _wgmma_heuristic(m: int, n: int, k: int, sms: int, gated: bool = False,
                     glu: str | None = None, wide_c: bool = False) -> Choice:
    """Measured on an H200 (bench/NOTES.md): the cooperative 128x256 tile when there are many
    waves of tiles, or about one wave or more and K >= 1024; else ping-pong tiles (one
    consumer's epilogue hides under the other's main loop), 64x256 for long K, 128x128
    otherwise; the cooperative 128x128 tile for half a wave to one (skinny outputs such as
    8192 x 256); smaller problems take 64x128 or 128x64 tiles, or, for K of 8192 and more,
    128x128 tiles with K split to fill the GPU. A gating epilogue (``gated``) takes the same
    tiles (its C arrives through the ring: on an H100, bf16, gelu_tanh gate, 16384 x 4096 x
    1024 takes 0.297 ms on 128x256 tiles against 0.356-0.388 ping-pong 128x128, 4096 x 4096
    x 1024 0.072 against 0.091), except the 64x256 ping-pong tile for long K (its staged gate
    spills registers where C cannot come through the ring).

    A gated linear unit (``glu``) that stores Z as well takes the cooperative 128x256 tile for
    K >= 2048 and about a wave or more where that tile stages Y and Z (``"yz_wide"``: 16-bit
    outputs without a bias, not the erf GELU; on an H100, bf16, silu, 4096 x 22016 x 4096
    takes 1.060 ms on it against 1.208 on ping-pong 128x128 tiles and 1.085 for a plain GEMM
    of that shape, 8192 x 28672 x 4096 2.943 against 3.593 and 2.748), else the ping-pong
    128x128 tile where it fills the GPU (16384 x 8192 x 1024: 0.465 ms against 0.513 on
    128x256 tiles; the 64x256 ping-pong tile stores unstaged, 1.2-1.8x slower); one that
    stores Y alone takes the 64x256 ping-pong tile for K up to 2048 with two waves or more
    (0.421 against 0.445 on 128x256 tiles at 16384 x 8192 x 1024).

    A gated linear unit's backward (``glu`` "dz": dH's GEMM whose epilogue reads Z and writes
    dZ, twice dH's columns) takes the ping-pong 128x128 tile from a wave up, so that one
    consumer's epilogue, heavy with Z's loads and the activation's derivative, hides under the
    other's main loop (on an H200, bf16, silu, dH of 4096 x 11008 x 4096: 0.641 ms against
    0.778 on 128x256 tiles, a plain GEMM of the shape 0.565; 8192 x 11008 x 4096: 1.263
    against 1.476; 4096 x 5632 x 2048: 0.217 against 0.242), or the 64x256 ping-pong tile
    ("dz_256", where the 128x128 one spills staging dZ: 0.653, 1.289 and 0.214 there)."""
    by_name = {c.name: c for c in WGMMA_CONFIGS}

    def pick(name: str, why: str, split: int = 1) -> Choice:
        cfg = by_name[name]
        return Choice(cfg, split, "heuristic", f"{_tiles(m, n, cfg)} tiles of "
                      f"{cfg.bm}x{cfg.bn} for {sms} SMs: {why}")

    tiles_128 = _tiles(m, n, by_name["wgmma_128x128_s6"])
    big = _tiles(m, n, by_name["wgmma_128x256_s4"])
    if glu == "yz_wide" and k >= 2048 and 10 * big >= 9 * sms:
        return pick("wgmma_128x256_s4", "a gated linear unit's Y and Z, staged, K >= 2048")
    if glu in ("yz", "yz_wide") and _tiles(m, n, by_name["wgmma_128x128_s6_pp"]) >= sms:
        return pick("wgmma_128x128_s6_pp", "a gated linear unit's Y and Z, staged")
    if glu == "y" and k <= 2048 and _tiles(m, n, by_name["wgmma_64x256_s4_pp"]) >= 2 * sms:
        return pick("wgmma_64x256_s4_pp", "a gated linear unit, ping-pong")
    if glu in ("dz", "dz_256"):
        name = "wgmma_128x128_s6_pp" if glu == "dz" else "wgmma_64x256_s4_pp"
        if _tiles(m, n, by_name[name]) >= sms:
            return pick(name, "a gated linear unit's dZ, ping-pong")
    wide = "wgmma_128x128_s6" if wide_c else "wgmma_128x256_s4"
    staged = ", 128x128 to take a float32 C through the ring" if wide_c else ""
    if big >= 8 * sms:
        return pick(wide, "8 or more waves" + staged)
    if k >= 1024 and 10 * big >= 9 * sms:
        return pick(wide, "about a wave or more, K >= 1024" + staged)
    if _tiles(m, n, by_name["wgmma_128x128_s6_pp"]) >= sms:
        if k >= 2048 and _tiles(m, n, by_name["wgmma_64x256_s4_pp"]) >= 2 * sms and not gated:
            return pick("wgmma_64x256_s4_pp", "ping-pong, long K")
        return pick("wgmma_128x128_s6_pp", "ping-pong")
    if 2 * tiles_128 >= sms:
        return pick("wgmma_128x128_s6", "about one wave")
    # a long K over few tiles (1024 x 1024 x 16384: 0.069 ms split 2 ways, 0.075 on 64x128
    # tiles, on an H100): slices of K fill the GPU
    split = max((s for s in (2, 4) if tiles_128 * s <= sms), default=1)
    if k >= 8192 and split > 1:
        return pick("wgmma_128x128_s6", f"few tiles, K = {k} split {split} ways", split)
    return pick("wgmma_64x128_s8" if n >= m else "wgmma_128x64_s8", "few tiles")


def _wgmma_x3_heuristic(m: int, n: int, k: int, sms: int) -> Choice:
    """3xTF32 on Hopper (measured on an H200, bench/NOTES.md): the cooperative 128x128 tile
    from about half a wave of tiles up; below that 128x64 tiles, with K (three times the
    problem's) split so that the slices about fill the GPU."""
    by_name = {c.name: c for c in WGMMA_X3_CONFIGS}
    cfg = by_name["wgmma_128x128_s6"]
    if 2 * _tiles(m, n, cfg) >= sms:
        return Choice(cfg, 1, "heuristic", f"{_tiles(m, n, cfg)} tiles of 128x128 for {sms} "
                      f"SMs (3xTF32)")
    cfg = by_name["wgmma_128x64_s8"]
    tiles, k_tiles = _tiles(m, n, cfg), -(-3 * k // 32)
    split = max(s for s in (1, 2, 4) if s == 1 or (tiles * s <= sms and k_tiles >= 8 * s))
    return Choice(cfg, split, "heuristic", f"{tiles} tiles of 128x64 for {sms} SMs, K split "
                  f"{split} ways (3xTF32)")


def _wgmma_fp8_heuristic(m: int, n: int, k: int, sms: int, precision: Precision) -> Choice:
    """8-bit inputs on Hopper (measured on an H200 with bias + GELU; bench/NOTES.md, "8-bit
    inputs"): with float32 sums (``promotes``) the cooperative 192x128 tile (three consumer
    warpgroups) from about a wave of tiles up (8192^3: 0.991 ms against 1.007 on 128x192
    tiles, which took 0.94 against 1.04 on 128x128 tiles and 1.27 on ping-pong 64x192),
    128x128 from half a wave, else 128x64 or 64x128 tiles; with ``fast_accum`` the ping-pong
    64x256 tile from a wave up (4096^3: 0.123 ms against 0.128 on 128x256 tiles; 8192 x 16384
    x 4096: 0.892 against 1.004), else the 16-bit inputs' choice."""
    if precision is Precision.FAST_ACCUM:
        pp = WGMMA_FP8_FAST_CONFIGS[2]   # wgmma_64x256_s4_pp
        if _tiles(m, n, pp) >= sms:
            return Choice(pp, 1, "heuristic", f"{_tiles(m, n, pp)} tiles of 64x256 for {sms} "
                          "SMs (8-bit, fast_accum): ping-pong")
        ch = _wgmma_heuristic(m, n, k, sms)
        if ch.split_k > 1:   # (8-bit inputs take no split of K)
            cfg = WGMMA_FP8_CONFIGS[3 if n >= m else 2]
            return Choice(cfg, 1, "heuristic", f"{_tiles(m, n, cfg)} tiles of {cfg.bm}x"
                          f"{cfg.bn} for {sms} SMs: few tiles (8-bit, fast_accum)")
        return Choice(ch.config, 1, ch.reason, ch.detail + " (8-bit, fast_accum)")
    _, square, tall, low, three = WGMMA_FP8_CONFIGS
    if 10 * _tiles(m, n, three) >= 9 * sms:
        cfg = three
    elif 2 * _tiles(m, n, square) >= sms:
        cfg = square
    else:
        cfg = low if n >= m else tall
    return Choice(cfg, 1, "heuristic", f"{_tiles(m, n, cfg)} tiles of {cfg.bm}x{cfg.bn} for "
                  f"{sms} SMs (8-bit, float32 sums)")


def staged(dtype: DType, layouts: str, precision: Precision = Precision.IEEE,
           aligns: Aligns | None = None) -> tuple[bool, bool]:
    """Which operands the tensor-core kernels read through a K-major copy: for 3xTF32 both
    (split into hi and lo parts); on Hopper, tf32 and 8-bit wgmma read K-major operands only
    (row-major A, column-major B; 16-bit ones it transposes itself), and 8-bit operands whose
    rows TMA cannot read (``aligns`` below 16 bytes) are copied into aligned ones."""
    if precision is Precision.TF32X3:
        return True, True
    kmajor = dtype is DType.F32 or dtype.is_fp8
    stage_a, stage_b = kmajor and layouts[0] == "c", kmajor and layouts[1] == "r"
    if dtype.is_fp8 and aligns is not None:
        stage_a, stage_b = stage_a or aligns[0] < 16, stage_b or aligns[1] < 16
    return stage_a, stage_b


def tma_fits(aligns: Aligns, dtype: DType, layouts: str, k: int,
             precision: Precision = Precision.IEEE) -> str | None:
    """Why the Hopper kernel cannot take this problem, or None when it can: TMA needs 16-byte
    aligned pointers and rows (a staged copy is aligned by construction)."""
    stage_a, stage_b = staged(dtype, layouts, precision, aligns)
    if (aligns[0] < 16 and not stage_a) or (aligns[1] < 16 and not stage_b):
        return "TMA needs 16-byte aligned operand pointers and leading dimensions"
    if k == 0:
        return "K = 0"
    return None


def resolve(choice: Choice, dtype: DType, layouts: str, aligns: Aligns, m: int, n: int,
            k: int, sms: int, precision: Precision = Precision.IEEE) -> Choice:
    """``choice``, or the family below it that this problem's layout and alignment allow:
    wgmma -> mma.sync -> the fallback kernel (each step says why)."""
    cfg = choice.config
    if isinstance(cfg, WgmmaConfig):
        why = tma_fits(aligns, dtype, layouts, k, precision)
        if why is None:
            return choice
        sub = _mma_heuristic(m, n, sms, dtype, precision)
        choice = Choice(sub.config, 1, choice.reason, f"{cfg.name}: {why}; {sub.detail}")
        cfg = sub.config
    if isinstance(cfg, MmaConfig) and not mma_fits(aligns, precision):
        return Choice(FALLBACK_TILE, 1, "fallback",
                      f"{choice.name}: a {dtype.numpy_name} operand whose pointer or leading "
                      f"dimension is not 4-byte aligned cannot be copied by cp.async")
    return choice


#: Alignment in bytes (a power of two up to 16) of an operand's pointer and leading dimension,
#: A's, B's, Y's (with Z's) and C's (16 without C): what decides the copy and store widths a
#: kernel can use, and whether C can arrive by TMA.
Aligns = tuple[int, int, int, int]


def alignment(ptr: int, ld_bytes: int) -> int:
    """The largest power of two up to 16 that divides both ``ptr`` and ``ld_bytes``."""
    x = (ptr | ld_bytes | 16) & -(ptr | ld_bytes | 16)
    return min(x, 16)


def mma_fits(aligns: Aligns, precision: Precision = Precision.IEEE) -> bool:
    """Whether the tensor-core kernel can copy both operands (4-byte cp.async at least; the
    split copies of 3xTF32 are aligned by construction)."""
    return precision is Precision.TF32X3 or (aligns[0] >= 4 and aligns[1] >= 4)


@dataclass(frozen=True)
class KernelSet:
    """The kernels one config launches for a problem, with its split of K."""

    main: TiledGemmSpec | PipelinedGemmSpec | MmaGemmSpec | WgmmaGemmSpec
    reduce: SplitKReduceSpec | None
    splits: int
    k_tiles_per_split: int
    #: the kernels that first copy A and B into the K-major layout ``main`` reads (a
    #: transposition, or the 3xTF32 split), or None for an operand read as it is
    prep_a: TransposeSpec | Tf32SplitSpec | None = None
    prep_b: TransposeSpec | Tf32SplitSpec | None = None

    @property
    def specs(self) -> tuple:
        return tuple(dict.fromkeys(s for s in (self.main, self.reduce, self.prep_a, self.prep_b)
                                   if s is not None))


def _preps(dtype: DType, layout_a: Layout, layout_b: Layout, stage: tuple[bool, bool],
           precision: Precision):
    """The copy kernels of the staged operands: the 3xTF32 split (A's rows hi, hi, lo; B's
    columns hi, lo, hi), or a copy into K-major layout (a transposition, or for a K-major
    8-bit operand at an unaligned address or leading dimension, a plain copy)."""
    if precision is Precision.TF32X3:
        preps = (Tf32SplitSpec(layout_a is Layout.COL, "hhl"),
                 Tf32SplitSpec(layout_b is Layout.ROW, "hlh"))
    else:
        preps = (TransposeSpec(dtype, layout_a is Layout.COL),
                 TransposeSpec(dtype, layout_b is Layout.ROW))
    return tuple(spec if s else None for spec, s in zip(preps, stage))


def kernel_set(dtype: DType, layout_a: Layout, layout_b: Layout, epilogue: Epilogue, config,
               split_k: int, k: int, aligns: Aligns, precision: Precision = Precision.IEEE
               ) -> KernelSet:
    """The specs that ``config`` (split ``split_k`` ways) launches for a problem with this
    epilogue, K and these alignments (bytes: A's, B's, Y's, C's). Needs no GPU: the warm-up uses it
    too. Each spec gets its fields chosen here, once: the copy and store widths the alignments
    and layouts allow, and for a split K the ``PARTIAL_SUMS`` epilogue of the slices, the
    problem's going to the reduction.

    A tensor-core config whose operands cannot be copied (16-bit data at odd addresses or
    leading dimensions) becomes the fallback kernel, which reads any alignment. With 3xTF32
    (float32 inputs), the tensor-core configs read both operands through split K-major
    copies; the CUDA-core configs compute exact float32. ``epilogue.bgrad`` (with a gate)
    asks for the column sums: the Hopper kernel makes them where it can
    (``WgmmaGemmSpec.can_bgrad``), no other kernel does; the caller reads
    ``main.epilogue.bgrad`` to know."""
    sums = epilogue.bgrad
    epilogue = replace(epilogue, bgrad=False)
    if precision is Precision.TF32X3 and dtype is not DType.F32:
        raise ArgumentValueError(f"precision: 'tf32x3' applies to float32 inputs, not "
                                 f"{dtype.numpy_name}")
    stage = _stage(dtype, layout_a.value + layout_b.value, config, k, aligns, precision)
    r = _SetRequest(dtype, layout_a, layout_b, epilogue, config, split_k, k, aligns, precision,
                    sums, stage, _preps(dtype, layout_a, layout_b, stage, precision))
    if isinstance(config, WgmmaConfig):
        return _wgmma_set(r)
    if isinstance(config, MmaConfig) and mma_fits(aligns, precision):
        return _mma_set(r)
    if isinstance(config, PipelineConfig):
        return _pipelined_set(r)
    tile = config if isinstance(config, TileConfig) else FALLBACK_TILE
    return KernelSet(TiledGemmSpec(dtype, layout_a, layout_b, epilogue, tile), None, 1, 0)


@dataclass(frozen=True, slots=True)
class _SetRequest:
    """``kernel_set``'s arguments (``epilogue`` without ``bgrad``; ``sums``: whether it was
    asked for), with which operands the GEMM reads through a K-major copy (``stage``) and the
    copy kernels of those (``preps``: A's, B's)."""

    dtype: DType
    layout_a: Layout
    layout_b: Layout
    epilogue: Epilogue
    config: object
    split_k: int
    k: int
    aligns: Aligns
    precision: Precision
    sums: bool
    stage: tuple[bool, bool]
    preps: tuple

    @property
    def read_layouts(self) -> tuple[Layout, Layout]:
        """The layouts the GEMM reads A and B in: a staged copy's is K-major."""
        return (Layout.ROW if self.stage[0] else self.layout_a,
                Layout.COL if self.stage[1] else self.layout_b)


def _stage(dtype: DType, layouts: str, config, k: int, aligns: Aligns,
           precision: Precision) -> tuple[bool, bool]:
    """Which operands ``config``'s GEMM reads through a K-major copy (``staged``): a
    tensor-core config's with 3xTF32 (whose 3K must fit the kernels' 32-bit counts), the
    Hopper kernel's otherwise as its types and alignments need, no other's."""
    x3 = precision is Precision.TF32X3
    if isinstance(config, (WgmmaConfig, MmaConfig)) and k > 0 and x3:
        if 3 * k > X3_MAX_3K:
            raise ArgumentValueError(
                f"config: {config.name} with precision='tf32x3' runs one GEMM over 3K = "
                f"{3 * k}, more than the {X3_MAX_3K} the kernels count; K up to "
                f"{X3_MAX_3K // 3} (or an exact float32 config, or no config)")
        return staged(dtype, layouts, precision)
    if isinstance(config, WgmmaConfig):
        return staged(dtype, layouts, aligns=aligns)
    return False, False


def _wgmma_set(r: _SetRequest) -> KernelSet:
    """``kernel_set`` of a Hopper config: its K split in whole 128-byte tiles, C through the
    TMA ring and the staged 16-byte stores where the alignments and registers allow."""
    dtype, config, split_k, precision = r.dtype, r.config, r.split_k, r.precision
    _, _, align_y, align_c = r.aligns
    why = tma_fits(r.aligns, dtype, r.layout_a.value + r.layout_b.value, r.k, precision)
    if why is not None:
        raise ArgumentValueError(f"config: {config.name}: {why}")
    k_tiles = -(-r.k * k_parts(precision) // (128 // dtype.itemsize))
    per_split = max(-(-k_tiles // split_k), 1)
    splits = -(-k_tiles // per_split) if split_k > 1 else 1
    if splits > 1 and dtype.is_fp8:
        raise ArgumentValueError(f"config: {config.name}_k{split_k}: {dtype.numpy_name} "
                                 f"inputs take no split of K; pin {config.name}")
    main_epilogue = PARTIAL_SUMS if splits > 1 else r.epilogue
    # a row-major C whose rows TMA can copy arrives through the ring; else reading C with
    # the accumulators leaves too few registers for the staging (a gate reads it after
    # staging, from whole rows)
    c_tma = (align_y >= 16 and main_epilogue.layout_c is Layout.ROW and align_c >= 16
             and WgmmaGemmSpec.c_tma_unfit(config, main_epilogue) is None)
    staging = (align_y >= 16
               and WgmmaGemmSpec.staging_spills(config, main_epilogue, c_tma) is None)
    c_tma = c_tma and staging
    # (a gated linear unit's backward copies its Z into the staging blocks in 16-byte
    # segments, and forms dZ there)
    store16 = staging and (main_epilogue.layout_c is None or main_epilogue.gate is not None
                           or c_tma or (main_epilogue.glu_grad is not None
                                        and align_c >= 16))
    y_item = r.epilogue.out_dtype.itemsize
    main = WgmmaGemmSpec(dtype, *r.read_layouts, main_epilogue, config,
                         store16 or align_y >= 2 * y_item, store16,
                         promote=promotes(dtype, precision),
                         split_k=splits > 1, c_tma=c_tma)
    if r.sums and main.can_bgrad:
        main = replace(main, epilogue=replace(main_epilogue, bgrad=True))
    reduce = None
    if splits > 1:   # 4 outputs per thread: 4-element stores need that alignment
        reduce = SplitKReduceSpec(dtype, r.epilogue, align_y >= 4 * y_item)
    return KernelSet(main, reduce, splits, per_split if splits > 1 else 0, *r.preps)


def _mma_set(r: _SetRequest) -> KernelSet:
    """``kernel_set`` of an mma.sync config whose operands cp.async can copy."""
    align_a, align_b, align_y, _ = r.aligns
    copy_a = 16 if r.stage[0] else min(align_a, 16)
    copy_b = 16 if r.stage[1] else min(align_b, 16)
    main = MmaGemmSpec(r.dtype, *r.read_layouts, r.epilogue, r.config, copy_a, copy_b,
                       align_y >= 2 * r.epilogue.out_dtype.itemsize,
                       promote=r.precision is Precision.TF32X3)
    return KernelSet(main, None, 1, 0, *r.preps)


def _pipelined_set(r: _SetRequest) -> KernelSet:
    """``kernel_set`` of a float32 CUDA-core pipelined config, its K split where asked."""
    dtype, config, split_k, k = r.dtype, r.config, r.split_k, r.k
    align_a, align_b, align_y, _ = r.aligns
    if dtype is not DType.F32:
        raise ArgumentValueError(
            f"config: {config.name} is a float32 CUDA-core config; {dtype.numpy_name} "
            f"inputs run on 'mma_' configs (or a tiled config such as "
            f"{FALLBACK_TILE.name!r})")
    k_tiles = -(-k // config.bk) if k else 0
    per_split = max(-(-k_tiles // split_k), 1)
    splits = max(-(-k_tiles // per_split), 1) if split_k > 1 else 1
    split = splits > 1
    # 16-byte copies of an operand whose contiguous dimension is the shared tile's (m of
    # column-major A, n of row-major B); the slices of a split K go to a workspace of
    # 16-byte rows
    main = PipelinedGemmSpec(dtype, r.layout_a, r.layout_b,
                             PARTIAL_SUMS if split else r.epilogue, config,
                             align_a >= 16 and r.layout_a is Layout.COL,
                             align_b >= 16 and r.layout_b is Layout.ROW,
                             align_y >= 16 or split, split)
    reduce = SplitKReduceSpec(dtype, r.epilogue, align_y >= 16) if split else None
    return KernelSet(main, reduce, splits, per_split)
