"""The base of every kernel spec: a frozen, hashable description of one kernel variant."""

from __future__ import annotations

from typing import ClassVar

from ..errors import ArgumentTypeError
from .params import Param, param_list


def check_field(obj, name: str, typ: type, optional: bool = False) -> None:
    """ArgumentTypeError (a TypeError) unless field ``name`` of the spec ``obj`` is a ``typ``
    (or None, when ``optional``); a bool is no int. One line naming the field."""
    value = getattr(obj, name)
    if optional and value is None:
        return
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ArgumentTypeError(f"{type(obj).__name__}.{name}: expected {typ.__name__}"
                                f"{' or None' if optional else ''}, got {value!r}")


class KernelSpec:
    """Mixin for frozen dataclasses that name one kernel.

    A subclass sets ``template`` (a path under ``kernel_templates/``) and defines ``kernel_name``,
    which is also the ``extern "C"`` symbol of the kernel, and ``params``, its parameters in
    order. The template is rendered with the spec as its only variable (``spec``) and declares
    the kernel as ``{{ spec.kernel_name }}({{ spec.param_list() }})``.
    """

    template: ClassVar[str]
    #: Dynamic shared memory the kernel is launched with (bytes); above 48 KiB the loader raises
    #: the kernel's limit.
    smem_bytes: ClassVar[int] = 0

    @property
    def kernel_name(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def params(self) -> tuple[Param, ...]:
        """The kernel's parameters, in order (``ge2jit.jit.params``)."""
        raise NotImplementedError(f"{type(self).__name__} declares no kernel parameters")

    def param_list(self) -> str:
        """The C parameter list of the kernel's declaration."""
        return param_list(self.params)

    def compile_options(self) -> tuple[str, ...]:
        """Extra NVRTC options this kernel needs (beyond the architecture)."""
        return ()

    def target_arch(self, device_arch: str) -> str:
        """The architecture to compile for on a device of ``device_arch``: the plain one
        ('sm_90a' -> 'sm_90'), except for kernels that use architecture-specific instructions,
        which override this ('sm_90' -> 'sm_90a')."""
        from .nvrtc import arch_number

        return f"sm_{arch_number(device_arch)}"
