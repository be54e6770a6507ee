"""What every op's PyTorch integration shares: the custom-op namespace, float32 precision from
PyTorch's setting, autocast's input types, the empty tensor that stands for an absent output
(custom ops return tensors only), and which calls take the custom ops rather than the eager
path. Imported only by the ops' PyTorch modules, which ``ge2jit.torch`` loads: it imports
torch."""

from __future__ import annotations

import torch

#: the namespace of ge2jit's custom ops: ``torch.ops.ge2jit.<name>``
NAMESPACE = "ge2jit"

#: ``torch.get_float32_matmul_precision()`` -> ge2jit's float32 precision
FLOAT32_PRECISION = {"highest": "ieee", "high": "tf32x3", "medium": "tf32"}


def op_name(name: str) -> str:
    """The qualified name of custom op ``name``: ``ge2jit::name``."""
    return f"{NAMESPACE}::{name}"


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


def absent(like: torch.Tensor) -> torch.Tensor:
    """The stand-in of an output that is not there: an empty tensor on ``like``'s device."""
    return like.new_empty(0)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def traced(*tensors) -> bool:
    """Whether a call takes the custom ops rather than the eager ``autograd.Function``: it is
    being traced (``torch.compile``, fake tensors and other subclasses of Tensor) or not every
    tensor is on a CUDA device (meta tensors get the fake implementations, others the
    dispatcher's error). None stands for an absent tensor."""
    return torch.compiler.is_compiling() or any(
        t is not None and (type(t) not in _PLAIN or not t.is_cuda) for t in tensors)


def needs_grad(*tensors) -> bool:
    """Whether autograd records a call on these tensors (None: absent)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
