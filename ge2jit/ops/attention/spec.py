"""The fused attention forward kernel for sm_80+ (``kernel_templates/attention/fwd_sm80.cu``,
the mma.sync design of FlashAttention-2), its configs and its launch shape. Pure: no GPU.

Semantics: ``o[i] = softmax(s[i, :]) v`` per query row ``i`` of each head, with ``s[i, j] =
(q_i . k_j) * scale`` (``softcap * tanh(s / softcap)`` with ``softcap``), the softmax in
float32 in the exp2 domain; ``lse[i] = log(sum_j exp(s[i, j]))`` (natural log, float32) with
``write_lse``. GQA: query head ``h`` reads kv head ``h // (H // H_kv)``. Masks per sequence of
lengths ``S_q``, ``S_k``, bottom-right aligned: key ``j`` is allowed for row ``i`` iff ``0 <=
j < S_k`` and ``i + S_k - S_q - left <= j <= i + S_k - S_q + right``, each bound only where
it is set (``causal``: right = 0; ``window``: ``window_left``, ``window_right``, -1 =
unbounded). A row that allows no key gets ``o = 0`` and ``lse = -inf`` (no NaN).

Layouts: dense q is (B, S_q, H, D) addressed by element strides (batch ``qb``, sequence
``qs``, head ``qh``) and unit stride along D, so (B, H, S, D) tensors work by their strides;
k, v (B, S_k, H_kv, D) and o (like q) the same; lse is (B, H, S_q) contiguous. ``varlen``:
``cu_seqlens_q`` / ``cu_seqlens_k`` (int32, B + 1 entries) give each sequence's rows in
packed q (total_q, H, D) and k/v (total_k, H_kv, D) (the batch strides unused), ``S_q`` /
``S_k`` are the longest lengths (the grid's size), lse is (H, total_q) contiguous.
Alignment is the caller's: q, k, v, o 16-byte aligned and every stride a multiple of 8
elements (16-byte cp.async copies and stores); ``scale`` positive (the running max is taken on
the unscaled scores); lengths below 2^31. Rows past a length are zero-filled by cp.async's
src-size, never read.

Launch shape (``grid``): grid = (ceil(S_q / block_m), H, B), block = (32 * warps,), dynamic
shared memory ``smem_bytes`` (above 48 KiB the loader raises the kernel's limit; sm_80 allows
163 KiB per block, sm_90 227 KiB). Work split: a block takes ``block_m`` query rows of one head
of one sequence; each warp ``block_m / warps`` consecutive rows (``m_tiles`` m16 tiles: 16
rows in every candidate config, the only tiling whose every variant fits 255 registers
without spilling); the block walks the key blocks of ``block_n`` keys that meet its rows' allowed
intervals (fully masked blocks skipped, element masks only in partly masked blocks), K and V
tiles double-buffered (``stages`` buffers) by cp.async. Per warp and key block: S = Q K^T
(mma.sync m16n8k16, float32), online softmax on the accumulators, O += P V with P packed to
16-bit A fragments in registers and V read by ldmatrix.trans. Q stays in registers when
``m_tiles * head_dim <= 128`` (``q_in_registers``), else its fragments are reloaded from
shared memory at each k-step (D = 256: Q's 64 registers plus O's 128 accumulators would
spill). Shared memory: Q (block_m x D, reused to stage O for 16-byte stores) + stages x (K, V)
tiles of block_n x D, 16-bit.

Configs (``CONFIGS[head_dim]``, the first the default), measured with NVRTC 13.5
(this checkout's wheels): registers with every option off / every option on (causal, window,
softcap, varlen, lse), all with 0 spill bytes and 0 stack on both architectures; every
config is 16 rows a warp (``m_tiles`` 1), launch bounds (threads, 1):

====  =================  =====  ========  ==========  ==============  ==============
D     block_m x block_n  warps  smem      Q           sm_80 regs      sm_90 regs
====  =================  =====  ========  ==========  ==============  ==============
64    128 x 64           8      48 KiB    registers   153 / 166       149 / 168
64    64 x 64            4      40 KiB    registers   163 / 168       160 / 179
128   128 x 64           8      96 KiB    registers   222 / 232       208 / 240
128   64 x 64            4      80 KiB    registers   234 / 248       230 / 247
128   128 x 32           8      64 KiB    registers   194 / 204       190 / 208
256   64 x 32            4      96 KiB    shared      248 / 255       245 / 253
256   128 x 32           8      128 KiB   shared      243 / 244       241 / 248
====  =================  =====  ========  ==========  ==============  ==============

(2 stages each: smem = (block_m + 4 block_n) * D * 2 bytes.) Per thread the live state is O's
accumulators (D / 2 floats), S's (block_n / 2), Q's fragments (D / 4 registers, when held),
plus ptxas' own prefetch of ldmatrix fragments. Tried and dropped: 32 rows a warp (128 x 64 /
4 warps at D = 64, 128 x 32 / 4 warps at D = 128) and 64 x 64 / 4 warps at D = 256 spill 12
to 56 bytes in their every-option variants. The 8-warp configs hold one block a
multiprocessor (by registers), the 4-warp ones two (by registers, and at D = 128 by shared
memory: 2 x 80 KiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit.params import Param, double, int64, pointer, tensor_maps
from ...jit.spec import KernelSpec, check_field
from ...runtime.dtypes import DType

#: head dimensions the kernel is instantiated for
HEAD_DIMS = (64, 128, 256)
#: the 16-bit input types (the mma's A and B operands)
DTYPES = (DType.F16, DType.BF16)
#: shared memory one block may have: sm_80 (163 KiB); sm_90 allows 227 KiB
MAX_SMEM_SM80 = 163 * 1024


@dataclass(frozen=True)
class AttentionConfig:
    """One tiling of the forward kernel: ``block_m`` query rows and ``block_n`` keys per step,
    ``warps`` warps (each ``block_m / warps`` rows: whole m16 tiles), ``stages`` K/V buffers,
    ``min_blocks`` resident blocks per multiprocessor asked of the compiler (launch bounds)."""

    block_m: int
    block_n: int
    warps: int
    stages: int = 2
    min_blocks: int = 1

    def __post_init__(self):
        for name in ("block_m", "block_n", "warps", "stages", "min_blocks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ArgumentValueError(f"AttentionConfig.{name}: expected a positive int, "
                                         f"got {v!r}")
        if self.warps not in (1, 2, 4, 8):
            raise ArgumentValueError(f"AttentionConfig.warps: expected 1, 2, 4 or 8, got "
                                     f"{self.warps}")
        if self.block_m % (16 * self.warps) or self.block_m // (16 * self.warps) not in (1, 2):
            raise ArgumentValueError(f"AttentionConfig.block_m: expected 16 or 32 rows per "
                                     f"warp (16 * warps * 1 or 2 = {16 * self.warps} or "
                                     f"{32 * self.warps}), got {self.block_m}")
        if self.block_n not in (16, 32, 64, 128):
            raise ArgumentValueError(f"AttentionConfig.block_n: expected 16, 32, 64 or 128, "
                                     f"got {self.block_n}")
        if self.stages not in (2, 3):
            raise ArgumentValueError(f"AttentionConfig.stages: expected 2 or 3, got "
                                     f"{self.stages}")
        if self.min_blocks not in (1, 2):
            raise ArgumentValueError(f"AttentionConfig.min_blocks: expected 1 or 2, got "
                                     f"{self.min_blocks}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def m_tiles(self) -> int:
        """m16 tiles (of 16 query rows) per warp."""
        return self.block_m // (16 * self.warps)

    def smem_bytes_for(self, head_dim: int) -> int:
        """Q's tile and ``stages`` (K, V) tiles of 16-bit rows of ``head_dim``."""
        return (self.block_m + 2 * self.stages * self.block_n) * head_dim * 2

    @property
    def name(self) -> str:
        name = f"m{self.block_m}n{self.block_n}w{self.warps}s{self.stages}"
        return name + (f"b{self.min_blocks}" if self.min_blocks != 1 else "")


#: candidate configs per head dimension, the default first (all compile to 0 spills, 0 stack
#: on sm_80 and sm_90; see the module's docstring for their registers)
CONFIGS: dict[int, tuple[AttentionConfig, ...]] = {
    64: (AttentionConfig(128, 64, 8), AttentionConfig(64, 64, 4)),
    128: (AttentionConfig(128, 64, 8), AttentionConfig(64, 64, 4), AttentionConfig(128, 32, 8)),
    256: (AttentionConfig(64, 32, 4), AttentionConfig(128, 32, 8)),
}


class _Segments:
    """What every attention kernel's spec with ``segments`` shares: each row of a dense batch
    holds several sequences, kept apart by each token's bounds (``seq_bounds``, (B, S, 2)
    int32: its sequence's first token and one past its last, within the row; masks.cuh's
    RowMasks)."""

    def _check_segments(self) -> None:
        if self.segments and self.varlen:
            raise ArgumentValueError(f"{type(self).__name__}: expected segments (each row's "
                                     f"sequences apart in a dense batch) without varlen")

    def row_bounds(self, batch: str) -> str:
        """The kernel's expression of sequence ``batch``'s row of ``seq_bounds`` (two int32 a
        token: its sequence's first token and one past its last), or nullptr without
        ``segments``."""
        if not self.segments:
            return "nullptr"
        return f"seq_bounds + 2 * static_cast<long long>({batch}) * S_q"

    def _segment_params(self) -> tuple[Param, ...]:
        """``seq_bounds`` with ``segments`` (a kernel without them takes no such parameter)."""
        return (pointer("seq_bounds", "int", const=True),) if self.segments else ()


@dataclass(frozen=True)
class AttentionFwdSpec(_Segments, KernelSpec):
    """One compiled attention forward kernel (sm_80+, mma.sync): inputs and output of
    ``dtype`` (float16 or bfloat16), heads of ``head_dim`` (64, 128 or 256), the masks
    (``causal``, ``window``: sliding window bounds as arguments), ``softcap``, ``varlen``
    (packed sequences by cumulative lengths), ``write_lse``, and a tiling ``config``."""

    dtype: DType
    head_dim: int
    config: AttentionConfig
    causal: bool = False
    window: bool = False
    softcap: bool = False
    varlen: bool = False
    write_lse: bool = False
    segments: bool = False

    template = "attention/fwd_sm80.cu"

    def __post_init__(self):
        if not isinstance(self.dtype, DType):
            raise TypeError(f"AttentionFwdSpec.dtype: expected a DType, got {self.dtype!r}")
        if self.dtype not in DTYPES:
            raise ArgumentValueError(f"AttentionFwdSpec.dtype: expected float16 or bfloat16, "
                                     f"got {self.dtype.numpy_name}")
        if (isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int)
                or self.head_dim not in HEAD_DIMS):
            raise ArgumentValueError(f"AttentionFwdSpec.head_dim: expected 64, 128 or 256, "
                                     f"got {self.head_dim!r}")
        check_field(self, "config", AttentionConfig)
        for name in ("causal", "window", "softcap", "varlen", "write_lse", "segments"):
            check_field(self, name, bool)
        self._check_segments()
        if self.smem_bytes > MAX_SMEM_SM80:
            raise ArgumentValueError(f"AttentionFwdSpec.config: {self.config.name} needs "
                                     f"{self.smem_bytes} B of shared memory at head_dim "
                                     f"{self.head_dim} ({MAX_SMEM_SM80} B allowed on sm_80)")

    @property
    def threads(self) -> int:
        return self.config.threads

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes_for(self.head_dim)

    @property
    def q_in_registers(self) -> bool:
        """Q's fragments held in registers through the key loop (else reloaded from shared
        memory at each k-step): at most 32 registers of them."""
        return self.config.m_tiles * self.head_dim <= 128

    @property
    def kernel_name(self) -> str:
        flags = "".join(f"_{name}" for name, on in (
            ("causal", self.causal), ("win", self.window), ("cap", self.softcap),
            ("varlen", self.varlen), ("lse", self.write_lse), ("seg", self.segments)) if on)
        return (f"attn_fwd_sm80_{self.dtype.value}_d{self.head_dim}_{self.config.name}"
                + flags)

    @property
    def params(self) -> tuple[Param, ...]:
        """q, k, v, o; lse (float32, unused without ``write_lse``); cu_seqlens_q,
        cu_seqlens_k (int32, unused without ``varlen``); the element strides of q, k, v, o
        along batch, sequence and head (``qb, qs, qh``, ``kb, ks, kh``, ``vb, vs, vh``,
        ``ob, os, oh``); ``B``, ``H``, ``H_kv``, ``S_q``, ``S_k`` (the longest lengths with
        ``varlen``); ``scale`` and ``softcap`` (float64; ``softcap`` unused without it);
        ``window_left``, ``window_right`` (-1 unbounded; unused without ``window``); with
        ``segments``, ``seq_bounds`` (B, S, 2) int32 (:meth:`row_bounds`)."""
        t = self.dtype.ctype
        return (pointer("q", t, const=True), pointer("k", t, const=True),
                pointer("v", t, const=True), pointer("o", t),
                pointer("lse", "float"),
                pointer("cu_seqlens_q", "int", const=True),
                pointer("cu_seqlens_k", "int", const=True),
                *int64("qb", "qs", "qh", "kb", "ks", "kh", "vb", "vs", "vh", "ob", "os", "oh",
                       "B", "H", "H_kv", "S_q", "S_k"),
                *double("scale", "softcap"),
                *int64("window_left", "window_right"), *self._segment_params())

    def grid(self, batch: int, heads: int, max_seqlen_q: int,
             sms: int = 0) -> tuple[int, int, int]:
        """(ceil(S_q / block_m), H, B): one block per ``block_m`` query rows of a head of a
        sequence (with ``varlen``, ``max_seqlen_q`` the longest; blocks past a sequence's
        length exit). ``sms`` (the Hopper forward's persistent grid) changes nothing."""
        bm = self.config.block_m
        return (max(1, -(-max_seqlen_q // bm)), heads, batch)


def make_spec(dtype: DType, head_dim: int, *, causal: bool = False, window: bool = False,
              softcap: bool = False, varlen: bool = False, write_lse: bool = False,
              segments: bool = False, config: AttentionConfig | None = None
              ) -> AttentionFwdSpec:
    """The forward kernel for these options, with ``config`` (default: the head dimension's
    first candidate)."""
    if head_dim not in CONFIGS:
        raise ArgumentValueError(f"head_dim: expected 64, 128 or 256, got {head_dim!r}")
    return AttentionFwdSpec(dtype, head_dim, CONFIGS[head_dim][0] if config is None else config,
                            causal, window, softcap, varlen, write_lse, segments)


# --- the backward -------------------------------------------------------------------------

#: the backward's kernels, in the order they run: delta = rowsum(do o), then dq, then dk and dv;
#: "dqout" converts the float32 dq of the Hopper one-kernel backward ("dkvq", bwd_sm90.cu)
BWD_KINDS = ("dot", "dq", "dkv", "dqout")
#: the threads of a block of the "dot" kernel
DOT_THREADS = 128
#: the kernels with a thread per 8 columns of a row (DOT_THREADS a block), no tiling
ROW_KINDS = ("dot", "dqout")


@dataclass(frozen=True)
class AttentionBwdConfig:
    """One tiling of the backward's dq or dkv kernel (``bwd_sm80.cu``): ``block_m`` query rows
    and ``block_n`` keys (the dq kernel's block holds ``block_m`` = 16 ``warps`` rows and steps
    through ``block_n`` keys; the dkv kernel's holds ``block_n`` = 16 ``warps`` keys and steps
    through ``block_m`` queries), double-buffered (``stages`` 2), and ``dsplit`` column splits
    of dk and dv (the dkv kernel at head_dim 256: a block's accumulators for whole rows would
    not fit in registers)."""

    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2
    dsplit: int = 1

    def __post_init__(self):
        for name in ("block_m", "block_n", "warps", "stages", "dsplit"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ArgumentValueError(f"AttentionBwdConfig.{name}: expected a positive int, "
                                         f"got {v!r}")
        if self.block_m % 16 or self.block_n % 16 or self.block_m > 128 or self.block_n > 128:
            raise ArgumentValueError(f"AttentionBwdConfig: expected block_m and block_n "
                                     f"multiples of 16 up to 128, got {self.block_m} and "
                                     f"{self.block_n}")
        if self.stages != 2 or self.dsplit not in (1, 2, 4) or self.warps not in (2, 4, 8):
            raise ArgumentValueError(f"AttentionBwdConfig: expected stages 2, dsplit 1, 2 or "
                                     f"4 and warps 2, 4 or 8, got {self}")

    @property
    def name(self) -> str:
        return (f"m{self.block_m}n{self.block_n}w{self.warps}"
                + (f"x{self.dsplit}" if self.dsplit != 1 else ""))


#: the backward's tilings per head dimension: (dq kernel's, dkv kernel's). The dq kernel's
#: block is 16 warps x ... rows: block_m = 16 warps; the dkv kernel's block_n = 16 warps.
BWD_CONFIGS: dict[int, tuple[AttentionBwdConfig, AttentionBwdConfig]] = {
    64: (AttentionBwdConfig(64, 64), AttentionBwdConfig(64, 64)),
    128: (AttentionBwdConfig(64, 64), AttentionBwdConfig(32, 64)),
    256: (AttentionBwdConfig(64, 32), AttentionBwdConfig(16, 64, dsplit=2)),
}


@dataclass(frozen=True)
class AttentionBwdSpec(_Segments, KernelSpec):
    """One kernel of the attention backward (sm_80+, ``bwd_sm80.cu``): ``kind`` "dot" (delta =
    the rows' sums of do * o), "dq" or "dkv", for ``dtype`` (float16 or bfloat16) and
    ``head_dim`` (64, 128 or 256), the forward's masks (``causal``, ``window``), ``softcap``
    and ``varlen``, and a tiling (``config``; the "dot" kernel's is its head dimension's dq
    tiling, unused)."""

    kind: str
    dtype: DType
    head_dim: int
    config: AttentionBwdConfig
    causal: bool = False
    window: bool = False
    softcap: bool = False
    varlen: bool = False
    segments: bool = False

    template = "attention/bwd_sm80.cu"

    def __post_init__(self):
        if self.kind not in BWD_KINDS:
            raise ArgumentValueError(f"AttentionBwdSpec.kind: expected one of {BWD_KINDS}, "
                                     f"got {self.kind!r}")
        check_field(self, "dtype", DType)
        if self.dtype not in DTYPES:
            raise ArgumentValueError(f"AttentionBwdSpec.dtype: expected float16 or bfloat16, "
                                     f"got {self.dtype.numpy_name}")
        if (isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int)
                or self.head_dim not in HEAD_DIMS):
            raise ArgumentValueError(f"AttentionBwdSpec.head_dim: expected 64, 128 or 256, "
                                     f"got {self.head_dim!r}")
        check_field(self, "config", AttentionBwdConfig)
        for name in ("causal", "window", "softcap", "varlen", "segments"):
            check_field(self, name, bool)
        self._check_segments()
        if self.segments and self.kind in ROW_KINDS:
            raise ArgumentValueError(f"AttentionBwdSpec: expected segments only with kind "
                                     f"'dq' or 'dkv', got kind {self.kind!r}")
        c = self.config
        if self.kind == "dq" and c.block_m != 16 * c.warps:
            raise ArgumentValueError(f"AttentionBwdSpec.config: the dq kernel takes 16 rows a "
                                     f"warp (block_m = {16 * c.warps}), got {c.name}")
        if self.kind == "dkv":
            if c.block_n != 16 * c.warps:
                raise ArgumentValueError(f"AttentionBwdSpec.config: the dkv kernel takes 16 "
                                         f"keys a warp (block_n = {16 * c.warps}), got "
                                         f"{c.name}")
            if (self.head_dim // c.dsplit) % 64:
                raise ArgumentValueError(f"AttentionBwdSpec.config: dsplit {c.dsplit} leaves "
                                         f"head_dim {self.head_dim} in pieces that are not "
                                         f"multiples of 64")
        if self.smem_bytes > MAX_SMEM_SM80:
            raise ArgumentValueError(f"AttentionBwdSpec.config: {c.name} needs "
                                     f"{self.smem_bytes} B of shared memory at head_dim "
                                     f"{self.head_dim} ({MAX_SMEM_SM80} B allowed on sm_80)")

    @property
    def threads(self) -> int:
        return DOT_THREADS if self.kind in ROW_KINDS else 32 * self.config.warps

    @property
    def smem_bytes(self) -> int:
        row, c = self.head_dim * 2, self.config
        if self.kind == "dq":        # Q, dO; stages x (K, V)
            return (2 * c.block_m + c.stages * 2 * c.block_n) * row
        if self.kind == "dkv":       # K, V; stages x (Q, dO, lse and delta)
            return 2 * c.block_n * row + c.stages * (2 * c.block_m * row + 8 * c.block_m)
        return 0

    @property
    def kernel_name(self) -> str:
        flags = "".join(f"_{name}" for name, on in (
            ("causal", self.causal), ("win", self.window), ("cap", self.softcap),
            ("varlen", self.varlen), ("seg", self.segments)) if on)
        tiling = "" if self.kind in ROW_KINDS else f"_{self.config.name}"
        return (f"attn_bwd_{self.kind}_sm80_{self.dtype.value}_d{self.head_dim}{tiling}"
                + flags)

    @property
    def params(self) -> tuple[Param, ...]:
        """q, k, v, o, dout (the gradient of o), lse (the forward's), delta (float32: written
        by the "dot" kernel, read by the others), dq, dk, dv, dq_accum (float32, rows as lse's,
        head_dim columns: null, or the Hopper one-kernel backward's dq, zeroed by "dot" and
        read by "dqout", in tiles of ``dq_pad`` rows), cu_seqlens_q, cu_seqlens_k; the
        element strides along batch, sequence and head of q, k, v, o, dout (``gb, gs, gh``),
        dq, dk, dv; ``B``, ``H``, ``H_kv``, ``S_q``, ``S_k``; ``scale``, ``softcap``;
        ``window_left``, ``window_right`` (as the forward's). Every kernel takes them all; the
        dq and dkv kernels with ``segments`` also ``seq_bounds`` (B, S, 2) int32."""
        t = self.dtype.ctype
        return (pointer("q", t, const=True), pointer("k", t, const=True),
                pointer("v", t, const=True), pointer("o", t, const=True),
                pointer("dout", t, const=True), pointer("lse", "float", const=True),
                pointer("delta", "float"), pointer("dq", t), pointer("dk", t),
                pointer("dv", t), pointer("dq_accum", "float"),
                pointer("cu_seqlens_q", "int", const=True),
                pointer("cu_seqlens_k", "int", const=True),
                *int64("qb", "qs", "qh", "kb", "ks", "kh", "vb", "vs", "vh", "ob", "os", "oh",
                       "gb", "gs", "gh", "dqb", "dqs", "dqh", "dkb", "dks", "dkh", "dvb", "dvs",
                       "dvh", "B", "H", "H_kv", "S_q", "S_k", "dq_pad"),
                *double("scale", "softcap"),
                *int64("window_left", "window_right"), *self._segment_params())

    def grid(self, batch: int, heads: int, kv_heads: int, max_seqlen_q: int,
             max_seqlen_k: int) -> tuple[int, int, int]:
        """The launch grid: "dot" and "dqout" a block per DOT_THREADS / (head_dim / 8) rows of
        a head; "dq" per ``block_m`` query rows of a head; "dkv" per ``block_n`` keys of a kv
        head, times ``dsplit``; z the batch (sequences)."""
        c = self.config
        if self.kind in ROW_KINDS:
            rows = DOT_THREADS // (self.head_dim // 8)
            return (max(1, -(-max_seqlen_q // rows)), heads, batch)
        if self.kind == "dq":
            return (max(1, -(-max_seqlen_q // c.block_m)), heads, batch)
        return (max(1, -(-max_seqlen_k // c.block_n)) * c.dsplit, kv_heads, batch)


def make_bwd_specs(dtype: DType, head_dim: int, *, causal: bool = False, window: bool = False,
                   softcap: bool = False, varlen: bool = False, segments: bool = False,
                   configs: tuple[AttentionBwdConfig, AttentionBwdConfig] | None = None
                   ) -> tuple[AttentionBwdSpec, AttentionBwdSpec, AttentionBwdSpec]:
    """The backward's three kernels ("dot", "dq", "dkv") for these options, with ``configs``
    (the dq and dkv tilings; default the head dimension's)."""
    if head_dim not in BWD_CONFIGS:
        raise ArgumentValueError(f"head_dim: expected 64, 128 or 256, got {head_dim!r}")
    dq_cfg, dkv_cfg = BWD_CONFIGS[head_dim] if configs is None else configs
    masks = dict(causal=causal, window=window, softcap=softcap, varlen=varlen,
                 segments=segments)
    return (AttentionBwdSpec("dot", dtype, head_dim, dq_cfg, varlen=varlen),
            AttentionBwdSpec("dq", dtype, head_dim, dq_cfg, **masks),
            AttentionBwdSpec("dkv", dtype, head_dim, dkv_cfg, **masks))


# --- the Hopper forward ---------------------------------------------------------------------

#: shared memory one block may have on sm_90
MAX_SMEM_SM90 = 227 * 1024


@dataclass(frozen=True)
class AttentionSm90Config:
    """One tiling of the Hopper forward (``fwd_sm90.cu``): 128 query rows a block (two
    consumer warpgroups of 64), ``block_n`` keys a step through ``stages`` buffers;
    ``overlap``: a block's softmax under the previous block's P V product (FlashAttention-3's
    intra-warpgroup overlap); ``pingpong`` (with ``overlap``; None: as ``overlap``): the two
    consumers taking turns at the tensor cores, so that one's softmax runs under the other's
    products; ``persistent``: a block per multiprocessor taking the tiles in turn. Named
    ``h{block_n}s{stages}``, then ``o`` (overlap and ping-pong) or ``i`` (overlap alone), then
    ``p`` (persistent)."""

    block_n: int
    stages: int = 2
    overlap: bool = False
    persistent: bool = False
    pingpong: bool | None = None

    def __post_init__(self):
        check_field(self, "overlap", bool)
        check_field(self, "persistent", bool)
        _resolve_pingpong(self)
        for name in ("block_n", "stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ArgumentTypeError(f"AttentionSm90Config.{name}: expected int, got {v!r}")
        if self.block_n % 16 or not 16 <= self.block_n <= 256 or self.stages not in (2, 3):
            raise ArgumentValueError(f"AttentionSm90Config: expected block_n a multiple of 16 "
                                     f"up to 256 and stages 2 or 3, got {self.block_n} and "
                                     f"{self.stages}")

    @property
    def block_m(self) -> int:
        return 128

    @property
    def name(self) -> str:
        return f"h{self.block_n}s{self.stages}" + _suffix(self)


def _resolve_pingpong(c) -> None:
    """A Hopper forward config's or spec's ``pingpong``: None becomes ``overlap``; a bool, and
    True only with ``overlap``."""
    if c.pingpong is None:
        object.__setattr__(c, "pingpong", c.overlap)
    check_field(c, "pingpong", bool)
    if c.pingpong and c.overlap is not True:
        raise ArgumentValueError(f"{type(c).__name__}: expected pingpong only with overlap")


def _suffix(c) -> str:
    """A Hopper forward's name after its stages: ``o`` (overlap and ping-pong) or ``i``
    (overlap alone), then ``p`` (persistent)."""
    return (("o" if c.pingpong else "i") if c.overlap else "") + ("p" if c.persistent else "")


#: the Hopper forward's tilings per head dimension, the default first (taken on sm_90 devices
#: unless a call pins an sm_80 config)
SM90_CONFIGS: dict[int, tuple[AttentionSm90Config, ...]] = {
    64: (AttentionSm90Config(256, persistent=True), AttentionSm90Config(128),
         AttentionSm90Config(128, overlap=True), AttentionSm90Config(128, persistent=True),
         AttentionSm90Config(192, persistent=True), AttentionSm90Config(192, 3, persistent=True),
         AttentionSm90Config(128, overlap=True, persistent=True),
         AttentionSm90Config(128, overlap=True, persistent=True, pingpong=False),
         AttentionSm90Config(192, overlap=True, persistent=True, pingpong=False)),
    128: (AttentionSm90Config(128, overlap=True, persistent=True, pingpong=False),
          AttentionSm90Config(128, persistent=True), AttentionSm90Config(128),
          AttentionSm90Config(128, overlap=True), AttentionSm90Config(144),
          AttentionSm90Config(160), AttentionSm90Config(176), AttentionSm90Config(192),
          AttentionSm90Config(160, persistent=True), AttentionSm90Config(176, persistent=True),
          AttentionSm90Config(128, 3, persistent=True),
          AttentionSm90Config(128, overlap=True, pingpong=False),
          AttentionSm90Config(128, overlap=True, persistent=True),
          AttentionSm90Config(160, overlap=True, persistent=True, pingpong=False),
          AttentionSm90Config(176, overlap=True, persistent=True, pingpong=False),
          AttentionSm90Config(176, overlap=True, persistent=True)),
    256: (AttentionSm90Config(64), AttentionSm90Config(64, overlap=True),
          AttentionSm90Config(64, persistent=True), AttentionSm90Config(80, persistent=True),
          AttentionSm90Config(80, overlap=True, persistent=True, pingpong=False)),
}
SM90_BLOCK_N = {d: cfgs[0].block_n for d, cfgs in SM90_CONFIGS.items()}
#: head_dim -> (keys, config): the Hopper forward's default for causal calls of at most that many
#: keys (the head dimension's first config elsewhere): at head_dim 64 a causal row block's
#: 256-key blocks are too few and too much masked (an H200: 1.05-1.07x at 512 keys, 1.02-1.03x
#: at 1024; without the mask the 256-key blocks stay 1.13-1.18x faster at those lengths)
SM90_SHORT_DEFAULT = {64: (1024, AttentionSm90Config(128, persistent=True))}


def candidates_for(head_dim: int, arch: int) -> tuple:
    """The configs a call of ``head_dim`` may take on a device of compute capability ``arch``
    (90 for sm_90), its default first: the Hopper kernel's then the sm_80 kernel's on sm_90,
    the sm_80 kernel's elsewhere."""
    return (SM90_CONFIGS[head_dim] + CONFIGS[head_dim]) if arch == 90 else CONFIGS[head_dim]


def default_config(head_dim: int, arch: int, seqlen_k: int | None = None,
                   causal: bool = False) -> tuple:
    """(config, why) of a call that pins none and has no tuned config: the first of
    :func:`candidates_for`, or on sm_90 :data:`SM90_SHORT_DEFAULT`'s for a ``causal`` call of
    at most its keys (``seqlen_k``: the keys, the longest packed sequence's; None: long)."""
    short = SM90_SHORT_DEFAULT.get(head_dim) if arch == 90 and causal else None
    if short is not None and seqlen_k is not None and seqlen_k <= short[0]:
        return short[1], f"default for causal calls of at most {short[0]} keys"
    return candidates_for(head_dim, arch)[0], "default"


def default_configs(head_dim: int, arch: int, causal: bool = False) -> list:
    """Every config :func:`default_config` gives ``head_dim`` on ``arch`` with ``causal`` (what
    a warm-up of the defaults compiles): the long sequences' first."""
    return list(dict.fromkeys(default_config(head_dim, arch, n, causal)[0] for n in (None, 1)))


class _Hopper(_Segments):
    """What the Hopper attention kernels' specs share: sm_90a, three warpgroups, the checks of
    their types, flags and shared memory, and the flags' part of their names."""

    FLAGS: tuple = ()

    def _check(self, sizes, what: str) -> None:
        """The dtype, ``head_dim`` (one of ``sizes``), the FLAGS (bools) and the shared
        memory (``what``: the tiling that asks for it, for the message)."""
        owner = type(self).__name__
        check_field(self, "dtype", DType)
        if self.dtype not in DTYPES:
            raise ArgumentValueError(f"{owner}.dtype: expected float16 or bfloat16, got "
                                     f"{self.dtype.numpy_name}")
        if isinstance(self.head_dim, bool) or self.head_dim not in sizes:
            raise ArgumentValueError(f"{owner}.head_dim: expected 64, 128 or 256, got "
                                     f"{self.head_dim!r}")
        for name in self.FLAGS:
            check_field(self, name, bool)
        if self.smem_bytes > MAX_SMEM_SM90:
            raise ArgumentValueError(f"{owner}: {what} needs {self.smem_bytes} B of shared "
                                     f"memory at head_dim {self.head_dim} ({MAX_SMEM_SM90} B "
                                     f"allowed)")

    def _flags(self) -> str:
        short = {"window": "win", "softcap": "cap", "write_lse": "lse", "defer_dq": "dqd",
                 "segments": "seg"}
        return "".join(f"_{short.get(n, n)}" for n in self.FLAGS
                       if n not in ("overlap", "persistent", "pingpong") and getattr(self, n))

    @property
    def threads(self) -> int:
        return 384

    def target_arch(self, device_arch: str) -> str:
        from ...jit.nvrtc import arch_number

        return f"sm_{arch_number(device_arch)}a"


@dataclass(frozen=True)
class AttentionFwdSm90Spec(_Hopper, KernelSpec):
    """The attention forward on Hopper (sm_90a, ``fwd_sm90.cu``): TMA loads of Q, K and V by
    tensor maps (``tma_q``, ``tma_k``, ``tma_v``: 4-D over (head_dim, seq, heads, batch), 3-D
    over (head_dim, rows, heads) with ``varlen``), wgmma products, a producer warpgroup and
    two consumer warpgroups of 64 query rows; ``block_n`` keys a step through ``stages``
    buffers. Options as :class:`AttentionFwdSpec`'s."""

    dtype: DType
    head_dim: int
    block_n: int
    causal: bool = False
    window: bool = False
    softcap: bool = False
    varlen: bool = False
    write_lse: bool = False
    stages: int = 2
    overlap: bool = False
    persistent: bool = False
    pingpong: bool | None = None   # None: as overlap
    segments: bool = False

    template = "attention/fwd_sm90.cu"
    FLAGS = ("causal", "window", "softcap", "varlen", "write_lse", "overlap", "persistent",
             "pingpong", "segments")

    @property
    def config(self) -> AttentionSm90Config:
        return AttentionSm90Config(self.block_n, self.stages, self.overlap, self.persistent,
                                   self.pingpong)

    def __post_init__(self):
        _resolve_pingpong(self)
        check_field(self, "block_n", int)
        check_field(self, "stages", int)
        if self.block_n % 16 or not 16 <= self.block_n <= 256 or self.stages not in (2, 3):
            raise ArgumentValueError(f"AttentionFwdSm90Spec: expected block_n a multiple of 16 "
                                     f"up to 256 and stages 2 or 3, got {self.block_n} and "
                                     f"{self.stages}")
        self._check(SM90_BLOCK_N, f"block_n {self.block_n}")
        self._check_segments()

    @property
    def smem_bytes(self) -> int:
        """Q's tile, ``stages`` (K, V) tiles, the barriers, (``overlap``) a 4-byte slot per
        consumer warp, (``write_lse``) the 128 rows' maximum after those slots; 1024 bytes of
        slack for the 128-byte swizzle's alignment."""
        row = self.head_dim * 2
        return (128 * row + self.stages * 2 * self.block_n * row + 8 * (2 + 4 * self.stages)
                + (4 * 8 if self.overlap or self.write_lse else 0)
                + (4 * 128 if self.write_lse else 0) + 1024)

    @property
    def kernel_name(self) -> str:
        return (f"attn_fwd_sm90_{self.dtype.value}_d{self.head_dim}_n{self.block_n}"
                f"s{self.stages}" + _suffix(self) + self._flags())

    @property
    def params(self) -> tuple[Param, ...]:
        """The tensor maps of q, k and v; o, lse, cu_seqlens_q, cu_seqlens_k; o's element
        strides (``ob, os, oh``); ``B``, ``H``, ``H_kv``, ``S_q``, ``S_k``; ``scale``,
        ``softcap``; ``window_left``, ``window_right``; ``heads_group`` (persistent: the
        (sequence, head) pairs whose tiles are taken together, :func:`heads_group`); with
        ``segments``, ``seq_bounds`` (B, S, 2) int32 (:meth:`row_bounds`)."""
        t = self.dtype.ctype
        return (*tensor_maps("tma_q", "tma_k", "tma_v"), pointer("o", t),
                pointer("lse", "float"), pointer("cu_seqlens_q", "int", const=True),
                pointer("cu_seqlens_k", "int", const=True),
                *int64("ob", "os", "oh", "B", "H", "H_kv", "S_q", "S_k"),
                *double("scale", "softcap"), *int64("window_left", "window_right",
                                                    "heads_group"),
                *self._segment_params())

    def grid(self, batch: int, heads: int, max_seqlen_q: int,
             sms: int = 0) -> tuple[int, int, int]:
        """A block per 128 query rows of each head of each sequence, or (``persistent``) one
        per multiprocessor (``sms``), at most one per tile."""
        blocks = max(1, -(-max_seqlen_q // 128))
        if self.persistent:
            tiles = max(1, blocks * heads * batch)
            return (min(tiles, sms) if sms else tiles, 1, 1)
        return (blocks, heads, batch)


#: bytes of L2 the persistent forward's K and V of one section may take (FlashAttention-3's
#: choice; H100 and H200 have 50 MB)
L2_SECTION_BYTES = 32 << 20


def heads_group(batch: int, heads: int, kv_heads: int, seqlen_k: int, head_dim: int,
                itemsize: int = 2) -> int:
    """The persistent forward's section: how many (sequence, head) pairs' tiles it takes
    together, the query blocks of a section in turn: whole groups of heads sharing K and V,
    as many as fit in :data:`L2_SECTION_BYTES` (at least one group)."""
    kv_bytes = max(1, seqlen_k) * head_dim * itemsize * 2
    group = heads // kv_heads
    return max(1, min(batch * heads, max(1, L2_SECTION_BYTES // kv_bytes) * group))


def make_sm90_spec(dtype: DType, head_dim: int, *, config: AttentionSm90Config | None = None,
                   **options) -> AttentionFwdSm90Spec:
    """The Hopper forward for these options (``causal``, ``window``, ``softcap``, ``varlen``,
    ``write_lse``), with ``config`` (default: the head dimension's)."""
    if head_dim not in SM90_CONFIGS:
        raise ArgumentValueError(f"head_dim: expected 64, 128 or 256, got {head_dim!r}")
    c = SM90_CONFIGS[head_dim][0] if config is None else config
    return AttentionFwdSm90Spec(dtype, head_dim, c.block_n, stages=c.stages,
                                overlap=c.overlap, persistent=c.persistent,
                                pingpong=c.pingpong, **options)


def spec_for(config, dtype: DType, head_dim: int, **options):
    """The forward kernel of ``config`` (an :class:`AttentionSm90Config`: the Hopper kernel;
    an :class:`AttentionConfig` or None: the sm_80 kernel, None its default tiling) for these
    options."""
    if isinstance(config, AttentionSm90Config):
        return make_sm90_spec(dtype, head_dim, config=config, **options)
    return make_spec(dtype, head_dim, config=config, **options)


def forward_specs(config, dtype: DType, head_dim: int, arch: int, **options) -> list:
    """The forward kernels of ``config`` for these options (:func:`spec_for`'s), or with None
    those of every default :func:`default_configs` gives ``head_dim`` on ``arch`` (with the
    options' ``causal``): what a warm-up compiles and ``specs_for_config`` lists."""
    configs = ([config] if config is not None
               else default_configs(head_dim, arch, options.get("causal", False)))
    return [spec_for(c, dtype, head_dim, **options) for c in configs]


# --- the Hopper backward ------------------------------------------------------------------------

#: the Hopper backward's steps per head dimension: (dq kernel's keys a step, dkv kernel's
#: queries a step, dkv kernel's column splits)
#: head_dim -> (dq step, dkv step, dkv column splits, dq stages, dkv stages) of the Hopper
#: backward
SM90_BWD = {64: (64, 64, 1, 2, 2), 128: (64, 48, 1, 2, 2), 256: (32, 32, 2, 2, 2)}
#: the one-kernel backward's (dkvq) queries a step and pipeline stages per head dimension: the
#: narrow step, taken where the wide one would spill (or pinned by config "sm90n"). Three
#: stages at head_dim 64: 2% faster at 8 x 16 x 2048 (H200), the same at the other shapes
SM90_BWD_FUSED = {64: (64, 3), 128: (48, 2)}
#: the one-kernel backward's wide step (the default where it applies; pinned by config
#: "sm90w"), and the options with which it would spill registers (ptxas for sm_90a)
SM90_BWD_WIDE = {64: 96, 128: 64}
#: the fewest queries (a sequence's, or max_seqlen_q) from which the default takes the wide step
#: at a head dimension: below 2048 at 64 the narrow step of 64 is faster (an H200: 1.07x at
#: 1024 causal queries, 1.14x at 512, where a causal block's last step of 96 is mostly masked)
WIDE_MIN_QUERIES = {64: 2048, 128: 0}
WIDE_SPILLS = {64: ("softcap",), 128: ("softcap", "window", "varlen")}


def _fused_refusal(spilling: dict, head_dim: int, deterministic: bool, options: dict
                   ) -> str | None:
    """Why a one-kernel backward whose options that spill are ``spilling`` (head_dim -> the
    option names) cannot take a call, or None."""
    if head_dim not in spilling:
        return f"head_dim 64 or 128, got {head_dim}"
    if deterministic:
        return "deterministic=False (it adds dq by reductions in any order)"
    spills = [n for n in spilling[head_dim] if options.get(n)]
    if spills:
        return (f"none of {', '.join(spilling[head_dim])} at head_dim {head_dim} (its "
                f"registers would spill), got {', '.join(spills)}")
    return None


def wide_bwd_refusal(head_dim: int, deterministic: bool = False, **options) -> str | None:
    """Why the wide one-kernel backward ("sm90w") cannot take a call of ``head_dim`` with
    these options (``causal``, ``window``, ``softcap``, ``varlen``), or None."""
    return _fused_refusal(WIDE_SPILLS, head_dim, deterministic, options)


#: the head dimensions at which the default ("sm90") defers each step's dq product under the
#: next step's, and at which the deferred backward ("sm90d") takes the default's step; elsewhere
#: (128) "sm90d" takes its narrow step, the wide one's registers spilling, and the default does
#: not defer (an H200: at 64, 1.02-1.04x from 2048 queries and equal below; at 128 the narrow
#: deferred kernel is no faster than the wide default)
DEFER_DIMS = (64,)


#: the options with which the deferred dq backward would spill registers (ptxas for sm_90a)
DEFER_SPILLS = {64: (), 128: ("softcap",)}


def deferred_bwd_refusal(head_dim: int, deterministic: bool = False, **options) -> str | None:
    """Why the one-kernel backward with the deferred dq product ("sm90d") cannot take a call
    of ``head_dim`` with these options (``causal``, ``window``, ``softcap``, ``varlen``), or
    None."""
    return _fused_refusal(DEFER_SPILLS, head_dim, deterministic, options)


def fused_step(family: str, head_dim: int, seqlen_q: int | None = None, **options
               ) -> tuple[int, str]:
    """(queries a step, why) of the one-kernel backward of ``family`` at ``head_dim``:
    "sm90w" and "sm90n" pin the wide and the narrow step; "sm90" takes the wide one where
    :func:`wide_bwd_refusal` gives no reason (``options`` as its) and there are
    ``WIDE_MIN_QUERIES`` queries (``seqlen_q``; None: as many as needed), as "sm90d" does at
    ``DEFER_DIMS`` (elsewhere its narrow step). The reason says where the dq product is
    deferred (:func:`defers_dq`)."""
    narrow, wide = SM90_BWD_FUSED[head_dim][0], SM90_BWD_WIDE[head_dim]
    if family == "sm90w":
        return wide, f"the wide step of {wide} queries (pinned)"
    if family == "sm90n":
        return narrow, f"the narrow step of {narrow} queries (pinned)"
    deferred = "each step's dq product under the next step's"
    if family == "sm90d" and head_dim not in DEFER_DIMS:
        return narrow, (f"the narrow step of {narrow} queries (the wide one's registers "
                        f"would spill), {deferred} (pinned)")
    why = wide_bwd_refusal(head_dim, **options)
    if why is not None:
        step, why = narrow, f"the narrow step of {narrow} queries (the wide one takes {why})"
    elif seqlen_q is not None and seqlen_q < WIDE_MIN_QUERIES[head_dim]:
        step, why = narrow, (f"the narrow step of {narrow} queries (the wide one from "
                             f"{WIDE_MIN_QUERIES[head_dim]} queries at head_dim {head_dim}, "
                             f"got {seqlen_q})")
    else:
        step, why = wide, f"the wide step of {wide} queries"
    if family == "sm90d":
        return step, f"{why}, {deferred} (pinned)"
    return step, f"{why}, {deferred}" if defers_dq(family, head_dim) else why


def defers_dq(family: str, head_dim: int) -> bool:
    """Whether the one-kernel backward of ``family`` at ``head_dim`` issues each step's dq
    product under the next step's: "sm90d" always, the default "sm90" at ``DEFER_DIMS``."""
    return family == "sm90d" or (family == "sm90" and head_dim in DEFER_DIMS)


@dataclass(frozen=True)
class AttentionBwdSm90Spec(_Hopper, KernelSpec):
    """The dq or dkv kernel of the attention backward on Hopper (sm_90a, ``bwd_sm90.cu``): a
    block of 128 query rows (dq) or keys (dkv), a producer warpgroup loading by TMA (maps
    ``tma_q``, ``tma_k``, ``tma_v``, ``tma_do`` as the forward's), two consumer warpgroups of
    64 rows, ``step`` keys (dq) or queries (dkv) a step, dk and dv in ``dsplit`` column
    splits. Delta comes from the sm_80 backward's "dot" kernel. ``kind`` "dkvq" is the dkv
    kernel that also adds each step's dq into a float32 ``dq_accum`` by a bulk reduction
    (head_dim 64 and 128, dsplit 1; the "dot" kernel zeroes it, the "dqout" one converts
    it)."""

    kind: str
    dtype: DType
    head_dim: int
    step: int
    dsplit: int = 1
    stages: int = 2
    causal: bool = False
    window: bool = False
    softcap: bool = False
    varlen: bool = False
    defer_dq: bool = False
    segments: bool = False

    template = "attention/bwd_sm90.cu"

    FLAGS = ("causal", "window", "softcap", "varlen", "defer_dq", "segments")

    def __post_init__(self):
        if self.kind not in ("dq", "dkv", "dkvq"):
            raise ArgumentValueError(f"AttentionBwdSm90Spec.kind: expected 'dq', 'dkv' or "
                                     f"'dkvq', got {self.kind!r}")
        for name in ("step", "dsplit", "stages"):
            check_field(self, name, int)
        if self.step % 16 or not 16 <= self.step <= 256 or self.dsplit not in (1, 2) or (
                self.kind == "dq" and self.dsplit != 1) or (self.head_dim // self.dsplit) % 64:
            raise ArgumentValueError(f"AttentionBwdSm90Spec: expected step a multiple of 16 up "
                                     f"to 256 and dsplit 1 or 2 (dq: 1) leaving multiples of "
                                     f"64 columns, got {self.step} and {self.dsplit}")
        if self.stages not in (2, 3, 4):
            raise ArgumentValueError(f"AttentionBwdSm90Spec.stages: expected 2, 3 or 4, got "
                                     f"{self.stages}")
        if self.kind == "dkvq" and (self.dsplit != 1 or self.head_dim not in (64, 128)
                                    or (self.step // (2 if self.head_dim == 64 else 1)) % 16):
            raise ArgumentValueError(f"AttentionBwdSm90Spec: the dkvq kernel takes head_dim "
                                     f"64 or 128, dsplit 1 and a step of whole 16-query "
                                     f"groups per warpgroup, got head_dim {self.head_dim}, "
                                     f"dsplit {self.dsplit}, step {self.step}")
        self._check(SM90_BWD, f"step {self.step}")
        if self.defer_dq and self.kind != "dkvq":
            raise ArgumentValueError(f"AttentionBwdSm90Spec: expected defer_dq only with kind "
                                     f"'dkvq', got kind {self.kind!r}")
        self._check_segments()

    @property
    def smem_bytes(self) -> int:
        row = self.head_dim * 2
        # own tiles, the stages' tiles, (dkvq) two buffers of dS^T (step x 128 keys) and two
        # of dq's float32 (step x head_dim), 128 B of barriers, the stages' lse and delta
        ds = (2 * self.step * 256 + 2 * self.step * self.head_dim * 4
              if self.kind == "dkvq" else 0)
        return (2 * 128 * row + self.stages * 2 * self.step * row + ds + 128
                + self.stages * 8 * self.step + 1024)

    @property
    def kernel_name(self) -> str:
        split = f"x{self.dsplit}" if self.dsplit != 1 else ""
        stages = f"p{self.stages}" if self.stages != 2 else ""
        return (f"attn_bwd_{self.kind}_sm90_{self.dtype.value}_d{self.head_dim}_s{self.step}"
                f"{split}{stages}" + self._flags())

    @property
    def params(self) -> tuple[Param, ...]:
        """The tensor maps of q, k, v and do; lse and delta (float32); dq, dk, dv; dq_accum
        (float32, the dkvq kernel's); cu_seqlens_q, cu_seqlens_k; the element strides of dq,
        dk, dv along batch, sequence and head; ``B``, ``H``, ``H_kv``, ``S_q``, ``S_k``;
        ``scale``, ``softcap``; ``window_left``, ``window_right``; with ``segments``,
        ``seq_bounds`` (B, S, 2) int32 (:meth:`row_bounds`)."""
        t = self.dtype.ctype
        return (*tensor_maps("tma_q", "tma_k", "tma_v", "tma_do"),
                pointer("lse", "float", const=True), pointer("delta", "float", const=True),
                pointer("dq", t), pointer("dk", t), pointer("dv", t),
                pointer("dq_accum", "float"), pointer("cu_seqlens_q", "int", const=True),
                pointer("cu_seqlens_k", "int", const=True),
                *int64("dqb", "dqs", "dqh", "dkb", "dks", "dkh", "dvb", "dvs", "dvh",
                       "B", "H", "H_kv", "S_q", "S_k"),
                *double("scale", "softcap"), *int64("window_left", "window_right"),
                *self._segment_params())

    def grid(self, batch: int, heads: int, kv_heads: int, max_seqlen_q: int,
             max_seqlen_k: int) -> tuple[int, int, int]:
        if self.kind == "dq":
            return (max(1, -(-max_seqlen_q // 128)), heads, batch)
        return (max(1, -(-max_seqlen_k // 128)) * self.dsplit, kv_heads, batch)


def make_bwd_sm90_specs(dtype: DType, head_dim: int, **options
                        ) -> tuple[AttentionBwdSm90Spec, AttentionBwdSm90Spec]:
    """The Hopper backward's dq and dkv kernels for these options (``causal``, ``window``,
    ``softcap``, ``varlen``)."""
    if head_dim not in SM90_BWD:
        raise ArgumentValueError(f"head_dim: expected 64, 128 or 256, got {head_dim!r}")
    dq_step, dkv_step, dsplit, dq_stages, dkv_stages = SM90_BWD[head_dim]
    return (AttentionBwdSm90Spec("dq", dtype, head_dim, dq_step, stages=dq_stages, **options),
            AttentionBwdSm90Spec("dkv", dtype, head_dim, dkv_step, dsplit, dkv_stages,
                                 **options))


def fused_bwd(family: str, head_dim: int, deterministic: bool) -> bool:
    """Whether the backward of ``family`` is the Hopper one-kernel backward (dq by bulk
    reductions): on "sm90" and "sm90n" at head_dim 64 and 128 unless ``deterministic``, and
    "sm90w" (its wide step, :func:`wide_bwd_refusal` says where) and "sm90d" (the deferred dq
    product, :func:`deferred_bwd_refusal`)."""
    return (family in ("sm90w", "sm90d")
            or (family in ("sm90", "sm90n") and head_dim in (64, 128) and not deterministic))


def bwd_specs_for(family: str, dtype: DType, head_dim: int, *, deterministic: bool = False,
                  seqlen_q: int | None = None, **options) -> tuple:
    """The backward's kernels of ``family``, in launch order, for these options: "sm90" the
    sm_80 "dot" kernel, the Hopper "dkvq" kernel (dk, dv and dq by bulk reductions) and the
    sm_80 "dqout" one, or with ``deterministic`` (and at head_dim 256) "dot" and the Hopper dq and
    dkv. The one-kernel backward's step is :func:`fused_step`'s
    ("sm90w" pins the wide step, refusing where it would spill; "sm90n" the narrow one;
    "sm90d" each step's dq product deferred under the next step's, as the default does at
    ``DEFER_DIMS``: :func:`defers_dq`).
    "sm80": the three sm_80 kernels (deterministic)."""
    refusal = {"sm90w": wide_bwd_refusal, "sm90d": deferred_bwd_refusal}.get(family)
    why = refusal(head_dim, deterministic, **options) if refusal is not None else None
    if why is not None:
        raise ArgumentValueError(f"config: {family!r} takes {why}")
    specs = make_bwd_specs(dtype, head_dim, **options)
    if fused_bwd(family, head_dim, deterministic):
        step, _ = fused_step(family, head_dim, seqlen_q, **options)
        stages = SM90_BWD_FUSED[head_dim][1]
        fused = AttentionBwdSm90Spec("dkvq", dtype, head_dim, step, stages=stages,
                                     defer_dq=defers_dq(family, head_dim), **options)
        out = AttentionBwdSpec("dqout", dtype, head_dim, specs[0].config,
                               varlen=specs[0].varlen)
        return (specs[0], fused, out)
    if family in ("sm90", "sm90n"):
        return (specs[0], *make_bwd_sm90_specs(dtype, head_dim, **options))
    return specs
