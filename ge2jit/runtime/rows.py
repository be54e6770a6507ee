"""What the ops whose kernels work on whole rows (a reduction along the last axis, then a pass
that writes the row) share: the configuration names of their variants, how rows are laid out
in memory, and the widest access that every row start allows. Pure: no GPU, no CuPy.

Variants (each op says which it has and which shapes it accepts):

``warp{G}_v{V}_r{R}``
    ``G`` lanes per row (32: a whole warp; fewer for short rows, several rows per warp), each
    holding ``V`` values of a row in registers, ``R`` rows per lane group loaded together.
``block_{T}_v{V}``
    One block of ``T`` threads per row, each holding ``V`` values in registers.
``loop_{T}``
    One block of ``T`` threads per row of any length, reading it in steps.

An op may add variants of its own, named ``{variant}_{T}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ArgumentValueError
from .dtypes import DType

#: The largest grid (blocks along x) the row kernels are launched with; they loop past it.
GRID_MAX = 2**31 - 1


def pow2_at_least(v: int) -> int:
    """The smallest power of two >= ``v`` (1 for ``v`` <= 1)."""
    return 1 << max(0, (v - 1).bit_length())


def access_width(*dtypes: DType) -> int:
    """Elements per 16-byte access of the widest of ``dtypes`` (4 or 8)."""
    return 16 // max(d.itemsize for d in dtypes)


def walk_as_one(dims) -> tuple[int, int] | None:
    """(count, stride) of ``dims`` ((size, stride) pairs, outermost first) walked as one
    dimension; None when their strides do not allow it. Dimensions of size 1 drop out; no
    dimension at all is (1, 0)."""
    dims = [(size, stride) for size, stride in dims if size != 1]
    if not dims:
        return 1, 0
    count, stride = dims[-1]
    for size, s in reversed(dims[:-1]):
        if s != stride * count:
            return None
        count *= size
    return count, stride


def vector_width(width: int, arrays, rows: int) -> int:
    """The widest access (elements, a power of two <= ``width``) that every row start of
    ``arrays`` allows: each is (pointer, row stride in elements or None for a single vector,
    item size), and an access of ``v`` elements needs the pointer aligned to
    ``min(16, v * item size)`` bytes and, with more than one row, a row stride that is a
    multiple of ``v``."""
    v = width
    while v > 1 and not all(
            ptr % min(16, v * item) == 0
            and (rows == 1 or stride is None or stride % v == 0)
            for ptr, stride, item in arrays):
        v //= 2
    return v


def check_accesses(owner: str, vec: int, width: int, vpt: int | None = None) -> None:
    """A kernel spec's vector accesses: ``vec`` elements, 1, 2, 4 or 8 and at most ``width``
    (what 16 bytes of the widest type it moves hold), and ``vpt`` values per thread (if given)
    a whole number of them. ``owner`` names the spec in the error."""
    if vec not in (1, 2, 4, 8) or vec > width:
        raise ArgumentValueError(f"{owner}.vec: expected 1, 2, 4 or 8 elements of at most 16 "
                                 f"bytes ({width} here), got {vec}")
    if vpt is not None and (vpt < 1 or vpt % vec):
        raise ArgumentValueError(f"{owner}.vpt: expected a multiple of vec ({vec}), got {vpt}")


def check_block(owner: str, threads: int, lanes: int, lane_counts, reduces: bool) -> None:
    """A kernel spec's block: whole warps up to 1024 threads (a power of two where the whole
    block ``reduces`` through shared memory), ``lanes`` per row one of ``lane_counts`` and a
    divisor of the block. ``owner`` names the spec in the error."""
    if threads % 32 or not 32 <= threads <= 1024:
        raise ArgumentValueError(f"{owner}.threads: expected whole warps up to 1024, got "
                                 f"{threads}")
    if reduces and threads & (threads - 1):
        raise ArgumentValueError(f"{owner}.threads: block reductions need a power of two, got "
                                 f"{threads}")
    if lanes not in lane_counts or threads % lanes:
        raise ArgumentValueError(f"{owner}.lanes: expected one of {tuple(lane_counts)}, got "
                                 f"{lanes}")


@dataclass(frozen=True)
class RowConfig:
    """One variant with its shape (see the module's docstring): ``threads`` per block, ``vpt``
    values per thread (warp and block), ``lanes`` per row and ``rows`` per lane group (warp).
    ``name`` is what an op's ``config=`` takes. Ops subclass it to check the shapes they
    accept."""

    variant: str
    threads: int
    vpt: int = 0
    lanes: int = 32
    rows: int = 1

    @property
    def name(self) -> str:
        if self.variant == "warp":
            return f"warp{self.lanes}_v{self.vpt}_r{self.rows}"
        if self.variant == "block":
            return f"block_{self.threads}_v{self.vpt}"
        return f"{self.variant}_{self.threads}"

    @property
    def capacity(self) -> int | None:
        """The longest row this variant holds in registers (None: any length)."""
        if self.variant == "warp":
            return self.lanes * self.vpt
        if self.variant == "block":
            return self.threads * self.vpt
        return None

    @property
    def rows_per_block(self) -> int:
        """Rows a block takes at once: lane groups times rows per group for warp, else 1."""
        if self.variant == "warp":
            return self.threads // self.lanes * self.rows
        return 1

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class RowShapes:
    """The shapes an op's warp, block and loop variants accept: values per thread and rows per
    lane group of the warp variant (``warp_max_values``: their product at most), threads and
    values per thread of the block variant, threads of the loop variant; warp variants run
    ``warp_threads`` per block with ``lanes`` per row."""

    warp_vpt: tuple[int, ...]
    warp_rows: tuple[int, ...]
    warp_max_values: int
    block_threads: tuple[int, ...]
    block_vpt: tuple[int, ...]
    loop_threads: tuple[int, ...]
    warp_threads: int = 128
    lanes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def check(self, c: RowConfig, variants) -> None:
        """One line naming what ``c`` gets wrong: a variant not among ``variants``, or a warp,
        block or loop shape these do not accept (an op checks its other variants itself)."""
        if c.variant not in variants:
            raise ArgumentValueError(f"config: variant must be one of {', '.join(variants)}, "
                                     f"got {c.variant!r}")
        if c.variant == "warp":
            if c.threads != self.warp_threads:
                raise ArgumentValueError(f"config: warp variants run {self.warp_threads} "
                                         f"threads per block, got {c.threads}")
            one_of("lanes per row (warpG)", c.lanes, self.lanes)
            one_of("values per thread (_vV)", c.vpt, self.warp_vpt)
            one_of("rows per lane group (_rR)", c.rows, self.warp_rows)
            if c.vpt * c.rows > self.warp_max_values:
                raise ArgumentValueError(
                    f"config: {c.name} holds {c.vpt * c.rows} values per thread; at most "
                    f"{self.warp_max_values} (values per thread x rows)")
        elif c.variant == "block":
            one_of("threads (block_T)", c.threads, self.block_threads)
            one_of("values per thread (_vV)", c.vpt, self.block_vpt)
        elif c.variant == "loop":
            one_of("threads (loop_T)", c.threads, self.loop_threads)

    def parse(self, config, cls, variants, text: str):
        """A ``cls`` (a ``RowConfig`` subclass, which checks itself) from its name among
        ``variants``, or the config itself; for anything else one line that says what names
        look like (``text``)."""
        if isinstance(config, cls):
            return config
        found = parse_row_name(config, variants) if isinstance(config, str) else None
        if found is None:
            raise ArgumentValueError(f"config: expected {text}, got {config!r}")
        variant, nums = found
        if variant == "warp":
            return cls("warp", self.warp_threads, vpt=nums[1], lanes=nums[0], rows=nums[2])
        if variant == "block":
            return cls("block", nums[0], vpt=nums[1])
        return cls(variant, nums[0])


def one_of(what: str, value: int, allowed) -> None:
    """One line naming the config's field when ``value`` is not ``allowed``."""
    if value not in allowed:
        raise ArgumentValueError(f"config: {what} must be one of "
                                 f"{', '.join(map(str, allowed))}, got {value}")


def parse_row_name(text: str, variants) -> tuple[str, tuple[int, ...]] | None:
    """(variant, its numbers) of a config name among ``variants``: ``warp`` (lanes, values,
    rows), ``block`` (threads, values) or any other ``{variant}_{threads}`` (threads); None
    when ``text`` is none of them."""
    for variant in variants:
        pattern = _PATTERNS.get(variant) or re.escape(variant) + r"_(\d+)"
        match = re.fullmatch(pattern, text)
        if match is not None:
            return variant, tuple(int(g) for g in match.groups())
    return None


_PATTERNS = {"warp": r"warp(\d+)_v(\d+)_r(\d+)", "block": r"block_(\d+)_v(\d+)"}


def check_capacity(config: RowConfig, n: int) -> None:
    """One line saying that a pinned ``config`` cannot hold rows of ``n`` elements."""
    cap = config.capacity
    if cap is not None and n > cap:
        raise ArgumentValueError(f"config: {config.name} holds rows of at most {cap} elements, "
                                 f"got rows of {n}")
