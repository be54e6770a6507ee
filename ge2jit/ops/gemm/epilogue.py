"""The fused epilogue of the GEMM kernels: its vocabulary (storage layouts, activations, bias
kinds) and ``Epilogue``, the one value that a problem, a plan key, ``kernel_set`` and every GEMM
kernel spec carry for it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...errors import ArgumentValueError
from ...jit.params import Param, array, double, pointer
from ...jit.spec import check_field
from ...runtime.dtypes import DType


class Layout(Enum):
    """How a 2-D operand is stored: row-major (strides (ld, 1)) or column-major ((1, ld))."""

    ROW = "r"
    COL = "c"


class Act(Enum):
    NONE = "none"
    RELU = "relu"
    LEAKY_RELU = "leaky_relu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    SILU = "silu"


class BiasKind(Enum):
    """Shape class of the bias: none, one scalar, one value per column (N), one per row (M)."""

    NONE = "nobias"
    SCALAR = "scalarbias"
    COL = "colbias"
    ROW = "rowbias"


class Scale(Enum):
    """How the 8-bit inputs' products are scaled: not at all, by one value from a device
    scalar, or by a value per row of A (``ROW``) or per column of B (``COL``)."""

    NONE = "none"
    TENSOR = "t"
    ROW = "r"
    COL = "c"


ACT_NAMES: dict[str, Act] = {a.value: a for a in Act}

#: Activations whose derivative is a function of their output (the backward can start from Y).
ACTS_FROM_Y = (Act.NONE, Act.RELU, Act.LEAKY_RELU, Act.SIGMOID, Act.TANH)


@dataclass(frozen=True, kw_only=True)
class Epilogue:
    """What a GEMM kernel does with its float32 accumulators ``acc``: ``Z = alpha * acc +
    beta * C + bias`` and ``Y = act(Z)``, stored as ``out_dtype`` (Z too, with ``save_z``).

    ``bias`` is the bias' shape class, ``bias_dtype`` its type (None without a bias);
    ``layout_c`` is C's layout, None for no C term (beta == 0), ``c_dtype`` its type (None
    without C). ``gate`` (an activation, with act none, no bias, no Z and C given) makes it
    ``Y = alpha * acc * gate'(C)``: the backward's dA of the next layer formed as the gradient
    of this layer's pre-activation, with C its Z (or, ``gate_from_y``, its output). ``bgrad``
    (with a gate): the column sums of each 16 rows of Y as well, in float32, to the array the
    bias pointer gives (rows of ``bias_stride``): the partial sums of that layer's bias
    gradient (cuBLASLt's BGRAD). A problem's epilogue asks for them; a kernel's makes them
    (``kernel_set`` keeps it where the kernel can). ``glu`` (no C, no gate; no bias or one
    per column) makes it a gated linear unit: the accumulator columns come in pairs, an even
    column ``2j`` (the gate) and the odd one after it (``2j + 1``, the linear half), and
    ``Y[:, j] = act(Z[:, 2j]) * Z[:, 2j + 1]``: Y has half the GEMM's columns, Z (with
    ``save_z``) all of them. ``glu_grad`` (an activation; with C, nothing else) is that
    unit's backward through the GEMM that makes the gradient of its output, dH = alpha * acc:
    C holds the unit's pre-activations Z, (gate, linear) column pairs, and Y = dZ, twice the
    GEMM's columns, ``Y[:, 2j] = dH[:, j] * Z[:, 2j + 1] * act'(Z[:, 2j])`` and ``Y[:, 2j + 1] =
    dH[:, j] * act(Z[:, 2j])``. The leaky ReLU's slope is no part of it: the kernels take it as
    a parameter at launch.

    Inputs of an 8-bit format give the kernel the parameters of their scales (``fp8_params``):
    ``scale_a`` (a device scalar, or one value per row of A) and ``scale_b`` (a scalar, or one
    per column of B) multiply the products, ``Z = alpha * scale_a[m] * scale_b[n] * acc + ...``
    (host scalars are folded into alpha); ``scale_y`` (an 8-bit ``out_dtype`` only) divides Y
    by a device scalar before it is rounded and saturated (a host scale, the kernel's
    ``y_scale_``, multiplies it by its inverse); ``amax`` writes the largest ``|Y|`` (before
    that scaling; NaN where Y has one) to a float32 scalar, which must hold 0 at launch.
    """

    out_dtype: DType
    act: Act = Act.NONE
    bias: BiasKind = BiasKind.NONE
    bias_dtype: DType | None = None
    layout_c: Layout | None = None
    c_dtype: DType | None = None
    save_z: bool = False
    gate: Act | None = None
    gate_from_y: bool = False
    bgrad: bool = False
    glu: bool = False
    glu_grad: Act | None = None
    scale_a: Scale = Scale.NONE
    scale_b: Scale = Scale.NONE
    scale_y: bool = False
    amax: bool = False

    def __post_init__(self):
        for name, typ, optional in (("out_dtype", DType, False), ("act", Act, False),
                                    ("bias", BiasKind, False), ("bias_dtype", DType, True),
                                    ("layout_c", Layout, True), ("c_dtype", DType, True),
                                    ("save_z", bool, False), ("gate", Act, True),
                                    ("gate_from_y", bool, False), ("bgrad", bool, False),
                                    ("glu", bool, False), ("glu_grad", Act, True),
                                    ("scale_a", Scale, False), ("scale_b", Scale, False),
                                    ("scale_y", bool, False), ("amax", bool, False)):
            check_field(self, name, typ, optional)
        if self.scale_a is Scale.COL or self.scale_b is Scale.ROW:
            raise ArgumentValueError(
                f"Epilogue: scale_a is per tensor or per row of A, scale_b per tensor or per "
                f"column of B; got scale_a {self.scale_a.value!r}, scale_b "
                f"{self.scale_b.value!r}")
        if self.scale_y and not self.out_dtype.is_fp8:
            raise ArgumentValueError(f"Epilogue.scale_y: Y's scale applies to an 8-bit output; "
                                     f"expected False with {self.out_dtype.numpy_name}, got True")
        if self.out_dtype.is_fp8 and self.save_z:
            raise ArgumentValueError("Epilogue.save_z: Z of an 8-bit output is not stored; "
                                     "expected False, got True")
        if (self.scaled or self.out_dtype.is_fp8) and (
                self.glu or self.gate is not None or self.glu_grad is not None or self.bgrad):
            raise ArgumentValueError("Epilogue: scales, amax and 8-bit outputs are plain "
                                     "epilogues', without glu, gate, glu_grad or bgrad")
        if (self.bias_dtype is None) != (self.bias is BiasKind.NONE):
            raise ArgumentValueError(
                f"Epilogue.bias_dtype: expected a DType with bias {self.bias.value!r} and None "
                f"without a bias, got {self.bias_dtype!r}")
        if (self.c_dtype is None) != (self.layout_c is None):
            raise ArgumentValueError(
                f"Epilogue.c_dtype: expected a DType with a C term (layout_c given) and None "
                f"without one, got {self.c_dtype!r} with layout_c {self.layout_c!r}")
        if self.glu and (self.gate is not None or self.layout_c is not None
                         or self.bias in (BiasKind.SCALAR, BiasKind.ROW)):
            raise ArgumentValueError(
                "Epilogue.glu: a gated linear unit (Y = act(Z[:, 0::2]) * Z[:, 1::2]) takes no "
                "gate and no C, and no bias or one per column; expected glu False, got True "
                f"with gate {self.gate!r}, layout_c {self.layout_c!r}, bias {self.bias.value!r}")
        if self.glu_grad is not None and (
                self.glu or self.gate is not None or self.layout_c is None or self.save_z
                or self.act is not Act.NONE or self.bias is not BiasKind.NONE):
            raise ArgumentValueError(
                "Epilogue.glu_grad: a gated linear unit's backward (Y = dZ from dH = alpha * "
                "acc and C = Z) reads C and takes no activation, bias, gate or saved Z; "
                f"expected glu_grad None, got {self.glu_grad.value!r}")
        if self.gate is None:
            if self.gate_from_y:
                raise ArgumentValueError("Epilogue.gate_from_y: expected False without a gate, "
                                         "got True")
            if self.bgrad:
                raise ArgumentValueError("Epilogue.bgrad: the column sums are a gated output's; "
                                         "expected False without a gate, got True")
        elif (self.act is not Act.NONE or self.bias is not BiasKind.NONE or self.save_z
              or self.layout_c is None):
            raise ArgumentValueError(
                "Epilogue: a gate (Y = alpha * A @ B * act'(C)) reads C and takes no "
                "activation, bias or saved Z")
        elif self.gate_from_y and self.gate not in ACTS_FROM_Y:
            raise ArgumentValueError(f"Epilogue: act {self.gate.value!r} has no derivative in "
                                     "terms of its output")

    @property
    def scaled(self) -> bool:
        """Whether it reads a scale or writes an amax."""
        return (self.scale_a is not Scale.NONE or self.scale_b is not Scale.NONE
                or self.scale_y or self.amax)

    @property
    def has_c(self) -> bool:
        return self.layout_c is not None

    def y_cols(self, n: int) -> int:
        """Y's columns for a GEMM of ``n`` columns (half of them for a gated linear unit,
        twice as many for its backward, ``glu_grad``)."""
        return n // 2 if self.glu else 2 * n if self.glu_grad is not None else n

    @property
    def y_ctype(self) -> str:
        """The C type of Y and Z."""
        return self.out_dtype.ctype

    def name(self, dtype: DType) -> str:
        """Its part of a kernel's name, for inputs of type ``dtype``:
        ``[_glu]_<act>_<bias>[_g<z|y><gate>][<bias dtype>][_c<layout>[<dtype>]][_o<dtype>][_z]
        [_bg]`` (dtypes only where they differ from the inputs')."""
        name = f"{'_glu' if self.glu else ''}_{self.act.value}_{self.bias.value}"
        if self.glu_grad is not None:
            name += f"_dglu{self.glu_grad.value}"
        if self.gate is not None:
            name += f"_g{'y' if self.gate_from_y else 'z'}{self.gate.value}"
        if self.bias_dtype not in (None, dtype):
            name += self.bias_dtype.value
        if self.layout_c is not None:
            name += f"_c{self.layout_c.value}" + (self.c_dtype.value if self.c_dtype is not dtype
                                                  else "")
        if self.out_dtype is not dtype:
            name += f"_o{self.out_dtype.value}"
        if self.save_z:
            name += "_z"
        if self.bgrad:
            name += "_bg"
        for field, tag in ((self.scale_a, "_sa"), (self.scale_b, "_sb")):
            if field is not Scale.NONE:
                name += tag + field.value
        if self.scale_y:
            name += "_sy"
        if self.amax:
            name += "_amax"
        return name

    def params(self, dtype: DType) -> tuple[Param, ...]:
        """The kernel parameters of C, the bias (``bgrad``: the float32 column sums written in
        its place), Y and Z, each with its leading dimension (the bias: its stride). A C or
        bias that is not read is typed as the inputs (``dtype``); 8-bit inputs add
        ``fp8_params``."""
        bias = (array("bias", "float", "bias_stride") if self.bgrad else
                array("bias", (self.bias_dtype or dtype).ctype, "bias_stride", const=True))
        fp8 = fp8_params() if dtype.is_fp8 else ()
        return (*array("C", (self.c_dtype or dtype).ctype, "ldc", const=True), *bias,
                *array("Y", self.y_ctype, "ldy"), *array("Z", self.y_ctype, "ldz"), *fp8)


def fp8_params() -> tuple[Param, ...]:
    """The parameters of a kernel of 8-bit inputs after Z: the scales of A and B (device
    pointers with their element strides, read by the kinds that need them), Y's device scale,
    the amax and Y's host scale (the inverse of a host ``scale_y``, else 1)."""
    return (*array("scale_a", "float", "scale_a_stride", const=True),
            *array("scale_b", "float", "scale_b_stride", const=True),
            pointer("scale_y", "float", const=True), pointer("amax", "unsigned"),
            *double("y_scale_"))


#: The epilogue of a split-K slice: its raw float32 partial products, which
#: ``SplitKReduceSpec`` sums before it applies the problem's epilogue.
PARTIAL_SUMS = Epilogue(out_dtype=DType.F32)
