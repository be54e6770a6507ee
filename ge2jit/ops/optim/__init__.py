"""Fused optimizer steps (Adam/AdamW, SGD with momentum) for training with ge2jit's ops: one
kernel per parameter reads the gradient, updates the float32 parameter and its optimizer
state in place, and can write the 16-bit copy of the weights that the next forward reads.

Adam's step count is either a Python int, baked into the launch as its bias corrections, or a
one-element device array that the kernel reads when it runs (``UpdateSpec.step_dtype``): the
form a captured CUDA graph can replay, the step incrementing the counter itself."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentTypeError, ArgumentValueError
from ...jit.loader import launcher_for
from ...jit.params import Param, double, int64, pointer
from ...jit.spec import KernelSpec
from ...runtime.arrays import call_arguments, framework_of, views
from ...runtime.checks import _cupy, check_array, check_scalar, check_shaped
from ...runtime.dtypes import DType

__all__ = ["UpdateSpec", "adam_update", "sgd_update"]

#: the types of a device step count (``adam_update(step=array)``) -> (C type, name suffix)
STEP_TYPES = {"int32": ("int", "i32"), "int64": ("long long", "i64"),
              "float32": ("float", "f32")}

@dataclass(frozen=True)
class UpdateSpec(KernelSpec):
    """One optimizer step over a flat float32 parameter: ``rule`` "adam" or "sgd" (with
    ``nesterov``), the gradient's type, and the type of the parameter's copy to write (None:
    no copy). ``step_dtype`` (Adam): None when the step count comes as a Python int (its bias
    corrections are kernel parameters), else the type of the one-element device array the
    kernel reads it from at run time ("int32", "int64" or "float32"; the CUDA-graph form)."""

    rule: str
    grad_dtype: DType
    copy_dtype: DType | None = None
    nesterov: bool = False
    step_dtype: str | None = None

    template = "optim/update.cu"
    threads = 256
    smem_bytes = 0

    def __post_init__(self):
        if self.rule not in ("adam", "sgd"):
            raise ArgumentValueError(f"UpdateSpec.rule: expected 'adam' or 'sgd', got "
                                     f"{self.rule!r}")
        if not isinstance(self.grad_dtype, DType) or not (
                self.copy_dtype is None or isinstance(self.copy_dtype, DType)):
            raise TypeError("UpdateSpec: grad_dtype and copy_dtype must be DType (copy: or None)")
        if self.rule == "adam" and self.nesterov:
            raise ArgumentValueError("UpdateSpec: nesterov applies to sgd")
        if self.step_dtype is not None and (self.rule != "adam"
                                            or self.step_dtype not in STEP_TYPES):
            raise ArgumentValueError(f"UpdateSpec.step_dtype: expected None or one of "
                                     f"{', '.join(STEP_TYPES)} (adam only), got "
                                     f"{self.step_dtype!r} for {self.rule}")

    @property
    def kernel_name(self) -> str:
        copy = f"_copy{self.copy_dtype.value}" if self.copy_dtype else ""
        rule = "sgd_nesterov" if self.nesterov else self.rule
        step = f"_step{STEP_TYPES[self.step_dtype][1]}" if self.step_dtype else ""
        return f"{rule}_update_g{self.grad_dtype.value}{copy}{step}"

    @property
    def params(self) -> tuple[Param, ...]:
        """The parameter, its gradient, the optimizer's state (Adam: m and v; SGD: the
        momentum buffer, buf2 unused), the copy, the size and the rule's scalars (see
        ``adam_update``, ``sgd_update``); with ``step_dtype``, the device step count last
        (c1_, c2_ unused)."""
        step = ((pointer("step", STEP_TYPES[self.step_dtype][0], const=True),)
                if self.step_dtype else ())
        return (pointer("param", "float"), pointer("grad", self.grad_dtype.ctype, const=True),
                pointer("buf1", "float"), pointer("buf2", "float"),
                pointer("copy", self.copy_dtype.ctype if self.copy_dtype else "float"),
                *int64("n"), *double("lr_", "h1_", "h2_", "eps_", "wd_", "c1_", "c2_"), *step)


def _flat(x, name: str, size: int, shape, dtypes) -> DType:
    dt = check_shaped(x, name, shape, "(param's)", dtypes)
    if size and not x.flags.c_contiguous:
        raise ArgumentValueError(f"{name}: expected a C-contiguous array, got strides "
                                 f"{x.strides}")
    return dt


_STEP_TEXT = ("an int >= 1 (the 1-based step count) or a one-element int32, int64 or "
              "float32 GPU array holding it")


def _is_device_step(step) -> bool:
    """Whether ``step`` is to be read from the device (anything but a number; what is not a
    GPU array is refused by ``_device_step``)."""
    return not isinstance(step, (numbers.Number, np.generic, str, bytes)) and step is not None


def _device_step(step, device_id: int) -> str:
    """The type name of a device step count (a CuPy view), checked."""
    if step.size != 1:
        raise ArgumentValueError(f"step: expected {_STEP_TEXT}, got an array of shape "
                                 f"{step.shape}")
    if step.dtype.name not in STEP_TYPES:
        raise ArgumentValueError(f"step: expected {_STEP_TEXT}, got an array of dtype "
                                 f"{step.dtype}")
    if step.data.device_id != device_id:
        raise ArgumentValueError(f"step: on device {step.data.device_id}, param on "
                                 f"{device_id}")
    if step.data.ptr % step.itemsize:
        raise ArgumentValueError(f"step: expected a pointer aligned to its {step.itemsize}-byte "
                                 "element; pass a fresh array")
    return step.dtype.name


def _checked(rule, param, grad, buf1, buf2, param_copy, nesterov, step=None):
    """(spec, device, blocks, framework, (param, grad, buf1, buf2, param_copy, step) as CuPy
    views) of one step on these arrays, checked; None for an empty parameter (nothing to
    launch). ``step``: Adam's device step count, or None (a Python int, in the scalars)."""
    names = ("m", "v") if rule == "adam" else ("momentum_buffer",)
    if step is not None:
        try:
            framework_of({"step": step})
        except ArgumentTypeError:
            raise ArgumentTypeError(f"step: expected {_STEP_TEXT}, got "
                                    f"{_describe(step)}") from None
    fw, device_id, native = call_arguments({"param": param, "grad": grad, names[0]: buf1,
                                            "v": buf2, "param_copy": param_copy, "step": step})
    v = views(fw, native)
    param, grad, buf1, buf2, param_copy, step = (
        v[k] for k in ("param", "grad", names[0], "v", "param_copy", "step"))
    check_array(param, "param")
    shape = param.shape
    _flat(param, "param", param.size, shape, (DType.F32,))
    grad_dtype = _flat(grad, "grad", param.size, shape, tuple(DType))
    for name, buf in zip(names, (buf1, buf2)):
        _flat(buf, name, param.size, shape, (DType.F32,))
    copy_dtype = None
    if param_copy is not None:
        copy_dtype = _flat(param_copy, "param_copy", param.size, shape, tuple(DType))
    cp = _cupy()
    for name, x in (("grad", grad), *zip(names, (buf1, buf2)), ("param_copy", param_copy)):
        if x is not None and x.data.device_id != param.data.device_id:
            raise ArgumentValueError(f"{name}: on device {x.data.device_id}, param on "
                                     f"{param.data.device_id}")
    step_dtype = None if step is None else _device_step(step, param.data.device_id)
    if param.size == 0:
        return None
    sms = cp.cuda.Device(device_id).attributes["MultiProcessorCount"]
    blocks = max(1, min(-(-param.size // 256), 8 * sms))
    return (UpdateSpec(rule, grad_dtype, copy_dtype, nesterov, step_dtype), device_id, blocks,
            fw, (param, grad, buf1, buf2, param_copy, step))


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return (f"a numpy.ndarray of shape {x.shape}; move it to the GPU with "
                "cupy.asarray(step)")
    return repr(x) if isinstance(x, (str, bytes)) else f"a {type(x).__name__}"


def _launch(rule, param, grad, buf1, buf2, param_copy, nesterov, scalars, step=None) -> None:
    checked = _checked(rule, param, grad, buf1, buf2, param_copy, nesterov, step)
    if checked is None:
        return
    spec, device_id, blocks, fw, (param, grad, buf1, buf2, param_copy, step) = checked
    launcher = launcher_for(spec, device_id)
    extra = {} if step is None else {"step": step.data.ptr}
    with fw.context(device_id):
        launcher.launch((blocks, 1, 1), (256, 1, 1), 0, fw.stream_getter(device_id)(),
                        param=param.data.ptr, grad=grad.data.ptr, buf1=buf1.data.ptr,
                        buf2=0 if buf2 is None else buf2.data.ptr,
                        copy=0 if param_copy is None else param_copy.data.ptr, n=param.size,
                        **scalars, **extra)


def _adam_scalars(step, lr, betas, eps, weight_decay) -> dict:
    """The kernel's scalars of an Adam step, checked (a device ``step`` is checked with the
    arrays; its kernel computes the corrections itself)."""
    device = _is_device_step(step)
    if not device and (isinstance(step, bool) or not isinstance(step, (int, np.integer))
                       or step < 1):
        raise ArgumentValueError(f"step: expected {_STEP_TEXT}, got {step!r}")
    try:
        b1, b2 = (check_scalar(b, "betas") for b in tuple(betas))
    except (TypeError, ValueError):
        raise ArgumentValueError(f"betas: expected two floats, got {betas!r}") from None
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ArgumentValueError(f"betas: expected values in [0, 1), got {betas!r}")
    return dict(lr_=check_scalar(lr, "lr"), h1_=b1, h2_=b2, eps_=check_scalar(eps, "eps"),
                wd_=check_scalar(weight_decay, "weight_decay"),
                c1_=0.0 if device else 1.0 - b1 ** step, c2_=0.0 if device else 1.0 - b2 ** step)


def _sgd_scalars(lr, momentum, weight_decay, nesterov) -> dict:
    """The kernel's scalars of an SGD step, checked."""
    if not isinstance(nesterov, bool):
        raise ArgumentValueError(f"nesterov: expected a bool, got {nesterov!r}")
    return dict(lr_=check_scalar(lr, "lr"), h1_=check_scalar(momentum, "momentum"), h2_=0.0,
                eps_=0.0, wd_=check_scalar(weight_decay, "weight_decay"), c1_=1.0, c2_=1.0)


def adam_update(param, grad, m, v, *, step, lr: float = 1e-3, betas=(0.9, 0.999),
                eps: float = 1e-8, weight_decay: float = 0.0, param_copy=None) -> None:
    """One Adam step in place (AdamW's decoupled weight decay when ``weight_decay`` > 0):
    ``m``, ``v`` (float32, zeros before the first step) are the moment estimates, ``step``
    the 1-based step count for the bias corrections ``1 - beta**step``. ``param`` is float32;
    ``grad`` float32, float16 or bfloat16; ``param_copy`` (optional) receives the updated
    parameter in its own dtype (e.g. the bfloat16 weights of a mixed-precision model).

    ``step`` is a Python int (the corrections are computed here and passed to the kernel), or
    a one-element (0-d or (1,)) int32, int64 or float32 array on the parameter's device, of
    the parameter's framework (a CuPy array, or a tensor for PyTorch tensors): the kernel
    reads it when it runs and computes the corrections itself, in float64 as the host does.
    That is the form for a step captured as a CUDA graph (``ge2jit.graph``), whose launch
    parameters are fixed at capture: the captured step increments the counter itself, before
    its updates (``t += 1``), so every replay uses the next count. The counter must hold a
    value >= 1 when the kernel runs (0 gives infinite corrections: NaN parameters)."""
    _launch("adam", param, grad, m, v, param_copy, False,
            _adam_scalars(step, lr, betas, eps, weight_decay),
            step if _is_device_step(step) else None)


def sgd_update(param, grad, momentum_buffer, *, lr: float, momentum: float = 0.9,
               weight_decay: float = 0.0, nesterov: bool = False, param_copy=None) -> None:
    """One SGD step with momentum in place, PyTorch's rule: ``g = grad + weight_decay *
    param``; ``buf = momentum * buf + g`` (``momentum_buffer``: float32, zeros before the
    first step); ``param -= lr * buf`` (Nesterov: ``lr * (g + momentum * buf)``). Types as in
    ``adam_update``."""
    _launch("sgd", param, grad, momentum_buffer, None, param_copy, nesterov,
            _sgd_scalars(lr, momentum, weight_decay, nesterov))


from ...runtime.registry import register  # noqa: E402 - the ops above are what it registers
from .registration import ADAM, SGD  # noqa: E402

register(ADAM)
register(SGD)
