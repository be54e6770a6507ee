"""The rotary position embedding kernel (``kernel_templates/rope/rope.cu``), its launch shape
and the widest vector access a call allows. Everything here is pure: no GPU, no CuPy.

One kernel rotates q (B, S, Hq, D) and k (B, S, Hk, D) of every token in one launch. Pair ``j
< half`` of a head is ``(x[j], x[j + half])`` (GPT-NeoX, ``interleaved=False``) or ``(x[2j],
x[2j + 1])`` (GPT-J, ``interleaved=True``), rotated by the angle whose cosine and sine are
``cos[row, j]`` and ``sin[row, j]`` (the opposite angle with ``backward``), ``row`` the
token's position (``positions[b, s]``, or ``s`` without positions); float32 math. The
elements ``R = 2 * half`` to ``D`` of each head pass through: copied by the kernel when
``copy_rest`` (an output that is not the input), untouched otherwise. A position outside
``[0, table_rows)`` reads no table: the token's rotated elements are written as NaN.

Launch shape (``launch_geometry``): a 3-D block of (pair-chunk lanes, head lanes, token lanes),
at most ``threads`` threads. A thread takes one chunk of ``vec`` pairs (two accesses of ``vec``
elements: ``x1`` and ``x2`` of NeoX, the two halves of ``2 * vec`` adjacent elements of GPT-J)
in each of its heads (``h = threadIdx.y + i * blockDim.y``; with accesses narrower than 16
bytes, two heads loaded before either is written), reading that chunk's ``vec`` cosines and
sines once per token. The head lanes split the heads evenly (40 heads on 32 lanes would leave
most lanes idle in the second round: 20 lanes of 2 heads instead), and blocks of few work
items take several tokens; the blocks walk the tokens grid-stride past 2^31 - 1 blocks. Each
warp reads and writes whole 128-byte lines (8 lanes x 16 bytes per half-head at LLaMA's
``half`` = 64 and 16-bit types), no shared memory, no barriers.

What a spec supports: ``vec`` is 1, 2, 4 or 8 elements of at most 16 bytes of q's type (1, 2
or 4 for float32); a call with head dimension ``D`` and ``half`` pairs runs on it when ``half
>= 1``, ``2 * half <= D`` and ``half % vec == 0`` (both layouts: a chunk is ``vec`` pairs), and
with ``copy_rest`` also ``D % vec == 0`` (the pass-through part is copied in accesses of
``vec`` elements starting at ``R``); ``check_fits`` says so in one line. Alignment is the
caller's: every q/k/output pointer aligned to ``vec`` elements, the tables' to ``min(16, vec
* table item size)`` bytes, and every element stride (batch, sequence, head; the tables'
batch and row) a multiple of ``vec``; ``max_vec`` gives the widest ``vec`` a call allows.

One fixed configuration, no tuning: blocks of at most ``DEFAULT_THREADS`` (256) threads, whose
launch bounds ask for at most 64 registers (every variant compiles to 40 to 64, no spills), so
at least 1024 threads per multiprocessor are resident. The kernel is memory-bound: with 16-byte
accesses each thread has two loads (32 bytes) in flight, about 32 KiB per multiprocessor, what
a copy at full bandwidth keeps in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentValueError
from ...jit.params import Param, int64, pointer
from ...jit.spec import KernelSpec, check_field
from ...runtime.dtypes import DType, as_dtype
from ...runtime.rows import GRID_MAX, access_width, check_accesses, vector_width

#: the positions' element types (None: no positions, the row of token (b, s) is s)
POSITION_TYPES = (None, "int32", "int64")
#: the blocks' sizes a spec may have (its launch bounds: 1024 / threads blocks resident)
THREAD_COUNTS = (32, 64, 128, 256, 512, 1024)
#: the block size of the one configuration the op runs
DEFAULT_THREADS = 256
#: the most token lanes of a block (CUDA's limit on blockDim.z)
MAX_TOKEN_LANES = 64

_POSITION_CTYPES = {None: "int", "int32": "int", "int64": "long long"}


@dataclass(frozen=True)
class RopeSpec(KernelSpec):
    """One compiled rope kernel: ``dtype`` of q, k and both outputs, ``table_dtype`` of cos
    and sin, ``positions`` (None, "int32" or "int64"), the layout (``interleaved``: GPT-J),
    the direction (``backward``: the opposite angle, dq from dq_out), ``copy_rest`` (copy
    elements ``2 * half`` to ``head_dim`` of each head: an output that is not the input),
    ``vec`` elements per access and at most ``threads`` threads per block."""

    dtype: DType
    table_dtype: DType
    positions: str | None = None
    interleaved: bool = False
    backward: bool = False
    copy_rest: bool = False
    vec: int = 1
    threads: int = DEFAULT_THREADS

    template = "rope/rope.cu"
    smem_bytes = 0

    def __post_init__(self):
        if not isinstance(self.dtype, DType) or not isinstance(self.table_dtype, DType):
            raise TypeError("RopeSpec: dtype and table_dtype must be DType")
        for name, dt in (("dtype", self.dtype), ("table_dtype", self.table_dtype)):
            if dt.is_fp8:
                raise ArgumentValueError(f"RopeSpec.{name}: expected float32, float16 or "
                                         f"bfloat16, got {dt.numpy_name}")
        if self.positions not in POSITION_TYPES:
            raise ArgumentValueError(f"RopeSpec.positions: expected None, 'int32' or 'int64', "
                                     f"got {self.positions!r}")
        for name in ("interleaved", "backward", "copy_rest"):
            check_field(self, name, bool)
        check_accesses("RopeSpec", self.vec, access_width(self.dtype))
        if self.threads not in THREAD_COUNTS:
            raise ArgumentValueError(f"RopeSpec.threads: expected one of "
                                     f"{', '.join(map(str, THREAD_COUNTS))}, got "
                                     f"{self.threads!r}")

    @property
    def position_ctype(self) -> str:
        """The C type of the positions (``int`` without positions: the pointer is unused)."""
        return _POSITION_CTYPES[self.positions]

    @property
    def kernel_name(self) -> str:
        direction = "bwd" if self.backward else "fwd"
        layout = "gptj" if self.interleaved else "neox"
        pos = {None: "nopos", "int32": "pos32", "int64": "pos64"}[self.positions]
        rest = "copy" if self.copy_rest else "keep"
        return (f"rope_{direction}_{layout}_{self.dtype.value}_cs{self.table_dtype.value}_"
                f"{pos}_{rest}_x{self.vec}_t{self.threads}")

    @property
    def params(self) -> tuple[Param, ...]:
        """q, k, q_out, k_out (not ``__restrict__``: in place, an output is its input), cos,
        sin, positions (unused without them; k and k_out unused with ``hk`` = 0); then
        ``tokens`` (B * S), ``seq`` (S), ``hq``, ``hk``, ``head_dim`` (D), ``half`` (R / 2),
        ``table_rows``, and the element strides: q, k, q_out and k_out along batch, sequence
        and head (``qb, qs, qh``, ``kb, ks, kh``, ``qob, qos, qoh``, ``kob, kos, koh``), cos
        and sin along batch (0 for a 2-D table) and row (``cb, cr``, ``sb, sr``), positions
        along batch (0 for a 1-D array) and sequence (``pb, ps``). Unit stride along D and
        along the tables' columns."""
        t, tt = self.dtype.ctype, self.table_dtype.ctype
        return (pointer("q", t, const=True, restrict=False),
                pointer("k", t, const=True, restrict=False),
                pointer("q_out", t, restrict=False),
                pointer("k_out", t, restrict=False),
                pointer("cos", tt, const=True),
                pointer("sin", tt, const=True),
                pointer("positions", self.position_ctype, const=True),
                *int64("tokens", "seq", "hq", "hk", "head_dim", "half", "table_rows",
                       "qb", "qs", "qh", "kb", "ks", "kh", "qob", "qos", "qoh",
                       "kob", "kos", "koh", "cb", "cr", "sb", "sr", "pb", "ps"))


def _position_type(positions) -> str | None:
    if positions is None:
        return None
    try:
        name = np.dtype(positions).name
    except TypeError:
        name = None
    if name not in ("int32", "int64"):
        raise ArgumentValueError(f"positions: expected None, int32 or int64, got {positions!r}")
    return name


def make_spec(dtype, table_dtype=None, *, positions=None, interleaved: bool = False,
              backward: bool = False, copy_rest: bool = False, vec: int = 1,
              threads: int | None = None) -> RopeSpec:
    """The kernel for q/k of ``dtype`` and tables of ``table_dtype`` (default ``dtype``), with
    ``positions`` of None, int32 or int64 (a name or a NumPy dtype), accesses of ``vec``
    elements and blocks of at most ``threads`` (default ``DEFAULT_THREADS``); one line naming
    the argument for any value it cannot take."""
    dt = as_dtype(dtype, "dtype")
    tdt = dt if table_dtype is None else as_dtype(table_dtype, "table_dtype")
    pos = _position_type(positions)
    for name, value in (("interleaved", interleaved), ("backward", backward),
                        ("copy_rest", copy_rest)):
        if not isinstance(value, bool | np.bool_):
            raise ArgumentValueError(f"{name}: expected a bool, got {value!r}")
    width = access_width(dt)
    if isinstance(vec, bool) or not isinstance(vec, int | np.integer) or vec not in (1, 2, 4, 8) \
            or vec > width:
        raise ArgumentValueError(f"vec: expected 1, 2, 4 or 8 elements of at most 16 bytes "
                                 f"({width} of {dt.numpy_name}), got {vec!r}")
    threads = DEFAULT_THREADS if threads is None else threads
    if isinstance(threads, bool) or threads not in THREAD_COUNTS:
        raise ArgumentValueError(f"threads: expected one of "
                                 f"{', '.join(map(str, THREAD_COUNTS))}, got {threads!r}")
    return RopeSpec(dt, tdt, pos, bool(interleaved), bool(backward), bool(copy_rest),
                    int(vec), int(threads))


def check_fits(spec: RopeSpec, half: int, head_dim: int) -> None:
    """One line saying why ``spec`` cannot run heads of ``head_dim`` elements with ``half``
    rotated pairs (see the module's docstring), if so."""
    if half < 1:
        raise ArgumentValueError(f"half: expected at least 1 rotated pair, got {half}")
    if 2 * half > head_dim:
        raise ArgumentValueError(f"half: the rotary dimension 2 * {half} exceeds the head "
                                 f"dimension {head_dim}")
    if half % spec.vec:
        raise ArgumentValueError(f"half: {half} pairs are not whole chunks of the spec's "
                                 f"vec ({spec.vec})")
    if spec.copy_rest and head_dim % spec.vec:
        raise ArgumentValueError(f"head_dim: {head_dim} is not a multiple of the spec's vec "
                                 f"({spec.vec}), which the pass-through copy needs")


def max_vec(dtype, table_dtype=None, *, half: int, head_dim: int, copy_rest: bool = False,
            arrays=(), tables=()) -> int:
    """The widest ``vec`` (a power of two, at most 16 bytes of ``dtype``) that a call allows:
    ``half`` a multiple of it (and ``head_dim`` with ``copy_rest``), and the alignment of
    ``arrays`` (q, k, q_out, k_out) and ``tables`` (cos, sin), each ``(address in bytes,
    element strides)``: an address a multiple of ``min(16, vec * item size)`` bytes, every
    stride a multiple of ``vec`` (give the strides of the dimensions that have more than one
    index; a stride of 0 is any multiple)."""
    dt = as_dtype(dtype, "dtype")
    tdt = dt if table_dtype is None else as_dtype(table_dtype, "table_dtype")
    v = access_width(dt)
    while v > 1 and (half % v or (copy_rest and head_dim % v)):
        v //= 2
    entries = []
    for group, item in ((arrays, dt.itemsize), (tables, tdt.itemsize)):
        for ptr, strides in group:
            entries += [(ptr, s, item) for s in strides] or [(ptr, None, item)]
    return vector_width(v, entries, 2)


def launch_geometry(spec: RopeSpec, tokens: int, heads_total: int,
                    half: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) for ``tokens`` tokens of ``heads_total`` (Hq + Hk) heads with ``half``
    pairs each: ``half / vec`` chunk lanes (at most ``threads``; the kernel loops over more),
    head lanes that split the heads into the fewest rounds of equal size, and as many token
    lanes as the rest of ``threads`` holds (at most 64); a grid of at most 2^31 - 1 blocks
    (the kernel walks the tokens past it). The kernel is correct for any block shape."""
    chunks = max(1, half // spec.vec)
    lanes = min(chunks, spec.threads)
    heads = max(1, heads_total)
    most = spec.threads // lanes
    rounds = -(-heads // most)
    head_lanes = -(-heads // rounds)
    token_lanes = max(1, min(spec.threads // (lanes * head_lanes), MAX_TOKEN_LANES,
                             max(tokens, 1)))
    blocks = -(-max(tokens, 1) // token_lanes)
    return (min(blocks, GRID_MAX), 1, 1), (lanes, head_lanes, token_lanes)
