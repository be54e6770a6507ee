"""What every op's PyTorch integration shares: the custom-op namespace, float32 precision from
PyTorch's setting, autocast's input types, the empty tensor that stands for an absent output
(custom ops return tensors only), which calls take the custom ops rather than the eager
path, and a one-time warning that does not break a ``torch.compile`` graph. Imported only by
the ops' PyTorch modules, which ``ge2jit.torch`` loads: it imports torch."""

from __future__ import annotations

import inspect
import warnings

import torch

from ..errors import ArgumentTypeError, ArgumentValueError
from .checks import not_on_cuda

#: the namespace of ge2jit's custom ops: ``torch.ops.ge2jit.<name>``
NAMESPACE = "ge2jit"

#: ``torch.get_float32_matmul_precision()`` -> ge2jit's float32 precision
FLOAT32_PRECISION = {"highest": "ieee", "high": "tf32x3", "medium": "tf32"}


def op_name(name: str) -> str:
    """The qualified name of custom op ``name``: ``ge2jit::name``."""
    return f"{NAMESPACE}::{name}"


#: the Library every op of ge2jit's is defined in (kept for the process's life: a Library
#: dropped takes its definitions with it)
_library = None


#: each op's implementation and the dispatch key it is registered for
_implementations: dict = {}


def define_op(name: str, fn, device: str = "CUDA", library=None) -> torch._ops.OpOverload:
    """``torch.ops.ge2jit.<name>``, defined by ``torch.library.Library``'s ``define`` and
    ``impl``: its schema inferred from ``fn``'s annotations (no argument mutated), ``fn`` its
    implementation for ``device`` ("CUDA"; tests define CPU ops in a ``library`` of their
    own). Calls of an op so defined cost the dispatcher's few microseconds, without
    ``torch.library.custom_op``'s Python layers (several times more per call, and again per
    call under ``torch.compile``). ``register_fake`` and ``register_autograd`` complete
    it."""
    global _library
    if library is None:
        if _library is None:
            _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        library = _library
    # tagged as torch.library.custom_op tags its ops: fit for torch.compile
    library.define(name + torch.library.infer_schema(fn, mutates_args=()),
                   tags=(torch.Tag.pt2_compliant_tag,))
    library.impl(name, fn, device)
    op = getattr(getattr(torch.ops, library.ns), name).default
    _implementations[op] = (fn, getattr(torch._C.DispatchKey, device), library, name)
    return op


def register_fake(op):
    """``@register_fake(op)``: the shapes and types of ``op``'s outputs, for fake and meta
    tensors (``torch.compile``)."""
    def decorate(fn):
        torch.library.register_fake(op, fn)
        return fn

    return decorate


def register_autograd(op, backward, setup_context) -> None:
    """``op``'s gradient: ``setup_context(ctx, inputs, output)`` saves what
    ``backward(ctx, *grads)`` reads.

    The op's Autograd kernel is ``torch.library.register_autograd``'s, behind one check: a
    call that records no gradient on plain tensors of the op's device (a compiled graph's
    calls, inference) goes straight to the op's implementation, without the redispatch
    below autograd (a second crossing between the dispatcher and Python). Anything else
    (a gradient to record, fake or functional tensors, a dispatch mode) takes PyTorch's own
    kernel. Where this PyTorch lacks the pieces, ``register_autograd`` as it is."""
    found = _implementations.get(op)
    pieces = getattr(torch._library, "autograd", None)
    make = getattr(pieces, "make_autograd_impl", None)
    info = getattr(pieces, "Info", None)
    any_grad = getattr(torch._C, "_any_requires_grad", None)
    after = getattr(torch._C, "_after_autograd_keyset", None)
    if any(x is None for x in (found, make, info, any_grad, after)):
        torch.library.register_autograd(op, backward, setup_context=setup_context)
        return
    impl, backend, library, name = found
    torch_kernel = make(op, info(backward, setup_context))
    view_key = torch._C.DispatchKey.ADInplaceOrView
    only = torch._C.DispatchKeySet(backend)
    plain = {only.raw_repr(), only.add(view_key).raw_repr()}
    grad_enabled = torch._C.is_grad_enabled

    def kernel(keyset, *args, **kwargs):
        if kwargs or (grad_enabled() and any_grad(*args)) or (
                (keyset & after).raw_repr() not in plain):
            return torch_kernel(keyset, *args, **kwargs)
        return impl(*args)

    library.impl(name, kernel, "Autograd", with_keyset=True)


@torch.compiler.assume_constant_result
def _matmul_precision() -> str:
    return FLOAT32_PRECISION.get(torch.get_float32_matmul_precision(), "ieee")


def precision_for(dtype: torch.dtype, precision: str | None) -> str | None:
    """The precision a float32 call runs at: ``precision`` when given, else PyTorch's
    ``torch.get_float32_matmul_precision()`` ("highest": exact float32, "high": 3xTF32,
    float32 accuracy on the tensor cores, "medium": TF32). None for 16-bit inputs. Under
    ``torch.compile`` the setting is read when the function is traced (a constant of the
    compiled graph, as PyTorch's own matmuls take it)."""
    if precision is not None:
        return precision
    if dtype != torch.float32:
        return None
    return _matmul_precision()


def autocast_dtype(device_type: str = "cuda") -> torch.dtype | None:
    """The type autocast casts matrix-multiply inputs to in the current region, or None
    outside autocast."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def cast(x: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """``x`` as ``dtype`` (a floating tensor; None and other types unchanged)."""
    if x is None or dtype is None or x.dtype == dtype or not x.is_floating_point():
        return x
    return x.to(dtype)


#: the 16-bit types whose matrix products take float32 master weights (cast in the op)
_HALF = (torch.float16, torch.bfloat16)


def is_master(w: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``w`` holds float32 master weights of a 16-bit computation on ``x``: the op
    multiplies by ``w`` cast to ``x``'s type and writes ``w``'s gradient in float32 from its
    matrix product's accumulators (no cast of the gradient after, as autocast's would be)."""
    return w.dtype == torch.float32 and x.dtype in _HALF


def lowered(w: torch.Tensor, x: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:
    """``w`` as the op multiplies by it: master weights (``is_master``) cast to ``x``'s type
    (``kept``, the forward's cast, where it is one), else ``w``."""
    if not is_master(w, x):
        return w
    if kept is not None and kept.shape == w.shape:
        return kept
    return w.to(x.dtype)


def lowered_like(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The fake of the cast an op keeps of master weights ``w`` (``w``'s layout, ``x``'s type;
    an absent tensor where ``w`` is not master weights)."""
    return torch.empty_like(w, dtype=x.dtype) if is_master(w, x) else absent(x)


def kept_cast(w: torch.Tensor, low: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """What a forward returns as its cast of ``w``: ``low`` where ``w`` is master weights,
    else an absent tensor."""
    return low if is_master(w, x) else absent(x)


def weight_cast(w: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """A weight operand as a call inside ``torch.autocast`` (``dtype``: its type) passes it:
    float32 weights that need a gradient go to the op as they are (master weights, cast in
    the op, their gradient written in float32), others as ``cast`` makes them."""
    if (w is not None and dtype in _HALF and w.dtype == torch.float32
            and torch.is_grad_enabled() and w.requires_grad):
        return w
    return cast(w, dtype)


class BoundForward:
    """``function`` bound to ``module`` as its ``forward`` (``module.forward =
    BoundForward(function, module)``), as ``types.MethodType`` binds it, but one that pickles:
    a bound method pickles as ``getattr(module, function.__name__)``, which names no attribute
    of the module, so a model saved whole (``torch.save(model)``) after ``patch`` could not
    be loaded. ``__func__``, ``__self__`` and the signature (the function's without its
    first parameter) are a bound method's."""

    __slots__ = ("__func__", "__self__")

    def __init__(self, function, module):
        self.__func__, self.__self__ = function, module

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        sig = inspect.signature(self.__func__)
        return sig.replace(parameters=list(sig.parameters.values())[1:])

    @property
    def __name__(self) -> str:
        return self.__func__.__name__

    def __reduce__(self):
        return BoundForward, (self.__func__, self.__self__)

    def __repr__(self) -> str:
        return f"<forward {self.__func__.__qualname__} of {type(self.__self__).__name__}>"


_FUNCTION_APPLY = torch._C._FunctionBase.__dict__.get("apply")
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", None)
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def fast_apply(cls: type):
    """``cls.apply`` (``cls`` a ``torch.autograd.Function`` whose ``forward`` takes ``ctx``)
    without the Python layer some PyTorch versions put in front of the C ``apply`` (it binds
    arguments and maps a pytree over them at every call: several microseconds a call).
    What that layer does that matters is kept: a functorch transform active takes
    ``cls.apply``; tensors left behind by a finished transform are unwrapped."""
    slow = cls.apply
    if _FUNCTION_APPLY is None or _functorch_active is None or _unwrap_if_dead is None:
        return slow   # a PyTorch without these: its own apply
    direct = _FUNCTION_APPLY.__get__(None, cls)

    def apply(*args):
        if _functorch_active():
            return slow(*args)
        return direct(*[_unwrap_if_dead(a) if isinstance(a, torch.Tensor) else a
                        for a in args])

    return apply


def eager_function(name: str, forward, setup, backward) -> type:
    """The eager mode's ``torch.autograd.Function`` of an op: ``forward(*inputs)`` makes the
    output, ``setup(ctx, inputs, output)`` saves what ``backward(ctx, *grads)`` reads (the
    signatures of ``register_autograd``'s functions, so that one implementation serves the
    custom op and this class).

    The class takes the form whose ``forward`` receives ``ctx`` and calls ``setup`` itself:
    ``apply`` of the form with a separate ``setup_context`` binds its arguments with
    ``inspect.signature`` at every call, about two thirds of a small op's host time. Its
    ``fast_apply`` is ``fast_apply``'s: the ops' eager paths call it."""

    def forward_with_ctx(ctx, *inputs):
        output = forward(*inputs)
        setup(ctx, inputs, output)
        return output

    cls = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward_with_ctx), "backward": staticmethod(backward),
        "__module__": getattr(forward, "__module__", __name__),
        "__doc__": f"The eager autograd.Function of {getattr(forward, '__name__', name)}."})
    cls.fast_apply = staticmethod(fast_apply(cls))   # what the ops' eager paths call
    return cls


#: the messages ``warn_once`` has given
_warned: set[str] = set()


@torch.compiler.assume_constant_result
def warn_once(message: str) -> None:
    """``warnings.warn(message)`` the first time ``message`` comes; later calls nothing. Safe
    in code ``torch.compile`` traces: TorchDynamo makes the call while it traces (the warning
    comes as the graph is compiled, once) and puts nothing of it in the graph, where a
    ``warnings.warn`` would break the graph (the model's frame split, or its layer loop run
    eagerly). Call it with a message made of constants (strings, shapes, types)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def absent(like: torch.Tensor) -> torch.Tensor:
    """The stand-in of an output that is not there: an empty tensor on ``like``'s device."""
    return like.new_empty(0)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def traced(*tensors, names=()) -> bool:
    """Whether a call takes the custom ops rather than the eager ``autograd.Function``: it is
    being traced (``torch.compile``, fake tensors and other subclasses of Tensor) or a tensor
    is a meta tensor (the fake implementations). None stands for an absent tensor.

    Raises:
        ArgumentTypeError: a tensor on another device (the CPU) or an argument that is no
            tensor, named by ``names`` (the tensors' argument names, in order; or a function
            that makes them, called only then). The custom
            ops are CUDA-only: the dispatcher's own error would be many lines about
            backends.
    """
    if torch.compiler.is_compiling():
        return True
    custom = False
    for i, t in enumerate(tensors):
        if t is None or (type(t) in _PLAIN and t.is_cuda):
            continue
        if isinstance(t, torch.Tensor) and (type(t) not in _PLAIN or t.is_meta):
            custom = True
        else:
            if callable(names):
                names = names()
            raise not_a_cuda_tensor(t, names[i] if i < len(names) else "tensor")
    return custom


def not_a_cuda_tensor(x, name: str) -> ArgumentTypeError:
    """The error for an argument of a ``ge2jit.torch`` function or layer that is not a tensor
    on a CUDA device."""
    if isinstance(x, torch.Tensor):
        return not_on_cuda(x, name)
    kind = type(x)
    kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    return ArgumentTypeError(f"{name}: expected a torch.Tensor on a CUDA device, got {kind}")


def check_layer_input(layer, x, features: int, parameter) -> None:
    """A layer's input ``x``: a tensor whose last dimension is ``features``, on a CUDA device
    as the layer's ``parameter`` (one of its own, or None where it has none) must be. Checked
    by the layer, which can name itself and say to move it, before its op would name an
    operand the caller never saw (a layer built without ``device=`` is on the CPU).

    Raises:
        ArgumentTypeError: ``x`` is no tensor, or it or the parameter is not on a CUDA device.
        ArgumentValueError: the last dimension is not ``features``.
    """
    if not isinstance(x, torch.Tensor):
        raise not_a_cuda_tensor(x, "input")
    if x.dim() < 1 or x.shape[-1] != features:
        raise ArgumentValueError(f"input: expected a last dimension of {features}, got shape "
                                 f"{tuple(x.shape)}")
    if not (x.is_cuda or x.is_meta) or (parameter is not None and not (parameter.is_cuda
                                                                       or parameter.is_meta)):
        where = "" if parameter is None else f" and the parameters on {parameter.device}"
        raise ArgumentTypeError(
            f"{type(layer).__name__}: expected the input and the parameters on a CUDA device, "
            f"got the input on {x.device}{where}; move them with .cuda() (the layer: "
            "layer.cuda(), or device='cuda' when it is made)")


def needs_grad(*tensors) -> bool:
    """Whether autograd records a call on these tensors (None: absent)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


class Differentiable:
    """A differentiable PyTorch op made once from its parts, for every op:

    - ``forward(*inputs)``: the implementation (annotated: the custom op's schema comes from
      it), ``fake(*inputs)`` its outputs' shapes and types;
    - ``backward(*args)`` and ``backward_fake``: the backward op's implementation and fake
      (``torch.ops.ge2jit.<name>_backward``);
    - ``setup(ctx, inputs, output)``: what the backward needs, saved on ``ctx``;
    - ``inference(*inputs)`` and ``inference_fake`` (optional): the call where no gradient
      is recorded, without what only the backward reads (a statistic saved for it):
      ``torch.ops.ge2jit.<name>_inference``, taken by ``infer``;
    - ``grads(ctx, *grad_outputs, backward=...)``: the inputs' gradients, computed by calling
      ``backward`` (the backward op when the call is traced, its implementation in eager mode).

    It defines both custom ops with their fakes and the forward's autograd
    (``register_autograd``), and the eager ``autograd.Function`` over the same
    implementations (``eager_function``). Calling it dispatches a call: traced
    (``torch.compile``, fake or meta tensors) → the custom op; a gradient to record → the
    eager Function (``fast_apply``); else the implementation itself. ``infer`` dispatches
    the same way to the inference op or implementation, for a call that records no
    gradient (``needs_grad`` false: the caller asks). ``op``, ``backward_op``,
    ``inference_op`` (None without one) and ``function`` are the ops and the Function
    (``function_name``: the Function's class
    name, by default ``_<Name>Function``). ``device``/``library``: as
    ``define_op``'s (tests define CPU ops)."""

    def __init__(self, name: str, forward, *, fake, setup, grads, backward, backward_fake,
                 inference=None, inference_fake=None, function_name: str | None = None,
                 device: str = "CUDA", library=None):
        if (inference is None) != (inference_fake is None):
            raise TypeError("Differentiable: expected inference and inference_fake together")
        self.forward = forward
        self.inference = inference
        self.inference_op = None
        if inference is not None:
            self.inference_op = define_op(name + "_inference", inference, device, library)
            register_fake(self.inference_op)(inference_fake)
        self.op = define_op(name, forward, device, library)
        register_fake(self.op)(fake)
        self.backward_op = define_op(name + "_backward", backward, device, library)
        register_fake(self.backward_op)(backward_fake)
        op_backward = self.backward_op

        def traced_grads(ctx, *grad_outputs):
            return grads(ctx, *grad_outputs, backward=op_backward)

        register_autograd(self.op, traced_grads, setup_context=setup)
        camel = "".join(part.title() for part in name.split("_"))
        self.function = eager_function(
            function_name or f"_{camel}Function", forward, setup,
            lambda ctx, *grad_outputs: grads(ctx, *grad_outputs, backward=backward))
        self._apply = self.function.fast_apply
        params = list(inspect.signature(forward).parameters.values())
        self._positions = tuple(i for i, p in enumerate(params) if _is_tensor(p.annotation))
        self._names = tuple(params[i].name for i in self._positions)
        self._cuda = device == "CUDA"

    def _traced(self, tensors) -> bool:
        if self._cuda:
            return traced(*tensors, names=self._names)
        return torch.compiler.is_compiling() or any(
            isinstance(t, torch.Tensor) and (type(t) not in _PLAIN or t.is_meta)
            for t in tensors)

    def __call__(self, *args):
        tensors = [args[i] for i in self._positions]
        if self._traced(tensors):
            return self.op(*args)
        if needs_grad(*tensors):
            return self._apply(*args)
        return self.forward(*args)

    def infer(self, *args):
        """The inference op (traced) or implementation (eager) on ``args``: for a call whose
        caller has checked that no gradient is recorded (``needs_grad``)."""
        if self.inference is None:
            raise TypeError(f"{self!r}: no inference implementation")
        tensors = [args[i] for i in self._positions]
        if self._traced(tensors):
            return self.inference_op(*args)
        return self.inference(*args)

    def __repr__(self) -> str:
        return f"Differentiable({self.op})"


def _is_tensor(annotation) -> bool:
    """Whether a parameter's annotation is one tensor (``Tensor`` or ``Tensor | None``; lists
    of tensors are not looked into)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                  str(annotation))
    return "Tensor" in text and "[" not in text
