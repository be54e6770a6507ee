"""attention: the call. :func:`attention` checks every argument before anything is launched
(:func:`checked` gives a :class:`Call`: the spec, the sizes, the element strides, the scalars),
launches the forward kernel (``spec.py``) and stores the call's launch as a prepared call and a
compiled-path program for the next call of its signature.

Layouts (FlashAttention's): dense q (B, S_q, H, D), k and v (B, S_k, H_kv, D) (``layout``
None or "bshd"), or q (B, H, S_q, D), k and v (B, H_kv, S_k, D) (``layout="bhsd"``: read by
its strides, never copied); packed (varlen) q (total_q, H, D), k and v (total_k, H_kv, D) with
``cu_seqlens_q`` and ``cu_seqlens_k`` (int32, B + 1 entries each) and ``max_seqlen_q``,
``max_seqlen_k`` (the longest lengths: the grid's size). The output has q's shape and type.

The contents of ``cu_seqlens_q`` and ``cu_seqlens_k`` are the caller's contract: they live on
the GPU and reading them would synchronize, so only their type, shape, device and layout are
checked. They must start at 0, not decrease and stay within the packed rows (``cu[-1] <=
total``), and no sequence may be longer than ``max_seqlen_q`` / ``max_seqlen_k``; otherwise
the kernel reads and writes out of bounds or skips rows.

Several sequences a row of a dense batch (packed sequences of one length per row, as a data
collator that concatenates documents makes them) take ``seq_bounds`` instead: int32 (B, S, 2),
each token's sequence's first token and one past its last within its row. Their contents are
the caller's contract too (unread); the kernels clamp every bound to the row, so wrong bounds
give wrong rows, never an access out of bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral

from ...errors import ArgumentTypeError, ArgumentValueError, DeviceMismatchError
from ...jit import fastlaunch
from ...jit.device import sm_count
from ...jit.fastlaunch import Map, Ptr
from ...jit.loader import launcher_for
from ...runtime.arrays import call_arguments, views
from ...runtime.checks import (
    check_aligned,
    check_apart,
    check_array,
    check_bool,
    check_host_scale,
    check_out,
    check_same_device,
    check_scalar,
)
from ...runtime.dtypes import SUPPORTED_DTYPES, DType
from ...runtime.prepared import OverlapGuard, PreparedCalls
from .spec import (
    DTYPES,
    HEAD_DIMS,
    SM90_CONFIGS,
    AttentionConfig,
    AttentionFwdSm90Spec,
    AttentionFwdSpec,
    AttentionSm90Config,
    candidates_for,
    default_config,
    heads_group,
    spec_for,
)

#: the array arguments, in the order of the signature
ARRAYS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seq_bounds", "out")
#: the other arguments, in the order of the signature
OPTIONS = ("causal", "scale", "window", "softcap", "max_seqlen_q", "max_seqlen_k",
           "return_lse", "layout", "config")
#: a prepared call's and a program's arguments: the arrays, then lse (an output slot that no
#: caller fills: the program allocates it with ``return_lse``)
_SLOTS = (*ARRAYS, "lse")
_OUT, _LSE = 6, 7
_PREPARED = PreparedCalls("attention")
#: the compiled launch path's programs (``jit.fastlaunch``): the arrays and lse's slot, then
#: the options by value
_COMPILED = fastlaunch.Table("attention", "A" * len(_SLOTS) + "V" * len(OPTIONS))
#: float32's largest value: the kernel's scalars (scale log2(e), scale / softcap, softcap
#: log2(e)) are float32
FLT_MAX = 3.4028234663852886e38
LOG2E = 1.4426950408889634
#: every argument but q, k, v, with its default
DEFAULTS = {"causal": False, "scale": None, "window": None, "softcap": None,
            "cu_seqlens_q": None, "cu_seqlens_k": None, "max_seqlen_q": None,
            "max_seqlen_k": None, "seq_bounds": None, "return_lse": False, "out": None,
            "layout": None, "config": None}
LAYOUTS = ("bshd", "bhsd")
#: the kernel's lengths are 32-bit (and so are cu_seqlens' entries)
MAX_LEN = 2**31 - 1
#: the grid's y (heads) and z (batch) dimensions
MAX_GRID_YZ = 65535
#: the kernel's 16-byte cp.async copies and stores: pointers aligned to 16 bytes, strides
#: multiples of 8 (16-bit) elements
ALIGN_BYTES = 16
ALIGN_ELEMENTS = 8
_DTYPE_TEXT = " or ".join(d.numpy_name for d in DTYPES)
_DIMS_TEXT = ", ".join(map(str, HEAD_DIMS[:-1])) + f" or {HEAD_DIMS[-1]}"


@dataclass(frozen=True, eq=False)
class Call:
    """A checked attention call: the arrays (CuPy views; ``out``, ``cu_seqlens_q``,
    ``cu_seqlens_k``, ``seq_bounds`` None when not given), the problem's sizes, the element
    strides the kernel takes and the spec it runs.

    Sizes: ``batch`` B (varlen: the number of sequences), ``heads`` H, ``kv_heads`` H_kv,
    ``seqlen_q`` S_q and ``seqlen_k`` S_k (varlen: ``max_seqlen_q`` / ``max_seqlen_k``, the
    longest), ``head_dim`` D, ``total_q`` and ``total_k`` (the rows of q and of k and v in
    token-major order: B * S dense, the packed rows varlen). Strides: (batch, seq, head) in
    elements of q, k, v and of the output (the given ``out``'s, else those of a new output
    contiguous in the caller's layout, which the op allocates), the batch stride 0 with
    varlen (unused). ``window``: (left, right), -1 for an unbounded side, right 0 with
    ``causal``. ``scale``: the scores' factor (1 / sqrt(D) by default); ``softcap``: 0 for
    none. ``out_shape``: the output's (q's) shape; ``lse_shape``: (B, H, S_q) dense,
    (H, total_q) varlen, float32 contiguous. ``empty``: the output has no element (B, H,
    S_q or total_q 0): nothing to launch. ``no_keys``: the output has elements but no row
    sees a key (S_k or total_k 0): the output is 0 and lse -inf (the kernel writes them
    without reading k or v). ``key``: the tuning database's key of the call; ``reason``: why
    its config ("pinned", "tuned", "default"); ``arch``: the device's compute capability (90:
    the Hopper kernel is a candidate)."""

    q: object
    k: object
    v: object
    out: object
    cu_seqlens_q: object
    cu_seqlens_k: object
    seq_bounds: object
    dtype: DType
    layout: str
    varlen: bool
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    total_q: int
    total_k: int
    q_strides: tuple[int, int, int]
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    out_strides: tuple[int, int, int]
    causal: bool
    window: tuple[int, int]
    scale: float
    softcap: float
    return_lse: bool
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]
    empty: bool
    no_keys: bool
    spec: AttentionFwdSpec | AttentionFwdSm90Spec
    key: dict
    reason: str
    arch: int

    @property
    def config(self) -> AttentionConfig | AttentionSm90Config:
        return self.spec.config

    @property
    def hopper(self) -> bool:
        """Whether the call runs the Hopper kernel (TMA loads by tensor maps)."""
        return isinstance(self.spec, AttentionFwdSm90Spec)


def attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              seq_bounds=None, return_lse=False, out=None, layout=None, config=None):
    """Fused attention, ``softmax(q k^T * scale [masked] [soft-capped]) v`` per head, in one
    launch, never holding the (S_q x S_k) scores in memory: float32 scores and softmax
    statistics, 16-bit P and output.

    Args:
        q: a GPU array (``cupy.ndarray``, ``torch.Tensor`` on a CUDA device, or an object
            with ``__cuda_array_interface__``), float16 or bfloat16, of shape (batch, seq_q,
            heads, head_dim) (``layout`` None or "bshd"), (batch, heads, seq_q, head_dim)
            (``layout="bhsd"``), or (total_q, heads, head_dim) with ``cu_seqlens_q`` (packed
            sequences); head_dim 64, 128 or 256. Read by its strides, never copied: unit
            stride along head_dim, a 16-byte aligned pointer, the other strides multiples of
            8 elements.
        k: of q's type and head_dim, in q's layout, with ``seq_k`` keys and ``kv_heads``
            heads dividing q's (grouped-query attention: query head ``h`` reads kv head ``h
            // (heads // kv_heads)``; 1: multi-query).
        v: of k's shape and q's type.
        causal: key ``j`` allowed for row ``i`` only up to ``i + seq_k - seq_q``: the causal
            mask aligned to the bottom right, as FlashAttention aligns it when ``seq_q !=
            seq_k``.
        scale: the scores' factor (None: ``1 / sqrt(head_dim)``); positive and finite.
        window: None, or ``(left, right)``: key ``j`` allowed for row ``i`` only from ``i +
            seq_k - seq_q - left`` to ``i + seq_k - seq_q + right`` (-1: that side unbounded;
            ``causal`` makes ``right`` 0): sliding-window (local) attention.
        softcap: None or 0 (none), or a positive number: the scores become ``softcap *
            tanh(scores / softcap)`` (Gemma 2, Grok).
        cu_seqlens_q: packed (variable-length) sequences: an int32 array of B + 1 cumulative
            lengths (FlashAttention's ``cu_seqlens``); sequence ``b`` is rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q. Its contents are the caller's
            contract (reading them would wait for the GPU): they must start at 0, never
            decrease, stay within the rows, and no sequence may be longer than
            ``max_seqlen_q``.
        cu_seqlens_k: with cu_seqlens_q, the same for k and v (``max_seqlen_k``).
        max_seqlen_q: with cu_seqlens, the longest sequence of q.
        max_seqlen_k: with cu_seqlens, the longest sequence of k and v.
        seq_bounds: several sequences a row of a dense batch (seq_q == seq_k, the same tokens'
            queries and keys): an int32 array (batch, seq, 2), C-contiguous, of each token's
            sequence's first token and one past its last within its row (a token of no
            sequence, padding say, ``(t, t)``: output 0). Query ``i`` then sees only the keys
            of its sequence, with the masks above within it. Every token of a sequence has
            the same bounds, and the sequences follow each other along the row. Unread, as
            cu_seqlens (``ge2jit.torch.sequence_bounds`` makes them from sequence ids).
        return_lse: also return the rows' log-sum-exp of the scaled (and capped) scores, in
            float32: (batch, heads, seq_q), or (heads, total_q) with cu_seqlens (what the
            backward takes). A row that allows no key has ``lse = -inf`` and output 0.
        out: None (a new array of q's shape, C-contiguous), or an array of q's shape and type
            with the same layout rules as q, apart from q, k and v.
        layout: None or "bshd" (sequence before heads), or "bhsd" (heads before sequence).
        config: None (the head dimension's default tiling), or a config name or an
            ``AttentionConfig`` among ``CONFIGS[head_dim]``.

    Returns:
        The output, in q's framework (with ``return_lse``, ``(out, lse)``), on PyTorch's
        current stream for tensors.

    Raises:
        ArgumentTypeError: an argument of the wrong kind.
        ArgumentValueError: a shape, type, stride, alignment or option the kernel cannot
            take, named in one line, before anything is launched.
    """
    options = (causal, scale, window, softcap, max_seqlen_q, max_seqlen_k, return_lse, layout,
               config)
    done = _COMPILED.call(q, k, v, cu_seqlens_q, cu_seqlens_k, seq_bounds, out, None, *options)
    if done is not fastlaunch.MISS:
        return done
    arrays = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q,
              "cu_seqlens_k": cu_seqlens_k, "seq_bounds": seq_bounds, "out": out}
    try:
        hash(options)
    except TypeError:   # a window given as a list, say: checked and run, not kept
        options = None

    def first(fw, device_id, v_, native):
        given = dict(zip(OPTIONS, (causal, scale, window, softcap, max_seqlen_q,
                                   max_seqlen_k, return_lse, layout, config)))
        call = checked({**given, **v_}, device_id)
        result, prepared = _execute(fw, device_id, call, native)
        if prepared is not None and options is not None:
            _COMPILED.put((q, k, v, cu_seqlens_q, cu_seqlens_k, seq_bounds, out, None,
                           *options),
                          prepared.program, fw.name)
        return result, prepared if options is not None else None

    return _PREPARED.run(arrays, options if options is not None else (object(),), first)


def clear_plans() -> None:
    """Forget the stored launches (after ``tune`` stored a config: the next call chooses
    again)."""
    _PREPARED.clear()
    _COMPILED.clear()


def _execute(fw, device_id: int, call: Call, native: dict):
    """Launch a checked call; (its result, its prepared call: None for an empty one)."""
    make_out = fw.allocator(call.q.dtype, device_id)
    make_lse = fw.allocator("float32", device_id) if call.return_lse else None
    o = native["out"] if native["out"] is not None else make_out(call.out_shape)
    lse = make_lse(call.lse_shape) if make_lse is not None else None
    result = (o, lse) if call.return_lse else o
    if call.empty:
        return result, None
    grid, block, smem, params = launch_params(call, sm_count(device_id))
    kernel = launcher_for(call.spec, device_id)
    launch = kernel.bind(grid, block, smem, **params)
    stream, ptr = fw.stream_getter(device_id), fw.ptr
    geometry = map_geometry(call) if call.hopper else None
    maps = {} if geometry is None else tensor_maps(
        call, geometry, (call.q.data.ptr, call.k.data.ptr, call.v.data.ptr))
    launch(stream(), **pointers(call, fw.view(o, "out"),
                                None if lse is None else fw.view(lse, "lse")), **maps)
    given = native["out"] is not None
    guard = None
    if given:
        arrays = (call.q, call.k, call.v, call.cu_seqlens_q, call.cu_seqlens_k,
                  call.seq_bounds, call.out)
        guard = OverlapGuard(ARRAYS, arrays, (_OUT,)) or None
    return_lse, segments = call.return_lse, call.spec.segments

    def prepared(q, k, v, cu_q, cu_k, bounds, out):
        ptrs = (ptr(q), ptr(k), ptr(v), 0 if cu_q is None else ptr(cu_q),
                0 if cu_k is None else ptr(cu_k), 0 if bounds is None else ptr(bounds))
        if out is None:
            out = make_out(call.out_shape)
        elif guard is not None:
            guard((*ptrs, ptr(out)))
        lse_ = make_lse(call.lse_shape) if return_lse else None
        inputs = (dict(q=ptrs[0], k=ptrs[1], v=ptrs[2]) if geometry is None
                  else tensor_maps(call, geometry, ptrs))
        if segments:
            inputs["seq_bounds"] = ptrs[5]
        launch(stream(), **inputs, o=ptr(out), lse=0 if lse_ is None else ptr(lse_),
               cu_seqlens_q=ptrs[3], cu_seqlens_k=ptrs[4])
        return (out, lse_) if return_lse else out

    allocs = [] if given else [(_OUT, make_out, call.out_shape)]
    if return_lse:
        allocs.append((_LSE, make_lse, call.lse_shape))
    if geometry is None:
        inputs = {"q": Ptr(0), "k": Ptr(1), "v": Ptr(2)}
    else:   # each map moved to its array's address at every call
        addresses = (call.q.data.ptr, call.k.data.ptr, call.v.data.ptr)
        inputs = {name: Map(geometry[name][0], blob, addresses[geometry[name][0]])
                  for name, blob in maps.items()}
    if segments:
        inputs["seq_bounds"] = Ptr(5)
    prepared.program = fastlaunch.program(
        fw.name, [fastlaunch.step(kernel, grid, block, smem, {
            **params, **inputs, "cu_seqlens_q": Ptr(3), "cu_seqlens_k": Ptr(4),
            "o": Ptr(_OUT), "lse": Ptr(_LSE)})],
        allocs, guard.pairs if guard is not None else (), guard, stream,
        fastlaunch.launch_failed(call.spec.kernel_name),
        returns=(_OUT, _LSE) if return_lse else (_OUT,))
    return result, prepared


def check_arguments(q, k, v, **kwargs):
    """(framework, device, the arrays as the framework reads them, the checked :class:`Call`)
    of a call's arguments as ``ge2jit.attention`` takes them (keywords as its own, defaults
    as :data:`DEFAULTS`): the first call of an argument pattern."""
    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise ArgumentTypeError(f"{unknown[0]}: not an argument of attention (it takes "
                                f"{', '.join(DEFAULTS)})")
    args = {**DEFAULTS, **kwargs, "q": q, "k": k, "v": v}
    fw, device_id, native = call_arguments({name: args[name] for name in ARRAYS})
    call = checked({**args, **views(fw, native)}, device_id)
    return fw, device_id, native, call


def checked(args: dict, device_id: int | None = None) -> Call:
    """A call's arguments by name (arrays as CuPy views; absent keys take :data:`DEFAULTS`)
    checked as the call checks them, each refusal one line naming the argument; with the
    spec it runs. ``device_id``: the device the call runs on (None: q's); every array must
    be on it."""
    a = {**DEFAULTS, **args}
    causal = check_bool(a["causal"], "causal")
    return_lse = check_bool(a["return_lse"], "return_lse")
    q, k, v = a["q"], a["k"], a["v"]
    cu_q, cu_k = a["cu_seqlens_q"], a["cu_seqlens_k"]
    varlen = cu_q is not None or cu_k is not None
    for name, x, other in (("cu_seqlens_q", cu_q, "cu_seqlens_k"),
                           ("cu_seqlens_k", cu_k, "cu_seqlens_q")):
        if varlen and x is None:
            raise ArgumentValueError(f"{name}: expected an int32 array with {other} (packed "
                                     f"sequences take both), got None")
    layout = _layout(a["layout"], varlen)

    # the inputs: types, dimensions, sizes
    b, s_q, h, d, q_axes = _dims(q, "q", layout, varlen)
    dtype = _dtype(q, "q")
    b_k, s_k, h_kv, d_k, k_axes = _dims(k, "k", layout, varlen)
    _same_dtype(k, "k", q)
    b_v, s_v, h_v, d_v, v_axes = _dims(v, "v", layout, varlen)
    _same_dtype(v, "v", q)
    _check_shapes(q, k, v, (b, h, d), (b_k, h_kv, d_k), d_v, varlen)

    b, s_q, s_k, total_q, total_k = _lengths(a, varlen, b, s_q, s_k)
    bounds = a["seq_bounds"]
    if bounds is not None:
        _check_seq_bounds(bounds, varlen, b, s_q, s_k)

    # the inputs' layouts in memory
    q_strides = _strides(q, "q", q_axes)
    k_strides = _strides(k, "k", k_axes)
    v_strides = _strides(v, "v", v_axes)

    # the output
    out = a["out"]
    if out is None:
        out_strides = _new_strides(q.shape, q_axes)
    else:
        out_strides = _check_output(out, q, q_axes, {"q": q, "k": k, "v": v,
                                                     "cu_seqlens_q": cu_q,
                                                     "cu_seqlens_k": cu_k,
                                                     "seq_bounds": bounds})
    arrays = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
              "seq_bounds": bounds, "out": out}
    _check_devices(arrays, device_id)

    # the scalars
    window = _window(a["window"], causal)
    scale = 1.0 / math.sqrt(d) if a["scale"] is None else _scale(a["scale"])
    softcap = _softcap(a["softcap"])
    if softcap and scale / softcap > FLT_MAX:
        raise ArgumentValueError(f"softcap: expected at least scale / {FLT_MAX:.4g} = "
                                 f"{scale / FLT_MAX:.4g} (the kernel takes scale / softcap as a "
                                 f"float32), got {a['softcap']!r}")
    has_window = window[0] >= 0 or (not causal and window[1] >= 0)
    key = {"dtype": dtype.value, "head_dim": d, "causal": causal, "window": has_window,
           "softcap": softcap > 0, "varlen": varlen, "lse": return_lse,
           "seqlen_q": _bucket(s_q), "seqlen_k": _bucket(s_k), "rows": _bucket(b * h)}
    if bounds is not None:   # (only then: the keys tuned before seq_bounds stay valid)
        key["segments"] = True
    lse_shape = (h, total_q) if varlen else (b, h, s_q)
    empty = b == 0 or h == 0 or s_q == 0 or total_q == 0
    no_keys = not empty and (s_k == 0 or total_k == 0)
    # the Hopper kernel's tensor maps need arrays with elements: without keys, the sm_80 one
    arch = device_arch_number(q.data.device_id if device_id is None else device_id)
    config, reason = _config(a["config"], d, key, 80 if no_keys or empty else arch, s_k,
                             causal)
    spec = spec_for(config, dtype, d, causal=causal, window=has_window, softcap=softcap > 0,
                    varlen=varlen, write_lse=return_lse, segments=bounds is not None)
    return Call(q, k, v, out, cu_q, cu_k, bounds, dtype, layout, varlen, b, h, h_kv, s_q, s_k, d,
                total_q, total_k, q_strides, k_strides, v_strides, out_strides, causal, window,
                scale, softcap, return_lse, tuple(q.shape), lse_shape, empty, no_keys, spec,
                key, reason, arch)


def _bucket(n: int) -> int:
    """``n`` rounded up to a power of two (a tuning key's size)."""
    return 1 << max(n - 1, 0).bit_length()


def _check_shapes(q, k, v, q_dims: tuple, k_dims: tuple, d_v: int, varlen: bool) -> None:
    """q's (batch, heads, head_dim) and k's against each other, v's shape against k's."""
    (b, h, d), (b_k, h_kv, d_k) = q_dims, k_dims
    if d not in HEAD_DIMS:
        raise ArgumentValueError(f"q: expected head_dim {_DIMS_TEXT} (the kernel's), got {d} "
                                 f"(shape {q.shape})")
    for name, x, dx in (("k", k, d_k), ("v", v, d_v)):
        if dx != d:
            raise ArgumentValueError(f"{name}: expected q's head_dim {d} (one head_dim for q, "
                                     f"k and v), got {dx} (shape {x.shape})")
    if v.shape != k.shape:
        raise ArgumentValueError(f"v: expected k's shape {k.shape}, got {v.shape}")
    if not varlen and b_k != b:
        raise ArgumentValueError(f"k: expected q's batch {b}, got {b_k} (shape {k.shape})")
    if (h_kv == 0 and h != 0) or (h_kv and h % h_kv):
        raise ArgumentValueError(f"k: expected a number of heads that divides q's {h} "
                                 f"(grouped-query attention), got {h_kv} (shape {k.shape})")
    if h > MAX_GRID_YZ:
        raise ArgumentValueError(f"q: expected at most {MAX_GRID_YZ} heads (the grid's y), got "
                                 f"{h}")


def _lengths(a: dict, varlen: bool, b: int, s_q: int, s_k: int) -> tuple:
    """(batch, S_q, S_k, total_q, total_k): dense from the shapes (``s_q``, ``s_k``), varlen
    from cu_seqlens (``s_q``, ``s_k``: the packed rows) and max_seqlen_q / max_seqlen_k."""
    if varlen:
        b = _check_cu_seqlens(a["cu_seqlens_q"], a["cu_seqlens_k"])
        for name, n in (("q", s_q), ("k", s_k)):
            if n > MAX_LEN:
                raise ArgumentValueError(f"{name}: expected at most {MAX_LEN} packed rows "
                                         f"(int32 cu_seqlens), got {n}")
        return (b, _max_seqlen(a["max_seqlen_q"], "max_seqlen_q"),
                _max_seqlen(a["max_seqlen_k"], "max_seqlen_k"), s_q, s_k)
    for name in ("max_seqlen_q", "max_seqlen_k"):
        if a[name] is not None:
            raise ArgumentValueError(f"{name}: expected None without cu_seqlens_q and "
                                     f"cu_seqlens_k (dense inputs' lengths are their shapes), "
                                     f"got {a[name]!r}")
    for name, n in (("q", s_q), ("k", s_k)):
        if n > MAX_LEN:
            raise ArgumentValueError(f"{name}: expected a sequence of at most {MAX_LEN} rows, "
                                     f"got {n}")
    if b > MAX_GRID_YZ:
        raise ArgumentValueError(f"q: expected a batch of at most {MAX_GRID_YZ} (the grid's "
                                 f"z), got {b}")
    return b, s_q, s_k, b * s_q, b * s_k


def _layout(layout, varlen: bool) -> str:
    if layout is None:
        return "bshd"
    if not isinstance(layout, str):
        raise ArgumentTypeError(f"layout: expected None, 'bshd' or 'bhsd', got "
                                f"{type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ArgumentValueError(f"layout: expected None, 'bshd' or 'bhsd', got {layout!r}")
    if varlen and layout != "bshd":
        raise ArgumentValueError(f"layout: expected None or 'bshd' with cu_seqlens (packed "
                                 f"(total, heads, head_dim) inputs), got {layout!r}")
    return layout


_SHAPES = {"bshd": "(batch, seq, heads, head_dim)", "bhsd": "(batch, heads, seq, head_dim)"}


def _dims(x, name: str, layout: str, varlen: bool):
    """(batch, seq, heads, head_dim, the axes of batch, seq and heads) of q, k, v or out in
    ``layout`` (varlen: batch None, seq the packed rows, axis of batch None)."""
    check_array(x, name)
    if varlen:
        if x.ndim != 3:
            raise ArgumentValueError(f"{name}: expected 3 dimensions (total, heads, head_dim) "
                                     f"with cu_seqlens, got shape {x.shape}")
        t, h, d = x.shape
        return None, t, h, d, (None, 0, 1)
    if x.ndim != 4:
        raise ArgumentValueError(f"{name}: expected 4 dimensions {_SHAPES[layout]} "
                                 f"(layout {layout!r}), got shape {x.shape}"
                                 + ("; packed inputs take cu_seqlens_q and cu_seqlens_k"
                                    if x.ndim == 3 else ""))
    if layout == "bhsd":
        b, h, s, d = x.shape
        return b, s, h, d, (0, 2, 1)
    b, s, h, d = x.shape
    return b, s, h, d, (0, 1, 2)


def _dtype(x, name: str) -> DType:
    dt = SUPPORTED_DTYPES.get(x.dtype.name)
    if dt not in DTYPES:
        raise ArgumentValueError(f"{name}: expected dtype {_DTYPE_TEXT} (the kernel's 16-bit "
                                 f"inputs), got {x.dtype}")
    return dt


def _same_dtype(x, name: str, q) -> None:
    if x.dtype != q.dtype:
        raise ArgumentValueError(f"{name}: expected q's dtype {q.dtype}, got {x.dtype}")


def _strides(x, name: str, axes) -> tuple[int, int, int]:
    """The (batch, seq, head) element strides of ``x`` (0 for no batch axis), after checking
    what the kernel's 16-byte copies need: unit stride along head_dim, a 16-byte aligned
    pointer, strides of 8-element multiples (of the dimensions longer than 1). An empty array
    is read nowhere: nothing checked."""
    item = x.itemsize
    if x.size:
        if x.strides[-1] != item:
            raise ArgumentValueError(f"{name}: expected unit stride along head_dim, got strides "
                                     f"{x.strides} (bytes); pass {name}.contiguous() (a copy)")
        if x.data.ptr % ALIGN_BYTES:
            raise ArgumentValueError(
                f"{name}: expected a {ALIGN_BYTES}-byte aligned pointer (the kernel's 16-byte "
                f"copies), got one {x.data.ptr % ALIGN_BYTES} bytes past that; pass a copy "
                f"({name}.clone() or cupy.array({name}): new memory is aligned)")
        for axis in axes:
            if axis is not None and x.shape[axis] > 1 and x.strides[axis] % (ALIGN_ELEMENTS
                                                                             * item):
                raise ArgumentValueError(
                    f"{name}: expected strides that are multiples of {ALIGN_ELEMENTS} elements "
                    f"({ALIGN_BYTES} bytes: the kernel's 16-byte copies) but along head_dim, "
                    f"got strides {x.strides} (bytes); pass {name}.contiguous() (a copy)")
    return tuple(0 if axis is None else x.strides[axis] // item for axis in axes)


def _new_strides(shape: tuple, axes) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of a new C-contiguous array of ``shape``."""
    st, acc = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        st[i], acc = acc, acc * max(shape[i], 1)
    return tuple(0 if axis is None else st[axis] for axis in axes)


def _check_output(out, q, axes, inputs: dict) -> tuple[int, int, int]:
    """``out``'s (batch, seq, head) element strides, after checking it: q's shape and dtype,
    the kernel's layout rules, each element once and apart from every input (the kernel
    does not write in place: other blocks read k and v while o is written)."""
    check_array(out, "out")
    if out.shape != q.shape:
        raise ArgumentValueError(f"out: expected shape {q.shape} (q's), got {out.shape}")
    if out.dtype != q.dtype:
        raise ArgumentValueError(f"out: expected q's dtype {q.dtype}, got {out.dtype}")
    strides = _strides(out, "out", axes)
    check_out(out, {}, "out")   # each element once (no broadcast view)
    check_apart(out, "out", inputs, lambda other: " (attention does not write in place)")
    return strides


def _check_cu_seqlens(cu_q, cu_k) -> int:
    """B, the number of sequences, of the two cu_seqlens arrays (int32, 1-D contiguous, of
    equal length B + 1 >= 1, aligned). Their values are not read."""
    for name, x in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        _check_int32(x, name)
        if x.ndim != 1 or x.shape[0] < 1:
            raise ArgumentValueError(f"{name}: expected a 1-D array of B + 1 >= 1 entries, got "
                                     f"shape {x.shape}")
        if x.shape[0] > 1 and x.strides[0] != x.itemsize:
            raise ArgumentValueError(f"{name}: expected a contiguous array, got strides "
                                     f"{x.strides} (bytes); pass {name}.contiguous()")
        check_aligned(x, name)
    if cu_k.shape != cu_q.shape:
        raise ArgumentValueError(f"cu_seqlens_k: expected cu_seqlens_q's length "
                                 f"{cu_q.shape[0]} (B + 1), got {cu_k.shape[0]}")
    b = cu_q.shape[0] - 1
    if b > MAX_GRID_YZ:
        raise ArgumentValueError(f"cu_seqlens_q: expected at most {MAX_GRID_YZ} sequences (the "
                                 f"grid's z), got {b}")
    return b


def _check_int32(x, name: str) -> None:
    """``x`` a GPU array of int32 (cu_seqlens, seq_bounds)."""
    check_array(x, name)
    if x.dtype.name != "int32":
        raise ArgumentValueError(f"{name}: expected dtype int32, got {x.dtype}")


def _check_seq_bounds(x, varlen: bool, b: int, s_q: int, s_k: int) -> None:
    """``seq_bounds``: int32 (B, S, 2), C-contiguous and aligned, of a dense call whose queries
    and keys are the same tokens (S_q == S_k). Its values are not read."""
    if varlen:
        raise ArgumentValueError("seq_bounds: expected None with cu_seqlens (packed sequences "
                                 "are apart already), got an array")
    if s_q != s_k:
        raise ArgumentValueError(f"seq_bounds: expected q and k of one length (each token's "
                                 f"sequence among the same tokens), got seq_q {s_q} and seq_k "
                                 f"{s_k}")
    _check_int32(x, "seq_bounds")
    if tuple(x.shape) != (b, s_q, 2):
        raise ArgumentValueError(f"seq_bounds: expected shape {(b, s_q, 2)} (batch, seq, 2), "
                                 f"got {tuple(x.shape)}")
    if x.size and not x.flags.c_contiguous:
        raise ArgumentValueError(f"seq_bounds: expected a contiguous array, got strides "
                                 f"{x.strides} (bytes); pass seq_bounds.contiguous()")
    check_aligned(x, "seq_bounds")


def _max_seqlen(x, name: str) -> int:
    if x is None:
        raise ArgumentValueError(f"{name}: expected an int with cu_seqlens (the longest "
                                 f"sequence: the grid's size), got None")
    if isinstance(x, bool) or not isinstance(x, Integral):
        raise ArgumentTypeError(f"{name}: expected an int, got {x!r}")
    if not 0 <= x <= MAX_LEN:
        raise ArgumentValueError(f"{name}: expected an int from 0 to {MAX_LEN} (the longest "
                                 f"sequence), got {x}")
    return int(x)


def _check_devices(arrays: dict, device_id: int | None) -> None:
    if device_id is not None:
        check_same_device(arrays, device_id)
        return
    device = arrays["q"].data.device_id
    for name, x in arrays.items():
        if x is not None and x.data.device_id != device:
            raise DeviceMismatchError(f"{name}: expected an array on q's device (GPU "
                                      f"{device}), got one on GPU {x.data.device_id}; move it "
                                      f"there")


def _window(window, causal: bool) -> tuple[int, int]:
    """(left, right), -1 for an unbounded side; ``causal`` makes right 0. A side of 2^31 or
    more bounds nothing (lengths are below 2^31): it becomes -1."""
    if window is None:
        left, right = -1, -1
    else:
        if not isinstance(window, tuple | list) or len(window) != 2:
            raise ArgumentTypeError(f"window: expected None or a (left, right) pair of ints, "
                                    f"got {window!r}")
        for side in window:
            if isinstance(side, bool) or not isinstance(side, Integral):
                raise ArgumentTypeError(f"window: expected a (left, right) pair of ints, got "
                                        f"{tuple(window)!r}")
            if side < -1:
                raise ArgumentValueError(f"window: expected sides >= -1 (-1: unbounded), got "
                                         f"{tuple(window)!r}")
        left, right = (-1 if side > MAX_LEN else int(side) for side in window)
    return left, 0 if causal else right


def _scale(x) -> float:
    check_host_scale(x, "scale")   # a real number, positive and finite
    if float(x) * LOG2E > FLT_MAX:
        raise ArgumentValueError(f"scale: expected at most {FLT_MAX / LOG2E:.4g} (the kernel "
                                 f"takes scale * log2(e) as a float32), got {x!r}")
    return float(x)


def _softcap(x) -> float:
    if x is None:
        return 0.0
    value = check_scalar(x, "softcap")
    if not 0 <= value < math.inf:
        raise ArgumentValueError(f"softcap: expected None or a finite number >= 0 (0: none), "
                                 f"got {x!r}")
    if value * LOG2E > FLT_MAX:
        raise ArgumentValueError(f"softcap: expected at most {FLT_MAX / LOG2E:.4g} (the kernel "
                                 f"takes softcap * log2(e) as a float32), got {x!r}")
    return value


def device_arch_number(device_id: int) -> int:
    """The compute capability of ``device_id`` as a number (90 for sm_90)."""
    from ...jit.device import device_arch
    from ...jit.nvrtc import arch_number

    return arch_number(device_arch(device_id))


def _config(config, d: int, key: dict, arch: int, seqlen_k: int, causal: bool) -> tuple:
    """(the config, why) for head_dim ``d`` on a device of compute capability ``arch``:
    ``config`` ("pinned": one of the candidates, by name or as a config object: the Hopper
    kernel's on sm_90 only), else the one ``tune`` stored for ``key`` ("tuned"), else the
    default for ``seqlen_k`` keys and ``causal`` (:func:`default_config`: the Hopper kernel's
    on sm_90)."""
    candidates = candidates_for(d, arch)
    if config is None:
        from ...runtime.tools import tuned_config

        tuned = tuned_config("attention", key)
        found = next((c for c in candidates if c.name == tuned), None)
        return (default_config(d, arch, seqlen_k, causal) if found is None
                else (found, "tuned"))
    if isinstance(config, AttentionConfig | AttentionSm90Config):
        found = config if config in candidates else None
        got = config.name
    elif isinstance(config, str):
        found = next((c for c in candidates if c.name == config), None)
        got = config
    else:
        raise ArgumentTypeError(f"config: expected None, a config name or a config object, "
                                f"got {type(config).__name__}")
    if found is None:
        names = ", ".join(repr(c.name) for c in candidates)
        hopper = any(c.name == got for cs in SM90_CONFIGS.values() for c in cs)
        raise ArgumentValueError(
            f"config: expected one of {names} (head_dim {d}'s candidates on this GPU), got "
            f"{got!r}" + ("; it runs the Hopper kernel: sm_90 only" if hopper else ""))
    return found, "pinned"


def launch_params(call: Call, sms: int = 0) -> tuple[tuple, tuple, int, dict]:
    """(grid, block, dynamic shared memory bytes, the kernel's scalar parameters by name) of
    a checked call that is not ``empty``: the strides (``qb`` .. ``oh``; the Hopper kernel's
    o's only: its inputs come by tensor maps), ``B``, ``H``, ``H_kv``, ``S_q``, ``S_k``,
    ``scale``, ``softcap``, ``window_left``, ``window_right``. The output's strides are
    ``call.out_strides``: the given ``out``'s, or those of a new output of ``call.out_shape``
    contiguous (what the op allocates). :func:`pointers` gives the pointer parameters,
    :func:`tensor_maps` the Hopper kernel's maps."""
    spec = call.spec
    grid = spec.grid(call.batch, call.heads, call.seqlen_q, sms)
    params = {}
    strided = (("o", call.out_strides),) if call.hopper else (
        ("q", call.q_strides), ("k", call.k_strides), ("v", call.v_strides),
        ("o", call.out_strides))
    for letter, strides in strided:
        params.update(zip((letter + "b", letter + "s", letter + "h"), strides))
    params.update(B=call.batch, H=call.heads, H_kv=call.kv_heads, S_q=call.seqlen_q,
                  S_k=call.seqlen_k, scale=call.scale, softcap=call.softcap,
                  window_left=call.window[0], window_right=call.window[1])
    if call.hopper:
        params["heads_group"] = heads_group(call.batch, call.heads, call.kv_heads,
                                            call.seqlen_k, call.head_dim, call.q.itemsize)
    return grid, (spec.threads, 1, 1), spec.smem_bytes, params


def pointers(call: Call, o, lse=None) -> dict:
    """The kernel's pointer parameters of a checked call whose output is ``o`` (a CuPy view:
    ``call.out`` or a new array laid out as ``call.out_strides``) and lse ``lse`` (float32
    contiguous of ``call.lse_shape``; None without ``return_lse``): 0 for those absent (the
    Hopper kernel takes q, k and v by tensor maps instead); ``seq_bounds`` where the kernel
    takes them."""
    def p(x):
        return 0 if x is None else x.data.ptr

    ptrs = dict(o=p(o), lse=p(lse), cu_seqlens_q=p(call.cu_seqlens_q),
                cu_seqlens_k=p(call.cu_seqlens_k))
    if call.spec.segments:
        ptrs["seq_bounds"] = p(call.seq_bounds)
    if not call.hopper:
        ptrs.update(q=p(call.q), k=p(call.k), v=p(call.v))
    return ptrs


#: the tensor maps' element types
_MAP_TYPES = {DType.F16: "f16", DType.BF16: "bf16"}


def map_geometry(call: Call, maps=None) -> dict:
    """Tensor maps of a call's arrays without their addresses: name -> (argument index,
    dims innermost first, byte strides, box), for ``maps``: (name, argument index, array (a
    CuPy view of q's or k's layout), its (batch, seq, head) element strides, rows a box)
    (default: the Hopper forward's q, k, v, boxes of its block's rows and keys). An array is
    (head_dim, seq, heads, batch) by its strides (packed: (head_dim, rows, heads)), a box 64
    columns x the rows of one head."""
    if maps is None:
        maps = (("tma_q", 0, call.q, call.q_strides, 128),
                ("tma_k", 1, call.k, call.k_strides, call.spec.block_n),
                ("tma_v", 2, call.v, call.v_strides, call.spec.block_n))
    item = call.q.itemsize
    geometry = {}
    for name, i, x, strides, rows in maps:
        b, seq, heads = strides
        if call.varlen:
            dims, outer = (call.head_dim, x.shape[0], x.shape[1]), (seq, heads)
        else:
            n_s, n_h = (x.shape[1], x.shape[2]) if call.layout == "bshd" else (x.shape[2],
                                                                                x.shape[1])
            dims, outer = (call.head_dim, n_s, n_h, call.batch), (seq, heads, b)
        geometry[name] = (i, dims, _map_strides(dims, outer, item),
                          (64, rows) + (1,) * (len(dims) - 2))
    return geometry


def _map_strides(dims: tuple, strides: tuple, item: int) -> tuple:
    """The byte strides of a tensor map's outer dimensions: the arrays', but a dimension of
    one element (whose stride the checks leave free, and PyTorch may give any) that of a
    contiguous array there (a multiple of 16 bytes, as the copy engine asks)."""
    out, span = [], dims[0] * item
    for n, st in zip(dims[1:], strides):
        out.append(st * item if n > 1 else -(-span // 16) * 16)
        span = out[-1] * n
    return tuple(out)


def tensor_maps(call: Call, geometry: dict, ptrs) -> dict:
    """The Hopper kernel's tensor maps for the arrays at ``ptrs`` (q's, k's, v's)."""
    from ...jit.tma import tensor_map

    kind = _MAP_TYPES[call.dtype]
    return {name: tensor_map(kind, ptrs[i], dims, strides, box)
            for name, (i, dims, strides, box) in geometry.items()}
