"""Whether this thread is capturing a CUDA graph, and the check ge2jit's kernel loader makes
before it compiles or loads a kernel.

Neither may happen inside a capture: a compile takes seconds of host time that the graph
would not hold anyway, and loading a module is no stream operation a graph can record. So a
kernel that is not loaded yet when a captured step launches it is an error that says to warm
up with the same shapes first (``GraphCaptureError``), never a half-captured stream.

``ge2jit.graph`` marks its captures here (``capture_scope``). A capture ge2jit did not start is
seen on PyTorch's current stream (``torch.cuda.graph``, whose global capture mode would refuse
the module load anyway, invalidating the capture), queried only when a kernel is about to be
loaded, never on a launch. A CuPy capture of the caller's own (relaxed mode, where a load is
allowed) is left alone.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from ..errors import GraphCaptureError

_state = threading.local()


def capturing() -> str | None:
    """What this thread is capturing now (the label ``capture_scope`` was given, such as
    "step 'train_step'"), or None."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def capture_scope(label: str):
    """Marks this thread as capturing ``label`` while the block runs (nested scopes allowed)."""
    stack = _state.__dict__.setdefault("stack", [])
    stack.append(label)
    try:
        yield
    finally:
        stack.pop()


def _torch_capturing() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a query that fails tells nothing: no capture seen
        return False


def external_capture() -> str | None:
    """A capture that ge2jit did not start, on PyTorch's current stream, or None."""
    return "PyTorch's current stream" if _torch_capturing() else None


def check_not_capturing(kernel_name: str, device_id: int) -> None:
    """Raise ``GraphCaptureError`` if this thread is capturing a CUDA graph: ``kernel_name``
    is not loaded on ``device_id`` and would be compiled or loaded inside the capture."""
    what = capturing()
    if what is None:
        where = external_capture()
        if where is None:
            return
        what = f"a CUDA graph on {where}"
    raise GraphCaptureError(
        f"kernel {kernel_name!r} is not loaded on device {device_id}, and compiling or loading "
        f"it is not possible while {what} is captured; run the step eagerly with these shapes, "
        "dtypes and options first (ge2jit.graph.capture's warmup, or ge2jit.warmup with a "
        "table listing them) so every kernel is compiled and loaded before the capture")
