"""Validation of gemm_bias_act's arguments: every check happens here, before any launch."""

from __future__ import annotations

import numpy as np

from ...errors import ArgumentValueError
from ...runtime.checks import (  # noqa: F401 - the op's modules take the shared kit from here
    _cupy,
    byte_span,
    check_aligned,
    check_array,
    check_dtype,
    check_same_device,
    check_scalar,
    check_shaped,
)
from ...runtime.dtypes import SUPPORTED_DTYPES, DType, dtype_name
from ...runtime.prepared import check_spans
from .epilogue import ACT_NAMES, Act, BiasKind, Epilogue, Layout
from .spec import Precision

PRECISIONS = {p.value: p for p in Precision}
BIAS_SHAPES_TEXT = "None, () or (1,) for a scalar, (N,) or (1, N) per column, (M, 1) per row"
#: The largest K: the kernels count along K in 32-bit integers.
MAX_K = 2**31 - 1
#: The largest M and N: 32-bit tile coordinates, with room for the offsets of the last tile's
#: threads past its first row or column (m0 + BM and the like stay below 2**31).
MAX_MN = 2**31 - 2**16


def check_out_dtype(out_dtype, dtype: DType, out, arg: str = "out_dtype") -> DType:
    """Y's type: ``out_dtype``, else ``out``'s dtype, else the inputs'. Allowed: the inputs'
    dtype or float32. ``arg``: the argument's name, for the error."""
    allowed = {dtype.numpy_name, "float32"}
    text = " or ".join(sorted(allowed))
    if out_dtype is None:
        if out is None:
            return dtype
        name = out.dtype.name
        if name not in allowed:
            raise ArgumentValueError(f"out: expected dtype {text} (a and b are "
                                     f"{dtype.numpy_name}), got {out.dtype}")
        return SUPPORTED_DTYPES[name]
    name = dtype_name(out_dtype)
    if name not in allowed:
        raise ArgumentValueError(f"{arg}: expected {text} (a and b are {dtype.numpy_name}),"
                                 f" got {out_dtype!r}")
    return SUPPORTED_DTYPES[name]


def check_precision(precision, dtype: DType) -> Precision:
    """float32 math mode: 'ieee' (exact float32, the default), 'tf32' (tensor cores, tf32
    inputs) or 'tf32x3' (tensor cores, float32 accuracy from three tf32 products)."""
    if precision is None:
        from ...settings import get_settings

        precision = get_settings().float32_precision if dtype is DType.F32 else "ieee"
    p = PRECISIONS.get(precision) if isinstance(precision, str) else (
        precision if isinstance(precision, Precision) else None)
    if p is None:
        raise ArgumentValueError(f"precision: expected one of {', '.join(PRECISIONS)} or None, "
                                 f"got {precision!r}")
    if p is not Precision.IEEE and dtype is not DType.F32:
        raise ArgumentValueError(f"precision: {p.value!r} applies to float32 inputs; a and b "
                                 f"are {dtype.numpy_name}, which run on the tensor cores "
                                 f"already")
    return p


def _input_or_f32(x, name: str, dtype: DType) -> DType:
    """C's and the bias' type: the inputs' dtype or float32."""
    dt = SUPPORTED_DTYPES.get(x.dtype.name)
    if dt is not dtype and dt is not DType.F32:
        allowed = " or ".join(sorted({dtype.numpy_name, "float32"}))
        raise ArgumentValueError(f"{name}: expected dtype {allowed} (a and b are "
                                 f"{dtype.numpy_name}), got {x.dtype}")
    return dt


def layout_by_strides(rows: int, cols: int, e0: int, e1: int):
    """(Layout, leading dimension) of a non-empty 2-D operand of these strides in elements,
    or None where it is neither row- nor column-major (``layout_of``'s rule)."""
    if (cols == 1 or e1 == 1) and (rows == 1 or e0 >= cols):
        return Layout.ROW, (e0 if rows > 1 else cols)
    if (rows == 1 or e0 == 1) and (cols == 1 or e1 >= rows):
        return Layout.COL, (e1 if cols > 1 else rows)
    return None


def layout_of(x, name: str):
    """(Layout, leading dimension in elements, array) of a 2-D operand, used without a copy.

    Row-major means strides (ld, 1) with ld >= columns, column-major (1, ld) with ld >= rows; a
    slice of a larger array qualifies. Any other strides (negative, both non-unit, not a multiple
    of the item size) are copied into a C-contiguous array: the result is right, at the cost of
    one copy. Strides that are not multiples of the item size are refused before this
    (``check_aligned``).
    """
    rows, cols = x.shape
    if x.size == 0:
        return Layout.ROW, max(cols, 1), x
    item = x.itemsize
    s0, s1 = x.strides
    if s0 % item == 0 and s1 % item == 0:
        found = layout_by_strides(rows, cols, s0 // item, s1 // item)
        if found is not None:
            return (*found, x)
    cp = _cupy()
    y = cp.ascontiguousarray(x)
    return Layout.ROW, max(cols, 1), y


def check_act(act) -> Act:
    if isinstance(act, Act):
        return act
    a = ACT_NAMES.get(act) if isinstance(act, str) else None
    if a is None:
        raise ArgumentValueError(
            f"act: unknown activation {act!r}; valid names: {', '.join(ACT_NAMES)}"
        )
    return a


def bias_kind(bias, m: int, n: int) -> tuple[BiasKind, int]:
    """(kind, element stride along the bias' varying dimension) of a bias for an (m, n) output."""
    if bias is None:
        return BiasKind.NONE, 0
    check_array(bias, "bias")
    check_aligned(bias, "bias")
    shape = bias.shape
    if bias.ndim <= 2 and bias.size == 1:
        return BiasKind.SCALAR, 0
    item = bias.itemsize
    if shape == (n,):
        return BiasKind.COL, bias.strides[0] // item
    if shape == (1, n):
        return BiasKind.COL, bias.strides[1] // item
    if shape == (m, 1):
        return BiasKind.ROW, bias.strides[0] // item
    raise ArgumentValueError(
        f"bias: shape {shape} does not broadcast to the output's ({m}, {n}) in a supported way; "
        f"accepted: {BIAS_SHAPES_TEXT}"
    )


_SPAN_NAMES = ("a", "b", "c", "bias", "out", "preact_out")


def check_outputs_do_not_overlap(a, b, c, bias, out, preact_out) -> None:
    check_spans(_SPAN_NAMES, [None if x is None else byte_span(x)
                              for x in (a, b, c, bias, out, preact_out)], (4, 5))


class Problem:
    """A validated call: sizes, types, the epilogue and the operands as the kernel will read
    them. Immutable: ``replace`` makes a changed copy."""

    __slots__ = ("m", "n", "k", "dtype", "y_numpy_dtype", "precision", "epilogue",
                 "bias_stride", "alpha", "beta", "leaky_slope", "device_id", "a", "b", "c",
                 "bias", "out", "preact_out", "layout_a", "lda", "layout_b", "ldb", "ldc",
                 "copied")

    def __init__(self, **kw):
        unknown = set(kw) - set(self.__slots__)
        if unknown:
            raise TypeError(f"Problem: unknown fields {sorted(unknown)}")
        for name in self.__slots__:
            object.__setattr__(self, name, kw.get(name))

    def __setattr__(self, name, value):
        raise AttributeError(f"Problem is immutable (set {name} through replace())")

    def replace(self, **changes) -> Problem:
        """A copy with ``changes``."""
        return Problem(**{**{name: getattr(self, name) for name in self.__slots__}, **changes})

    @property
    def empty(self) -> bool:
        return self.m == 0 or self.n == 0


def check_output(x, name: str, m: int, n: int, dtype) -> None:
    """An output must be an (m, n) array of ``dtype``, row-major (ld >= n)."""
    check_array(x, name)
    if x.shape != (m, n) or x.dtype != dtype:
        raise ArgumentValueError(
            f"{name}: expected shape ({m}, {n}) and dtype {dtype}, got shape {x.shape} and "
            f"dtype {x.dtype}"
        )
    check_aligned(x, name)
    item = x.itemsize
    if m and n and ((n > 1 and x.strides[1] != item) or (m > 1 and x.strides[0] < n * item)):
        raise ArgumentValueError(
            f"{name}: expected a row-major array (strides (ld*{item}, {item}) with ld >= {n}), "
            f"got strides {x.strides}; pass a C-contiguous array"
        )


def validate(a, b, bias, act, c, alpha, beta, leaky_slope, out, preact_out=None,
             save_preact=False, out_dtype=None, precision=None, glu=False) -> Problem:
    """Check every argument of gemm_bias_act (``glu``: of gemm_gated, whose B holds (gate,
    linear) column pairs and whose Y has half of B's columns); raise before anything is
    launched."""
    cp = _cupy()
    a = check_array(a, "a")
    b = check_array(b, "b")
    if a.ndim != 2:
        raise ArgumentValueError(f"a: expected a 2-D (M, K) array, got shape {a.shape}")
    if b.ndim != 2:
        raise ArgumentValueError(f"b: expected a 2-D (K, N) array, got shape {b.shape}")
    dtype = check_dtype(a, "a")
    if b.dtype != a.dtype:
        raise ArgumentValueError(f"b: expected dtype {a.dtype} (the dtype of a), got {b.dtype}")
    m, k = a.shape
    k2, n = b.shape
    if k2 != k:
        raise ArgumentValueError(
            f"b: expected shape ({k}, {'2N' if glu else 'N'}) to match a of shape {a.shape} "
            f"(a is (M, K), b is (K, {'2N' if glu else 'N'})), got {b.shape}"
        )
    if glu and n % 2:
        raise ArgumentValueError(
            f"b: expected (K, 2N), the gate and linear columns interleaved in pairs (an even "
            f"number of columns; see interleave_gate_up), got shape {b.shape}")
    for name, size, limit, text in (("M", m, MAX_MN, "2**31 - 2**16"),
                                    ("N", n, MAX_MN, "2**31 - 2**16"),
                                    ("K", k, MAX_K, "2**31 - 1")):
        if size > limit:
            raise ArgumentValueError(f"{name} = {size}: at most {limit} ({text}) is supported")
    check_aligned(a, "a")
    check_aligned(b, "b")
    act_e = check_act(act)
    alpha = check_scalar(alpha, "alpha")
    beta = check_scalar(beta, "beta")
    slope = check_scalar(leaky_slope, "leaky_slope")
    kind, bias_stride = bias_kind(bias, m, n)
    if glu and kind not in (BiasKind.NONE, BiasKind.COL):
        raise ArgumentValueError(
            f"bias: expected None or shape ({n},) (2N: the gate's and the linear half's biases "
            f"interleaved as b's columns), got shape {bias.shape}")
    bias_dtype = None if bias is None else _input_or_f32(bias, "bias", dtype)
    c_dtype = None
    if c is not None:
        check_array(c, "c")
        if c.ndim != 2 or c.shape != (m, n):
            raise ArgumentValueError(f"c: expected shape ({m}, {n}) (M, N), got {c.shape}")
        check_aligned(c, "c")
        c_dtype = _input_or_f32(c, "c", dtype)
    elif beta != 0.0:
        raise ArgumentValueError(f"beta: is {beta}, which needs c, but c is None; pass c= or "
                                 "beta=0")
    if out is not None:
        check_array(out, "out")
    y_dtype = check_out_dtype(out_dtype, dtype, out)
    np_y = a.dtype if y_dtype is dtype else np.dtype(np.float32)
    if out is not None:
        check_output(out, "out", m, n // 2 if glu else n, np_y)
    if preact_out is not None:
        if not save_preact:
            raise ArgumentValueError("preact_out: given, but save_preact is False")
        check_output(preact_out, "preact_out", m, n, np_y)
    prec = check_precision(precision, dtype)
    device_id = cp.cuda.runtime.getDevice()
    check_same_device({"a": a, "b": b, "bias": bias, "c": c, "out": out,
                       "preact_out": preact_out}, device_id)
    check_outputs_do_not_overlap(a, b, c, bias, out, preact_out)
    use_c = c is not None and beta != 0.0
    layouts = dict(layout_a=None, lda=0, layout_b=None, ldb=0, ldc=0)
    layout_c = None
    copied = False
    if m and n:
        layouts["layout_a"], layouts["lda"], a_read = layout_of(a, "a")
        layouts["layout_b"], layouts["ldb"], b_read = layout_of(b, "b")
        c_read = c
        if use_c:
            layout_c, layouts["ldc"], c_read = layout_of(c, "c")
        copied = a_read is not a or b_read is not b or (use_c and c_read is not c)
        a, b, c = a_read, b_read, c_read
    epilogue = Epilogue(out_dtype=y_dtype, act=act_e, bias=kind, bias_dtype=bias_dtype,
                        layout_c=layout_c, c_dtype=c_dtype if layout_c is not None else None,
                        save_z=bool(save_preact), glu=glu)
    return Problem(m=m, n=n, k=k, dtype=dtype, y_numpy_dtype=np_y, precision=prec,
                   epilogue=epilogue, bias_stride=bias_stride, alpha=alpha, beta=beta,
                   leaky_slope=slope, device_id=device_id, a=a, b=b, bias=bias, out=out,
                   preact_out=preact_out, c=c if use_c else None, copied=copied, **layouts)

