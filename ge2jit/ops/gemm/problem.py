"""Validation of gemm_bias_act's arguments: every check happens here, before any launch."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import ArgumentValueError
from ...runtime.checks import (  # noqa: F401 - the op's modules take the shared kit from here
    _cupy,
    byte_span,
    check_aligned,
    check_array,
    check_dtype,
    check_float32_word,
    check_host_scale,
    check_same_device,
    check_scalar,
    check_shaped,
    host_scale,
)
from ...runtime.dtypes import FP8_DTYPES, FP8_TEXT, SUPPORTED_DTYPES, DType, dtype_name
from ...runtime.prepared import check_spans, same_view
from .epilogue import ACT_NAMES, Act, BiasKind, Epilogue, Layout, Scale
from .spec import Precision

PRECISIONS = {p.value: p for p in Precision}
BIAS_SHAPES_TEXT = "None, () or (1,) for a scalar, (N,) or (1, N) per column, (M, 1) per row"
#: The largest K: the kernels count along K in 32-bit integers.
MAX_K = 2**31 - 1
#: The largest M and N: 32-bit tile coordinates, with room for the offsets of the last tile's
#: threads past its first row or column (m0 + BM and the like stay below 2**31).
MAX_MN = 2**31 - 2**16


#: Y's types for 8-bit inputs
FP8_OUT = {"bfloat16": DType.BF16, "float16": DType.F16, "float32": DType.F32, **FP8_DTYPES}


def check_out_dtype(out_dtype, dtype: DType, out, arg: str = "out_dtype") -> DType:
    """Y's type: ``out_dtype``, else ``out``'s dtype, else the inputs' (bfloat16 for 8-bit
    inputs). Allowed: the inputs' dtype or float32; for 8-bit inputs bfloat16, float16,
    float32 or an 8-bit format. ``arg``: the argument's name, for the error."""
    table = FP8_OUT if dtype.is_fp8 else {dtype.numpy_name: dtype, "float32": DType.F32}
    text = " or ".join(sorted(table))
    if out_dtype is None:
        if out is None:
            return DType.BF16 if dtype.is_fp8 else dtype
        name = out.dtype.name
        if name not in table:
            raise ArgumentValueError(f"out: expected dtype {text} (a and b are "
                                     f"{dtype.numpy_name}), got {out.dtype}")
        return table[name]
    name = dtype_name(out_dtype)
    if name not in table:
        raise ArgumentValueError(f"{arg}: expected {text} (a and b are {dtype.numpy_name}),"
                                 f" got {out_dtype!r}")
    return table[name]


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
    if dtype.is_fp8:
        if p not in (Precision.IEEE, Precision.FAST_ACCUM):
            raise ArgumentValueError(f"precision: expected 'ieee' (float32 sums, the default) "
                                     f"or 'fast_accum' for {dtype.numpy_name} inputs, got "
                                     f"{p.value!r}")
        return p
    if p is Precision.FAST_ACCUM:
        raise ArgumentValueError(f"precision: 'fast_accum' applies to 8-bit inputs; a and b "
                                 f"are {dtype.numpy_name}")
    if p is not Precision.IEEE and dtype is not DType.F32:
        raise ArgumentValueError(f"precision: {p.value!r} applies to float32 inputs; a and b "
                                 f"are {dtype.numpy_name}, which run on the tensor cores "
                                 f"already")
    return p


def _input_or_f32(x, name: str, dtype: DType) -> DType:
    """C's and the bias' type: the inputs' dtype or float32 (for 8-bit inputs: float32 or
    either 16-bit type)."""
    allowed = set(SUPPORTED_DTYPES.values()) if dtype.is_fp8 else {dtype, DType.F32}
    dt = SUPPORTED_DTYPES.get(x.dtype.name)
    if dt not in allowed:
        text = " or ".join(sorted(d.numpy_name for d in allowed))
        raise ArgumentValueError(f"{name}: expected dtype {text} (a and b are "
                                 f"{dtype.numpy_name}), got {x.dtype}")
    return dt


def input_dtype(a, b, dtype) -> tuple[DType, object, object]:
    """(the inputs' DType, a, b): float32, float16, bfloat16 or an 8-bit format; ``dtype``
    (None, or an 8-bit format's name) reads uint8 arrays as that format (a and b returned as
    views of it)."""
    if dtype is not None:
        fmt = FP8_DTYPES.get(dtype_name(dtype) or "")
        if fmt is None:
            raise ArgumentValueError(f"dtype: expected {FP8_TEXT} (the format of uint8 a and "
                                     f"b) or None, got {dtype!r}")
        for x, arg in ((a, "a"), (b, "b")):
            if x.dtype.name not in ("uint8", fmt.numpy_name):
                raise ArgumentValueError(f"{arg}: expected uint8 or {fmt.numpy_name} data with "
                                         f"dtype={fmt.numpy_name!r}, got {x.dtype}")
        np_dt = fmt.numpy_dtype
        return fmt, a.view(np_dt), b.view(np_dt)
    fmt = FP8_DTYPES.get(a.dtype.name)
    if fmt is None:
        if a.dtype.name == "uint8":
            raise ArgumentValueError(f"a: uint8 data is read as 8-bit floats with dtype= "
                                     f"{FP8_TEXT}; got dtype None")
        fmt = check_dtype(a, "a")
    if b.dtype != a.dtype:
        raise ArgumentValueError(f"b: expected dtype {a.dtype} (the dtype of a), got {b.dtype}")
    return fmt, a, b


class Fp8Args:
    """The scales and the amax of a GEMM of 8-bit inputs (``check_fp8_args``): device arrays,
    or host numbers (those of A and B folded into alpha, Y's inverted into the kernel's
    ``y_scale_``); ``fields``: the ``Epilogue`` fields they make."""

    __slots__ = ("scale_a", "scale_b", "scale_y", "amax", "stride_a", "stride_b", "fields")

    def __init__(self, scale_a, scale_b, scale_y, amax, stride_a, stride_b, fields):
        self.scale_a, self.scale_b, self.scale_y, self.amax = scale_a, scale_b, scale_y, amax
        self.stride_a, self.stride_b, self.fields = stride_a, stride_b, fields

    def launch_args(self, alpha: float, ptr=lambda x: x.data.ptr) -> tuple[float, dict]:
        """(alpha with the host scales of A and B, the kernel's ``fp8_params``) of these
        arguments (``ptr``: the device pointer of an array)."""
        return fp8_launch_args(alpha, self.scale_a, self.scale_b, self.scale_y, self.amax,
                               self.stride_a, self.stride_b, ptr)


def fp8_launch_args(alpha, scale_a, scale_b, scale_y, amax, stride_a, stride_b, ptr
                    ) -> tuple[float, dict]:
    """``Fp8Args.launch_args`` of the arguments of one validated pattern."""
    if host_scale(scale_a):
        alpha, pa = alpha * (1.0 if scale_a is None else scale_a), 0
    else:
        pa = ptr(scale_a)
    if host_scale(scale_b):
        alpha, pb = alpha * (1.0 if scale_b is None else scale_b), 0
    else:
        pb = ptr(scale_b)
    if host_scale(scale_y):
        y_scale, py = (1.0 if scale_y is None else 1.0 / scale_y), 0
    else:
        y_scale, py = 1.0, ptr(scale_y)
    return alpha, {"scale_a": pa, "scale_a_stride": stride_a, "scale_b": pb,
                   "scale_b_stride": stride_b, "scale_y": py,
                   "amax": 0 if amax is None else ptr(amax), "y_scale_": y_scale}


def _check_scale(x, name: str, vector: tuple[tuple[int, ...], ...] = (), what: str = ""
                 ) -> tuple[Scale, int]:
    """(Scale kind, element stride) of a scale: None, a positive finite host number (kind
    NONE: the host applies it), or a float32 device array of one element or of one of the
    ``vector`` shapes (one value per ``what``: a row of A, a column of B)."""
    if host_scale(x):
        check_host_scale(x, name)
        return Scale.NONE, 0
    check_array(x, name)
    if x.dtype != np.float32:
        raise ArgumentValueError(f"{name}: expected a float32 array, got dtype {x.dtype}")
    check_aligned(x, name)
    if x.size == 1 and x.ndim <= 2:
        return Scale.TENSOR, 0
    if x.shape in vector:
        axis = 0 if len(x.shape) == 1 or x.shape[0] > 1 else 1
        return Scale.ROW if what == "row" else Scale.COL, x.strides[axis] // x.itemsize
    per = (f" or one value per {what} (shape " + " or ".join(str(v) for v in vector) + ")"
           if vector else "")
    raise ArgumentValueError(f"{name}: expected a number, a float32 array of one element"
                             f"{per}, got shape {x.shape}")


def check_fp8_args(dtype: DType, y_dtype: DType, m: int, n: int, scale_a, scale_b, scale_y,
                   amax_out) -> Fp8Args | None:
    """The 8-bit inputs' scales and amax, checked (None for other inputs, which take none)."""
    if not dtype.is_fp8:
        for x, name in ((scale_a, "scale_a"), (scale_b, "scale_b"), (scale_y, "scale_y"),
                        (amax_out, "amax_out")):
            if x is not None:
                raise ArgumentValueError(f"{name}: applies to 8-bit inputs ({FP8_TEXT}); a and "
                                         f"b are {dtype.numpy_name}")
        return None
    kind_a, stride_a = _check_scale(scale_a, "scale_a", ((m,), (m, 1)), "row")
    kind_b, stride_b = _check_scale(scale_b, "scale_b", ((n,), (1, n)), "column")
    if scale_y is not None and not y_dtype.is_fp8:
        raise ArgumentValueError(f"scale_y: divides an 8-bit output; Y is "
                                 f"{y_dtype.numpy_name} (out_dtype={FP8_TEXT} for one)")
    kind_y, _ = _check_scale(scale_y, "scale_y")
    if amax_out is not None:
        check_float32_word(amax_out, "amax_out")
    fields = {"scale_a": kind_a, "scale_b": kind_b, "scale_y": kind_y is Scale.TENSOR,
              "amax": amax_out is not None}
    return Fp8Args(scale_a, scale_b, scale_y, amax_out, stride_a, stride_b, fields)


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
    if x.dtype.name in FP8_DTYPES:   # (CuPy copies 8-bit floats as bytes)
        return Layout.ROW, max(cols, 1), cp.ascontiguousarray(x.view(np.uint8)).view(x.dtype)
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


def bias_kind(bias, m: int, n: int, glu: bool = False) -> tuple[BiasKind, int]:
    """(kind, element stride along the bias' varying dimension) of a bias for an (m, n) output
    (``glu``: gemm_gated's, which takes no C)."""
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
    # a full (M, N) array is an addend the epilogue reads as C, not as a bias
    hint = ("; pass a full (M, N) addend as c= with beta=1.0 (Z = alpha * A @ B + beta * C + "
            "bias)" if shape == (m, n) and not glu else "")
    raise ArgumentValueError(
        f"bias: shape {shape} does not broadcast to the output's ({m}, {n}) in a supported way; "
        f"accepted: {BIAS_SHAPES_TEXT}{hint}"
    )


_SPAN_NAMES = ("a", "b", "c", "bias", "out", "preact_out")


#: (output, input) pairs of _SPAN_NAMES where the output may be the input itself: ``out=c``
#: accumulates in place (``Y = alpha * A @ B + beta * Y``; each element of C is read by the
#: thread, or the tile, that then writes the same element of Y)
IN_PLACE = frozenset({(4, 2)})


def check_outputs_do_not_overlap(a, b, c, bias, out, preact_out) -> None:
    arrays = (a, b, c, bias, out, preact_out)
    same = {(o, i) for o, i in IN_PLACE if arrays[o] is not None and arrays[i] is not None
            and same_view(arrays[o], arrays[i])}
    check_spans(_SPAN_NAMES, [None if x is None else byte_span(x) for x in arrays], (4, 5),
                IN_PLACE, same)


class Problem:
    """A validated call: sizes, types, the epilogue and the operands as the kernel will read
    them. Immutable: ``replace`` makes a changed copy."""

    __slots__ = ("m", "n", "k", "dtype", "y_numpy_dtype", "precision", "epilogue",
                 "bias_stride", "alpha", "beta", "leaky_slope", "device_id", "a", "b", "c",
                 "bias", "out", "preact_out", "layout_a", "lda", "layout_b", "ldb", "ldc",
                 "copied", "fp8")

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
             save_preact=False, out_dtype=None, precision=None, glu=False, dtype=None,
             scale_a=None, scale_b=None, scale_y=None, amax_out=None) -> Problem:
    """Check every argument of gemm_bias_act (``glu``: of gemm_gated, whose B holds (gate,
    linear) column pairs and whose Y has half of B's columns); raise before anything is
    launched. ``dtype`` reads uint8 inputs as an 8-bit format; the scales and ``amax_out``
    are 8-bit inputs' (``check_fp8_args``)."""
    cp = _cupy()
    dtype, a, b = _check_operands(a, b, dtype, glu)
    (m, k), n = a.shape, b.shape[1]
    act_e = check_act(act)
    alpha = check_scalar(alpha, "alpha")
    beta = check_scalar(beta, "beta")
    slope = check_scalar(leaky_slope, "leaky_slope")
    kind, bias_stride = bias_kind(bias, m, n, glu)
    if glu and kind not in (BiasKind.NONE, BiasKind.COL):
        raise ArgumentValueError(
            f"bias: expected None or shape ({n},) (2N: the gate's and the linear half's biases "
            f"interleaved as b's columns), got shape {bias.shape}")
    bias_dtype = None if bias is None else _input_or_f32(bias, "bias", dtype)
    c_dtype = _check_c(c, beta, m, n, dtype)
    if out is not None:
        check_array(out, "out")
        if out.dtype.name == "uint8" and dtype_name(out_dtype) in FP8_DTYPES:
            out = out.view(FP8_DTYPES[dtype_name(out_dtype)].numpy_dtype)
    y_dtype = check_out_dtype(out_dtype, dtype, out)
    np_y = y_dtype.numpy_dtype
    if dtype.is_fp8:
        _check_fp8_call(dtype, y_dtype, k, glu, save_preact)
    fp8 = check_fp8_args(dtype, y_dtype, m, n, scale_a, scale_b, scale_y, amax_out)
    if out is not None:
        check_output(out, "out", m, n // 2 if glu else n, np_y)
    if preact_out is not None:
        if not save_preact:
            raise ArgumentValueError("preact_out: given, but save_preact is False")
        check_output(preact_out, "preact_out", m, n, np_y)
    prec = check_precision(precision, dtype)
    device_id = cp.cuda.runtime.getDevice()
    scales = {} if fp8 is None else {name: getattr(fp8, name) for name in
                                     ("scale_a", "scale_b", "scale_y")}
    check_same_device({"a": a, "b": b, "bias": bias, "c": c, "out": out,
                       "preact_out": preact_out, "amax_out": amax_out,
                       **{k: v for k, v in scales.items() if not host_scale(v)}}, device_id)
    check_outputs_do_not_overlap(a, b, c, bias, out, preact_out)
    read = _read_operands(a, b, c if c is not None and beta != 0.0 else None, m, n)
    epilogue = Epilogue(out_dtype=y_dtype, act=act_e, bias=kind, bias_dtype=bias_dtype,
                        layout_c=read.layout_c,
                        c_dtype=c_dtype if read.layout_c is not None else None,
                        save_z=bool(save_preact), glu=glu,
                        **({} if fp8 is None else fp8.fields))
    return Problem(m=m, n=n, k=k, dtype=dtype, y_numpy_dtype=np_y, precision=prec, fp8=fp8,
                   epilogue=epilogue, bias_stride=bias_stride, alpha=alpha, beta=beta,
                   leaky_slope=slope, device_id=device_id, a=read.a, b=read.b, bias=bias,
                   out=out, preact_out=preact_out, c=read.c, copied=read.copied,
                   layout_a=read.layout_a, lda=read.lda, layout_b=read.layout_b, ldb=read.ldb,
                   ldc=read.ldc)


def _check_operands(a, b, dtype, glu: bool) -> tuple[DType, object, object]:
    """``validate``'s A and B: 2-D arrays of one input type (``input_dtype``: ``dtype`` reads
    uint8 as an 8-bit format), of matching K (``glu``: B of an even number of columns), within
    the kernels' sizes, aligned; (the inputs' DType, a, b)."""
    a = check_array(a, "a")
    b = check_array(b, "b")
    if a.ndim != 2:
        raise ArgumentValueError(f"a: expected a 2-D (M, K) array, got shape {a.shape}")
    if b.ndim != 2:
        raise ArgumentValueError(f"b: expected a 2-D (K, N) array, got shape {b.shape}")
    dtype, a, b = input_dtype(a, b, dtype)
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
    return dtype, a, b


def _check_c(c, beta: float, m: int, n: int, dtype: DType) -> DType | None:
    """C's type (None without C): an (M, N) array, of the inputs' type or float32; a nonzero
    ``beta`` needs one."""
    if c is None:
        if beta != 0.0:
            raise ArgumentValueError(f"beta: is {beta}, which needs c, but c is None; pass c= "
                                     "or beta=0")
        return None
    check_array(c, "c")
    if c.ndim != 2 or c.shape != (m, n):
        raise ArgumentValueError(f"c: expected shape ({m}, {n}) (M, N), got {c.shape}")
    check_aligned(c, "c")
    return _input_or_f32(c, "c", dtype)


def _check_fp8_call(dtype: DType, y_dtype: DType, k: int, glu: bool, save_preact) -> None:
    """What a call of 8-bit inputs cannot ask for: gemm_gated, K = 0, Z of an 8-bit Y."""
    if glu:
        raise ArgumentValueError(f"a: gemm_gated takes float32, float16 or bfloat16 "
                                 f"inputs, got {dtype.numpy_name}")
    if k == 0:
        raise ArgumentValueError(f"a: K = 0: a GEMM of {dtype.numpy_name} inputs needs K "
                                 f">= 1")
    if save_preact and y_dtype.is_fp8:
        raise ArgumentValueError(f"save_preact: Z is not stored for an 8-bit output "
                                 f"({y_dtype.numpy_name}); use a 16-bit out_dtype to keep "
                                 f"it")


class _Read(NamedTuple):
    """A problem's operands as its kernel reads them (``layout_of``), with their layouts and
    leading dimensions in elements (None and 0 for an empty problem, and for C where the
    problem takes none); ``copied``: whether any had to be copied."""

    a: object
    layout_a: Layout | None
    lda: int
    b: object
    layout_b: Layout | None
    ldb: int
    c: object
    layout_c: Layout | None
    ldc: int
    copied: bool


def _read_operands(a, b, c, m: int, n: int) -> _Read:
    """``_Read`` of A, B and C (None where the problem takes no C: none given, or beta 0) of
    an (m, n) output: as they are for an empty one."""
    if not (m and n):
        return _Read(a, None, 0, b, None, 0, c, None, 0, False)
    layout_a, lda, a_read = layout_of(a, "a")
    layout_b, ldb, b_read = layout_of(b, "b")
    layout_c, ldc, c_read = (None, 0, None) if c is None else layout_of(c, "c")
    copied = a_read is not a or b_read is not b or (c is not None and c_read is not c)
    return _Read(a_read, layout_a, lda, b_read, layout_b, ldb, c_read, layout_c, ldc, copied)
