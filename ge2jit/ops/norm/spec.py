"""The normalization kernels (``kernel_templates/norm/``), their configuration names and the
choice among them. Everything here is pure: no GPU, no CuPy.

Two kinds share every kernel: ``"rms"`` (RMSNorm: ``y = h * rstd * w``, ``rstd = 1 /
sqrt(mean(h^2) + eps)``) and ``"layer"`` (LayerNorm: ``y = (h - mean) * rstd * w + b``,
``rstd = 1 / sqrt(mean((h - mean)^2) + eps)``), where ``h`` is the input row, or ``x +
residual`` rounded to h's type with a residual. Statistics are float32.

Forward variants, by row length ``n`` (the names of ``runtime.rows``):

``warp{G}_v{V}_r{R}``
    ``G`` lanes per row, ``V`` values each in registers, ``R`` rows per lane group loaded
    together; blocks of 128 threads. Rows up to ``G * V`` elements; shuffles only.
``block_{T}_v{V}``
    One block of ``T`` threads per row, ``V`` values each in registers; rows up to ``T * V``
    elements (16384 with ``block_1024_v16``). One read of each input, one write of each
    output.
``loop_{T}``
    One block of ``T`` threads per row of any length: a pass that reads x (and the residual,
    writing h) and keeps the statistics (a compensated sum of squares; for LayerNorm Chan's
    parallel combination of per-step means and squared deviations of h less the row's first
    value), then a pass that reads the row again (h, as stored) and writes y.

Backward variants (``dx``, and each block's partial sums of ``dweight`` and ``dbias``, which a
second kernel adds up in a fixed order): ``warp{G}_v{V}_r1`` (rows up to ``G * V``; blocks of
128 threads), ``block_{T}_v{V}`` and ``loop_{T}`` (two passes over dy and h, two rows at a
time, their four sums in one reduction; each block adds its partial sums in shared memory
where they fit, else in a row of the workspace it owns). The backward's blocks stay resident and
walk the rows (a grid of what the GPU holds at once), so that the partial sums are few.

The vector width of the accesses (up to 16 bytes of the widest row type) is not part of the
name: the call takes the widest that the pointers and row strides allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...errors import ArgumentValueError
from ...jit.params import Param, double, int64, pointer
from ...jit.spec import KernelSpec
from ...runtime.dtypes import DType
from ...runtime.rows import (
    GRID_MAX,
    RowConfig,
    RowShapes,
    access_width,
    check_accesses,
    check_capacity,
    pow2_at_least,
)

KINDS = ("rms", "layer")
#: the public function of each kind
OP_NAMES = {"rms": "rms_norm", "layer": "layer_norm"}
VARIANTS = ("warp", "block", "loop")

WARP_THREADS = 128
WARP_LANES = (1, 2, 4, 8, 16, 32)
WARP_VPT = (4, 8, 16)
WARP_ROWS = (1, 2)
#: VPT * ROWS: the values a lane holds. With the weight's and bias' values of a slot, each
#: row's pointers and LayerNorm's statistics, 16 values of at most 2 rows are what 64 registers
#: hold without spilling (the kernels' launch bounds ask for 1024 threads per multiprocessor).
WARP_MAX_VALUES = 16
BLOCK_THREADS = (128, 256, 512, 1024)
BLOCK_VPT = (8, 16)
LOOP_THREADS = (256, 512, 1024)

#: The backward holds two values per element (x-hat and the gradient) and the partial sums of
#: dweight and dbias of its columns: at most 8 values per thread.
BACKWARD_WARP_VPT = (4, 8)
BACKWARD_BLOCK_VPT = (4, 8)

WARP_MAX_N = max(WARP_LANES) * max(WARP_VPT)                       # 512
BLOCK_MAX_N = max(BLOCK_THREADS) * max(BLOCK_VPT)                  # 16384
BACKWARD_WARP_MAX_N = max(WARP_LANES) * max(BACKWARD_WARP_VPT)     # 256
BACKWARD_BLOCK_MAX_N = max(BLOCK_THREADS) * max(BACKWARD_BLOCK_VPT)  # 8192
#: Rows a block of the loop backward takes at once (their loads go out together): four where
#: the registers allow (no dh, dy and h of one type, whole 16-byte accesses), else two
LOOP_BACKWARD_ROWS = (4, 2)
#: The most shared memory the loop backward's sums take (a block a multiprocessor: 128 KiB,
#: LayerNorm's two arrays of 16384 columns)
SMEM_SUMS_BYTES = 128 * 1024

SHAPES = RowShapes(WARP_VPT, WARP_ROWS, WARP_MAX_VALUES, BLOCK_THREADS, BLOCK_VPT,
                   LOOP_THREADS, WARP_THREADS, WARP_LANES)
BACKWARD_SHAPES = RowShapes(BACKWARD_WARP_VPT, (1,), WARP_MAX_VALUES, BLOCK_THREADS,
                            BACKWARD_BLOCK_VPT, LOOP_THREADS, WARP_THREADS, WARP_LANES)

#: The longest rows (elements): the register variants count in 32-bit integers.
MAX_N = 2**31 - 1
#: Columns per block of the kernel that adds up the backward's partial sums, and the groups of
#: partial rows its threads split (``norm/sums.cu``).
SUMS_COLUMNS = 32
SUMS_GROUPS = 32


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ArgumentValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")


def _dtype_or_none(value, name: str) -> None:
    if value is not None and not isinstance(value, DType):
        raise TypeError(f"{name}: expected a DType or None, got {value!r}")


def _ctype(dtype: DType | None) -> str:
    """The C type of an array's elements; float for an absent array (a null pointer)."""
    return dtype.ctype if dtype is not None else "float"


def _tag(prefix: str, dtype: DType | None) -> str:
    return f"_{prefix}{dtype.value}" if dtype is not None else ""


@dataclass(frozen=True)
class ForwardTypes:
    """The types a forward kernel reads and writes: ``x``, ``y``, the ``residual`` and ``h``
    (both None without a residual; h is written with one), the ``weight`` and ``bias`` (None:
    absent), and whether it writes the per-row statistics (``stats``: rstd, and mean for
    LayerNorm, float32)."""

    x: DType
    y: DType
    residual: DType | None = None
    h: DType | None = None
    weight: DType | None = None
    bias: DType | None = None
    stats: bool = False

    def __post_init__(self):
        if not isinstance(self.x, DType) or not isinstance(self.y, DType):
            raise TypeError("ForwardTypes: x and y must be DType")
        for name in ("residual", "h", "weight", "bias"):
            _dtype_or_none(getattr(self, name), f"ForwardTypes.{name}")
        if (self.residual is None) != (self.h is None):
            raise ArgumentValueError("ForwardTypes: a residual and h come together")
        if not isinstance(self.stats, bool):
            raise TypeError("ForwardTypes.stats: expected a bool")

    @property
    def width(self) -> int:
        """Elements per 16-byte access of the widest row type (x, residual, h, y)."""
        return access_width(*(d for d in (self.x, self.residual, self.h, self.y) if d))

    @property
    def name(self) -> str:
        res = f"_r{self.residual.value}h{self.h.value}" if self.residual else ""
        weight = _tag("w", self.weight) or "_nw"
        return (f"{self.x.value}{res}_y{self.y.value}{weight}{_tag('b', self.bias)}"
                f"{'_stats' if self.stats else ''}")


@dataclass(frozen=True)
class BackwardTypes:
    """The types a backward kernel reads and writes: ``dy``, ``h`` (the forward's normalized
    input), ``dx``, the ``weight`` (None: no weight, and no dweight), the ``bias``' (None: no
    dbias is made) and ``dh`` (the gradient arriving at h from elsewhere, added to dx; None:
    absent). dweight and dbias come in the weight's and bias' types."""

    dy: DType
    h: DType
    dx: DType
    weight: DType | None = None
    bias: DType | None = None
    dh: DType | None = None

    def __post_init__(self):
        for name in ("dy", "h", "dx"):
            if not isinstance(getattr(self, name), DType):
                raise TypeError(f"BackwardTypes.{name}: expected a DType")
        for name in ("weight", "bias", "dh"):
            _dtype_or_none(getattr(self, name), f"BackwardTypes.{name}")

    @property
    def width(self) -> int:
        return access_width(*(d for d in (self.dy, self.h, self.dx, self.dh) if d))

    @property
    def partials(self) -> bool:
        """Whether the kernel writes partial sums (of dweight, dbias or both)."""
        return self.weight is not None or self.bias is not None

    @property
    def name(self) -> str:
        return (f"dy{self.dy.value}_h{self.h.value}_dx{self.dx.value}"
                f"{_tag('w', self.weight) or '_nw'}{_tag('b', self.bias)}{_tag('dh', self.dh)}")


# ---- configs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class NormConfig(RowConfig):
    """A forward variant with its shape (the module's docstring); ``name`` is what
    ``rms_norm(config=...)`` and ``layer_norm(config=...)`` take."""

    def __post_init__(self):
        SHAPES.check(self, VARIANTS)


@dataclass(frozen=True)
class NormBackwardConfig(RowConfig):
    """A backward variant with its shape (the module's docstring); ``name`` is what
    ``rms_norm_backward(config=...)`` and ``layer_norm_backward(config=...)`` take."""

    def __post_init__(self):
        BACKWARD_SHAPES.check(self, VARIANTS)


NAME_EXAMPLES = {NormConfig: "'warp32_v8_r2', 'block_1024_v16' or 'loop_512'",
                 NormBackwardConfig: "'warp32_v8_r1', 'block_512_v8' or 'loop_1024'"}


def _parse(config, cls):
    shapes = SHAPES if cls is NormConfig else BACKWARD_SHAPES
    what = "" if cls is NormConfig else " backward"
    return shapes.parse(config, cls, VARIANTS, f"a normalization{what} variant name such as "
                                               f"{NAME_EXAMPLES[cls]}")


def parse_config(config) -> NormConfig:
    """A forward ``NormConfig`` from its name (or the config itself); one line naming what is
    wrong for anything else."""
    return _parse(config, NormConfig)


def parse_backward_config(config) -> NormBackwardConfig:
    """A ``NormBackwardConfig`` from its name (or the config itself)."""
    return _parse(config, NormBackwardConfig)


def all_configs() -> list[NormConfig]:
    """Every forward configuration."""
    out = [NormConfig("warp", WARP_THREADS, vpt=v, lanes=g, rows=r)
           for g in WARP_LANES for v in WARP_VPT for r in WARP_ROWS if v * r <= WARP_MAX_VALUES]
    out += [NormConfig("block", t, vpt=v) for t in BLOCK_THREADS for v in BLOCK_VPT]
    return out + [NormConfig("loop", t) for t in LOOP_THREADS]


def all_backward_configs() -> list[NormBackwardConfig]:
    """Every backward configuration."""
    out = [NormBackwardConfig("warp", WARP_THREADS, vpt=v, lanes=g)
           for g in WARP_LANES for v in BACKWARD_WARP_VPT]
    out += [NormBackwardConfig("block", t, vpt=v) for t in BLOCK_THREADS
            for v in BACKWARD_BLOCK_VPT]
    return out + [NormBackwardConfig("loop", t) for t in LOOP_THREADS]


# ---- kernel specs -------------------------------------------------------------------------

def loop_vpt(vec: int, backward: bool) -> int:
    """Values per thread and step of a loop variant: two accesses of each row array (the
    backward: one), at least 8 values (the backward: 4; scalar accesses and their bounds
    checks take more registers)."""
    return max(4, vec) if backward else max(8, 2 * vec)


class _RowSpec:
    """What the forward and backward specs share: the shape read from the config."""

    @property
    def variant_code(self) -> int:
        return VARIANTS.index(self.config.variant)

    @property
    def threads(self) -> int:
        return self.config.threads

    @property
    def lanes(self) -> int:
        return self.config.lanes

    @property
    def rows(self) -> int:
        return self.config.rows

    @property
    def layer(self) -> bool:
        return self.kind == "layer"

    @property
    def vpt(self) -> int:
        """Values per thread: per row (warp and block), per step (loop)."""
        if self.config.variant == "loop":
            return loop_vpt(self.vec, isinstance(self, NormBackwardSpec))
        return self.config.vpt

    @property
    def shape_name(self) -> str:
        c = self.config
        if c.variant == "warp":
            return f"warp{c.lanes}_v{c.vpt}_r{c.rows}"
        return f"{c.variant}{c.threads}_v{self.vpt}"


@dataclass(frozen=True)
class NormSpec(_RowSpec, KernelSpec):
    """One forward kernel (``norm/forward.cu``): the kind, the types, the config and the
    elements per access (``vec``)."""

    kind: str
    types: ForwardTypes
    config: NormConfig
    vec: int = 1

    template = "norm/forward.cu"
    smem_bytes = 0

    def __post_init__(self):
        _check_kind(self.kind)
        if not isinstance(self.types, ForwardTypes) or not isinstance(self.config, NormConfig):
            raise TypeError("NormSpec: types must be ForwardTypes and config a NormConfig")
        if self.kind == "rms" and self.types.bias is not None:
            raise ArgumentValueError("NormSpec: RMSNorm takes no bias")
        check_accesses("NormSpec", self.vec, self.types.width, self.vpt)

    @property
    def params(self) -> tuple[Param, ...]:
        """x, the residual, h and y (not ``__restrict__``: an output may be an input), the
        weight and bias, the statistics (float32 per row), the row count and length, the
        row strides (elements) of x, the residual, h and y, and eps. Absent arrays are null
        pointers (of float)."""
        t, c = self.types, _ctype
        return (pointer("x", t.x.ctype, const=True, restrict=False),
                pointer("r", c(t.residual), const=True, restrict=False),
                pointer("h", c(t.h), restrict=False), pointer("y", t.y.ctype, restrict=False),
                pointer("w", c(t.weight), const=True), pointer("b", c(t.bias), const=True),
                pointer("mean", "float"), pointer("rstd", "float"),
                *int64("rows", "n", "sx", "sr", "sh", "sy"), *double("eps"))

    @property
    def kernel_name(self) -> str:
        return f"{OP_NAMES[self.kind]}_{self.shape_name}_x{self.vec}_{self.types.name}"


@dataclass(frozen=True)
class NormBackwardSpec(_RowSpec, KernelSpec):
    """One backward kernel (``norm/backward.cu``): dx, and the block's partial sums of
    dweight and dbias. ``smem_cols`` (loop variant, rows of at most that many elements): the
    block adds its sums up in shared memory (``smem_cols`` floats an array) rather than in its
    rows of the partial sums in global memory, which it then writes once."""

    kind: str
    types: BackwardTypes
    config: NormBackwardConfig
    vec: int = 1
    smem_cols: int = 0

    template = "norm/backward.cu"

    def __post_init__(self):
        _check_kind(self.kind)
        if (not isinstance(self.types, BackwardTypes)
                or not isinstance(self.config, NormBackwardConfig)):
            raise TypeError("NormBackwardSpec: types must be BackwardTypes and config a "
                            "NormBackwardConfig")
        if self.kind == "rms" and self.types.bias is not None:
            raise ArgumentValueError("NormBackwardSpec: RMSNorm takes no bias")
        check_accesses("NormBackwardSpec", self.vec, self.types.width, self.vpt)
        if self.smem_cols and (self.config.variant != "loop" or self.smem_cols % 1024
                               or self.smem_bytes > SMEM_SUMS_BYTES):
            raise ArgumentValueError(
                f"NormBackwardSpec.smem_cols: the loop variant's sums in shared memory, a "
                f"multiple of 1024 columns and at most {SMEM_SUMS_BYTES} bytes; got "
                f"{self.smem_cols} for {self.config.name}")

    @property
    def loop_rows(self) -> int:
        """Rows the loop variant's blocks take at once (``LOOP_BACKWARD_ROWS``; more of them
        spill registers with dh, or with narrower accesses or types)."""
        t = self.types
        roomy = t.dh is None and t.dy is t.h and self.vec == t.width
        return LOOP_BACKWARD_ROWS[0] if roomy else LOOP_BACKWARD_ROWS[1]

    @property
    def sums_arrays(self) -> int:
        """The partial sums the kernel makes: dweight's, dbias' (0, 1 or 2)."""
        return (self.types.weight is not None) + (self.types.bias is not None)

    @property
    def smem_bytes(self) -> int:
        return 4 * self.smem_cols * self.sums_arrays

    @property
    def params(self) -> tuple[Param, ...]:
        """dy, h, the weight, the statistics, dh, dx, the partial sums of dweight and dbias
        (float32, a row of n per block), the row count and length and the row strides
        (elements) of dy, h, dh and dx."""
        t, c = self.types, _ctype
        return (pointer("dy", t.dy.ctype, const=True), pointer("h", t.h.ctype, const=True),
                pointer("w", c(t.weight), const=True), pointer("mean", "float", const=True),
                pointer("rstd", "float", const=True), pointer("dh", c(t.dh), const=True),
                pointer("dx", t.dx.ctype), pointer("pw", "float"), pointer("pb", "float"),
                *int64("rows", "n", "sdy", "sh", "sdh", "sdx"))

    @property
    def kernel_name(self) -> str:
        return (f"{OP_NAMES[self.kind]}_backward_{self.shape_name}_x{self.vec}_"
                f"{self.types.name}" + (f"_s{self.smem_cols}" if self.smem_cols else ""))


@dataclass(frozen=True)
class NormSumsSpec(KernelSpec):
    """The kernel that adds up the backward's partial sums (``norm/sums.cu``): dweight (into
    ``weight``'s type) and dbias (``bias``'), each column in a fixed order."""

    kind: str
    weight: DType | None
    bias: DType | None

    template = "norm/sums.cu"
    smem_bytes = 0
    threads = SUMS_COLUMNS * SUMS_GROUPS

    def __post_init__(self):
        _check_kind(self.kind)
        _dtype_or_none(self.weight, "NormSumsSpec.weight")
        _dtype_or_none(self.bias, "NormSumsSpec.bias")
        if self.weight is None and self.bias is None:
            raise ArgumentValueError("NormSumsSpec: nothing to add up (no weight, no bias)")

    @property
    def params(self) -> tuple[Param, ...]:
        """The partial sums of dweight and dbias (parts x n float32), the outputs, the part
        count and n."""
        return (pointer("pw", "float", const=True), pointer("pb", "float", const=True),
                pointer("dw", _ctype(self.weight)), pointer("db", _ctype(self.bias)),
                *int64("parts", "n"))

    @property
    def kernel_name(self) -> str:
        return (f"{OP_NAMES[self.kind]}_backward_sums{_tag('w', self.weight)}"
                f"{_tag('b', self.bias)}")


# ---- choices ------------------------------------------------------------------------------

class Choice(NamedTuple):
    """A kernel and its launch shape."""

    spec: NormSpec | NormBackwardSpec
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def config(self) -> RowConfig:
        return self.spec.config


def heuristic(rows: int, n: int, types: ForwardTypes, sm_count: int = 132) -> NormConfig:
    """The forward configuration for ``rows`` rows of ``n`` elements.

    - ``n`` <= 512: warp. Rows of at most 32 accesses of 16 bytes (of the widest row type) get
      one access per lane (``V`` = 4 float32 or 8 16-bit values) and ``G`` = the row's accesses
      rounded up to a power of two lanes; longer rows a whole warp with ``V`` = n / 32 rounded
      up to a power of two. ``R`` = 16 / ``V`` rows per lane group (at most 2), halved while
      that leaves fewer than 8 blocks of 128 threads per multiprocessor.
    - ``n`` <= 16384: block, ``V`` = 8 up to 4096 elements and 16 above, ``T`` = n / V rounded
      up to a power of two (at least 128).
    - longer rows: loop, 1024 threads (one block per multiprocessor: the fewest rows in
      flight, so that more of a row is still in L2 when the second pass reads it).
    """
    width = types.width
    if n <= WARP_MAX_N:
        if n <= 32 * width:
            vpt, lanes = width, pow2_at_least(-(-n // width))
        else:
            vpt, lanes = pow2_at_least(-(-n // 32)), 32
        r = max(1, min(max(WARP_ROWS), WARP_MAX_VALUES // vpt))
        while r > 1 and -(-rows // (WARP_THREADS // lanes * r)) < 8 * sm_count:
            r //= 2
        return NormConfig("warp", WARP_THREADS, vpt=vpt, lanes=lanes, rows=r)
    if n <= BLOCK_MAX_N:
        vpt = 8 if n <= 4096 else 16
        return NormConfig("block", max(128, pow2_at_least(-(-n // vpt))), vpt=vpt)
    return NormConfig("loop", 1024)


def backward_heuristic(n: int, types: BackwardTypes) -> NormBackwardConfig:
    """The backward configuration for rows of ``n`` elements: warp up to 256 elements (``V``
    = one 16-byte access of the widest row type, 4 or 8 values, or 8 for float32 rows longer
    than 128; ``G`` = the row's slots rounded up to a power of two lanes), block up to 8192
    (``V`` = 8, ``T`` = n / 8 rounded up to a power of two, at least 128), loop beyond (1024
    threads)."""
    width = types.width
    if n <= BACKWARD_WARP_MAX_N:
        vpt = max(BACKWARD_WARP_VPT) if n > 32 * width else width
        return NormBackwardConfig("warp", WARP_THREADS, vpt=vpt,
                                  lanes=min(32, pow2_at_least(-(-n // vpt))))
    if n <= BACKWARD_BLOCK_MAX_N:
        return NormBackwardConfig("block", max(128, pow2_at_least(-(-n // 8))), vpt=8)
    return NormBackwardConfig("loop", 1024)


def _candidates(n: int, configs) -> list:
    most = max(4 * pow2_at_least(max(n, 1)), 64)
    return [c for c in configs
            if c.variant == "loop" or (c.capacity is not None and n <= c.capacity <= most)]


def candidates(n: int) -> list[NormConfig]:
    """The forward configurations worth timing for rows of ``n`` elements: the warp and block
    variants that hold the row in at most 4x its length rounded up to a power of two (64 for
    the shortest rows), and every loop variant."""
    return _candidates(n, all_configs())


def backward_candidates(n: int) -> list[NormBackwardConfig]:
    """The backward configurations worth timing for rows of ``n`` elements (as
    ``candidates``)."""
    return _candidates(n, all_backward_configs())


def _vec(config: RowConfig, width: int, max_vec: int) -> int:
    if config.variant == "loop":
        return max(1, min(width, max_vec))
    return max(1, min(width, max_vec, config.vpt))


def make_spec(kind: str, config: NormConfig, types: ForwardTypes, max_vec: int = 8) -> NormSpec:
    """The forward kernel of ``config``, with accesses of at most ``max_vec`` elements (what
    the alignment of the arrays allows)."""
    return NormSpec(kind, types, config, _vec(config, types.width, max_vec))


def make_backward_spec(kind: str, config: NormBackwardConfig, types: BackwardTypes,
                       max_vec: int = 8, n: int | None = None) -> NormBackwardSpec:
    """The backward kernel of ``config``, with accesses of at most ``max_vec`` elements; for
    the loop variant and rows of ``n`` elements whose sums fit, with the sums in shared memory
    (``smem_cols``: n rounded up to a power of two, at least 1024)."""
    vec = _vec(config, types.width, max_vec)
    cols = max(1024, pow2_at_least(n or 0))
    arrays = (types.weight is not None) + (types.bias is not None)
    if config.variant == "loop" and n and arrays and 4 * cols * arrays <= SMEM_SUMS_BYTES:
        return NormBackwardSpec(kind, types, config, vec, cols)
    return NormBackwardSpec(kind, types, config, vec)


def _config(config, n: int, parse, default):
    if config is None:
        return default()
    cfg = parse(config)
    check_capacity(cfg, n)
    return cfg


def choose(kind: str, rows: int, n: int, types: ForwardTypes, sm_count: int = 132, *,
           max_vec: int = 8, config=None) -> Choice:
    """The forward kernel and launch shape for ``rows`` rows of ``n`` elements: ``config``
    (a name or NormConfig) if given, which must hold the rows, else the heuristic.
    ``max_vec``: the widest access (elements) the arrays' alignment allows. The grid covers
    the rows (at most 2^31 - 1 blocks; the kernels loop past it)."""
    cfg = _config(config, n, parse_config, lambda: heuristic(rows, n, types, sm_count))
    blocks = -(-rows // cfg.rows_per_block)
    return Choice(make_spec(kind, cfg, types, max_vec), (max(1, min(blocks, GRID_MAX)), 1, 1),
                  (cfg.threads, 1, 1))


def choose_backward(kind: str, rows: int, n: int, types: BackwardTypes, sm_count: int = 132,
                    resident: int | None = None, *, max_vec: int = 8,
                    config=None) -> Choice:
    """The backward kernel and launch shape: ``config`` if given (it must hold the rows), else
    the heuristic. The grid is what the GPU holds at once, ``sm_count`` x ``resident`` blocks
    (the blocks of this kernel one multiprocessor holds; default: 2048 threads' worth), and no
    more blocks than the rows need: each block walks its share of the rows and writes one row
    of partial sums."""
    cfg = _config(config, n, parse_backward_config, lambda: backward_heuristic(n, types))
    resident = resident or max(1, 2048 // cfg.threads)
    spec = make_backward_spec(kind, cfg, types, max_vec, n)
    per_block = spec.loop_rows if cfg.variant == "loop" else cfg.rows_per_block
    blocks = min(-(-rows // per_block), sm_count * resident)
    return Choice(spec, (max(1, blocks), 1, 1),
                  (cfg.threads, 1, 1))


def sums_shape(n: int, types: BackwardTypes) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of the kernel that adds up the partial sums: blocks of ``SUMS_COLUMNS``
    columns, along y dweight's (0) and dbias' (1)."""
    return ((-(-n // SUMS_COLUMNS), 2 if types.weight and types.bias else 1, 1),
            (SUMS_COLUMNS * SUMS_GROUPS, 1, 1))
