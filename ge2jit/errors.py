"""The exceptions and warnings that ge2jit raises."""

from __future__ import annotations


class Ge2jitError(Exception):
    """Root of every error raised by ge2jit."""


class ArgumentValueError(Ge2jitError, ValueError):
    """An argument has the right type but a value the op cannot take (shape, dtype, name)."""


class ArgumentTypeError(Ge2jitError, TypeError):
    """An argument has the wrong type (a NumPy array where a CuPy array is needed, say)."""


class DeviceMismatchError(ArgumentValueError):
    """Arrays of one call live on different devices, or not on the current one."""


class SettingsError(ArgumentValueError):
    """A ``GE2JIT_*`` environment variable has a value ge2jit cannot use (the message names it)."""


class MissingDependencyError(Ge2jitError, ImportError):
    """A package ge2jit needs for this call is not installed; the message names the pip extra
    that brings it (``pip install "ge2jit[cuda13]"``)."""


class CacheNotWritableError(Ge2jitError):
    """The kernel cache cannot store kernels (disabled, not writable, refused): a warm-up or a
    bundle import would keep nothing."""


class NvrtcError(Ge2jitError):
    """NVRTC could not be found or loaded, or a requested NVRTC library is unusable."""


class KernelCompileError(Ge2jitError):
    """NVRTC rejected a rendered kernel.

    The message leads with the kernel's name and NVRTC's log. ``dump()`` writes the rendered
    source with line numbers, which is what the log's line numbers refer to.
    """

    def __init__(self, kernel_name: str, log: str, source: str, options: tuple[str, ...]):
        self.kernel_name = kernel_name
        self.log = log
        self.source = source
        self.options = tuple(options)
        super().__init__(
            f"NVRTC failed to compile kernel {kernel_name!r} (options: {' '.join(options)})\n"
            f"{log.strip()}\n"
            "Call .dump() on this exception to print the rendered source with line numbers."
        )

    def __reduce__(self):
        # picklable (a process pool hands it back to its caller) with its own arguments
        return type(self), (self.kernel_name, self.log, self.source, self.options)

    def numbered_source(self) -> str:
        lines = self.source.splitlines()
        width = len(str(len(lines)))
        return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))

    def dump(self, file=None) -> None:
        """Print the rendered source with line numbers, then the NVRTC log."""
        import sys

        out = sys.stderr if file is None else file
        print(f"--- {self.kernel_name}: rendered source ---", file=out)
        print(self.numbered_source(), file=out)
        print(f"--- {self.kernel_name}: NVRTC log ---", file=out)
        print(self.log, file=out)


class KernelLaunchError(Ge2jitError):
    """A compiled kernel could not be loaded or launched (for example, too many resources)."""


class GraphCaptureError(Ge2jitError, RuntimeError):
    """Capturing a step as a CUDA graph failed (``ge2jit.graph``): a kernel that would be
    compiled or loaded during the capture (warm up with the same shapes first), or an
    operation a capture cannot hold (a synchronization, a copy to the host such as ``.item()``,
    work on the legacy default stream). The message names what failed and where; the capture
    was ended and nothing of it kept, so the stream and the device stay usable."""


class GraphCaptureWarning(UserWarning):
    """A captured step looks wrong but may be meant (``ge2jit.graph``): for example, it
    changed one of its arguments, which the graph copies in on each call, so the change
    happens to the graph's copy, not to the caller's array."""


class CacheWarning(UserWarning):
    """The disk cache is unusable (read-only, full); kernels are kept in memory instead."""
