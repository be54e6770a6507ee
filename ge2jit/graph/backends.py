"""The two ways a step is captured and replayed.

CuPy: the step runs on a private non-blocking stream between ``begin_capture`` and
``end_capture`` (relaxed mode, CuPy's default: its pool may call ``cudaMalloc``), with every
CuPy allocation served by a ``cupy.cuda.MemoryPool`` of the graph's own, which the captured
step keeps for the graph's life: no other allocation can be handed the memory the graph writes
when it replays. ge2jit's scratch for CuPy arrays comes from CuPy's current allocator, so it
lands there too.

PyTorch: ``torch.cuda.CUDAGraph`` captured under ``torch.cuda.graph`` (PyTorch's graph-private
pool for tensors), warmed up on a side stream as PyTorch's documentation does; ge2jit launches
on PyTorch's current stream, so its kernels join that capture. CuPy's current stream is the
capturing stream meanwhile and its allocations come from a private pool as above (any CuPy
memory ge2jit or the step still takes), each allocation made in relaxed capture mode so that
the pool may grow under PyTorch's global mode.

Neither compiles, synchronizes or allocates outside its pools while capturing; a step that
tries is stopped with one ``GraphCaptureError`` (``diagnose``), after the capture is ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

import numpy as np

from ..errors import ArgumentTypeError
from ..runtime.arrays import array_kind, external_stream
from ..runtime.capture import capture_scope
from .diagnose import capture_error, ended_error, is_capture_error
from .tree import ArrayKind


def kind_of(x) -> str | None:
    """"cupy" for CuPy arrays (and objects with ``__cuda_array_interface__``, read through
    CuPy), "torch" for PyTorch tensors, None for anything else."""
    kind = array_kind(x)
    return "cupy" if kind == "cai" else kind


def _view(x):
    """A CuPy array of ``x`` (itself, or a view of a ``__cuda_array_interface__`` object)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:   # an interface object before anything imported CuPy
        from .._deps import require_cupy

        cupy = require_cupy()
    return x if isinstance(x, cupy.ndarray) else cupy.asarray(x)


def _cupy_meta(x) -> tuple:
    v = _view(x)
    return (v.shape, v.dtype, v.data.device_id)


CUPY_KIND = ArrayKind(kind=kind_of, meta=_cupy_meta, ptr=lambda x: _view(x).data.ptr,
                      layout=lambda x: _view(x).strides)
TORCH_KIND = ArrayKind(kind=kind_of, meta=lambda x: (tuple(x.shape), x.dtype, x.device),
                       ptr=lambda x: x.data_ptr(), layout=lambda x: tuple(x.stride()))
KINDS = {"cupy": CUPY_KIND, "torch": TORCH_KIND}


def describe_meta(meta: tuple) -> str:
    shape, dtype, device = meta
    return f"shape {tuple(shape)}, dtype {dtype}, device {device}"


def check_leaf(path: str, x) -> None:
    """Refuse argument leaves no graph can read: host arrays and tensors not on a GPU."""
    if isinstance(x, np.ndarray):
        raise ArgumentTypeError(f"{path}: a numpy.ndarray of shape {x.shape}; a captured step "
                                f"reads GPU arrays: pass cupy.asarray({path}) (or a tensor on "
                                "a CUDA device)")
    if kind_of(x) == "torch" and not x.is_cuda:
        raise ArgumentTypeError(f"{path}: a tensor on {x.device}; a captured step reads GPU "
                                f"arrays: move it with {path}.cuda()")


# --- capture mode of this thread (the driver's, shared by every CUDA runtime in the process)

_exchange = None


def _capture_mode_exchange():
    """The driver's ``cuThreadExchangeStreamCaptureMode``, or None where it cannot be had."""
    global _exchange
    if _exchange is None:
        try:
            f = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
            f.argtypes = [ctypes.POINTER(ctypes.c_int)]
            f.restype = ctypes.c_int
            _exchange = f
        except (OSError, AttributeError):
            _exchange = False
    return _exchange or None


_RELAXED = 2   # CU_STREAM_CAPTURE_MODE_RELAXED


def relaxed(malloc):
    """``malloc`` made in relaxed capture mode: a pool that grows (``cudaMalloc``) while
    PyTorch captures in its global mode, which forbids that call otherwise (PyTorch's own
    allocator does the same around its ``cudaMalloc``)."""
    exchange = _capture_mode_exchange()
    if exchange is None:   # pragma: no cover - no driver library: nothing can capture anyway
        return malloc

    def alloc(size):
        mode = ctypes.c_int(_RELAXED)
        exchange(ctypes.byref(mode))
        try:
            return malloc(size)
        finally:
            exchange(ctypes.byref(mode))   # the thread's own mode back

    return alloc


def _abandon(stream_ptr: int) -> None:
    """End a capture left open on ``stream_ptr`` and drop what it recorded."""
    import cupy

    rt = cupy.cuda.runtime
    try:
        capturing = rt.streamIsCapturing(stream_ptr)
    except RuntimeError:   # invalidated, still open
        capturing = True
    except Exception:  # noqa: BLE001 - not capturing, or nothing to ask: nothing to end
        return
    if not capturing:
        return
    try:
        g = rt.streamEndCapture(stream_ptr)
    except Exception:  # noqa: BLE001 - an invalidated capture ends with an error, and ends
        return
    if g:
        rt.graphDestroy(g)


class CupyBackend:
    """Capture and replay through CuPy (``cupy.cuda.Graph``)."""

    name = "cupy"
    kind = CUPY_KIND

    def __init__(self):
        import cupy

        self.cp = cupy

    def device(self) -> int:
        return self.cp.cuda.runtime.getDevice()

    def new_pool(self):
        return self.cp.cuda.MemoryPool()

    def clone(self, x, pool):
        """The graph's input buffer for ``x`` (from ``pool``; ``x``'s layout where it is C or
        F contiguous, else C-contiguous), holding ``x``'s values."""
        v = _view(x)
        with self.cp.cuda.using_allocator(pool.malloc):
            static = self.cp.empty_like(v)
        self.copy_into(static, v)
        return static

    def copy_into(self, static, new) -> None:
        """``static[...] = new`` on the current stream (one memcpy for equal contiguous
        layouts)."""
        v = _view(new)
        if v.data.ptr == static.data.ptr and v.strides == static.strides:
            return
        if not static.nbytes:
            return
        if v.strides == static.strides and (static.flags.c_contiguous
                                            or static.flags.f_contiguous):
            static.data.copy_from_device_async(v.data, static.nbytes)
        else:
            self.cp.copyto(static, v)

    def differs(self, a, b) -> bool:
        """Whether two arrays of one shape and dtype differ in any bit (synchronizes)."""
        cp = self.cp
        x = cp.ascontiguousarray(_view(a)).reshape(-1).view(cp.uint8)
        y = cp.ascontiguousarray(_view(b)).reshape(-1).view(cp.uint8)
        return bool((x != y).any())

    def warm(self, fn, args, kwargs, times: int):
        """Run the step ``times`` times on the current stream; the last result."""
        out = None
        for _ in range(times):
            out = fn(*args, **kwargs)
        return out

    def capture(self, fn, args, kwargs, label: str, pool):
        """(graph, the step's result in the capture) of one capture of ``fn(*args,
        **kwargs)``.

        Raises:
            GraphCaptureError: the step did something a capture cannot hold (the capture is
                ended and dropped first); other errors of the step propagate as they are.
        """
        cp = self.cp
        stream = cp.cuda.Stream(non_blocking=True)
        failure = graph = out = None
        with capture_scope(label), cp.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - the capture is ended, then re-raised
                failure = e
            if failure is None:
                try:
                    graph = NodePriorityGraph.of(stream.end_capture())
                except Exception as e:
                    _abandon(stream.ptr)
                    raise ended_error(e, label) from e
            else:
                _abandon(stream.ptr)
        if failure is not None:
            if is_capture_error(failure):
                raise capture_error(failure, label) from failure
            raise failure
        return graph, out

    def replay(self, graph) -> None:
        graph.launch()   # on CuPy's current stream


#: ``CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`` (cuda.h): a replay runs each kernel at the
#: priority of the stream it was captured from, not all of them at the launching stream's
NODE_PRIORITY_FLAG = 8


class NodePriorityGraph:
    """A captured CuPy graph, instantiated again with node priorities: a replay runs each
    kernel at the priority of the stream it was captured from (captured kernel nodes carry
    it), as the step runs eagerly. CuPy instantiates without flags, and then every kernel runs
    at the priority of the stream the graph is launched on, so a reduction captured from a
    high-priority stream such as ``GradientAllReduce``'s would lose its priority. Launched on
    CuPy's current stream; the CuPy graph is kept (it owns the ``cudaGraph_t``)."""

    _driver = None

    def __init__(self, graph, executable: ctypes.c_void_p):
        self.graph, self._exec = graph, executable   # the CuPy graph owns the cudaGraph_t

    @classmethod
    def of(cls, graph):
        """``graph`` instantiated with node priorities, or ``graph`` itself when the driver
        has no ``cuGraphInstantiateWithFlags`` (CUDA < 11.7, or no libcuda found)."""
        driver = cls._load()
        if driver is None:
            return graph
        executable = ctypes.c_void_p()
        rc = driver.cuGraphInstantiateWithFlags(ctypes.byref(executable),
                                                ctypes.c_void_p(graph.graph),
                                                ctypes.c_ulonglong(NODE_PRIORITY_FLAG))
        if rc != 0:
            return graph
        return cls(graph, executable)

    @classmethod
    def _load(cls):
        if cls._driver is None:
            try:
                driver = ctypes.CDLL("libcuda.so.1")
                for name in ("cuGraphInstantiateWithFlags", "cuGraphLaunch",
                             "cuGraphExecDestroy"):
                    getattr(driver, name).restype = ctypes.c_int
            except (OSError, AttributeError):
                driver = False
            cls._driver = driver
        return cls._driver or None

    def launch(self, stream=None) -> None:
        """Replay on ``stream`` (default: CuPy's current stream)."""
        import cupy

        ptr = (stream or cupy.cuda.get_current_stream()).ptr
        rc = self._driver.cuGraphLaunch(self._exec, ctypes.c_void_p(ptr))
        if rc != 0:
            from ..errors import KernelLaunchError

            raise KernelLaunchError(f"cuGraphLaunch failed with CUresult {rc}")

    def upload(self, stream=None) -> None:
        """Nothing: the graph is uploaded at its first launch."""

    def __del__(self):
        executable, self._exec = getattr(self, "_exec", None), None
        if executable is not None and self._driver:
            self._driver.cuGraphExecDestroy(executable)


class TorchBackend:
    """Capture and replay through PyTorch (``torch.cuda.CUDAGraph``)."""

    name = "torch"
    kind = TORCH_KIND

    def __init__(self):
        import cupy
        import torch

        self.cp, self.torch = cupy, torch

    def device(self) -> int:
        return self.torch.cuda.current_device()

    def new_pool(self):
        """The private CuPy pool of the graph (its tensors are in PyTorch's graph pool)."""
        return self.cp.cuda.MemoryPool()

    def clone(self, x, pool):
        static = x.detach().clone(memory_format=self.torch.preserve_format)
        if x.requires_grad:
            static.requires_grad_(True)
        return static

    def copy_into(self, static, new) -> None:
        if new.data_ptr() == static.data_ptr() and new.stride() == static.stride():
            return
        with self.torch.no_grad():
            static.copy_(new)

    def differs(self, a, b) -> bool:
        torch = self.torch
        x = a.detach().contiguous().reshape(-1).view(torch.uint8)
        y = b.detach().contiguous().reshape(-1).view(torch.uint8)
        return not torch.equal(x, y)

    def warm(self, fn, args, kwargs, times: int):
        """Run the step ``times`` times on a side stream (PyTorch's advice for warm-up before
        a capture), ordered after the current stream and before its later work."""
        torch = self.torch
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        out = None
        with torch.cuda.stream(side), external_stream(side.cuda_stream, self.device()):
            for _ in range(times):
                out = fn(*args, **kwargs)
        current.wait_stream(side)
        return out

    def capture(self, fn, args, kwargs, label: str, pool):
        """As ``CupyBackend.capture``, under ``torch.cuda.graph``."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        before = torch.cuda.current_stream()
        failure = error = out = None
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(capture_scope(label))
                stack.enter_context(self.cp.cuda.using_allocator(relaxed(pool.malloc)))
                stack.enter_context(torch.cuda.graph(graph, stream=stream))
                stack.enter_context(external_stream(stream.cuda_stream, self.device()))
                try:
                    out = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - re-raised after the capture ends
                    failure = e
                    raise
        except BaseException as e:  # noqa: BLE001 - the capture is ended, then reported
            error = e
        if error is not None:
            # torch.cuda.graph ended the capture (and its pool's) on the way out; if ending it
            # raised, its stream context was not left: restore the current stream.
            torch.cuda.set_stream(before)
            _abandon(stream.cuda_stream)
            first = failure if failure is not None else error
            if is_capture_error(first):
                raise capture_error(first, label) from first
            if failure is None:
                raise ended_error(error, label) from error
            raise first
        return graph, out

    def replay(self, graph) -> None:
        graph.replay()   # on PyTorch's current stream


_backends: dict[str, object] = {}


def backend(name: str):
    """The backend of that name ("cupy", "torch"), made once."""
    b = _backends.get(name)
    if b is None:
        b = _backends[name] = CupyBackend() if name == "cupy" else TorchBackend()
    return b
