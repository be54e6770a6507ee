"""The cross-entropy kernels (``kernel_templates/cross_entropy/``), their configuration names
and the choice among them. Everything here is pure: no GPU, no CuPy.

A call runs up to three kernels, in order on one stream:

``targets`` (``targets.cu``, one block)
    Reads the class indices once: the number of rows that are not ``ignore_index`` (the mean's
    denominator, which the gradient needs before it is written) and the first row whose index
    is outside [0, V) (the call raises on it before the loss kernel runs). It runs when the
    mean is asked for or the targets are checked.
``rows`` (``cross_entropy.cu``), the configs below
    The loss of each row, and with ``grad`` its gradient, in one kernel: a pass over the row
    keeps each thread's online (max, sum of exponentials) pair (and, with label smoothing,
    the sum of the logits), the row's threads combine them, and a second pass reads the row
    again and writes ``softmax - onehot`` (smoothed, scaled). Rows of any length.
``reduce`` (``reduce.cu``, one block)
    Adds the rows' losses in a fixed order (in float64) for ``sum`` and ``mean``.

and, for PyTorch's backward, ``scale`` (``scale.cu``): the saved gradient multiplied in place
by the upstream gradient, rows whose factor is exactly 1 (the usual case) left untouched.

Configs of the rows kernel:

``warp``
    One warp per row, four rows per block of 128 threads; reductions by shuffles alone. For
    short rows (the heuristic's up to 2048 classes), where a block per row would idle.
``block_{T}``
    One block of ``T`` threads per row; reductions through shared memory.

Each pass steps over the row in accesses of up to 16 bytes (``vec`` elements, the widest the
pointers and row strides allow), four per thread and step (at least 8 values; the gradient's
pass at most 16, so that its kernels keep to 64 registers without spilling).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from ...errors import ArgumentValueError
from ...jit.params import Param, double, int64, pointer
from ...jit.spec import KernelSpec
from ...runtime.dtypes import DType, as_dtype
from ...runtime.rows import GRID_MAX, check_accesses, one_of
from ...runtime.rows import access_width as widest_of

VARIANTS = ("warp", "block")
WARP_THREADS = 128
BLOCK_THREADS = (128, 256, 512, 1024)
AUX_THREADS = 1024

#: the class indices' types -> their C type
TARGET_TYPES = {"int32": "int", "int64": "long long"}
REDUCTIONS = ("none", "sum", "mean")

#: the heuristic's longest rows for a warp per row, and the row lengths up to which blocks of
#: 256 and 512 threads are enough (above: 1024)
WARP_MAX_V = 2048
BLOCK_256_MAX_V = 8192
BLOCK_512_MAX_V = 32768


def access_width(logits_dtype: DType, grad_dtype: DType | None) -> int:
    """Elements per 16-byte access of the wider of the logits' and the gradient's types."""
    return widest_of(logits_dtype, *((grad_dtype,) if grad_dtype else ()))


def step_vpt(vec: int) -> int:
    """Values per thread and step of the first pass: four accesses of ``vec`` elements, at
    least 8 (the gradient's pass takes at most 16: registers)."""
    return max(8, 4 * vec)


@dataclass(frozen=True)
class XentConfig:
    """One rows-kernel variant (see the module's docstring); ``name`` is what
    ``cross_entropy(config=...)`` takes."""

    variant: str
    threads: int

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ArgumentValueError(f"config: variant must be one of {', '.join(VARIANTS)}, "
                                     f"got {self.variant!r}")
        one_of(f"{self.variant} threads", self.threads,
               (WARP_THREADS,) if self.variant == "warp" else BLOCK_THREADS)

    @property
    def name(self) -> str:
        return "warp" if self.variant == "warp" else f"block_{self.threads}"

    @property
    def rows_per_block(self) -> int:
        return self.threads // 32 if self.variant == "warp" else 1

    def __str__(self) -> str:
        return self.name


NAME_EXAMPLES = "'warp', 'block_256', 'block_512' or 'block_1024'"
_BLOCK_RE = re.compile(r"block_(\d+)")


def parse_config(config) -> XentConfig:
    """An ``XentConfig`` from its name (or the config itself); one line naming what is wrong
    for anything else."""
    if isinstance(config, XentConfig):
        return config
    if config == "warp":
        return XentConfig("warp", WARP_THREADS)
    match = _BLOCK_RE.fullmatch(config) if isinstance(config, str) else None
    if match is None:
        raise ArgumentValueError(f"config: expected a cross_entropy config name such as "
                                 f"{NAME_EXAMPLES}, got {config!r}")
    return XentConfig("block", int(match.group(1)))


def all_configs() -> list[XentConfig]:
    """Every configuration ``cross_entropy(config=...)`` accepts (all run any row length)."""
    return [XentConfig("warp", WARP_THREADS), *(XentConfig("block", t) for t in BLOCK_THREADS)]


def candidates(n: int) -> list[XentConfig]:
    """The configurations worth timing for rows of ``n`` classes: every one (a warp per row
    only up to 4 times the heuristic's warp rows, where it would not be chosen anyway)."""
    return [c for c in all_configs() if c.variant == "block" or n <= 4 * WARP_MAX_V]


def heuristic(n: int, dtype=None) -> XentConfig:
    """The configuration the call takes for rows of ``n`` classes: a warp per row up to 2048
    classes (one to four steps of 32 lanes x 16 or more values), else a block per row whose
    threads take at most two or three steps of the row: 256 threads up to 8192 classes, 512 up
    to 32768, 1024 above (a 128k to 256k vocabulary: 64 KiB of loads in flight per block).
    The type does not change the choice (16-bit rows take twice the values per access)."""
    if n <= WARP_MAX_V:
        return XentConfig("warp", WARP_THREADS)
    if n <= BLOCK_256_MAX_V:
        return XentConfig("block", 256)
    if n <= BLOCK_512_MAX_V:
        return XentConfig("block", 512)
    return XentConfig("block", 1024)


@dataclass(frozen=True)
class XentSpec(KernelSpec):
    """The rows kernel: the logits' type, the class indices' type ("int32" or "int64"), the
    gradient's type (None: the loss alone), the variant and shape (``threads``, ``vpt``
    values per thread and step, ``vec`` elements per access), ``smoothing`` (label smoothing
    is on: the rows' logit sums are kept) and ``mean`` (the gradient is divided by the count
    of rows that are not ignored, read from the targets kernel's output)."""

    logits_dtype: DType
    target_dtype: str
    grad_dtype: DType | None
    variant: str
    threads: int
    vpt: int
    vec: int
    smoothing: bool = False
    mean: bool = False

    template = "cross_entropy/cross_entropy.cu"
    smem_bytes = 0

    def __post_init__(self):
        if not isinstance(self.logits_dtype, DType) or not (
                self.grad_dtype is None or isinstance(self.grad_dtype, DType)):
            raise TypeError("XentSpec: logits_dtype and grad_dtype must be DType (grad: or None)")
        if self.target_dtype not in TARGET_TYPES:
            raise ArgumentValueError(f"XentSpec.target_dtype: expected one of "
                                     f"{', '.join(TARGET_TYPES)}, got {self.target_dtype!r}")
        XentConfig(self.variant, self.threads)
        check_accesses("XentSpec", self.vec, access_width(self.logits_dtype, self.grad_dtype),
                       self.vpt)
        if self.mean and self.grad_dtype is None:
            raise ArgumentValueError("XentSpec.mean: scales the gradient; needs a grad_dtype")

    @property
    def config(self) -> XentConfig:
        return XentConfig(self.variant, self.threads)

    @property
    def variant_code(self) -> int:
        return VARIANTS.index(self.variant)

    @property
    def grad_ctype(self) -> str:
        return self.grad_dtype.ctype if self.grad_dtype else "float"

    @property
    def params(self) -> tuple[Param, ...]:
        """logits and grad (not ``__restrict__``: the gradient may be written over the logits),
        the class indices, the rows' losses (float32), the targets kernel's counts (``ws``:
        rows not ignored, first bad row), the sizes, the element strides (logits' and grad's
        rows, the indices'), ``ignore_index``, the smoothing and the gradient's scale."""
        return (pointer("logits", self.logits_dtype.ctype, const=True, restrict=False),
                pointer("targets", TARGET_TYPES[self.target_dtype], const=True),
                pointer("grad", self.grad_ctype, restrict=False),
                pointer("losses", "float"), pointer("ws", "long long", const=True),
                *int64("rows", "n", "ld", "gld", "ts", "ignore_index"),
                *double("smoothing", "grad_scale"))

    @property
    def kernel_name(self) -> str:
        shape = "warp" if self.variant == "warp" else f"block{self.threads}"
        grad = f"_g{self.grad_dtype.value}" if self.grad_dtype else ""
        flags = ("_ls" if self.smoothing else "") + ("_mean" if self.mean else "")
        return (f"cross_entropy_{shape}_v{self.vpt}_x{self.vec}_{self.logits_dtype.value}_"
                f"t{self.target_dtype[3:]}{grad}{flags}")


@dataclass(frozen=True)
class TargetsSpec(KernelSpec):
    """The targets kernel (one block): for the class indices of ``target_dtype``, writes
    ``ws[0]`` = rows whose index is not ``ignore_index``, ``ws[1]`` = the first row whose
    index is outside [0, n) and not ``ignore_index`` (-1: none), ``ws[2]`` = that index."""

    target_dtype: str

    template = "cross_entropy/targets.cu"
    smem_bytes = 0
    threads = AUX_THREADS

    def __post_init__(self):
        if self.target_dtype not in TARGET_TYPES:
            raise ArgumentValueError(f"TargetsSpec.target_dtype: expected one of "
                                     f"{', '.join(TARGET_TYPES)}, got {self.target_dtype!r}")

    @property
    def params(self) -> tuple[Param, ...]:
        return (pointer("targets", TARGET_TYPES[self.target_dtype], const=True),
                pointer("ws", "long long"), *int64("rows", "n", "ts", "ignore_index"))

    @property
    def kernel_name(self) -> str:
        return f"cross_entropy_targets_t{self.target_dtype[3:]}"


@dataclass(frozen=True)
class ReduceSpec(KernelSpec):
    """The reduce kernel (one block): ``out[0]`` = the sum of ``losses[0..rows)`` added in a
    fixed order in float64, divided by ``ws[0]`` (the rows not ignored) for the mean."""

    mean: bool

    template = "cross_entropy/reduce.cu"
    smem_bytes = 0
    threads = AUX_THREADS

    @property
    def params(self) -> tuple[Param, ...]:
        return (pointer("losses", "float", const=True), pointer("ws", "long long", const=True),
                pointer("out", "float"), *int64("rows"))

    @property
    def kernel_name(self) -> str:
        return f"cross_entropy_reduce_{'mean' if self.mean else 'sum'}"


@dataclass(frozen=True)
class ScaleSpec(KernelSpec):
    """The scale kernel: a gradient of ``grad_dtype`` multiplied in place by the loss's
    upstream gradient (float32; one factor, or one per row), rows whose factor is exactly 1
    left alone. ``vec`` elements per access, four accesses per thread and step."""

    grad_dtype: DType
    vec: int

    template = "cross_entropy/scale.cu"
    smem_bytes = 0
    threads = 256

    def __post_init__(self):
        if not isinstance(self.grad_dtype, DType):
            raise TypeError("ScaleSpec: grad_dtype must be a DType")
        check_accesses("ScaleSpec", self.vec, widest_of(self.grad_dtype))

    @property
    def vpt(self) -> int:
        return 4 * self.vec

    @property
    def params(self) -> tuple[Param, ...]:
        """The gradient, the factors, the gradient's shape and row stride, the factors'
        stride (0: one for every row); strides in elements."""
        return (pointer("grad", self.grad_dtype.ctype), pointer("f", "float", const=True),
                *int64("rows", "n", "gld", "fs"))

    @property
    def kernel_name(self) -> str:
        return f"cross_entropy_scale_x{self.vec}_{self.grad_dtype.value}"


def scale_spec(grad_dtype, max_vec: int = 8) -> ScaleSpec:
    """The scale kernel of a gradient of ``grad_dtype`` whose rows allow accesses of at most
    ``max_vec`` elements."""
    dt = as_dtype(grad_dtype)
    return ScaleSpec(dt, max(1, min(widest_of(dt), max_vec)))


class Kernels(NamedTuple):
    """What a call launches: the targets kernel (or None), the rows kernel with its grid, the
    reduce kernel (or None)."""

    targets: TargetsSpec | None
    rows: XentSpec
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    reduce: ReduceSpec | None

    @property
    def config(self) -> XentConfig:
        return self.rows.config

    @property
    def specs(self) -> tuple:
        """Every kernel, the rows kernel first."""
        return tuple(s for s in (self.rows, self.targets, self.reduce) if s is not None)


def as_grad_dtype(dtype) -> DType | None:
    """None (no gradient) or a DType."""
    return None if dtype is None else as_dtype(dtype)


def as_target_dtype(dtype) -> str:
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))
    if name not in TARGET_TYPES:
        raise ArgumentValueError(f"target_dtype: expected one of {', '.join(TARGET_TYPES)}, got "
                                 f"{dtype!r}")
    return name


def kernels(config: XentConfig, rows: int, dtype, target_dtype: str = "int64",
            grad_dtype=None, *, reduction: str = "mean", smoothing: bool = False,
            check: bool = True, max_vec: int = 8) -> Kernels:
    """The kernels of a call of ``config`` on ``rows`` rows: logits of ``dtype``, class
    indices of ``target_dtype``, a gradient of ``grad_dtype`` (None: none), ``reduction``,
    label smoothing on or off, the targets ``check``ed or not, accesses of at most ``max_vec``
    elements (what the alignment of the rows allows)."""
    if reduction not in REDUCTIONS:
        raise ArgumentValueError(f"reduction: expected one of {', '.join(map(repr, REDUCTIONS))}"
                                 f", got {reduction!r}")
    dt, gdt, tdt = as_dtype(dtype), as_grad_dtype(grad_dtype), as_target_dtype(target_dtype)
    vec = max(1, min(access_width(dt, gdt), max_vec))
    mean = reduction == "mean"
    rows_spec = XentSpec(dt, tdt, gdt, config.variant, config.threads, step_vpt(vec), vec,
                         smoothing, mean and gdt is not None)
    blocks = -(-rows // config.rows_per_block)
    return Kernels(TargetsSpec(tdt) if mean or check else None, rows_spec,
                   (max(1, min(blocks, GRID_MAX)), 1, 1), (config.threads, 1, 1),
                   None if reduction == "none" else ReduceSpec(mean))


def choose(rows: int, n: int, dtype, target_dtype: str = "int64", grad_dtype=None, *,
           reduction: str = "mean", smoothing: bool = False, check: bool = True,
           max_vec: int = 8, config=None) -> Kernels:
    """The kernels of a call on ``rows`` rows of ``n`` classes: ``config`` (a name or an
    XentConfig) if given, else the heuristic's."""
    cfg = heuristic(n, dtype) if config is None else parse_config(config)
    return kernels(cfg, rows, dtype, target_dtype, grad_dtype, reduction=reduction,
                   smoothing=smoothing, check=check, max_vec=max_vec)
