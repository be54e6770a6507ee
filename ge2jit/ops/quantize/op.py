"""quantize_fp8: the call's plumbing. Argument checks, the rows' layout, the kernel choice
(``spec``, pure), the prepared call and the launches."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ...errors import ArgumentValueError
from ...jit.device import device_arch, sm_count
from ...jit.loader import launcher_for
from ...jit.nvrtc import arch_number
from ...runtime.checks import (
    _cupy,
    check_aligned,
    check_array,
    check_bool,
    check_dtype,
    check_float32_word,
    check_host_scale,
    check_out,
    check_same_device,
    host_scale,
)
from ...runtime.dtypes import DType, as_fp8
from ...runtime.prepared import OverlapGuard, PreparedCalls
from ...runtime.rows import access_width, vector_width, walk_as_one
from ...runtime.tools import tuned_config
from .spec import Kernels, Source, check_fits, heuristic, kernels, parse_config, source_of

NAME = "quantize_fp8"
_prepared = PreparedCalls(NAME)
_kernels = lru_cache(maxsize=4096)(kernels)


class Problem(NamedTuple):
    """A checked call: x as ``rows`` rows of ``n`` elements (``xs``: the row stride in
    elements), its type and the format, where the scale comes from, whether the scales are
    per row and the rows lie end to end (``flat``), the per-row scales' stride, and the
    pinned config (or None)."""

    rows: int
    n: int
    xs: int
    in_dtype: DType
    fmt: DType
    source: Source
    per_row: bool
    ss: int
    amax: bool
    config: object


def quantize_fp8(x, *, fmt="e4m3", scale=None, per_row: bool = False, amax_out=None,
                 out=None, config=None):
    """Quantize ``x`` to an 8-bit float format: ``q = x * (1 / scale)`` rounded to
    nearest-even and saturated at the format's largest finite value (448 for e4m3, 57344 for
    e5m2; NaN stays NaN), so that ``scale * q`` approximates x. Returns ``(q, scale)``, ready
    for ``gemm_bias_act``'s ``scale_a`` / ``scale_b``.

    Args:
        x: a GPU array (``cupy.ndarray``, ``torch.Tensor`` on a CUDA device, or an object
            with ``__cuda_array_interface__``) of float32, float16 or bfloat16, any number of
            dimensions; its rows are along the last axis. Rows with a row stride (a slice of
            a wider matrix) are read in place; an array whose last axis is strided, or whose
            leading dimensions cannot be walked with one stride, is copied first.
        fmt: "e4m3" (``float8_e4m3fn``) or "e5m2" (``float8_e5m2``), by name or dtype.
        scale: None for a dynamic scale computed from x (``amax / largest``, 1 where the
            amax is 0), or the scale to use: a positive finite number, or a float32 device
            array of one element (per tensor) or, with ``per_row``, of shape ``x.shape[:-1]``
            (one per row; any stride). Device scales are read as they are: 0 or a negative
            scale gives what ``x * (1 / scale)`` gives.
        per_row: one scale per row (per token of activations, per output channel of a
            weight stored (N, K), which is also the layout the FP8 GEMM reads B in); else one
            for the whole tensor.
        amax_out: optional float32 device array of one element: receives max |x| of the
            whole tensor (NaN if x holds one), for delayed scaling.
        out: optional array of x's shape, of the format's dtype or uint8, whose rows are
            along a unit-stride last axis (any row stride): q is written there.
        config: pin the kernel variant by name (``ge2jit.ops.quantize.spec``): a row held
            by a warp or block (``"warp32_v8_r1"``, ``"block_512_v16"``), a block per row
            stepping along it (``"loop_1024"``), or the whole tensor shared by every block
            (``"flat_512"``: one scale, rows laid end to end).

    A dynamic per-row scale reads each row once where a warp or a block holds it (rows of up
    to 16384 elements with the heuristic's choices); a dynamic per-tensor scale reads x twice
    (its amax, then the quantization) in two launches. A NaN in x gives a NaN scale where it
    is dynamic; an infinity an infinite one (its finite values then quantize to 0). The call
    runs on CuPy's current device and stream (PyTorch tensors: their device and PyTorch's
    current stream), never synchronizes, and needs a GPU of compute capability 8.9 or newer.

    Returns:
        ``(q, scale)``: q of x's shape in the format (a PyTorch float8 tensor for a tensor
        x; for CuPy, an ``ml_dtypes`` view of uint8 memory, as CuPy holds 8-bit floats), and
        the scale: for a dynamic one a new float32 array of shape () (per tensor) or
        ``x.shape[:-1]`` (per row), else ``scale`` itself.

    Raises:
        ArgumentTypeError: x, a device scale, amax_out or out is not a GPU array; per_row is
            not a bool.
        ArgumentValueError: an unsupported dtype or format, a scale of the wrong kind or
            shape, out or amax_out of the wrong shape or dtype or overlapping x, an unknown
            config or one that does not fit, a GPU older than compute capability 8.9.
        DeviceMismatchError: an array is not on the current device.
    """
    check_bool(per_row, "per_row")
    host = host_scale(scale)
    if host and scale is not None:
        check_host_scale(scale, "scale")
    dev_scale = None if host else scale
    return _prepared.run({"x": x, "scale": dev_scale, "amax_out": amax_out, "out": out},
                         (as_fp8(fmt), per_row, scale is None, config),
                         lambda fw, dev, v, native: _first_call(fw, dev, v, native, fmt, scale,
                                                                per_row, config),
                         (None if scale is None or not host else float(scale),))


def _rows_of(a) -> tuple[int, int, int] | None:
    """(rows, n, row stride in elements) of ``a`` read as rows along its last axis; None when
    the last axis is strided or the leading dimensions cannot be walked with one stride."""
    shape = a.shape or (1,)
    strides = tuple(s // a.itemsize for s in a.strides) or (1,)
    n = shape[-1]
    if a.size == 0:
        rows = a.size // n if n else int(np.prod(shape[:-1]))
        return rows, n, n
    if n > 1 and strides[-1] != 1:
        return None
    lead = walk_as_one(list(zip(shape[:-1], strides[:-1])))
    if lead is None:
        return None
    rows, stride = lead
    return rows, n, stride if rows > 1 else n


def checked(x, scale, per_row, amax_out, out, fmt, config, device_id=None):
    """(problem, x, out) of a call's arguments (CuPy views; x copied when its rows cannot be
    walked), checked as the call checks them."""
    check_array(x, "x")
    in_dtype = check_dtype(x, "x")
    fmt = as_fp8(fmt)
    check_aligned(x, "x")
    rows_shape = x.shape[:-1]
    if host_scale(scale) and per_row and scale is not None:
        raise ArgumentValueError(f"scale: per_row=True takes one scale per row, a float32 "
                                 f"array of shape {rows_shape}; got the number {scale!r}")
    kind = "dynamic" if scale is None else "host" if host_scale(scale) else "device"
    source = source_of(kind, per_row)
    # (a new dynamic scale array is contiguous: one per row, or one)
    ss = (_device_scale(scale, per_row, rows_shape) if source is Source.DEVICE
          else int(source is Source.ROW))
    dev_scale = None if host_scale(scale) else scale
    if amax_out is not None:
        check_float32_word(amax_out, "amax_out")
    if out is not None:
        check_array(out, "out")
        if out.shape != x.shape:
            raise ArgumentValueError(f"out: expected shape {x.shape} (x's), got {out.shape}")
        if out.dtype.name not in ("uint8", fmt.numpy_name):
            raise ArgumentValueError(f"out: expected dtype {fmt.numpy_name} or uint8, got "
                                     f"{out.dtype}")
        if _rows_of(out) is None:
            raise ArgumentValueError("out: expected rows along a unit-stride last axis (any "
                                     f"row stride), got strides {out.strides}")
        check_out(out, {"x": x, "scale": dev_scale, "amax_out": amax_out})
    if amax_out is not None:
        check_out(amax_out, {"x": x, "scale": dev_scale}, "amax_out")
    if device_id is not None:
        check_same_device({"x": x, "scale": dev_scale, "amax_out": amax_out, "out": out},
                          device_id)
        arch = device_arch(device_id)
        if arch_number(arch) < 89:
            raise ArgumentValueError(f"x: 8-bit float conversions need a GPU of compute "
                                     f"capability 8.9 or newer (Ada, Hopper); this one is "
                                     f"{arch}")
    lay = _rows_of(x)
    if lay is None:
        x = _cupy().ascontiguousarray(x)
        lay = _rows_of(x)
    rows, n, xs = lay
    cfg = None if config is None else parse_config(config)
    return Problem(rows, n, xs, in_dtype, fmt, source, per_row, ss, amax_out is not None,
                   cfg), x, out


def _device_scale(scale, per_row: bool, rows_shape: tuple) -> int:
    """The element stride between the rows' scales of a device scale (0: one scale)."""
    check_array(scale, "scale")
    if scale.dtype != np.float32:
        raise ArgumentValueError(f"scale: expected a float32 array, got dtype {scale.dtype}")
    check_aligned(scale, "scale")
    if not per_row:
        if scale.size != 1:
            raise ArgumentValueError(f"scale: expected one float32 value (per_row=False), got "
                                     f"shape {scale.shape}; pass per_row=True for one per row")
        return 0
    if scale.shape != rows_shape and not (scale.size == 1 and len(rows_shape) == 0):
        raise ArgumentValueError(f"scale: expected shape {rows_shape} (one per row of x, "
                                 f"per_row=True), got {scale.shape}")
    walk = walk_as_one(list(zip(scale.shape, (s // 4 for s in scale.strides))))
    if walk is None:
        raise ArgumentValueError(f"scale: expected per-row scales that one stride walks, got "
                                 f"strides {scale.strides}; pass cupy.ascontiguousarray(scale)")
    return walk[1]


def is_flat(prob: Problem, qs: int) -> bool:
    """Whether one scale covers the tensor and its rows (and q's) lie end to end."""
    return not prob.per_row and (prob.rows == 1 or (prob.xs == prob.n and qs == prob.n))


def tuning_key(prob: Problem, qs: int | None = None) -> dict:
    """What keys the tuning database: the types, the row length and count (rounded up to
    powers of two), where the scale comes from and whether the flat variants can run."""
    return {"dtype": prob.in_dtype.value, "fmt": prob.fmt.value,
            "n": 1 << max(prob.n - 1, 0).bit_length(),
            "rows": 1 << max(prob.rows - 1, 0).bit_length(), "source": prob.source.value,
            "per_row": prob.per_row, "flat": is_flat(prob, prob.n if qs is None else qs)}


def decide(prob: Problem, x_ptr: int, q_ptr: int, qs: int, device_id: int
           ) -> tuple[Kernels, str]:
    """(the kernels, why their config): pinned, tuned or the heuristic's."""
    flat = is_flat(prob, qs)
    reason, cfg = "pinned", prob.config
    if cfg is not None:
        check_fits(cfg, prob.n, flat)
    else:
        tuned = tuned_config(NAME, tuning_key(prob, qs))
        if tuned is not None:
            cfg, reason = parse_config(tuned), "tuned"
            if cfg.flat and not flat:
                cfg = None
        if cfg is None:
            cfg, reason = heuristic(prob.rows, prob.n, prob.in_dtype, flat), "heuristic"
    rows = 1 if cfg.flat else prob.rows
    vec = vector_width(access_width(prob.in_dtype),
                       [(x_ptr, prob.xs, prob.in_dtype.itemsize), (q_ptr, qs, 1)], rows)
    return _kernels(cfg, prob.rows, prob.n, prob.in_dtype, prob.fmt, prob.source,
                    amax=prob.amax, max_vec=vec, sms=sm_count(device_id)), reason


def _first_call(fw, device_id, v, native, fmt, scale, per_row, config):
    # a device scale is checked as its CuPy view (a tensor is not a CuPy array)
    prob, x, out = checked(v["x"], scale if host_scale(scale) else v["scale"], per_row,
                           v["amax_out"], v["out"], fmt, config, device_id)
    if out is None:
        q_native = fw.allocator(prob.fmt.numpy_dtype, device_id)(v["x"].shape)
        q = fw.view(q_native, "out")
    else:
        q_native, q = native["out"], out
    qs = _rows_of(q)[2]
    ks, _ = decide(prob, x.data.ptr, q.data.ptr, qs, device_id)
    dynamic = prob.source in (Source.ROW, Source.TENSOR)
    scale_shape = x.shape[:-1] if per_row else ()
    new_scale = fw.allocator(np.float32, device_id) if dynamic else None
    run = _runner(fw, device_id, prob, ks, qs)
    stream = fw.stream_getter(device_id)
    ptr = fw.ptr
    host_inv = 1.0 if not host_scale(scale) or scale is None else 1.0 / float(scale)
    s_native = new_scale(scale_shape) if dynamic else scale
    s_ptr = (ptr(s_native) if dynamic else
             0 if host_scale(scale) else v["scale"].data.ptr)
    amax_ptr = 0 if v["amax_out"] is None else v["amax_out"].data.ptr
    run(stream(), x.data.ptr, q.data.ptr, s_ptr, amax_ptr, host_inv)
    if x is not v["x"]:      # a copy: not prepared (the copy is made per call)
        return (q_native, s_native), None
    given = out is not None
    guard = (OverlapGuard(("x", "scale", "amax_out", "out"),
                          (v["x"], v["scale"], v["amax_out"], out), (2, 3))
             if given or v["amax_out"] is not None else None)
    new_q = fw.allocator(prob.fmt.numpy_dtype, device_id)
    shape = v["x"].shape

    def call(x, scale_arr, amax_out, out, host):
        xp = ptr(x)
        if out is None:
            out = new_q(shape)
        if guard is not None:
            guard((xp, 0 if scale_arr is None else ptr(scale_arr),
                   0 if amax_out is None else ptr(amax_out), ptr(out)))
        if dynamic:
            s = new_scale(scale_shape)
            sp = ptr(s)
        else:
            s = host if scale_arr is None else scale_arr
            sp = 0 if scale_arr is None else ptr(scale_arr)
        run(stream(), xp, ptr(out), sp, 0 if amax_out is None else ptr(amax_out),
            1.0 if host is None else 1.0 / host)
        return out, s

    return (q_native, s_native), call


def _runner(fw, device_id, prob: Problem, ks: Kernels, qs: int):
    """``run(stream, x, q, scale, amax_out, host_inv)`` on pointers: the amax word zeroed
    (amax_out, or scratch memory for a dynamic per-tensor scale), then the kernels."""
    import cupy

    memset = cupy.cuda.runtime.memsetAsync
    sizes = dict(rows=prob.rows, n=prob.n, xs=prob.xs, qs=qs, ss=prob.ss)
    main = launcher_for(ks.quantize, device_id).bind(ks.grid, ks.block, 0, **sizes)
    first = (None if ks.amax is None else
             launcher_for(ks.amax, device_id).bind(ks.grid, ks.block, 0, **sizes))
    scratch = fw.scratch(device_id) if first is not None else None

    def run(stream, x, q, scale, amax_out, host_inv):
        ws = None
        if first is not None:
            ws = None if amax_out else scratch(4)
            word = amax_out or ws.ptr
            memset(word, 0, 4, stream)
            first(stream, x=x, q=0, scale=0, amax_in=0, amax=word, host_inv=1.0)
            main(stream, x=x, q=q, scale=scale, amax_in=word, amax=0, host_inv=host_inv)
        else:
            if amax_out:
                memset(amax_out, 0, 4, stream)
            main(stream, x=x, q=q, scale=scale, amax_in=0, amax=amax_out, host_inv=host_inv)
        return ws    # held until the launches are queued

    return run


def explain_parts(x, scale, per_row, amax_out, out, fmt, config, device_id):
    """(problem, kernels, reason) of a call for ``explain`` (CuPy views), launching
    nothing."""
    prob, x, out = checked(x, scale, per_row, amax_out, out, fmt, config, device_id)
    qs = prob.n if out is None else _rows_of(out)[2]
    q_ptr = 0 if out is None else out.data.ptr
    ks, reason = decide(prob, x.data.ptr, q_ptr, qs, device_id)
    return prob, ks, reason
