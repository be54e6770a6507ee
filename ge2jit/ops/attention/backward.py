"""attention_backward: the gradients of attention's q, k and v from that of its output, in three
launches: delta = rowsum(do * o) (``bwd_sm80.cu``), then on Hopper at head_dim 64 and 128 one
kernel making dk, dv and dq (``bwd_sm90.cu``'s dkvq: dq added up in float32 by bulk
reductions) and a conversion of dq; deterministic (and at head_dim 256, and before Hopper) a
dq kernel and a dk and dv kernel, each element summed in one fixed order. dk and dv of a kv
head are summed over its query heads in registers."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit import fastlaunch
from ...jit.fastlaunch import Map, Ptr
from ...jit.loader import launcher_for
from ...runtime.arrays import call_arguments, views
from ...runtime.checks import check_apart, check_array, check_bool, check_out, out_arrays
from ...runtime.prepared import OverlapGuard, PreparedCalls
from .op import (
    DEFAULTS,
    Call,
    _new_strides,
    _strides,
    checked,
    map_geometry,
    tensor_maps,
)
from .spec import AttentionBwdSm90Spec, bwd_specs_for

#: the array arguments, in the order of the signature (out's three outputs split out)
ARRAYS = ("do", "q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k", "seq_bounds",
          "dq_out", "dk_out", "dv_out")
#: the inputs among ARRAYS (the rest: the given outputs)
INPUTS = 9
#: the other arguments, in the order of the signature
OPTIONS = ("causal", "scale", "window", "softcap", "max_seqlen_q", "max_seqlen_k",
           "deterministic", "layout", "config")
#: the backward's kernels by name: the Hopper ones (the default on sm_90), the Hopper one-kernel
#: backward pinned to its wide or its narrow step, the sm_80 ones
FAMILIES = ("sm90", "sm90w", "sm90n", "sm90d", "sm80")
_DQ, _DK, _DV, _DELTA, _ACC = 9, 10, 11, 12, 13
_PREPARED = PreparedCalls("attention_backward")
#: the compiled path's programs: the arrays, the slots of delta and of the one-kernel
#: backward's float32 dq (intermediates that no caller fills: the program allocates them),
#: then the options by value
_COMPILED = fastlaunch.Table("attention_backward", "A" * (len(ARRAYS) + 2) + "V" * len(OPTIONS))


@dataclass(frozen=True, eq=False)
class BackwardCall:
    """A checked backward call: the forward's checked call (``fwd``: q, k, v, the sizes,
    masks and scalars), do, o and lse (CuPy views), the given outputs (None: made by the
    op), the element (batch, seq, head) strides of do, o and the three gradients, and the
    three kernels' specs (dot, dq, dkv: the Hopper ones with ``family`` "sm90")."""

    fwd: Call
    do: object
    o: object
    lse: object
    dq_out: object
    dk_out: object
    dv_out: object
    do_strides: tuple[int, int, int]
    o_strides: tuple[int, int, int]
    dq_strides: tuple[int, int, int]
    dk_strides: tuple[int, int, int]
    dv_strides: tuple[int, int, int]
    specs: tuple
    family: str


def attention_backward(do, q, k, v, o, lse, *, causal=False, scale=None, window=None,
                       softcap=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None, seq_bounds=None, deterministic=False, out=None,
                       layout=None, config=None):
    """The gradients of :func:`attention`'s q, k and v: ``(dq, dk, dv)`` from ``do``, the
    gradient of its output, and the forward's output ``o`` and ``lse`` (its ``return_lse``),
    with the forward's keywords. dk and dv of a kv head sum the gradients of every query
    head that reads it (grouped-query attention).

    As FlashAttention's backward, it recomputes the probabilities ``P = exp(s - lse)`` of
    the allowed keys and takes ``delta_i = sum(do_i * o_i)`` from the given o: ``dv = P^T
    do``, ``ds = P (do v^T - delta)`` (times ``1 - tanh^2`` with softcap), ``dq = scale ds
    k``, ``dk = scale ds^T q``. A query that sees no key (lse -inf) gives nothing.

    Args:
        do: the gradient of the forward's output: q's shape and type, the layout rules of q.
        q: the forward's q, as :func:`attention` takes it.
        k: the forward's k.
        v: the forward's v.
        o: the forward's output (q's shape and type, the same layout rules).
        lse: the forward's log-sum-exp: float32, (batch, heads, seq_q) or (heads, total_q)
            with cu_seqlens, contiguous.
        causal: the forward's (as every keyword below but deterministic and out).
        scale: the forward's.
        window: the forward's.
        softcap: the forward's.
        cu_seqlens_q: the forward's.
        cu_seqlens_k: the forward's.
        max_seqlen_q: the forward's.
        max_seqlen_k: the forward's.
        seq_bounds: the forward's.
        layout: the forward's.
        deterministic: the same bits on every run. By default the Hopper backward at
            head_dim 64 and 128 adds dq up by bulk reductions (atomic float32 adds) in one
            kernel with dk and dv (dk and dv are the same bits every run; dq may differ in
            its last bits); True takes its two-kernel form (a dq kernel and a dk and dv
            kernel, no atomics), as the sm_80 kernels always are.
        out: None (new arrays, contiguous), or ``(dq, dk, dv)``: arrays of q's, k's and v's
            shapes and type with their layout rules, apart from every input and each other.
        config: None (on sm_90 the Hopper kernels, elsewhere the sm_80 ones), or "sm80" or
            "sm90" (sm_90 only) to pin them. The Hopper one-kernel backward takes a wide step
            (96 queries at head_dim 64, 64 at 128) where its registers do not spill (no
            softcap, and at head_dim 128 no window nor packed sequences), else a narrow one
            (64 and 48); "sm90w" and "sm90n" (sm_90 only) pin one of them ("sm90w" refuses
            the options it cannot take); neither defers the dq product. "sm90d" runs each
            step's dq product under the next step's products and softmax, as the default does
            at head_dim 64 (at its step; at 128 the narrow one).

    Returns:
        ``(dq, dk, dv)`` in q's framework, on PyTorch's current stream for tensors.

    Raises:
        ArgumentTypeError, ArgumentValueError: as :func:`attention`, for these arguments
            too, in one line before any launch.
    """
    dq_o, dk_o, dv_o = outputs(out)
    options = (causal, scale, window, softcap, max_seqlen_q, max_seqlen_k, deterministic,
               layout, config)
    passed = (do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seq_bounds, dq_o, dk_o, dv_o)
    done = _COMPILED.call(*passed, None, None, *options)
    if done is not fastlaunch.MISS:
        return done
    arrays = dict(zip(ARRAYS, passed))
    try:
        hash(options)
    except TypeError:   # a window given as a list, say: checked and run, not kept
        options = None

    def first(fw, device_id, v_, native):
        given = dict(zip(OPTIONS, (causal, scale, window, softcap, max_seqlen_q, max_seqlen_k,
                                   deterministic, layout, config)))
        call = checked_backward({**given, **v_}, device_id)
        result, prepared = _execute(fw, device_id, call, native)
        if prepared is not None and options is not None:
            _COMPILED.put((*passed, None, None, *options), prepared.program, fw.name)
        return result, prepared if options is not None else None

    return _PREPARED.run(arrays, options if options is not None else (object(),), first)


#: (dq, dk, dv) of ``out=`` (None: three Nones)
outputs = partial(out_arrays, names=("dq", "dk", "dv"))


def check_backward_arguments(do, q, k, v, o, lse, **kwargs):
    """(framework, device, the arrays as the framework reads them, the checked call) of a
    backward call's arguments (keywords as :func:`attention_backward`'s)."""
    unknown = sorted(set(kwargs) - set(OPTIONS) - {"cu_seqlens_q", "cu_seqlens_k", "seq_bounds",
                                                    "out"})
    if unknown:
        raise ArgumentTypeError(f"{unknown[0]}: not an argument of attention_backward")
    dq_o, dk_o, dv_o = outputs(kwargs.pop("out", None))
    arrays = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse,
              "cu_seqlens_q": kwargs.pop("cu_seqlens_q", None),
              "cu_seqlens_k": kwargs.pop("cu_seqlens_k", None),
              "seq_bounds": kwargs.pop("seq_bounds", None),
              "dq_out": dq_o, "dk_out": dk_o, "dv_out": dv_o}
    fw, device_id, native = call_arguments(arrays)
    return fw, device_id, native, checked_backward({**kwargs, **views(fw, native)}, device_id)


def checked_backward(args: dict, device_id: int | None = None) -> BackwardCall:
    """A backward call's arguments by name (arrays as CuPy views) checked, each refusal one
    line naming the argument: the forward's checks for q, k, v and the keywords, then do,
    o, lse and the outputs."""
    a = {**DEFAULTS, "deterministic": False, **args}
    check_bool(a["deterministic"], "deterministic")
    family = a.get("config")
    fwd = checked({n: a[n] for n in (*DEFAULTS, "q", "k", "v") if n not in ("out", "config",
                                                                             "return_lse")},
                  device_id)
    q, axes = fwd.q, _axes(fwd)
    inputs = {"do": a["do"], "q": q, "k": fwd.k, "v": fwd.v, "o": a["o"], "lse": a["lse"],
              "cu_seqlens_q": fwd.cu_seqlens_q, "cu_seqlens_k": fwd.cu_seqlens_k,
              "seq_bounds": fwd.seq_bounds}
    strides = {}
    for name in ("do", "o"):
        x = a[name]
        check_array(x, name)
        if x.shape != q.shape or x.dtype != q.dtype:
            raise ArgumentValueError(f"{name}: expected q's shape {q.shape} and dtype {q.dtype}, "
                                     f"got {x.shape} and {x.dtype}")
        strides[name] = _strides(x, name, axes)
    _check_lse(a["lse"], fwd.lse_shape)
    outs = {}
    for name, like in (("dq_out", q), ("dk_out", fwd.k), ("dv_out", fwd.v)):
        x = a.get(name)
        outs[name] = x
        if x is None:
            strides[name] = _new_strides(like.shape, axes)
            continue
        label = name[:2]
        check_array(x, f"out ({label})")
        if x.shape != like.shape or x.dtype != like.dtype:
            raise ArgumentValueError(f"out: expected {label} of shape {like.shape} and dtype "
                                     f"{like.dtype}, got {x.shape} and {x.dtype}")
        strides[name] = _strides(x, f"out ({label})", axes)
        check_out(x, {}, f"out ({label})")
        check_apart(x, f"out ({label})", {**inputs, **{n: outs[n] for n in outs if n != name}},
                    lambda other: "")
    family = _family(family, 80 if fwd.empty or fwd.no_keys else fwd.arch)
    specs = bwd_specs_for(family, fwd.dtype, fwd.head_dim, deterministic=a["deterministic"],
                          seqlen_q=fwd.seqlen_q, causal=fwd.causal, window=fwd.spec.window,
                          softcap=fwd.spec.softcap, varlen=fwd.varlen,
                          segments=fwd.spec.segments)
    return BackwardCall(fwd, a["do"], a["o"], a["lse"], outs["dq_out"], outs["dk_out"],
                        outs["dv_out"], strides["do"], strides["o"], strides["dq_out"],
                        strides["dk_out"], strides["dv_out"], specs, family)


def _family(config, arch: int) -> str:
    """The backward's kernels: ``config`` pinned, else the Hopper ones on sm_90 (``arch``
    90; 80 for a call without keys or queries), else the sm_80 ones."""
    choices = FAMILIES if arch == 90 else tuple(f for f in FAMILIES if not f.startswith("sm90"))
    if config is None:
        return choices[0]
    if not isinstance(config, str):
        raise ArgumentTypeError(f"config: expected None or a name ({', '.join(map(repr, FAMILIES))}"
                                f"), got {type(config).__name__}")
    if config not in choices:
        raise ArgumentValueError(f"config: expected one of {', '.join(map(repr, choices))} on "
                                 f"this GPU (or None), got {config!r}")
    return config


def _axes(fwd: Call) -> tuple:
    """The (batch, seq, head) axes of the call's arrays."""
    if fwd.varlen:
        return (None, 0, 1)
    return (0, 2, 1) if fwd.layout == "bhsd" else (0, 1, 2)


def _check_lse(lse, shape: tuple) -> None:
    check_array(lse, "lse")
    if lse.dtype.name != "float32":
        raise ArgumentValueError(f"lse: expected dtype float32 (attention's return_lse), got "
                                 f"{lse.dtype}")
    if lse.shape != shape:
        raise ArgumentValueError(f"lse: expected shape {shape} (attention's return_lse for "
                                 f"these inputs), got {lse.shape}")
    if lse.size and not lse.flags.c_contiguous:
        raise ArgumentValueError(f"lse: expected a contiguous array, got strides {lse.strides}; "
                                 f"pass lse.contiguous()")


def launch_params(call: BackwardCall) -> tuple[list, dict]:
    """([(spec, grid, block, smem)] of the three launches, the scalar parameters they share)."""
    f = call.fwd
    params = {}
    for letter, strides in (("q", f.q_strides), ("k", f.k_strides), ("v", f.v_strides),
                            ("o", call.o_strides), ("g", call.do_strides),
                            ("dq", call.dq_strides), ("dk", call.dk_strides),
                            ("dv", call.dv_strides)):
        params.update(zip((letter + "b", letter + "s", letter + "h"), strides))
    fused = _fused_spec(call)
    params.update(B=f.batch, H=f.heads, H_kv=f.kv_heads, S_q=f.seqlen_q, S_k=f.seqlen_k,
                  dq_pad=0 if fused is None else fused.step,
                  scale=f.scale, softcap=f.softcap, window_left=f.window[0],
                  window_right=f.window[1])
    launches = [(s, s.grid(f.batch, f.heads, f.kv_heads, f.seqlen_q, f.seqlen_k),
                 (s.threads, 1, 1), s.smem_bytes) for s in call.specs]
    return launches, params


def _fused_spec(call: BackwardCall):
    """The one-kernel backward's dkvq kernel of ``call``, or None."""
    return next((s for s in call.specs if s.kind == "dkvq"), None)


def accum_shape(call: BackwardCall) -> tuple | None:
    """The shape of the one-kernel backward's float32 dq (None: not that backward): masks.cuh's
    dq_accum_row, each sequence's rows from a whole tile of the kernel's step: (B, H, S_q
    rounded up to the step, D), or packed (H, total_q + B step, D)."""
    fused = _fused_spec(call)
    if fused is None:
        return None
    f, pad = call.fwd, fused.step
    if f.varlen:
        return (f.heads, f.q.shape[0] + f.batch * pad, f.head_dim)
    return (f.batch, f.heads, -(-f.seqlen_q // pad) * pad, f.head_dim)


def _own(spec, values: dict) -> dict:
    """The entries of ``values`` that are ``spec``'s kernel's parameters."""
    names = {p.name for p in spec.params}
    return {n: v for n, v in values.items() if n in names}


def map_geometries(call: BackwardCall) -> dict:
    """Each Hopper kernel's tensor maps of q, k, v and do without addresses, by the kernel's
    position in ``call.specs`` (its own rows 128 a box, the step's rows the spec's)."""
    f = call.fwd
    found = {}
    for i, spec in enumerate(call.specs):
        if not isinstance(spec, AttentionBwdSm90Spec):
            continue
        own = ("q", "do") if spec.kind == "dq" else ("k", "v")
        arrays = {"q": (1, f.q, f.q_strides), "k": (2, f.k, f.k_strides),
                  "v": (3, f.v, f.v_strides), "do": (0, call.do, call.do_strides)}
        found[i] = map_geometry(f, [(f"tma_{n}", idx, x, st, 128 if n in own else spec.step)
                                    for n, (idx, x, st) in arrays.items()])
    return found


def clear_plans() -> None:
    _PREPARED.clear()
    _COMPILED.clear()


def _execute(fw, device_id: int, call: BackwardCall, native: dict):
    """Launch a checked call; (its result, its prepared call: None for an empty one)."""
    f = call.fwd
    dtype = f.q.dtype
    makers = [fw.allocator(dtype, device_id) for _ in range(3)]
    shapes = (f.q.shape, f.k.shape, f.v.shape)
    make_delta = fw.allocator("float32", device_id)
    names = ("dq_out", "dk_out", "dv_out")
    grads = [native[n] if native[n] is not None else make(shape)
             for n, make, shape in zip(names, makers, shapes)]
    result = tuple(grads)
    if f.empty or f.no_keys:
        # no query, or no key: every gradient is 0 (dk, dv of no query; dq of no key)
        for g in grads:
            fw.view(g, "out")[...] = 0
        return result, None
    launches, params = launch_params(call)
    kernels = [launcher_for(spec, device_id) for spec, *_ in launches]
    bound = [k.bind(grid, block, smem, **_own(spec, params))
             for k, (spec, grid, block, smem) in zip(kernels, launches)]
    stream, ptr = fw.stream_getter(device_id), fw.ptr
    delta = make_delta(f.lse_shape)
    acc_shape = accum_shape(call)
    fused = acc_shape is not None
    accum = make_delta(acc_shape) if fused else None
    geometries = map_geometries(call)

    def run(ptrs: dict) -> None:
        s = stream()
        inputs = (ptrs["dout"], ptrs["q"], ptrs["k"], ptrs["v"])
        for i, (launch, (spec, *_)) in enumerate(zip(bound, launches)):
            maps = ({} if i not in geometries
                    else tensor_maps(f, geometries[i], inputs))
            launch(s, **_own(spec, ptrs), **maps)

    def pointers(do, q, k, v, o, lse, cu_q, cu_k, bounds, dq, dk, dv, dl, acc) -> dict:
        return dict(dout=ptr(do), q=ptr(q), k=ptr(k), v=ptr(v), o=ptr(o), lse=ptr(lse),
                    cu_seqlens_q=0 if cu_q is None else ptr(cu_q),
                    cu_seqlens_k=0 if cu_k is None else ptr(cu_k),
                    seq_bounds=0 if bounds is None else ptr(bounds), dq=ptr(dq), dk=ptr(dk),
                    dv=ptr(dv), delta=ptr(dl), dq_accum=0 if acc is None else ptr(acc))

    arrays_in = [native[n] for n in ARRAYS[:INPUTS]]
    run(pointers(*arrays_in, *grads, delta, accum))
    given = [native[n] is not None for n in names]
    guard = None
    if any(given):
        views_ = (call.do, f.q, f.k, f.v, call.o, call.lse, f.cu_seqlens_q, f.cu_seqlens_k,
                  f.seq_bounds, call.dq_out, call.dk_out, call.dv_out)
        guard = OverlapGuard(ARRAYS, views_, tuple(i for i, g in zip((_DQ, _DK, _DV), given)
                                                  if g)) or None

    def prepared(do, q, k, v, o, lse, cu_q, cu_k, bounds, dq, dk, dv):
        outs = [x if x is not None else make(shape)
                for x, make, shape in zip((dq, dk, dv), makers, shapes)]
        if guard is not None:
            guard([0 if x is None else ptr(x)
                   for x in (do, q, k, v, o, lse, cu_q, cu_k, bounds, dq, dk, dv)])
        run(pointers(do, q, k, v, o, lse, cu_q, cu_k, bounds, *outs, make_delta(f.lse_shape),
                     make_delta(acc_shape) if fused else None))
        return tuple(outs)

    slots = {"dout": Ptr(0), "q": Ptr(1), "k": Ptr(2), "v": Ptr(3), "o": Ptr(4), "lse": Ptr(5),
             "cu_seqlens_q": Ptr(6), "cu_seqlens_k": Ptr(7), "seq_bounds": Ptr(8),
             "dq": Ptr(_DQ), "dk": Ptr(_DK), "dv": Ptr(_DV), "delta": Ptr(_DELTA),
             "dq_accum": Ptr(_ACC) if fused else 0}
    allocs = [(i, make, shape) for i, g, make, shape in zip((_DQ, _DK, _DV), given, makers,
                                                            shapes) if not g]
    allocs.append((_DELTA, make_delta, f.lse_shape))
    if fused:
        allocs.append((_ACC, make_delta, acc_shape))
    addresses = (call.do.data.ptr, f.q.data.ptr, f.k.data.ptr, f.v.data.ptr)
    steps = []
    for i, (kernel, (spec, grid, block, smem)) in enumerate(zip(kernels, launches)):
        values = {**_own(spec, params), **_own(spec, slots)}
        if i in geometries:   # each map moved to its array's address at every call
            blobs = tensor_maps(f, geometries[i], addresses)
            values.update({name: Map(geometries[i][name][0], blob,
                                     addresses[geometries[i][name][0]])
                           for name, blob in blobs.items()})
        steps.append(fastlaunch.step(kernel, grid, block, smem, values))
    prepared.program = fastlaunch.program(
        fw.name, steps,
        allocs, guard.pairs if guard is not None else (), guard, stream,
        fastlaunch.launch_failed(call.specs[1].kernel_name), returns=(_DQ, _DK, _DV))
    return result, prepared
