"""The softmax kernel variants (``kernel_templates/softmax/softmax.cu``), their configuration
names and the choice among them. Everything here is pure: no GPU, no CuPy.

Variants, by row length (``n``) along a unit-stride last axis:

``warp{G}_v{V}_r{R}``
    ``G`` lanes per row (32: a whole warp; fewer for short rows, several rows per warp), each
    holding ``V`` values of a row in registers, ``R`` rows per lane group loaded together;
    blocks of 128 threads, so ``128 / G * R`` rows per block. Rows up to ``G * V`` elements.
    No shared memory, no barriers: shuffles within the group.
``block_{T}_v{V}``
    One block of ``T`` threads per row, each holding ``V`` values in registers; rows up to
    ``T * V`` elements (32768 with ``block_1024_v32``). One read and one write of each element;
    two block reductions (max, then sum) through shared memory.
``loop_{T}``
    One block of ``T`` threads per row of any length: a pass of online (max, sum) pairs, one
    block reduction, then a pass that reads the row again and writes it (the input is read
    twice). Steps of four 16-byte accesses per thread (16 float32 or 32 16-bit values; 16
    values when the alignment allows only narrower accesses).
``strided_{T}``
    Any layout: one thread per softmax vector, walking its ``n`` elements with their stride
    (an axis that is not the last, or a last axis with a non-unit stride). Online pass, then
    a second read and the write; coalesced when neighbouring vectors are neighbours in memory
    (a C-contiguous array reduced over a leading axis).

The vector width of the accesses (up to 16 bytes) is not part of the name: the call takes the
widest that the pointers and row strides of the input and output allow.

The backward (``softmax_backward``: dx = y * (dy - sum(dy * y))) runs the same variants on two
inputs: the warp and block variants hold a row of dy and of y in registers, so a backward
config may hold at most half the values per thread of each (``SoftmaxConfig.held``: at most
``WARP_MAX_VALUES`` in all; ``block_T_v32`` and ``warp32_v32_r1`` are the forward's alone); the
loop variant reads both twice, in steps of half the forward's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...errors import ArgumentValueError
from ...jit.params import Param, int64, pointer
from ...jit.spec import KernelSpec
from ...runtime.dtypes import DType, as_dtype
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

VARIANTS = ("warp", "block", "loop", "strided")

WARP_THREADS = 128
WARP_LANES = (1, 2, 4, 8, 16, 32)
WARP_VPT = (4, 8, 16, 32)
WARP_ROWS = (1, 2, 4)
WARP_MAX_VALUES = 32            # values a thread holds (VPT * ROWS * arrays): its registers
BLOCK_THREADS = (128, 256, 512, 1024)
BLOCK_VPT = (8, 16, 32)
LOOP_THREADS = (256, 512, 1024)
STRIDED_THREADS = (128, 256)
STRIDED_VPT = 4                 # elements per thread loaded together

#: The longest rows the warp and block variants hold (above: loop).
WARP_MAX_N = max(WARP_LANES) * max(WARP_VPT)          # 1024
BLOCK_MAX_N = max(BLOCK_THREADS) * max(BLOCK_VPT)     # 32768


def loop_vpt(vec: int, backward: bool = False) -> int:
    """Values per thread and step of the loop variant: four accesses of ``vec`` elements, at
    least 16 values (32 scalar 16-bit loads and their bounds checks would spill); the
    backward's, of each of its two inputs: half that."""
    return max(16, 4 * vec) // (2 if backward else 1)


@dataclass(frozen=True)
class SoftmaxConfig(RowConfig):
    """One variant with its shape parameters (see the module's docstring); ``name`` is what
    ``softmax(config=...)`` takes."""

    def __post_init__(self):
        _check_config(self)

    @property
    def strided(self) -> bool:
        return self.variant == "strided"

    def held(self, backward: bool = False) -> int:
        """The values of a row a thread holds in registers (warp and block variants; 0 for
        the others, which stream their rows): per array and row, times the rows of a lane
        group, times the arrays (2 in the backward: dy and y)."""
        if self.variant not in ("warp", "block"):
            return 0
        return self.vpt * self.rows * (2 if backward else 1)

    def fits(self, n: int, strided: bool, backward: bool = False) -> bool:
        """Whether this variant can run rows of ``n`` elements (``strided``: the softmax is
        not over a unit-stride last axis, which only the strided variant reads; ``backward``:
        the backward, which holds two arrays' values)."""
        if strided and not self.strided:
            return False
        if self.held(backward) > WARP_MAX_VALUES:
            return False
        cap = self.capacity
        return cap is None or n <= cap


SHAPES = RowShapes(WARP_VPT, WARP_ROWS, WARP_MAX_VALUES, BLOCK_THREADS, BLOCK_VPT,
                   LOOP_THREADS, WARP_THREADS, WARP_LANES)


def _check_config(c: SoftmaxConfig) -> None:
    SHAPES.check(c, VARIANTS)
    if c.variant == "strided":
        one_of("threads (strided_T)", c.threads, STRIDED_THREADS)


NAME_EXAMPLES = "'warp32_v4_r2', 'block_1024_v16', 'loop_512' or 'strided_256'"


def parse_config(config) -> SoftmaxConfig:
    """A ``SoftmaxConfig`` from its name (or the config itself); one line naming what is wrong
    for anything else."""
    return SHAPES.parse(config, SoftmaxConfig, VARIANTS,
                        f"a softmax variant name such as {NAME_EXAMPLES}")


def all_configs(backward: bool = False) -> list[SoftmaxConfig]:
    """Every configuration ``softmax(config=...)`` accepts (``backward``: those
    ``softmax_backward`` accepts)."""
    out = [SoftmaxConfig("warp", WARP_THREADS, vpt=v, lanes=g, rows=r)
           for g in WARP_LANES for v in WARP_VPT for r in WARP_ROWS
           if v * r <= WARP_MAX_VALUES]
    out += [SoftmaxConfig("block", t, vpt=v) for t in BLOCK_THREADS for v in BLOCK_VPT]
    out += [SoftmaxConfig("loop", t) for t in LOOP_THREADS]
    out += [SoftmaxConfig("strided", t) for t in STRIDED_THREADS]
    return [c for c in out if c.held(backward) <= WARP_MAX_VALUES]


@dataclass(frozen=True)
class SoftmaxSpec(KernelSpec):
    """One compiled softmax kernel: the input and output types, the variant and its shape
    (``threads`` per block; ``vpt`` values per thread: per row for warp and block, per step
    for loop and strided; ``vec`` elements per access; ``lanes`` and ``rows`` of the warp
    variant); ``backward``: the backward's kernel (inputs dy and y of ``in_dtype``, output
    dx of ``out_dtype``)."""

    in_dtype: DType
    out_dtype: DType
    variant: str
    threads: int
    vpt: int
    vec: int = 1
    lanes: int = 32
    rows: int = 1
    backward: bool = False

    template = "softmax/softmax.cu"
    smem_bytes = 0

    @property
    def inputs(self) -> tuple[str, ...]:
        """The input arrays' parameter names: x (forward); dy and y (backward)."""
        return ("dy", "y") if self.backward else ("x",)

    @property
    def output(self) -> str:
        """The output array's parameter name: y (forward), dx (backward)."""
        return "dx" if self.backward else "y"

    @property
    def params(self) -> tuple[Param, ...]:
        """The inputs and the output (not ``__restrict__``: the output may be an input), the
        vectors' count and length, the extent after the axis, and each array's element
        strides, named after it (``xo``, ``xn``, ``xi``: outer, along the vector, inner)."""
        ins = tuple(pointer(a, self.in_dtype.ctype, const=True, restrict=False)
                    for a in self.inputs)
        strides = [f"{a}{k}" for a in (*self.inputs, self.output) for k in "oni"]
        return (*ins, pointer(self.output, self.out_dtype.ctype, restrict=False),
                *int64("rows", "n", "inner", *strides))

    def __post_init__(self):
        if not isinstance(self.in_dtype, DType) or not isinstance(self.out_dtype, DType):
            raise TypeError("SoftmaxSpec: in_dtype and out_dtype must be DType")
        if self.variant not in VARIANTS:
            raise ArgumentValueError(f"SoftmaxSpec.variant: expected one of {VARIANTS}, got "
                                     f"{self.variant!r}")
        check_accesses("SoftmaxSpec", self.vec, access_width(self.in_dtype, self.out_dtype),
                       self.vpt)
        check_block("SoftmaxSpec", self.threads, self.lanes, WARP_LANES,
                    self.variant in ("block", "loop"))
        if self.variant == "strided" and self.vec != 1:
            raise ArgumentValueError("SoftmaxSpec.vec: the strided variant reads single "
                                     "elements (vec=1)")
        held = (self.vpt * self.rows * (2 if self.backward else 1)
                if self.variant in ("warp", "block") else 0)
        if held > WARP_MAX_VALUES:
            raise ArgumentValueError(f"SoftmaxSpec: holds {held} values per thread; at most "
                                     f"{WARP_MAX_VALUES}")

    @property
    def variant_code(self) -> int:
        return VARIANTS.index(self.variant)

    @property
    def strided(self) -> bool:
        return self.variant == "strided"

    @property
    def config(self) -> SoftmaxConfig:
        """The configuration this kernel runs."""
        if self.variant == "warp":
            return SoftmaxConfig("warp", self.threads, vpt=self.vpt, lanes=self.lanes,
                                 rows=self.rows)
        if self.variant == "block":
            return SoftmaxConfig("block", self.threads, vpt=self.vpt)
        return SoftmaxConfig(self.variant, self.threads)

    @property
    def kernel_name(self) -> str:
        types = f"{self.in_dtype.value}_{self.out_dtype.value}"
        if self.variant == "warp":
            shape = f"warp{self.lanes}_v{self.vpt}_r{self.rows}_t{self.threads}"
        elif self.variant == "block":
            shape = f"block{self.threads}_v{self.vpt}"
        else:
            shape = f"{self.variant}{self.threads}_v{self.vpt}"
        kind = "softmax_backward" if self.backward else "softmax"
        return f"{kind}_{shape}_x{self.vec}_{types}"


class Choice(NamedTuple):
    """A kernel and its launch shape."""

    spec: SoftmaxSpec
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def config(self) -> SoftmaxConfig:
        return self.spec.config


def candidates(n: int, dtype, out_dtype=None, *, strided: bool = False,
               backward: bool = False) -> list[SoftmaxConfig]:
    """The configurations worth timing for rows of ``n`` elements (tuning): the warp and block
    variants that hold the row in at most 4x its length rounded up to a power of two (64 for
    the shortest rows), and every loop variant; for a strided softmax, the strided
    variants. ``backward``: of those, the ones the backward runs."""
    configs = all_configs(backward)
    if strided:
        return [c for c in configs if c.strided]
    most = max(4 * pow2_at_least(max(n, 1)), 64)
    return [c for c in configs
            if c.variant == "loop" or (c.capacity is not None and n <= c.capacity <= most)]


def heuristic(rows: int, n: int, dtype, out_dtype=None, sm_count: int = 132, *,
              strided: bool = False, backward: bool = False) -> SoftmaxConfig:
    """The configuration the call takes for ``rows`` rows of ``n`` elements (``backward``: of
    the backward, whose threads hold half the values of each of its two inputs, so its warp
    and block variants stop at half the lengths: 512 and 16384, with ``V`` = 16 for block).

    - strided softmax: ``strided_256``.
    - ``n`` <= 1024: warp. Rows of at most 32 accesses of 16 bytes get one access per lane
      (``V`` = 4 float32 or 8 16-bit values) and ``G`` = the rows' accesses rounded up to a power
      of two lanes; longer rows a whole warp with ``V`` = n / 32 rounded up to a power of two.
      ``R`` = 16 / ``V`` rows per lane group (at most 4, at least 1: 16 values per lane in
      flight), halved while that leaves fewer than 8 blocks of 128 threads per multiprocessor
      (half of what one can hold).
    - ``n`` <= 32768: block, ``V`` = 16 up to 4096 elements and 32 above (more bytes in flight
      per thread; registers still allow two blocks of 512 threads per multiprocessor), ``T`` =
      n / V rounded up to a power of two (at least 128).
    - longer rows: loop, 1024 threads: one block per multiprocessor (64 KiB of loads in flight
      each, plenty for the memory system) keeps the fewest rows in flight, so that more of a
      row is still in L2 when the second pass reads it again (132 rows of 64k float32 values
      are 33 MiB, against H100's and H200's 50 MiB of L2).
    """
    in_dt = as_dtype(dtype)
    out_dt = in_dt if out_dtype is None else as_dtype(out_dtype)
    if strided:
        return SoftmaxConfig("strided", 256)
    width = access_width(in_dt, out_dt)
    arrays = 2 if backward else 1
    if n <= WARP_MAX_N // arrays:
        if n <= 32 * width:
            vpt, lanes = width, pow2_at_least(-(-n // width))
        else:
            vpt, lanes = pow2_at_least(-(-n // 32)), 32
        r = max(1, min(max(WARP_ROWS), 16 // vpt))
        while r > 1 and -(-rows // (WARP_THREADS // lanes * r)) < 8 * sm_count:
            r //= 2
        return SoftmaxConfig("warp", WARP_THREADS, vpt=vpt, lanes=lanes, rows=r)
    if n <= BLOCK_MAX_N // arrays:
        vpt = 16 if n <= 4096 or backward else 32
        threads = max(128, pow2_at_least(-(-n // vpt)))
        return SoftmaxConfig("block", threads, vpt=vpt)
    return SoftmaxConfig("loop", 1024)


def make_spec(config: SoftmaxConfig, in_dtype, out_dtype=None, max_vec: int = 8, *,
              backward: bool = False) -> SoftmaxSpec:
    """The kernel of ``config`` for these types, with accesses of at most ``max_vec`` elements
    (what the alignment of the arrays allows); ``backward``: the backward's."""
    in_dt = as_dtype(in_dtype)
    out_dt = in_dt if out_dtype is None else as_dtype(out_dtype)
    width = access_width(in_dt, out_dt)
    check_held(config, backward)
    if config.variant == "strided":
        return SoftmaxSpec(in_dt, out_dt, "strided", config.threads, STRIDED_VPT, 1,
                           backward=backward)
    if config.variant == "loop":
        vec = max(1, min(width, max_vec))
        vpt = loop_vpt(vec, backward)
    else:
        vpt = config.vpt
        vec = max(1, min(width, max_vec, vpt))
    if config.variant == "warp":
        return SoftmaxSpec(in_dt, out_dt, "warp", config.threads, vpt, vec, config.lanes,
                           config.rows, backward)
    return SoftmaxSpec(in_dt, out_dt, config.variant, config.threads, vpt, vec,
                       backward=backward)


def launch_shape(config: SoftmaxConfig, rows: int) -> tuple[tuple[int, int, int],
                                                            tuple[int, int, int]]:
    """(grid, block) for ``rows`` rows (strided: columns); the kernels loop over what a grid
    of at most 2^31 - 1 blocks does not cover."""
    if config.variant == "warp":
        blocks = -(-rows // config.rows_per_block)
    elif config.variant == "strided":
        blocks = -(-rows // config.threads)
    else:
        blocks = rows
    return (max(1, min(blocks, GRID_MAX)), 1, 1), (config.threads, 1, 1)


def check_held(config: SoftmaxConfig, backward: bool) -> None:
    """One line saying why the backward cannot run ``config`` (it would hold too many values
    per thread), if so."""
    if config.held(backward) > WARP_MAX_VALUES:
        raise ArgumentValueError(
            f"config: {config.name} would hold {config.held(backward)} values per thread in "
            f"the backward (dy's and y's); at most {WARP_MAX_VALUES}: halve its _vV or _rR")


def check_fits(config: SoftmaxConfig, n: int, strided: bool, backward: bool = False) -> None:
    """One line saying why a pinned configuration cannot run this call."""
    if strided and not config.strided:
        raise ArgumentValueError(
            f"config: {config.name} reads rows along a unit-stride last axis; this call's "
            f"vectors are strided (another axis, or a last axis with a stride): use "
            f"{' or '.join(f'strided_{t}' for t in STRIDED_THREADS)}")
    check_held(config, backward)
    check_capacity(config, n)


def choose(rows: int, n: int, dtype, sm_count: int = 132, *, out_dtype=None,
           max_vec: int = 8, strided: bool = False, config=None,
           backward: bool = False) -> Choice:
    """The kernel and launch shape for ``rows`` softmax vectors of ``n`` elements: ``config``
    (a name or SoftmaxConfig) if given, which must fit, else the heuristic. ``max_vec``: the
    widest access (elements) the arrays' alignment allows; ``strided``: the vectors are not
    unit-stride rows (``rows`` then counts all (outer, inner) columns); ``backward``: the
    backward's kernel."""
    if config is not None:
        cfg = parse_config(config)
        check_fits(cfg, n, strided, backward)
    else:
        cfg = heuristic(rows, n, dtype, out_dtype, sm_count, strided=strided,
                        backward=backward)
    spec = make_spec(cfg, dtype, out_dtype, max_vec, backward=backward)
    grid, block = launch_shape(cfg, rows)
    return Choice(spec, grid, block)
