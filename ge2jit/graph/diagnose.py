"""What went wrong in a capture, in one ``GraphCaptureError``: the CUDA error (CuPy's or
PyTorch's exception, or the CUDA status it carries), what usually causes it, and where in the
step it happened (the step's own line, and the ge2jit function it was in, if any)."""

from __future__ import annotations

import os
import traceback

from ..errors import GraphCaptureError

#: the CUDA statuses of stream capture (runtime and driver API share the numbers)
STATUS = {
    900: "cudaErrorStreamCaptureUnsupported",
    901: "cudaErrorStreamCaptureInvalidated",
    902: "cudaErrorStreamCaptureMerge",
    903: "cudaErrorStreamCaptureUnmatched",
    904: "cudaErrorStreamCaptureUnjoined",
    905: "cudaErrorStreamCaptureIsolation",
    906: "cudaErrorStreamCaptureImplicit",
    907: "cudaErrorCapturedEvent",
    908: "cudaErrorStreamCaptureWrongThread",
}

#: what causes each, and what to change
HINTS = {
    900: "a capture cannot hold a synchronization (a stream's, an event's or the device's), a "
         "copy to or from the host (.item(), float(x), .get(), cupy.asnumpy, .cpu(), .tolist())"
         " or a blocking allocation: keep them out of the captured step (read its outputs "
         "after a replay)",
    901: "an earlier operation in the step, one a capture cannot hold (a synchronization, a "
         "copy to the host, work on the legacy default stream), had already invalidated the "
         "capture",
    902: "two independent captures were merged: the step waited on an event recorded in "
         "another capture",
    903: "the capture was ended on another stream than it began on",
    904: "work forked onto another stream was not joined back: make the capturing stream wait "
         "on an event recorded after the other stream's last work before the step returns",
    905: "the step waited on an event recorded outside the capture",
    906: "an operation on the legacy default stream (cupy.cuda.Stream.null, or a blocking "
         "stream) would have waited on the capturing stream: run the step's work on the "
         "current stream",
    907: "the step queried or synchronized an event recorded inside the capture",
    908: "another thread touched the capture",
}

#: messages that carry no status, mapped to the status they mean
_TEXT = (
    ("operation not permitted when stream is capturing", 900),
    ("the current stream is capturing", 900),           # CuPy's own checks
    ("operation failed due to a previous error during capture", 901),
    ("invalidated the capture sequence", 901),
    ("stream capture invalidated", 901),
    ("operation would make the legacy stream depend on a capturing blocking stream", 906),
    ("capturing stream has unjoined work", 904),
    ("unjoined", 904),
)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def capture_status(exc: BaseException) -> int | None:
    """The stream-capture status an exception (or one it was raised from) stands for, or
    None when it is not about capturing."""
    for e in _chain(exc):
        status = getattr(e, "status", None)
        if isinstance(status, int) and status in STATUS:
            return status
        text = str(e)
        for needle, status in _TEXT:
            if needle in text:
                return status
    return None


def is_capture_error(exc: BaseException) -> bool:
    return isinstance(exc, GraphCaptureError) or capture_status(exc) is not None


def _library_dirs() -> tuple[str, ...]:
    import sys

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),   # ge2jit
            os.path.dirname(os.__file__)]                                  # the standard library
    for name in ("cupy", "cupy_backends", "torch", "numpy", "cupyx"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(d + os.sep for d in dirs)


_CYTHON = (".pyx", ".pxd", ".pxi")


def locate(tb) -> tuple[str | None, str | None]:
    """(the step's own line that failed, as ``file:line in function (`code`)``; the public
    ge2jit function it was calling) from a traceback, each None where unknown."""
    frames = traceback.extract_tb(tb)
    libs = _library_dirs()
    ge2jit_dir = libs[0]
    user = None
    for i, f in enumerate(frames):
        # Cython frames (CuPy's .pyx) name their file relative to nothing: never the user's
        if not (os.path.abspath(f.filename).startswith(libs) or f.filename.endswith(_CYTHON)):
            user = i
    if user is None:
        return None, None
    f = frames[user]
    code = f" (`{f.line.strip()}`)" if f.line else ""
    where = f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}{code}"
    op = None
    import ge2jit

    for g in frames[user + 1:]:
        path = os.path.abspath(g.filename)
        if path.startswith(ge2jit_dir + "ops" + os.sep):
            if callable(getattr(ge2jit, g.name, None)) and not g.name.startswith("_"):
                op = f"ge2jit.{g.name}"
            break
    return where, op


_ENDED = ("The capture was ended and nothing of it kept; the stream and the device are "
          "usable")


def _sentences(*parts: str) -> str:
    """The parts (empty ones left out) as sentences, each ending with one period."""
    out = []
    for part in parts:
        part = part.strip().rstrip(".")
        if part:
            out.append(part[:1].upper() + part[1:] if out else part)
    return ". ".join(out) + "."


def _what(exc: BaseException, status: int | None) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    name = STATUS.get(status)
    if name and name not in what:
        what += f" ({name})"
    return what


def capture_error(exc: BaseException, label: str) -> GraphCaptureError:
    """The one error that reports ``exc``, raised while capturing ``label``."""
    where, op = locate(exc.__traceback__)
    place = f" at {where}" if where else ""
    if op:
        place += f", inside {op}"
    if isinstance(exc, GraphCaptureError):   # the loader's: a kernel not warmed up
        return GraphCaptureError(_sentences(f"capturing {label} failed{place}: {exc}",
                                            _ENDED))
    status = capture_status(exc)
    return GraphCaptureError(_sentences(f"capturing {label} failed{place}: "
                                        f"{_what(exc, status)}", HINTS.get(status, ""),
                                        _ENDED))


def ended_error(exc: BaseException, label: str) -> GraphCaptureError:
    """The error for a capture that ending it (or instantiating its graph) refused after the
    step itself returned."""
    status = capture_status(exc)
    hint = HINTS.get(status, "")
    if status == 901:
        hint = ("an operation in the step that a capture cannot hold (a synchronization, a "
                "copy to the host, work on the legacy default stream) invalidated the capture "
                "without raising an error then")
    return GraphCaptureError(_sentences(f"capturing {label} failed when the capture ended: "
                                        f"{_what(exc, status)}", hint, _ENDED))
