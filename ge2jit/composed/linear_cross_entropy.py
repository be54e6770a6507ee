"""linear_cross_entropy: a linear layer's output (a language model's head) and the cross-entropy
of it, in chunks of rows, so that the (rows x V) logits never exist in memory; with the
gradients of the input and of the weight made on the way. Built from two ops' public calls
(``gemm_bias_act`` and ``cross_entropy``); it owns no kernel.

Each chunk of rows is three GEMMs (``gemm_bias_act``) and one cross-entropy kernel, on one
logits buffer of ``chunk_rows x V`` reused by every chunk:

    logits = x_c @ W.T                       (the buffer)
    loss_c, G = cross_entropy(logits, t_c)   (G, the gradient, written over the logits)
    dx_c = G @ W                             (written once into its rows of dx)
    dW += G.T @ x_c                          (accumulated in place, in float32)
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import ArgumentValueError
from ..ops.cross_entropy import check_options, cross_entropy, scale_gradient
from ..ops.gemm import gemm_bias_act
from ..runtime import checks
from ..runtime.arrays import call_arguments, views

#: the default size of a chunk's logits: large enough that every GEMM of a chunk runs at the
#: tensor cores' rate (the weight-gradient GEMM sums over the chunk's rows, and its float32
#: accumulator is read and written once per chunk), small beside the whole logits
CHUNK_BYTES = 512 << 20
#: chunks hold a multiple of this many rows (the GEMMs' tile height), unless there is one
ROW_QUANTUM = 128


def chunk_rows_for(rows: int, classes: int, itemsize: int, d: int = 0,
                   budget: int = CHUNK_BYTES) -> int:
    """The default rows of a chunk: every row when the whole logits fit ``budget`` bytes, or
    take no more than the float32 accumulator of a (classes, d) weight's gradient that chunks
    would need (then one chunk costs the least memory), else as many multiples of 128 rows as
    fit the budget (at least 128)."""
    whole = rows * classes * itemsize
    if whole <= budget or whole <= classes * d * 4:
        return max(rows, 1)
    fit = budget // (classes * itemsize) // ROW_QUANTUM * ROW_QUANTUM
    return max(ROW_QUANTUM, min(fit, rows))


def linear_cross_entropy(x, weight, targets, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         grad: bool = False, grad_scale=None, chunk_rows=None,
                         check_targets: bool = True, precision=None):
    """The cross-entropy of ``x @ weight.T`` against class indices (``cross_entropy`` of a
    linear layer's output, e.g. a language model's head and loss) without the (rows, V)
    logits in memory: the rows go through in chunks, each a GEMM into one reused buffer of
    ``chunk_rows x V`` logits, the loss kernel (and with ``grad``, its gradient written over
    those logits), then the GEMMs of ``d x`` and ``d weight``. Memory beyond the inputs and
    results: the buffer, plus a float32 copy of ``d weight`` to add the chunks into when the
    weight is 16-bit and there is more than one chunk.

    The logits are computed as ``gemm_bias_act`` computes them (float32 sums, rounded once to
    ``x``'s type, as PyTorch's ``F.linear`` gives them), the loss in float32 (as
    ``cross_entropy``); the gradient of the logits is rounded to ``x``'s type before its two
    GEMMs, as PyTorch's backward rounds it.

    Args:
        x: (rows, d) GPU array (CuPy or PyTorch, as ``gemm_bias_act``) of float32, float16 or
            bfloat16, any strides.
        weight: (V, d) of ``x``'s dtype (a head's ``nn.Linear.weight``), any strides.
        targets: (rows,) int32 or int64 class indices, any stride.
        ignore_index: rows whose class is this add nothing (as ``cross_entropy``).
        reduction: "none", "sum" or "mean" (over the rows not ignored: NaN when every row
            is), as ``cross_entropy``.
        label_smoothing: as ``cross_entropy``.
        check_targets: as ``cross_entropy`` (one synchronization per chunk; False inside
            CUDA graph captures).
        grad: also return ``d loss / d x`` and ``d loss / d weight``: ``(loss, dx, dweight)``
            (with reduction "none": the gradients of the losses' sum), in ``x``'s and
            ``weight``'s dtypes.
        grad_scale: the loss's upstream gradient, a real number (default 1; with ``grad``).
        chunk_rows: rows per chunk (default: every row when the logits fit 512 MiB or take
            no more memory than the float32 gradient of the weight that several chunks add
            into, else the multiple of 128 rows that fits 512 MiB).
        precision: float32 inputs: the GEMMs' precision (``gemm_bias_act``'s).

    Returns:
        The loss (float32; shape () for "sum" and "mean", (rows,) for "none"), or with
        ``grad`` ``(loss, dx, dweight)``.

    Raises:
        ArgumentTypeError, ArgumentValueError: bad arguments, one line naming the argument
            (before anything is launched), or a class outside [0, V) with ``check_targets``.
    """
    fw, device_id, native = call_arguments({"x": x, "weight": weight, "targets": targets})
    with fw.context(device_id):
        v = views(fw, native)
        prob = _check(v, reduction, grad, grad_scale, chunk_rows, ignore_index,
                      label_smoothing, check_targets, precision)
        total, count, dx, dw = run(fw, device_id, native, prob)
        loss = _loss(fw, device_id, prob, total, count)
        if not grad:
            return loss
        factor = None if count is None else _factor(fw, count)
        return (loss, *finish(fw, device_id, dx, dw, factor, prob.weight_dtype))


def _alloc(fw, device_id: int, dtype, shape):
    """A new array of the framework (PyTorch's caching allocator for tensors)."""
    return fw.allocator(np.dtype(dtype), device_id)(shape)


def linear_cross_entropy_rows(x, weight, targets, row_scale, *, ignore_index: int = -100,
                              label_smoothing: float = 0.0, chunk_rows=None, precision=None):
    """``(dx, d weight)`` of ``sum(row_scale * losses)``, the losses those of
    ``linear_cross_entropy(..., reduction="none")``: each chunk's gradient rows are scaled by
    their ``row_scale`` (a float32 (rows,) GPU array) before its GEMMs. The backward of the
    per-row losses (PyTorch's, for an upstream gradient per row)."""
    fw, device_id, native = call_arguments({"x": x, "weight": weight, "targets": targets,
                                            "row_scale": row_scale})
    with fw.context(device_id):
        v = views(fw, native)
        rows = v["x"].shape[0] if v["x"].ndim == 2 else -1
        rs = v["row_scale"]
        checks.check_array(rs, "row_scale")
        if rs.dtype != np.float32 or rs.shape != (rows,):
            raise ArgumentValueError(f"row_scale: expected float32 of shape ({rows},), got "
                                     f"{rs.dtype} of shape {rs.shape}")
        prob = _check(v, "none", True, None, chunk_rows, ignore_index, label_smoothing, False,
                      precision, native["row_scale"])
        _, _, dx, dw = run(fw, device_id, native, prob)
        return finish(fw, device_id, dx, dw, None, prob.weight_dtype)


class _Problem:
    """A checked call: sizes, the options and the chunk height."""

    __slots__ = ("rows", "d", "classes", "reduction", "ignore_index", "smoothing", "grad",
                 "check", "chunk", "precision", "row_scale", "scale", "dtype", "weight_dtype")

    def __init__(self, **kw):
        for name in self.__slots__:
            setattr(self, name, kw.get(name))


def _check(v, reduction, grad, grad_scale, chunk_rows, ignore_index, smoothing, check,
           precision=None, row_scale=None) -> _Problem:
    x, w, t = v["x"], v["weight"], v["targets"]
    for name, a in (("x", x), ("weight", w)):
        checks.check_array(a, name)
        checks.check_dtype(a, name)
        if a.ndim != 2:
            axes = "(rows, d)" if name == "x" else "(V, d)"
            raise ArgumentValueError(f"{name}: expected a 2-D array {axes}, got shape "
                                     f"{a.shape}")
    rows, d = x.shape
    if w.dtype != x.dtype:
        raise ArgumentValueError(f"weight: expected x's dtype {x.dtype}, got {w.dtype}")
    if w.shape[1] != d or w.shape[0] == 0:
        raise ArgumentValueError(f"weight: expected shape (V, {d}) with V >= 1 (x is "
                                 f"{x.shape}), got {w.shape}")
    ignore_index, smoothing = check_options(t, rows, "x", ignore_index, reduction, smoothing)
    grad = checks.check_bool(grad, "grad")
    if grad_scale is not None:
        if not grad:
            raise ArgumentValueError("grad_scale: applies to the gradient; pass grad=True, or "
                                     "leave grad_scale out")
        checks.check_scalar(grad_scale, "grad_scale")
    if chunk_rows is None:
        chunk = chunk_rows_for(rows, w.shape[0], x.itemsize, d)
    else:
        chunk = checks.check_int64(chunk_rows, "chunk_rows")
        if chunk < 1:
            raise ArgumentValueError(f"chunk_rows: expected a positive int, got {chunk_rows!r}")
    checks.check_same_device({"x": x, "weight": w, "targets": t},
                             x.data.device_id if x.size else w.data.device_id)
    return _Problem(rows=rows, d=d, classes=w.shape[0], reduction=reduction,
                    ignore_index=ignore_index, smoothing=smoothing,
                    grad=grad, check=checks.check_bool(check, "check_targets"),
                    chunk=min(chunk, max(rows, 1)), precision=precision, row_scale=row_scale,
                    scale=1.0 if grad_scale is None else float(grad_scale), dtype=x.dtype,
                    weight_dtype=w.dtype)


def run(fw, device_id: int, native: dict, prob: _Problem):
    """The chunks of a checked call on the framework's own arrays (``native``; inside
    ``fw.context``, so that every allocation, ge2jit's and the framework's arithmetic's, is
    the framework's, ordered on its stream, and fit for a CUDA graph capture): ``(loss sum or
    the (rows,) losses, the count of rows not ignored, dx, d weight)``, all the framework's
    arrays. The gradients are those of the losses' sum times ``prob.scale`` (each chunk's
    gradient rows times ``prob.row_scale`` where it is given), d weight in float32 when it was
    added up over chunks; None for what was not asked for. "mean" in one chunk is the
    cross-entropy kernel's own (the loss the mean, the gradient scaled as it is written: the
    count None); over several chunks the loss and gradients are the sums', to be divided by
    the count."""
    x, w, t = native["x"], native["weight"], native["targets"]
    rows, classes, dtype = prob.rows, prob.classes, prob.dtype
    alloc = functools.partial(_alloc, fw, device_id)
    per_row = prob.reduction == "none"
    losses = alloc(np.float32, (rows,)) if per_row else None
    chunks = [(r, min(r + prob.chunk, rows)) for r in range(0, rows, prob.chunk)]
    direct = prob.reduction == "mean" and len(chunks) == 1 and prob.row_scale is None
    count = (t != prob.ignore_index).sum() if prob.reduction == "mean" and not direct \
        else None
    reduction = "mean" if direct else "none" if per_row else "sum"
    # rows padded to 16 bytes: the GEMMs that read the gradient (a row-major A, a column-major
    # A) need 16-byte aligned rows for the tensor cores' asynchronous copies (an odd V, as
    # GPT-2's 50257, would take the slow kernel)
    pad = 16 // dtype.itemsize
    padded = -(-classes // pad) * pad
    logits = alloc(dtype, (min(prob.chunk, rows), padded))[:, :classes] if rows else None
    dx = dw = None
    if prob.grad:
        dx = alloc(dtype, (rows, prob.d))
        dw = alloc(np.float32 if len(chunks) > 1 else prob.weight_dtype, (classes, prob.d))
        if not chunks:
            dw[...] = 0
    total = None
    wt = w.T
    for i, (r0, r1) in enumerate(chunks):
        xc, lc = x[r0:r1], logits[: r1 - r0]
        gemm_bias_act(xc, wt, out=lc, precision=prob.precision)
        out = cross_entropy(lc, t[r0:r1], ignore_index=prob.ignore_index, reduction=reduction,
                            label_smoothing=prob.smoothing, grad=prob.grad, inplace=prob.grad,
                            grad_scale=prob.scale if prob.grad else None,
                            check_targets=prob.check)
        loss_c = out[0] if prob.grad else out
        if per_row:
            losses[r0:r1] = loss_c
        else:
            total = loss_c if total is None else total + loss_c
        if not prob.grad:
            continue
        if prob.row_scale is not None:
            scale_gradient(lc, prob.row_scale[r0:r1])
        gemm_bias_act(lc, w, out=dx[r0:r1], precision=prob.precision)
        gemm_bias_act(lc.T, xc, c=dw if i else None, beta=1.0 if i else 0.0, out=dw,
                      precision=prob.precision)
    if not per_row and total is None:
        total = fw.zeros((), np.dtype(np.float32), device_id)
    return (losses if per_row else total), count, dx, dw


def _factor(fw, count):
    """The gradients' factor of "mean" over several chunks, a float32 GPU scalar of the
    framework: one over the count (no rows counted: the gradients are 0, and stay so)."""
    if fw.name == "torch":
        return 1.0 / count.clamp_min(1).float()
    import cupy as cp

    return (cp.float32(1.0) / cp.maximum(count, 1).astype(np.float32)).astype(np.float32)


def _as_float32(fw, a):
    return a.float() if fw.name == "torch" else a.astype(np.float32)


def _loss(fw, device_id: int, prob: _Problem, total, count):
    """The loss as the framework's float32 array: the sum, the mean, or the (rows,) losses."""
    if prob.reduction == "none":
        return total
    loss = _alloc(fw, device_id, np.float32, ())
    loss[...] = total / _as_float32(fw, count) if count is not None else total
    return loss


def finish(fw, device_id: int, dx, dw, factor, target):
    """``(dx, d weight)`` (``run``'s) scaled in place by ``factor`` (a float32 GPU array of
    shape () or None for 1), d weight rounded to ``target`` (the weight's NumPy dtype) if it
    was added up in float32, scaled and rounded in one pass."""
    if factor is not None:
        scale_gradient(dx, factor)
    now = fw.numpy_dtype(dw.dtype, "dweight") if fw.name == "torch" else dw.dtype
    if now != target:
        out = _alloc(fw, device_id, target, tuple(dw.shape))
        if factor is None:
            out[...] = dw
        elif fw.name == "torch":
            import torch

            torch.mul(dw, factor, out=out)
        else:
            import cupy as cp

            cp.multiply(dw, factor, out=out)
        return dx, out
    if factor is not None:
        scale_gradient(dw, factor)
    return dx, dw
