"""Launching a loaded kernel with little host overhead, its parameters passed by name.

A launcher is made from the kernel's parameters (``ge2jit.jit.params``). For each parameter
layout, functions whose keyword-only parameters are the kernel's parameter names, in order, are
generated once (as ``collections.namedtuple`` generates its class): a missing or unknown name
is Python's own TypeError naming it. They pack the arguments with one ``struct.pack_into`` into
a per-thread buffer whose slots a fixed array of pointers already addresses, and launch the
kernel with one ``cuLaunchKernel`` (the driver copies the parameters at launch, so the buffer
is free again at once).
"""

from __future__ import annotations

import struct
import textwrap
import threading
from threading import get_ident

import numpy as np

from ..errors import KernelLaunchError
from .params import Param, layout

#: CUresult of a driver call on a thread with no current context
CUDA_ERROR_INVALID_CONTEXT = 201

_tls = threading.local()
_lock = threading.Lock()
_classes: dict[tuple, type] = {}


def _buffers(offsets: tuple[int, ...], size: int):
    """(values, pointers, pointer array address) of this thread for one parameter layout."""
    table = getattr(_tls, "bufs", None)
    if table is None:
        table = _tls.bufs = {}
    bufs = table.get(offsets)
    if bufs is None:
        values = np.zeros(-(-size // 8), dtype=np.uint64)
        base = values.ctypes.data
        pointers = np.array([base + o for o in offsets], dtype=np.uintp)
        bufs = table[offsets] = (values, pointers, pointers.ctypes.data)
    return bufs


# The generated code; its own names start with '_', which no parameter's may. ``{args}``: the
# keyword-only parameters; ``{values}``: every parameter, in order.
_LAUNCH = """
_owner = {owner}._owner
if _owner[0] != _get_ident():
    _owner = {owner}._claim()
_pack_into(_owner[1], 0, {values})
try:
    {driver}(_fptr, _gx, _gy, _gz, _bx, _by, _bz, _smem, _stream_ptr, _owner[2], 0)
except Exception as _e:
    {owner}._failed(_e)   # returns when it made the thread's context current: once more
    try:
        {driver}(_fptr, _gx, _gy, _gz, _bx, _by, _bz, _smem, _stream_ptr, _owner[2], 0)
    except Exception as _e:
        {owner}._failed(_e, True)
"""
_CALL = """
def launch(_self, _grid, _block, _smem, _stream_ptr, /{args}):
    _fptr, (_gx, _gy, _gz), (_bx, _by, _bz) = _self.fptr, _grid, _block
{launch}
def pack(_self, _buffer, /{args}):
    _pack_into(_buffer, 0, {values})
"""
_BIND = """
def _make(_launcher, _driver, _fptr, _gx, _gy, _gz, _bx, _by, _bz, _smem, {fixed}):
    def launch(_stream_ptr, /{args}):
{launch}
    return launch
"""


def _generate(template: str, fmt: str, names, args, **fields) -> dict:
    """The namespace of ``template`` executed for parameters ``names`` (packed as ``fmt``), of
    which ``args`` are the generated functions' keywords."""
    values = ", ".join(names)
    if template is _CALL:
        launch = _LAUNCH.format(owner="_self", driver="_self._launch", values=values)
    else:
        launch = _LAUNCH.format(owner="_launcher", driver="_driver", values=values)
    source = template.format(
        args=", *, " + ", ".join(args) if args else "", values=values,
        launch=textwrap.indent(launch, "    " if template is _CALL else "        "), **fields)
    namespace = {"__name__": __name__, "_get_ident": get_ident,
                 "_pack_into": struct.Struct(fmt).pack_into}
    exec(compile(source, f"<ge2jit launcher {fmt}>", "exec"), namespace)
    return namespace


def _class_for(params: tuple[Param, ...]) -> type:
    """The launcher class of ``params``' layout (the name and kind of each parameter)."""
    key = tuple((p.name, p.kind) for p in params)
    cls = _classes.get(key)
    if cls is None:
        with _lock:
            cls = _classes.get(key)
            if cls is None:
                offsets, size, fmt = layout(params)
                names = tuple(p.name for p in params)
                ns = _generate(_CALL, fmt, names, names)
                ns["launch"].__qualname__ = "Launcher.launch"
                ns["pack"].__qualname__ = "Launcher.pack"
                cls = _classes[key] = type("Launcher", (Launcher,), {
                    "__slots__": (), "__module__": __name__, "launch": ns["launch"],
                    "pack": ns["pack"], "offsets": offsets, "size": size, "_format": fmt,
                    "_names": names, "_binders": {}})
    return cls


class Launcher:
    """Launches one kernel whose parameters are ``params``:
    ``launch(grid, block, smem, stream_ptr, **values by parameter name)``.

    ``offsets`` and ``size`` are the parameters' byte layout (8-byte slots; 128 bytes for a
    tensor map); ``pack(buffer, **values)`` writes them into a buffer of ``size`` bytes. The
    parameter buffers of the last thread that launched it are kept as one tuple ``(thread id,
    values, pointer array address)``, read once per call (so a thread never uses another's
    buffers); another thread takes its own from thread-local storage."""

    __slots__ = ("name", "fptr", "params", "_launch", "_owner")

    offsets: tuple[int, ...]
    size: int

    def __new__(cls, name: str, function_ptr: int, params: tuple[Param, ...]):
        if cls is Launcher:
            try:
                cls = _class_for(tuple(params))
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return object.__new__(cls)

    def __init__(self, name: str, function_ptr: int, params: tuple[Param, ...]):
        import cupy

        self.name = name
        self.fptr = function_ptr
        self.params = tuple(params)
        self._launch = cupy.cuda.driver.launchKernel
        self._owner = (None, None, 0)

    @classmethod
    def for_spec(cls, spec, function_ptr: int) -> Launcher:
        """The launcher of ``spec``'s kernel (``spec.params``), loaded at ``function_ptr``."""
        return cls(spec.kernel_name, function_ptr, spec.params)

    def _claim(self) -> tuple:
        """Take this thread's parameter buffers; the new owner tuple."""
        values, _, params = _buffers(self.offsets, self.size)
        self._owner = owner = (get_ident(), values, params)
        return owner

    def _failed(self, e: Exception, retried: bool = False) -> None:
        """Raise the KernelLaunchError of ``e``, except the first time a thread without a
        current CUDA context launched (CUDA_ERROR_INVALID_CONTEXT; PyTorch's autograd
        threads, which set device 0 without making its context current): then make it
        current and return, for the launch to be tried again."""
        if not retried and getattr(e, "status", None) == CUDA_ERROR_INVALID_CONTEXT:
            import cupy

            runtime = cupy.cuda.runtime
            runtime.setDevice(runtime.getDevice())   # initializes the primary context, current
            return
        raise KernelLaunchError(f"launch of {self.name} failed: {e}") from e

    def bind(self, grid, block, smem: int, **fixed):
        """``launch(stream_ptr, **rest)``: this kernel with a fixed launch shape and the
        parameters ``fixed`` (by name) baked in; ``rest`` are the others, by name."""
        unknown = [n for n in fixed if n not in self._names]
        if unknown:
            raise TypeError(f"{self.name}: no parameter named {', '.join(unknown)}")
        fixed_names = tuple(n for n in self._names if n in fixed)
        make = self._binders.get(fixed_names)
        if make is None:
            free = tuple(n for n in self._names if n not in fixed)
            make = _generate(_BIND, self._format, self._names, free,
                             fixed=", ".join(fixed_names))["_make"]
            self._binders[fixed_names] = make
        launch = make(self, self._launch, self.fptr, *grid, *block, smem,
                      *(fixed[n] for n in fixed_names))
        launch.__qualname__ = launch.__name__ = self.name
        return launch
