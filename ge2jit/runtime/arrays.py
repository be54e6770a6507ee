"""The arrays an op is called with: CuPy arrays, PyTorch tensors, or any object with
``__cuda_array_interface__``.

An op reads one :class:`Framework` for its arguments (``framework_of``): it gives each array's
pointer and a hashable key of its layout (the cached path's call signature), allocates outputs
in the caller's framework (PyTorch's caching allocator for tensors) and names the stream to
launch on (PyTorch's current stream for tensors, CuPy's for CuPy arrays); scratch
memory (``Framework.scratch``) comes from the same framework's allocator, on that stream, so
that a CUDA graph captured by either framework holds it too. The
first call of an argument pattern validates CuPy views of the same memory (``Framework.view``):
no copy, no DLPack round trip. PyTorch is imported only when a tensor is passed.

Objects with ``__cuda_array_interface__`` (Numba, JAX, ...) are read through ``cupy.asarray``
(a view) and give CuPy outputs on CuPy's current stream; CuPy waits for the stream the
interface names, as its own interop does.
"""

from __future__ import annotations

import contextlib
import sys
from operator import attrgetter

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError
from ..jit import fastlaunch
from .checks import not_an_array, not_on_cuda
from .dtypes import FP8_DTYPES

_cupy_mod = None


def _cp():
    global _cupy_mod
    if _cupy_mod is None:
        from .._deps import require_cupy

        _cupy_mod = require_cupy()
    return _cupy_mod


def _first_current_device() -> int:
    global current_device
    current_device = _cp().cuda.runtime.getDevice
    return current_device()


#: ``current_device()``: CuPy's current device, what a call on CuPy arrays runs on and part of
#: every prepared call's signature. Read as ``arrays.current_device()``: the first call puts
#: CuPy's own ``getDevice`` here.
current_device = _first_current_device


def _torch_tensor_type():
    """torch.Tensor if PyTorch is already imported (it is whenever a tensor exists), else None."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


class Framework:
    """How one framework's arrays are read, allocated and ordered."""

    name = ""
    #: the array's device pointer: ``ptr(x) -> int``
    ptr = None

    def key(self, x) -> tuple:
        """Everything about ``x`` a prepared call depends on, except its pointer (only the
        pointer's 16-byte alignment): shape, strides, dtype, device. Raises TypeError for an
        ``x`` that can have no prepared call (a tensor on the CPU)."""
        raise NotImplementedError

    def view(self, x, name: str):
        """A CuPy array on the same memory, for validation and copies."""
        raise NotImplementedError

    def device_of(self, x) -> int:
        raise NotImplementedError

    def allocator(self, dtype, device_id: int):
        """``empty(shape)``: a new array of ``dtype`` (a NumPy dtype) in this framework."""
        raise NotImplementedError

    def shaped_allocator(self, dtype, device_id: int, shape: tuple, strides: tuple):
        """``empty()``: a new array of ``dtype``, ``shape`` and element ``strides`` (a
        permutation of a contiguous array's: an output laid out as its input), in this
        framework; called with any arguments, which it ignores (a compiled program passes
        the shape it was given)."""
        raise NotImplementedError

    def zeros(self, shape, dtype, device_id: int):
        raise NotImplementedError

    def scratch(self, device_id: int):
        """``alloc(nbytes)``: scratch memory for one call, ordered on the stream the op
        launches on (the framework's current stream): an object whose ``ptr`` is the address,
        to be held until the launches that use it are queued."""
        raise NotImplementedError

    def stream_getter(self, device_id: int):
        """``stream() -> int``: the pointer of the stream to launch on, now."""
        raise NotImplementedError


    def context(self, device_id: int):
        """The context of a first call: ``device_id`` current, and CuPy's work (copies,
        scratch memory) ordered on the stream the op launches on."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<framework {self.name}>"


class CupyFramework(Framework):
    name = "cupy"
    ptr = staticmethod(attrgetter("data.ptr"))

    def key(self, x) -> tuple:
        d = x.data
        return (x.shape, x.strides, x.dtype, d.device_id, d.ptr & 15)

    def view(self, x, name: str):
        return x

    def device_of(self, x) -> int:
        return x.data.device_id

    def allocator(self, dtype, device_id: int):
        ndarray, dt = _cp().ndarray, np.dtype(dtype)
        if dt.name in FP8_DTYPES:   # (CuPy makes 8-bit float arrays only as views)
            def empty_fp8(shape):
                return ndarray(shape, np.uint8).view(dt)

            return empty_fp8

        def empty(shape):
            return ndarray(shape, dt)

        return empty

    def shaped_allocator(self, dtype, device_id: int, shape: tuple, strides: tuple):
        ndarray, dt = _cp().ndarray, np.dtype(dtype)
        byte_strides = tuple(s * dt.itemsize for s in strides)

        def empty(*_):
            return ndarray(shape, dt, strides=byte_strides)

        return empty

    def zeros(self, shape, dtype, device_id: int):
        return _cp().zeros(shape, dtype=dtype)

    def scratch(self, device_id: int):
        return _cp().cuda.alloc

    def stream_getter(self, device_id: int):
        current = _cp().cuda.get_current_stream

        def stream() -> int:
            return current().ptr

        return stream


    def context(self, device_id: int):
        return contextlib.nullcontext()


CUPY = CupyFramework()


def _torch_dtypes():
    import torch

    table = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
             torch.float64: np.dtype(np.float64), torch.int8: np.dtype(np.int8),
             torch.int16: np.dtype(np.int16), torch.int32: np.dtype(np.int32),
             torch.int64: np.dtype(np.int64), torch.uint8: np.dtype(np.uint8),
             torch.bool: np.dtype(np.bool_), torch.complex64: np.dtype(np.complex64),
             torch.complex128: np.dtype(np.complex128)}
    try:
        import ml_dtypes

        table[torch.bfloat16] = np.dtype(ml_dtypes.bfloat16)
        table[torch.float8_e4m3fn] = np.dtype(ml_dtypes.float8_e4m3fn)
        table[torch.float8_e5m2] = np.dtype(ml_dtypes.float8_e5m2)
    except ImportError:  # pragma: no cover - ml_dtypes comes with the cuda extra
        pass
    return table


class TorchFramework(Framework):
    """PyTorch tensors: read directly (``data_ptr()``, ``stride()``, ``dtype``), outputs from
    PyTorch's caching allocator, launched on ``torch.cuda.current_stream()``."""

    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.ptr = torch.Tensor.data_ptr
        for t in (torch.Tensor, torch.nn.Parameter):   # the compiled launch path's programs
            fastlaunch.register(t, "torch")
        self._to_numpy = _torch_dtypes()
        self._to_torch = {v: k for k, v in self._to_numpy.items()}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw
        self._devices: dict[int, object] = {}

    def key(self, x) -> tuple:
        # device_of refuses a tensor on the CPU (an ArgumentTypeError: the cached paths take
        # it as "no signature" and leave the message to the first call's checks) before a
        # signature asks for the current device, which fails without a GPU
        return (x.shape, x.stride(), x.dtype, self.device_of(x), x.data_ptr() & 15)

    def numpy_dtype(self, dtype, name: str) -> np.dtype:
        dt = self._to_numpy.get(dtype)
        if dt is None:
            from .dtypes import SUPPORTED_TEXT

            raise ArgumentValueError(f"{name}: dtype {dtype} is not supported; supported dtypes: "
                                     f"{SUPPORTED_TEXT}")
        return dt

    def torch_dtype(self, dtype) -> object:
        return self._to_torch[np.dtype(dtype)]

    def device_of(self, x, name: str = "tensor") -> int:
        d = x.get_device()
        if d < 0:
            raise not_on_cuda(x, name)
        return d

    def _device(self, device_id: int):
        dev = self._devices.get(device_id)
        if dev is None:
            dev = self._devices[device_id] = self.torch.device("cuda", device_id)
        return dev

    def view(self, x, name: str):
        if not x.is_cuda:
            raise not_on_cuda(x, name)
        cp = _cp()
        dtype = self.numpy_dtype(x.dtype, name)
        shape = tuple(x.shape)
        item = dtype.itemsize
        strides = tuple(s * item for s in x.stride())
        # (CuPy makes 8-bit float arrays only as views of bytes)
        raw = np.dtype(np.uint8) if dtype.name in FP8_DTYPES else dtype
        if x.numel() == 0:
            out = cp.ndarray(shape, raw, strides=strides)
        else:
            span = item + sum((n - 1) * s for n, s in zip(shape, strides))
            mem = cp.cuda.UnownedMemory(x.data_ptr(), span, x, x.get_device())
            out = cp.ndarray(shape, raw, cp.cuda.MemoryPointer(mem, 0), strides=strides)
        return out if raw is dtype else out.view(dtype)

    def allocator(self, dtype, device_id: int):
        # empty_strided with the strides given parses its arguments in about half the host
        # time of torch.empty (which a prepared call pays for every output it allocates)
        empty, td, dev = self.torch.empty_strided, self.torch_dtype(dtype), self._device(device_id)

        def alloc(shape):
            return empty(shape, _contiguous(shape), dtype=td, device=dev)

        return alloc

    def shaped_allocator(self, dtype, device_id: int, shape: tuple, strides: tuple):
        empty, td, dev = self.torch.empty_strided, self.torch_dtype(dtype), self._device(device_id)

        def alloc(*_):
            return empty(shape, strides, dtype=td, device=dev)

        return alloc

    def zeros(self, shape, dtype, device_id: int):
        return self.torch.zeros(shape, dtype=self.torch_dtype(dtype),
                                device=self._device(device_id))

    def scratch(self, device_id: int):
        empty, u8, dev = self.torch.empty_strided, self.torch.uint8, self._device(device_id)

        def alloc(nbytes: int) -> _TorchScratch:
            return _TorchScratch(empty((nbytes,), (1,), dtype=u8, device=dev))

        return alloc

    def stream_getter(self, device_id: int):
        raw = self._raw_stream
        if raw is not None:
            def stream() -> int:
                return raw(device_id)
        else:  # pragma: no cover - older PyTorch
            current = self.torch.cuda.current_stream
            dev = self._device(device_id)

            def stream() -> int:
                return current(dev).cuda_stream
        return stream


    def context(self, device_id: int):
        cp = _cp()
        stack = contextlib.ExitStack()
        if device_id != cp.cuda.runtime.getDevice():
            stack.enter_context(cp.cuda.Device(device_id))
        else:   # the device's context current on this thread (PyTorch's autograd threads
            # may have none: they set device 0 without making its context current)
            cp.cuda.runtime.setDevice(device_id)
        stream = self.stream_getter(device_id)()
        if stream != cp.cuda.get_current_stream().ptr:
            stack.enter_context(external_stream(stream, device_id))
        return stack


def _contiguous(shape) -> tuple:
    """The row-major strides, in elements, of ``shape``."""
    if len(shape) == 2:
        return (shape[1], 1)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class _TorchScratch:
    """Scratch bytes from PyTorch's caching allocator: the tensor, and its address."""

    __slots__ = ("tensor", "ptr")

    def __init__(self, tensor):
        self.tensor, self.ptr = tensor, tensor.data_ptr()


_torch_fw: TorchFramework | None = None


def torch_framework() -> TorchFramework:
    global _torch_fw
    if _torch_fw is None:
        _torch_fw = TorchFramework()
    return _torch_fw


def array_kind(x):
    """'cupy', 'torch', 'cai' (any other object with ``__cuda_array_interface__``, read through
    CuPy) or None (not a GPU array) for one argument."""
    cp = _cp()
    if isinstance(x, cp.ndarray):
        return "cupy"
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(x, tensor):
        return "torch"
    if hasattr(x, "__cuda_array_interface__"):
        return "cai"
    return None


def framework_of(arrays: dict) -> tuple[Framework, dict]:
    """The framework of an op's array arguments (``{name: array or None}``) and the arrays as
    it reads them (objects with ``__cuda_array_interface__`` become CuPy views).

    Raises:
        ArgumentTypeError: an argument that is no GPU array, or arrays of two frameworks in one
            call.
    """
    first = None
    out = {}
    for name, x in arrays.items():
        if x is None:
            out[name] = None
            continue
        kind = array_kind(x)
        if kind is None:
            raise not_an_array(x, name)
        if kind == "cai":
            kind, x = "cupy", _cp().asarray(x)
        if first is None:
            first = (name, kind)
        elif kind != first[1]:
            raise ArgumentTypeError(
                f"{name}: a {_KIND_TEXT[kind]}, but {first[0]} is a {_KIND_TEXT[first[1]]}; pass "
                f"arrays of one framework (torch.from_dlpack / cupy.from_dlpack convert without "
                f"a copy)")
        out[name] = x
    fw = torch_framework() if first is not None and first[1] == "torch" else CUPY
    for x in out.values():
        if x is not None:
            _by_type.setdefault(type(x), fw)
    return fw, out


#: array type -> framework, for the cached paths (filled by ``framework_of``)
_by_type: dict[type, Framework] = {}
#: ``framework_of_type(type(x))``: the framework of arrays of that type once a call has seen
#: one, else None (one dictionary lookup, for the cached paths; ``framework_of`` checks)
framework_of_type = _by_type.get


_KIND_TEXT = {"cupy": "cupy.ndarray", "torch": "torch.Tensor"}



def call_arguments(arrays: dict) -> tuple[Framework, int, dict]:
    """(framework, device, ``{name: array}``) of a first call's arrays (``framework_of``): the
    device is CuPy's current one for CuPy arrays, the tensors' for PyTorch's (the first
    array's; the op's device check compares the others with it)."""
    fw, native = framework_of(arrays)
    if fw is CUPY:
        return fw, _cp().cuda.runtime.getDevice(), native
    name, first = next((name, x) for name, x in native.items() if x is not None)
    return fw, fw.device_of(first, name), native


def views(fw: Framework, native: dict) -> dict:
    """``{name: CuPy view or None}`` of ``call_arguments``' arrays, for validation."""
    return {name: None if x is None else fw.view(x, name) for name, x in native.items()}


class _StreamHandle:
    """A raw stream pointer in the CUDA stream protocol (``__cuda_stream__``)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def external_stream(ptr: int, device_id: int):
    """A CuPy stream object (usable as a context) for a stream another framework made."""
    stream = _cp().cuda.Stream
    if hasattr(stream, "from_external"):
        return stream.from_external(_StreamHandle(ptr))
    return _cp().cuda.ExternalStream(ptr, device_id)  # pragma: no cover - CuPy < 14
