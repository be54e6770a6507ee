"""cross_entropy: the call's plumbing. Argument checks, the kernel choice (``spec.choose``,
pure), the scratch memory, the prepared call and the launches all live here."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ...errors import ArgumentValueError
from ...jit.loader import launcher_for
from ...runtime import checks
from ...runtime.arrays import call_arguments, views
from ...runtime.dtypes import DType
from ...runtime.prepared import OverlapGuard, PreparedCalls
from ...runtime.rows import GRID_MAX, vector_width
from ...runtime.tools import tuned_config
from .spec import (
    REDUCTIONS,
    TARGET_TYPES,
    Kernels,
    access_width,
    heuristic,
    kernels,
    parse_config,
    scale_spec,
)

_prepared = PreparedCalls("cross_entropy")
_kernels = lru_cache(maxsize=4096)(kernels)

#: scratch memory: the targets kernel's three counts, then (sum, mean) the rows' losses
WS_BYTES = 256


class Problem(NamedTuple):
    """A checked call: rows x n logits of ``dtype``, class indices of ``target_dtype``, the
    gradient's type (None: the loss alone; ``inplace``: written over the logits), the options,
    and the pinned config (or None)."""

    rows: int
    n: int
    dtype: DType
    target_dtype: str
    grad_dtype: DType | None
    reduction: str
    ignore_index: int
    smoothing: float
    check: bool
    inplace: bool
    config: object


def cross_entropy(logits, targets, *, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, grad: bool = False, grad_scale=None, out=None,
                  inplace: bool = False, check_targets: bool = True, config=None):
    """Cross-entropy of each row of ``logits`` against a class index (PyTorch's
    ``torch.nn.functional.cross_entropy`` with class indices), computed in float32 with an
    online max and sum of exponentials over each row (any number of classes), and with
    ``grad=True`` its gradient with respect to the logits written by the same kernel.

    Args:
        logits: a (rows, V) GPU array (``cupy.ndarray``, ``torch.Tensor`` on a CUDA device, or
            an object with ``__cuda_array_interface__``; results are of its framework, on
            PyTorch's current stream for tensors) of float32, float16 or bfloat16. Rows are
            read in place with any row stride; a class axis with a stride is copied first
            (unless the gradient is to be written over the logits, which needs a unit
            stride).
        targets: the (rows,) class indices, int32 or int64, any stride.
        ignore_index: rows whose index is this contribute nothing: loss 0, gradient 0, and
            they are left out of the mean's count. It may lie outside [0, V) (-100, the
            default, does).
        reduction: "none" (the (rows,) losses), "sum" or "mean" (over the rows that are not
            ignored; NaN when every row is, as PyTorch).
        label_smoothing: e in [0, 1]: the target becomes (1 - e) onehot + e / V, so each row's
            loss is (1 - e) times its negative log-likelihood plus e times the mean over all V
            classes of -log_softmax (PyTorch's definition; ignored rows still count nothing).
        grad: also compute d loss / d logits, ``softmax - (1 - e) onehot - e / V`` per row,
            divided by the count of rows not ignored for "mean", times ``grad_scale``; returns
            ``(loss, grad)``. (With "none" it is the gradient of the losses' sum.)
        grad_scale: a real number, the upstream gradient of the loss (default 1; only with
            ``grad``).
        out: where the gradient goes (with ``grad``): a (rows, V) array of float32, float16
            or bfloat16 whose rows have a unit-stride class axis and do not overlap; it may be
            ``logits`` itself (in place). Default: a new array of the logits' type.
        inplace: write the gradient over ``logits`` (the same as ``out=logits``): the call then
            needs no gradient-sized memory at all. The logits are gone afterwards.
        check_targets: read the targets kernel's verdict before anything is written and raise
            on a class outside [0, V) that is not ``ignore_index`` (this synchronizes the
            stream once: a 24-byte copy to the host). False: no synchronization (inside CUDA
            graph captures, or where the host must not wait); such rows then get a NaN loss and
            a NaN gradient row, so a sum or mean is NaN: never a silent wrong number, never an
            out-of-bounds read.
        config: pin the rows kernel: ``"warp"`` (a warp per row) or ``"block_T"`` (a block of
            T = 128, 256, 512 or 1024 threads per row); any row length runs on any config.

    Returns:
        The loss, float32: shape () for "sum" and "mean", (rows,) for "none"; with ``grad``,
        ``(loss, grad)``.

    Memory traffic: the loss alone reads the logits once; with the gradient, twice (a pass for
    the row's max and sum of exponentials, then one that writes the gradient: the loss needs
    the whole row before any gradient element is known) and writes the gradient once, 3 x
    rows x V x itemsize bytes in all (the second read partly from L2), plus the indices. The
    mean's count comes from a small kernel that reads only the indices (run before the rows
    kernel, so that the gradient is scaled as it is written), and the losses are added up by a
    one-block kernel in a fixed order: the same bits on every run, no atomics. Scratch memory:
    256 bytes plus 4 bytes per row for "sum" and "mean", from the arrays' framework's
    allocator.

    Special values follow float64's arithmetic and PyTorch: a row holding NaN or +inf has a
    NaN loss and gradient; a target logit of -inf gives an infinite loss. Ignored rows are not
    read at all (their gradient is 0 whatever they hold; PyTorch's is NaN for an ignored row
    holding NaN or inf).

    Raises:
        ArgumentTypeError: an argument is not a GPU array; an option of the wrong type.
        ArgumentValueError: unsupported dtypes, shapes that do not match, an unknown reduction,
            label_smoothing outside [0, 1], options that contradict each other, an ``out`` that
            overlaps the inputs, a class outside [0, V) (``check_targets``), a bad config.
        DeviceMismatchError: an array is not on the current device.
    """
    options = (ignore_index, reduction, label_smoothing, grad, grad_scale is None, inplace,
               check_targets, config)

    def first(fw, device_id, v, native):
        return _first_call(fw, device_id, v, native, options, grad_scale)

    return _prepared.run({"logits": logits, "targets": targets, "out": out}, options, first,
                         (grad_scale,))


def _check_matrix(x, name: str) -> DType:
    """A (rows, classes) array of a supported type: its DType."""
    checks.check_array(x, name)
    dtype = checks.check_dtype(x, name)
    if x.ndim != 2:
        raise ArgumentValueError(f"{name}: expected a 2-D array (rows, classes), got shape "
                                 f"{x.shape}")
    return dtype


def _check_rows(x, name: str, n: int) -> None:
    """The kernels walk ``x``'s rows along a unit-stride class axis; written rows must not
    overlap."""
    rows = x.shape[0]
    if n > 1 and x.strides[1] != x.itemsize:
        raise ArgumentValueError(f"{name}: expected rows along a unit-stride last axis, got "
                                 f"strides {x.strides} (bytes)")
    if rows > 1 and abs(x.strides[0]) < n * x.itemsize:
        raise ArgumentValueError(f"{name}: expected rows that do not overlap (a row stride of "
                                 f"at least {n} elements), got strides {x.strides} (bytes)")


def check_options(targets, rows: int, rows_of: str, ignore_index, reduction,
                  label_smoothing) -> tuple[int, float]:
    """The class indices (a CuPy view: (rows,) int32 or int64, one per row of ``rows_of``) and
    the loss's options, checked as ``cross_entropy`` checks them; returns (ignore_index,
    label_smoothing) as numbers. Raises one line naming the argument."""
    checks.check_array(targets, "targets")
    if targets.shape != (rows,):
        raise ArgumentValueError(f"targets: expected shape ({rows},) (one class index per row "
                                 f"of {rows_of}), got {targets.shape}")
    if targets.dtype.name not in TARGET_TYPES:
        raise ArgumentValueError(f"targets: expected dtype int32 or int64, got "
                                 f"{targets.dtype}")
    ignore_index = checks.check_int64(ignore_index, "ignore_index")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ArgumentValueError(f"reduction: expected one of "
                                 f"{', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    smoothing = checks.check_scalar(label_smoothing, "label_smoothing")
    if not 0.0 <= smoothing <= 1.0:
        raise ArgumentValueError(f"label_smoothing: expected a number in [0, 1], got "
                                 f"{label_smoothing!r}")
    return ignore_index, smoothing


def checked(logits, targets, out, options, grad_scale) -> tuple[Problem, float]:
    """(problem, grad_scale) of a call's arguments (CuPy views), checked as the call checks
    them."""
    ignore_index, reduction, label_smoothing, grad, _, inplace, check_targets, config = options
    dtype = _check_matrix(logits, "logits")
    rows, n = logits.shape
    if n == 0:
        raise ArgumentValueError(f"logits: expected at least one class, got shape "
                                 f"{logits.shape}")
    ignore_index, smoothing = check_options(targets, rows, "logits", ignore_index, reduction,
                                            label_smoothing)
    grad = checks.check_bool(grad, "grad")
    inplace = checks.check_bool(inplace, "inplace")
    check = checks.check_bool(check_targets, "check_targets")
    cfg = None if config is None else parse_config(config)
    scale = 1.0
    if not grad:
        for name, value in (("out", out), ("grad_scale", grad_scale)):
            if value is not None:
                raise ArgumentValueError(f"{name}: applies to the gradient; pass grad=True, "
                                         f"or leave {name} out")
        if inplace:
            raise ArgumentValueError("inplace: writes the gradient over logits; pass "
                                     "grad=True, or inplace=False")
    elif grad_scale is not None:
        scale = checks.check_scalar(grad_scale, "grad_scale")
    grad_dtype = dtype if grad else None
    if inplace and out is not None and not (out.data.ptr == logits.data.ptr
                                            and out.strides == logits.strides
                                            and out.dtype == logits.dtype):
        raise ArgumentValueError("out: inplace=True writes the gradient over logits; pass "
                                 "out=None (or out=logits)")
    if out is not None:
        grad_dtype = checks.check_shaped(out, "out", logits.shape, "(logits')", tuple(DType))
        checks.check_out(out, {"logits": logits, "targets": targets})
        _check_rows(out, "out", n)
        inplace = out.data.ptr == logits.data.ptr and logits.size > 0
    if inplace:
        _check_rows(logits, "logits", n)
    checks.check_aligned(logits, "logits")
    checks.check_aligned(targets, "targets")
    return Problem(rows, n, dtype, targets.dtype.name, grad_dtype, reduction, ignore_index,
                   smoothing, check, inplace, cfg), scale


def tuning_key(prob: Problem) -> dict:
    """What keys the tuning database for a call: the types, the class count and the row count
    (each rounded up to a power of two) and whether label smoothing is on."""
    return {"dtype": prob.dtype.value,
            "grad_dtype": prob.grad_dtype.value if prob.grad_dtype else "none",
            "n": 1 << max(prob.n - 1, 0).bit_length(),
            "rows": 1 << max(prob.rows - 1, 0).bit_length(), "smoothing": prob.smoothing > 0}


def decide(prob: Problem, logits, grad_ptr: int, grad_row: int) -> tuple[Kernels, str]:
    """(kernels, reason) of a checked call: the pinned config, else the tuning database's for
    this key, else the heuristic. ``logits`` is the array the kernel reads (a CuPy view),
    ``grad_ptr`` and ``grad_row`` the gradient's pointer and row stride (elements; 0, 0 for
    none or a new one: the call allocates it with rows of ``n`` elements, so its rows are
    aligned as ``n`` allows, whatever the logits' row stride)."""
    reason, cfg = "pinned", prob.config
    if cfg is None:
        tuned = tuned_config("cross_entropy", tuning_key(prob))
        cfg = None if tuned is None else parse_config(tuned)
        reason = "heuristic" if cfg is None else "tuned"
    if cfg is None:
        cfg = heuristic(prob.n, prob.dtype)
    spans = [(logits.data.ptr, logits.strides[0] // logits.itemsize, logits.itemsize)]
    if prob.grad_dtype is not None:
        spans.append((grad_ptr, grad_row or prob.n, prob.grad_dtype.itemsize))
    vec = vector_width(access_width(prob.dtype, prob.grad_dtype), spans, prob.rows)
    return _kernels(cfg, prob.rows, prob.dtype, prob.target_dtype, prob.grad_dtype,
                    reduction=prob.reduction, smoothing=prob.smoothing > 0, check=prob.check,
                    max_vec=vec), reason


def _first_call(fw, device_id, v, native, options, grad_scale):
    """Check a call (``v``: CuPy views, ``native``: the arrays as given), launch it; (the
    result, its prepared call or None)."""
    logits, targets, out = v["logits"], v["targets"], v["out"]
    prob, scale = checked(logits, targets, out, options, grad_scale)
    checks.check_same_device({"logits": logits, "targets": targets, "out": out}, device_id)
    copies = prob.n > 1 and logits.strides[1] != logits.itemsize
    if copies:   # a strided class axis (never in place: checked): read from a copy
        logits = checks._cupy().ascontiguousarray(logits)
    grad_ptr, grad_row = 0, 0
    if prob.inplace:
        grad_ptr, grad_row = logits.data.ptr, logits.strides[0] // logits.itemsize
    elif out is not None:
        grad_ptr, grad_row = out.data.ptr, out.strides[0] // out.itemsize
    ks, _ = decide(prob, logits, grad_ptr, grad_row)
    run = _runner(fw, device_id, prob, ks, logits.strides[0] // logits.itemsize,
                  grad_row or prob.n, targets.strides[0] // targets.itemsize)
    outputs = _outputs(fw, device_id, prob, v["logits"].dtype)
    if copies:
        loss, grad = outputs(native["logits"], native["out"])
        run(logits.data.ptr, targets.data.ptr, 0 if grad is None else fw.ptr(grad),
            fw.ptr(loss), scale)
        return (loss if grad is None else (loss, grad)), None
    call = _prepared_call(fw, prob, run, outputs, v, out is not None)
    return call(native["logits"], native["targets"], native["out"], scale), call


def _outputs(fw, device_id, prob: Problem, logits_dtype):
    """``outputs(logits, out) -> (loss, gradient or None)`` of a call: new arrays of the
    framework (the gradient of the logits' type), or the gradient ``out`` or the logits
    themselves where asked."""
    new_loss = fw.allocator(np.float32, device_id)
    loss_shape = () if prob.reduction != "none" else (prob.rows,)
    new_grad, grad_shape = fw.allocator(logits_dtype, device_id), (prob.rows, prob.n)
    grad, inplace = prob.grad_dtype is not None, prob.inplace

    def outputs(logits, out):
        loss = new_loss(loss_shape)
        if not grad:
            return loss, None
        if out is not None:
            return loss, out
        return loss, logits if inplace else new_grad(grad_shape)

    return outputs


def _runner(fw, device_id, prob: Problem, ks: Kernels, ld: int, gld: int, ts: int):
    """``run(logits, targets, grad, loss, grad_scale)`` on pointers: scratch memory, then the
    kernels on the framework's current stream, the targets checked in between."""
    stream = fw.stream_getter(device_id)
    alloc = fw.scratch(device_id)
    need_losses = prob.reduction != "none"
    nbytes = (WS_BYTES if ks.targets is not None or need_losses else 0) + (
        4 * prob.rows if need_losses else 0)
    targets_launch = None if ks.targets is None else launcher_for(ks.targets, device_id).bind(
        (1, 1, 1), (ks.targets.threads, 1, 1), 0, rows=prob.rows, n=prob.n, ts=ts,
        ignore_index=prob.ignore_index)
    rows_launch = launcher_for(ks.rows, device_id).bind(
        ks.grid, ks.block, 0, rows=prob.rows, n=prob.n, ld=ld, gld=gld, ts=ts,
        ignore_index=prob.ignore_index, smoothing=prob.smoothing)
    reduce_launch = None if ks.reduce is None else launcher_for(ks.reduce, device_id).bind(
        (1, 1, 1), (ks.reduce.threads, 1, 1), 0, rows=prob.rows)
    check = prob.check

    def run(lp: int, tp: int, gp: int, loss: int, scale: float):
        s = stream()
        if check:
            _refuse_capture(s)
        scratch = alloc(nbytes) if nbytes else None
        ws = scratch.ptr if scratch is not None else 0
        losses = ws + WS_BYTES if need_losses else loss
        if targets_launch is not None:
            targets_launch(s, targets=tp, ws=ws)
            if check:
                _check_targets(ws, s, prob)
        rows_launch(s, logits=lp, targets=tp, grad=gp, losses=losses, ws=ws, grad_scale=scale)
        if reduce_launch is not None:
            reduce_launch(s, losses=losses, ws=ws, out=loss)
        return scratch   # held until the launches are queued

    return run


def _refuse_capture(stream_ptr: int) -> None:
    if checks._cupy().cuda.runtime.streamIsCapturing(stream_ptr):
        raise ArgumentValueError(
            "check_targets: checking the class indices reads a result back to the host, "
            "which a CUDA graph capture cannot hold; pass check_targets=False inside a capture "
            "(rows with a class outside [0, V) then get a NaN loss and gradient)")


def _check_targets(ws: int, stream_ptr: int, prob: Problem) -> None:
    """Raise if the targets kernel found a class outside [0, V) (waits for the stream)."""
    rt = checks._cupy().cuda.runtime
    host = np.empty(2, np.int64)
    rt.memcpyAsync(host.ctypes.data, ws + 8, 16, rt.memcpyDeviceToHost, stream_ptr)
    rt.streamSynchronize(stream_ptr)
    row, value = int(host[0]), int(host[1])
    if row >= 0:
        raise ArgumentValueError(
            f"targets: row {row} holds {value}, outside [0, {prob.n}) and not ignore_index "
            f"({prob.ignore_index}); nothing was written (check_targets=False would give that "
            "row a NaN loss and gradient)")


def _prepared_call(fw, prob: Problem, run, outputs, v: dict, given: bool):
    """The prepared call ``call(logits, targets, out, grad_scale)`` of a signature."""
    ptr = fw.ptr
    guard = (OverlapGuard(("logits", "targets", "out"), (v["logits"], v["targets"], v["out"]),
                          (2,), in_place={(2, 0)}) if given else None)
    grad = prob.grad_dtype is not None

    def call(logits, targets, out, grad_scale):
        if grad_scale is None:
            scale = 1.0
        elif type(grad_scale) is float:
            scale = grad_scale
        else:
            scale = checks.check_scalar(grad_scale, "grad_scale")
        lp, tp = ptr(logits), ptr(targets)
        if guard is not None:
            guard((lp, tp, ptr(out)))
        loss, g = outputs(logits, out)
        run(lp, tp, 0 if g is None else ptr(g), ptr(loss), scale)
        return (loss, g) if grad else loss

    return call


def scale_gradient(grad, factor):
    """Multiply a gradient in place by a loss's upstream gradient: ``grad[r, :] *=
    factor[r]`` (``factor`` of shape (rows,), any stride) or ``grad *= factor`` (shape ()
    or (1,)), in float32 and rounded once. Rows whose factor is exactly 1, the usual upstream
    gradient of a loss, are not read or written: the common case costs one launch and no
    memory traffic, without the host reading the factor (no synchronization). PyTorch's
    backward of ``ge2jit.torch.cross_entropy`` runs this on the gradient its forward saved.

    Args:
        grad: a (rows, V) float32, float16 or bfloat16 GPU array whose rows have a unit-stride
            last axis (and do not overlap).
        factor: a float32 GPU array of shape (), (1,) or (rows,).

    Returns:
        ``grad``.
    """
    fw, device_id, native = call_arguments({"grad": grad, "factor": factor})
    with fw.context(device_id):
        v = views(fw, native)
        g, f = v["grad"], v["factor"]
        dtype = _check_matrix(g, "grad")
        rows, n = g.shape
        _check_rows(g, "grad", n)
        checks.check_array(f, "factor")
        if f.dtype != np.float32 or f.shape not in ((), (1,), (rows,)):
            raise ArgumentValueError(f"factor: expected a float32 array of shape (), (1,) or "
                                     f"({rows},), got {f.dtype} of shape {f.shape}")
        checks.check_same_device({"grad": g, "factor": f}, device_id)
        checks.check_aligned(g, "grad")
        checks.check_aligned(f, "factor")
        if g.size == 0:
            return native["grad"]
        gld = g.strides[0] // g.itemsize
        fs = f.strides[0] // f.itemsize if f.shape == (rows,) and rows > 1 else 0
        spec = scale_spec(dtype, vector_width(access_width(dtype, None),
                                              [(g.data.ptr, gld, g.itemsize)], rows))
        launcher_for(spec, device_id).launch(
            (max(1, min(rows, GRID_MAX)), 1, 1), (spec.threads, 1, 1), 0,
            fw.stream_getter(device_id)(), grad=g.data.ptr, f=f.data.ptr, rows=rows, n=n,
            gld=gld, fs=fs)
    return native["grad"]
