"""NVRTC: choosing the library, compiling a rendered kernel to a cubin, reading ptxas' report.

CuPy's own compile path needs a live device and cannot target ``sm_90a``, so ge2jit calls NVRTC
through CuPy's binding (``cupy_backends.cuda.libs.nvrtc``) and handles the cubin itself. That
works on machines with no GPU, for any architecture NVRTC supports.

Which NVRTC is used: ``GE2JIT_NVRTC`` (a path to ``libnvrtc.so.*``) if set; otherwise the newest
one shipped in an ``nvidia-cuda-nvrtc`` wheel installed in a site-packages directory (see
``_install_dirs``: never the working directory or the script's, where a planted library would
run its code in this process); otherwise the one ``cuda.pathfinder`` loads (CuPy's own search:
conda, the system loader's path, CUDA_PATH); otherwise whatever CuPy finds. The choice must be
made before CuPy first touches NVRTC, so it happens at import of ge2jit; ``nvrtc_info()``
reports what was loaded and why.

Why the wheel search is ge2jit's own and not ``cuda.pathfinder.load_nvidia_dynamic_lib``:
pathfinder takes the first library it meets in ``site.getsitepackages()`` under fixed folders
(``nvidia/cu13/lib``, ``nvidia/cuda_nvrtc/lib``) with the sonames it knows (12 and 13). It does
not look in a ``pip install --target`` folder named in PYTHONPATH (how the GPU machines carry
NVRTC 13.5 beside an image's 13.0, see docs/cli-and-cache.md), does not compare versions to take the
newest of several wheels, and would load a system NVRTC before a newer wheel outside
site-packages. It does the rest of the search (conda, the system, CUDA_PATH), so that part is
its: ``_load_by_pathfinder``. The CUDA headers are found by pathfinder too
(``cuda_include_dir``).
"""

from __future__ import annotations

import ctypes
import fnmatch
import glob
import hashlib
import importlib.util
import os
import re
import site
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .._deps import require_cupy
from ..errors import (
    ArgumentValueError,
    KernelCompileError,
    MissingDependencyError,
    NvrtcError,
    SettingsError,
)
from ..settings import get_settings

_lock = threading.Lock()
_loaded: dict[str, object] = {}

_BUILTINS_RE = re.compile(r"libnvrtc-builtins\.so\.(\d+)\.(\d+)")


def _loaded_nvrtc_paths() -> list[str]:
    """Paths of libnvrtc objects mapped into this process (Linux), in the order of their
    addresses (not of their loading)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return []
    seen: list[str] = []
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "/libnvrtc.so" in path and path not in seen:
            seen.append(path)
    return seen


def _in_install_dir(path: str) -> bool:
    """Whether ``path`` lies in a site-packages or dist-packages directory, or under the
    interpreter's prefix: places an installer writes to, not a user's working folders."""
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return any(Path(path).is_relative_to(os.path.realpath(prefix))
               for prefix in {sys.prefix, sys.base_prefix})


def _install_dirs() -> list[str]:
    """Directories that installed packages live in: this interpreter's site-packages (and the
    user's), the absolute folders named in PYTHONPATH (the user's own choice, from which Python
    imports code already: a ``pip install --target`` directory), and the parents of the
    installed ``nvidia`` namespace package's folders that lie in an install directory (a
    ``.pth`` line). ``sys.path`` itself is not searched: it starts with the working directory
    or the script's directory, where anyone who can write a file could plant a library."""
    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    dirs += [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(d)]
    untrusted = set()
    try:
        untrusted.add(os.path.realpath(os.getcwd()))
    except OSError:   # the working directory was removed: nothing to exclude
        pass
    if sys.path and not sys.flags.safe_path:   # the script's directory (or the cwd again)
        untrusted.add(os.path.realpath(sys.path[0] or os.curdir))
    try:
        spec = importlib.util.find_spec("nvidia")   # finds, imports nothing (top level)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        parent = os.path.realpath(os.path.dirname(location))
        if _in_install_dir(parent):
            dirs.append(parent)
    return list(dict.fromkeys(r for r in (os.path.realpath(d) for d in dirs if d)
                              if r not in untrusted and os.path.isdir(r)))


def _wheel_candidates() -> list[tuple[tuple[int, int], Path, str]]:
    """libnvrtc libraries shipped by installed pip wheels: ((major, minor), library, the
    directory it is installed in), newest first."""
    found: dict[Path, tuple[tuple[int, int], str]] = {}
    for entry in _install_dirs():
        for libdir in sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib"))):
            for builtins in glob.glob(os.path.join(libdir, "libnvrtc-builtins.so.*")):
                m = _BUILTINS_RE.search(os.path.basename(builtins))
                libs = sorted(glob.glob(os.path.join(libdir, "libnvrtc.so.*")))
                if m and libs:
                    found.setdefault(Path(libs[0]),
                                     ((int(m.group(1)), int(m.group(2))), entry))
    return sorted(((v, p, d) for p, (v, d) in found.items()), key=lambda c: c[0],
                  reverse=True)


def _version_of(lib) -> tuple[int, int] | None:
    """``nvrtcVersion`` of a loaded library (a ``ctypes.CDLL``), or None."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    try:
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
    except AttributeError:
        return None
    return major.value, minor.value


def _library_in_use(version: tuple[int, int]) -> tuple[str, object] | None:
    """(path, ``ctypes.CDLL``) of the libnvrtc that CuPy's binding calls, which reported
    ``version``: the one loaded library of that version, or among several the one ge2jit
    loaded (CuPy's binding, loaded after it, takes it by its name); None when that is not
    known. A process can hold two: ge2jit's and another package's (PyTorch loads its own by
    its path), and the first in memory need not be the one in use. Nothing is loaded here
    (``RTLD_NOLOAD``)."""
    found = []
    for path in _loaded_nvrtc_paths():
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        if _version_of(lib) == tuple(version):
            found.append((path, lib))
    if len(found) > 1:
        ours = _loaded.get("preloaded_path")
        found = [f for f in found if ours is not None and Path(f[0]).resolve() == ours]
    return found[0] if len(found) == 1 else None


def _preload(lib: Path) -> None:
    libdir = lib.parent
    for builtins in sorted(libdir.glob("libnvrtc-builtins.so.*")):
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


def _choose_library() -> tuple[Path, str] | None:
    """The library to load and why (``NvrtcInfo.reason``), or None to leave it to CuPy."""
    try:
        chosen = get_settings().nvrtc_library
    except SettingsError as e:   # no NVRTC to compile with (the command checks it as a setting)
        raise NvrtcError(str(e)) from None
    if chosen is not None:
        return chosen, "GE2JIT_NVRTC"
    candidates = _wheel_candidates()
    if not candidates:
        return None
    (major, minor), path, where = candidates[0]
    return path, f"nvidia-cuda-nvrtc {major}.{minor} wheel in {where}"


def _load_by_pathfinder() -> str | None:
    """Load NVRTC as CuPy would, through ``cuda.pathfinder`` (conda, the system loader's path,
    CUDA_PATH), so that ``nvrtc_info`` can say where it came from; the reason, or None when
    pathfinder is not installed or finds none (CuPy's binding then reports it at the first
    compile)."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        return None
    try:
        loaded = load_nvidia_dynamic_lib("nvrtc")
    except Exception:  # noqa: BLE001 - not found or not loadable: left to CuPy, as before
        return None
    return f"found by cuda.pathfinder ({loaded.found_via})"


def preload() -> None:
    """Load the chosen NVRTC into the process before CuPy loads one of its own.

    Called at ``import ge2jit``; a failure here is kept and reported at the first compile.
    """
    if "preloaded" in _loaded:
        return
    with _lock:
        if "preloaded" in _loaded:
            return
        _loaded["preloaded"] = None
        try:
            chosen = _choose_library()
        except NvrtcError as e:
            _loaded["preload_error"] = e
            raise
        already = _loaded_nvrtc_paths()
        if chosen is None:
            if already:
                _loaded["reason"] = "already loaded in the process"
            else:
                reason = _load_by_pathfinder()
                if reason:
                    _loaded["reason"] = reason
            return
        chosen, reason = chosen
        _loaded["reason"] = reason
        if already:
            if chosen.resolve() not in {Path(p).resolve() for p in already}:
                _loaded["reason"] = "already loaded in the process"
                warnings.warn(
                    f"NVRTC was already loaded from {already[0]} before ge2jit could load "
                    f"{chosen}; using the one already loaded. Import ge2jit before compiling "
                    "anything with CuPy to choose the NVRTC.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return
        try:
            _preload(chosen)
            _loaded["preloaded_path"] = chosen.resolve()
        except OSError as e:
            err = NvrtcError(f"could not load NVRTC from {chosen}: {e}")
            _loaded["preload_error"] = err
            raise err from e


def _ensure_loaded() -> None:
    if "nvrtc" in _loaded:
        return
    preload()
    if "preload_error" in _loaded:
        raise _loaded["preload_error"]
    with _lock:
        if "nvrtc" in _loaded:
            return
        try:
            _nvrtc = require_cupy("cupy_backends.cuda.libs.nvrtc")   # CuPy's binding
            version = _nvrtc.getVersion()
        except MissingDependencyError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure here means "no usable NVRTC"
            raise NvrtcError(
                "NVRTC could not be loaded. Install it with pip (the 'cuda13' or 'cuda12' extra "
                "of ge2jit, or nvidia-cuda-nvrtc), or point GE2JIT_NVRTC at a libnvrtc.so.* "
                f"file. The error was: {e}"
            ) from e
        # now, while the binding's library is the one loaded (another package may load its
        # own later)
        _loaded["in_use"] = _library_in_use(tuple(version))
        _loaded["nvrtc"] = _nvrtc


def _binding():
    _ensure_loaded()
    return _loaded["nvrtc"]


@dataclass(frozen=True)
class NvrtcInfo:
    """Which NVRTC this process uses."""

    version: tuple[int, int]
    path: str | None
    fingerprint: str
    supported_archs: tuple[str, ...]
    #: why this library: "GE2JIT_NVRTC", "nvidia-cuda-nvrtc 13.5 wheel in <site-packages>",
    #: "found by cuda.pathfinder (<how>)", "already loaded in the process" (before ge2jit's
    #: import) or "loaded by CuPy"
    reason: str = ""

    def __str__(self) -> str:
        return (f"NVRTC {self.version[0]}.{self.version[1]} ({self.path or 'path unknown'}; "
                f"{self.reason})")


@lru_cache(maxsize=1)
def nvrtc_info() -> NvrtcInfo:
    """The NVRTC in use: version, library path, build fingerprint, supported architectures,
    and why that library (``reason``)."""
    nv = _binding()
    version = tuple(nv.getVersion())
    in_use = _loaded.get("in_use")
    path = in_use[0] if in_use else None
    h = hashlib.sha256(f"nvrtc {version}".encode())
    if path:
        # A fingerprint of the build, independent of where it is installed: the size of the
        # library and of its builtins (a patch release changes them even when the version
        # numbers agree).
        lib = Path(path)
        h.update(str(lib.stat().st_size).encode())
        for b in sorted(lib.parent.glob("libnvrtc-builtins.so*")):
            if b.is_file() and not b.is_symlink():
                h.update(b.name.encode() + str(b.stat().st_size).encode())
    try:
        archs = tuple(f"sm_{a}" for a in nv.getSupportedArchs())
    except Exception:  # noqa: BLE001 - older NVRTC builds lack the call
        archs = ()
    return NvrtcInfo(version=version, path=path, fingerprint=h.hexdigest()[:16],
                     supported_archs=archs, reason=_loaded.get("reason", "loaded by CuPy"))


def normalize_arch(arch: str | int) -> str:
    """'90a', 'sm_90a', 'compute_90a', 90 -> 'sm_90a' / 'sm_90'."""
    text = str(arch).strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3})([af]?)", text)
    if not m:
        raise ArgumentValueError(
            f"arch: expected a CUDA architecture such as 'sm_80', 'sm_90' or 'sm_90a', got {arch!r}"
        )
    return f"sm_{m.group(1)}{m.group(2)}"


def arch_number(arch: str | int) -> int:
    """'sm_90a' -> 90, 'sm_80' -> 80: the compute capability, for comparisons."""
    return int(re.fullmatch(r"sm_(\d+)[af]?", normalize_arch(arch)).group(1))


@lru_cache(maxsize=1)
def cuda_include_dir() -> str | None:
    """The CUDA headers (cuda_fp16.h, cuda_bf16.h), preferring the nvidia-cuda-runtime wheel."""
    try:
        from cuda import pathfinder
    except ImportError:
        return None
    try:
        return pathfinder.find_nvidia_header_directory("cudart")
    except Exception:  # noqa: BLE001 - not found is not an error until a kernel needs them
        return None


@lru_cache(maxsize=8)
def header_listing(include_dir: str | None) -> str:
    """A checksum of the names and sizes of the CUDA headers (no contents), once per
    directory and process: part of a kernel's alias, beside NVRTC's fingerprint (the headers
    come with NVRTC's version). By ``os.scandir``: a process's first kernel pays for it."""
    h = hashlib.sha256()
    if include_dir:
        with os.scandir(include_dir) as entries:
            headers = sorted((e.name, e.stat().st_size) for e in entries
                             if fnmatch.fnmatchcase(e.name, "*.h*") and e.is_file())
        for name, size in headers:
            h.update(f"{name}\0{size}\0".encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=8)
def header_checksum(include_dir: str | None) -> str:
    """A checksum of the CUDA headers a kernel may include (part of the cache key), read once
    per directory and process."""
    h = hashlib.sha256()
    if include_dir:
        for p in sorted(Path(include_dir).glob("*.h*")):
            if p.is_file():
                h.update(p.name.encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


_REG_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_STACK_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclass(frozen=True)
class Resources:
    """ptxas' report for one kernel."""

    registers: int = -1
    shared_bytes: int = -1
    stack_bytes: int = -1
    spill_stores: int = -1
    spill_loads: int = -1

    @property
    def spill_bytes(self) -> int:
        return max(self.spill_stores, 0) + max(self.spill_loads, 0)

    @classmethod
    def parse(cls, log: str) -> Resources:
        regs = _REG_RE.search(log)
        smem = _SMEM_RE.search(log)
        stack = _STACK_RE.search(log)
        return cls(
            registers=int(regs.group(1)) if regs else -1,
            shared_bytes=int(smem.group(1)) if smem else 0,
            stack_bytes=int(stack.group(1)) if stack else -1,
            spill_stores=int(stack.group(2)) if stack else -1,
            spill_loads=int(stack.group(3)) if stack else -1,
        )


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str
    resources: Resources
    compile_seconds: float
    options: tuple[str, ...] = field(default=())


def compile_options(arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The options that define the machine code (part of the cache key; no paths).
    ``GE2JIT_LINEINFO=1`` adds ``--generate-line-info`` (source lines in the cubin, for
    profilers and compute-sanitizer; the code itself is the same)."""
    lineinfo = ("--generate-line-info",) if get_settings().lineinfo else ()
    return (f"--gpu-architecture={normalize_arch(arch)}", "-std=c++17",
            "--ptxas-options=-v", *lineinfo, *extra)


def _whole_cubin(prog: int, from_cupy: bytes) -> bytes:
    """The cubin with its last byte: CuPy's ``getCUBIN`` drops it, taking it for a string's
    terminating NUL. The driver loads the short file, but ``cuobjdump`` and ``nvdisasm``
    refuse it (its program headers run past the end). Read again through the libnvrtc that
    CuPy's binding calls (:func:`_library_in_use`; where that is not known, CuPy's bytes as
    they are), keeping CuPy's bytes if anything disagrees."""
    in_use = _loaded.get("in_use")
    if in_use is None:
        return bytes(from_cupy)
    try:
        lib = in_use[1]
        if "cubin_calls" not in _loaded:
            lib.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
            lib.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            _loaded["cubin_calls"] = True
        size = ctypes.c_size_t()
        if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0:
            return bytes(from_cupy)
        buf = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(prog, buf) != 0:
            return bytes(from_cupy)
    except (OSError, AttributeError):
        return bytes(from_cupy)
    whole = buf.raw
    return whole if whole[:len(from_cupy)] == bytes(from_cupy) else bytes(from_cupy)


def _with_includes(options: tuple[str, ...], source: str, kernel_name: str) -> list[str]:
    """``options`` with ``-I`` to the CUDA headers where ``source`` includes them."""
    full = list(options)
    if "#include <cuda" in source:
        inc = cuda_include_dir()
        if inc is None:
            raise NvrtcError(
                f"kernel {kernel_name!r} includes CUDA headers, which were not found: install "
                "nvidia-cuda-runtime (the 'cuda13' or 'cuda12' extra of ge2jit)"
            )
        full.append(f"-I{inc}")
    return full


def compile_to_ptx(source: str, kernel_name: str, arch: str,
                   extra_options: tuple[str, ...] = ()) -> str:
    """The PTX of ``source`` as it is compiled for ``arch`` (the same options, for the
    virtual architecture ``compute_XX`` of ``sm_XX``): what ptxas turns into the cubin.

    Raises:
        KernelCompileError: NVRTC rejected the source.
    """
    virtual = "compute_" + normalize_arch(arch)[len("sm_"):]
    options = tuple(f"--gpu-architecture={virtual}" if o.startswith("--gpu-architecture=")
                    else o for o in compile_options(arch, extra_options)
                    if not o.startswith("--ptxas-options"))
    ptx = _compile(source, kernel_name, _with_includes(options, source, kernel_name),
                   lambda nv, prog: nv.getPTX(prog))
    return ptx.decode() if isinstance(ptx, bytes) else str(ptx)


def _compile(source: str, kernel_name: str, options: list[str], read):
    """``read(binding, program)`` of ``source`` compiled with ``options``.

    Raises:
        KernelCompileError: NVRTC rejected the source; the error holds the log and the source.
    """
    nv = _binding()
    prog = nv.createProgram(source, f"{kernel_name}.cu", [], [])
    try:
        try:
            nv.compileProgram(prog, options)
        except nv.NVRTCError as e:
            log = nv.getProgramLog(prog)
            raise KernelCompileError(kernel_name, log or str(e), source, tuple(options)) from None
        return read(nv, prog)
    finally:
        nv.destroyProgram(prog)


def compile_to_cubin(source: str, kernel_name: str, arch: str,
                     extra_options: tuple[str, ...] = ()) -> CompileResult:
    """Compile ``source`` for ``arch`` and return the cubin with ptxas' resource report.

    Raises:
        KernelCompileError: NVRTC rejected the source; the error holds the log and the source.
    """
    options = compile_options(arch, extra_options)
    t0 = time.perf_counter()
    log, cubin = _compile(source, kernel_name, _with_includes(options, source, kernel_name),
                          lambda nv, prog: (nv.getProgramLog(prog),
                                            _whole_cubin(prog, nv.getCUBIN(prog))))
    seconds = time.perf_counter() - t0
    return CompileResult(cubin=cubin, log=log, resources=Resources.parse(log),
                         compile_seconds=seconds, options=tuple(options))


def check_archs(archs) -> tuple[str, ...]:
    """Normalize ``archs`` ('90a', 'sm_80', ...) and check them against the loaded NVRTC, once,
    before anything compiles (rather than one NVRTC failure per kernel).

    The 'a' and 'f' suffixes need their base architecture supported: sm_90a when sm_90 is.

    Returns:
        The normalized names, duplicates dropped, in the given order.

    Raises:
        ArgumentValueError: a name that is no architecture, or one this NVRTC cannot compile
            for; the message lists those it can.
        NvrtcError: NVRTC cannot be loaded.
    """
    from ..errors import ArgumentValueError

    try:
        names = tuple(dict.fromkeys(normalize_arch(a) for a in archs))
    except ValueError as e:
        raise ArgumentValueError(str(e)) from None
    info = nvrtc_info()
    if not info.supported_archs:  # an NVRTC too old to say: its compile errors will
        return names
    numbers = {arch_number(a) for a in info.supported_archs}
    refused = [a for a in names if arch_number(a) not in numbers]
    if refused:
        raise ArgumentValueError(
            f"arch: {', '.join(refused)}: not supported by NVRTC {info.version[0]}."
            f"{info.version[1]}, which compiles for {', '.join(info.supported_archs)} (and "
            "their 'a' variants, such as sm_90a)")
    return names
