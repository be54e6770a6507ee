"""The compiled launch path: prepared calls looked up and launched in C.

An op keeps a ``Table`` beside its Python prepared calls. ``table.call(*args)`` computes the
call's signature in C (the arrays' shapes, strides, dtypes, devices and pointer alignment, the
types or values of the other arguments, the current device), finds the ``Program`` stored
under it and runs it: pointers read, outputs not given allocated by the framework's
allocator, outputs given checked against the inputs for overlap, parameters packed, each
kernel launched with ``cuLaunchKernel`` on the framework's current stream. It returns the
call's result, or ``MISS``: the op then takes its Python path, which validates (and says what
is wrong), launches, and stores a program for the next call (``table.put``).

A program is a list of launches, each described by what goes into every kernel parameter
(``step``): a constant, an argument's pointer (``Ptr``), an argument as a double (``Scalar``)
or a TMA tensor map whose address is an argument's pointer (``Map``; the driver's
``cuTensorMapReplaceAddress`` moves it, only when the pointer changed).

The C module is ``ge2jit.jit._fastlaunch``: prebuilt in a wheel, else built once with the
machine's C compiler into the kernel cache. Without one (no compiler, no Python headers,
``GE2JIT_LAUNCH=python``) tables always miss and the Python path does all the work;
``launch_path()`` says which path runs and why.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
import sysconfig
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelLaunchError
from . import cbuild
from .params import Kind

log = logging.getLogger("ge2jit")

#: what a table returns when the call must take the Python path
MISS = object()

#: CUresult of a launch on a thread with no current context
_INVALID_CONTEXT = 201
_KINDS = {"cupy": 1, "torch": 2}
#: a tensor map's argument when no argument moves it
_NO_ARG = 255
#: the most launches a program makes and the most arrays it returns (``_fastlaunch.c``'s
#: MAX_STEPS and MAX_RETURNS)
MAX_STEPS = 12
MAX_RETURNS = 8

_lock = threading.Lock()
_state: dict = {}
_tables: weakref.WeakSet = weakref.WeakSet()


@dataclass(frozen=True)
class Ptr:
    """A parameter: the device pointer of argument ``arg`` (0 for None), plus ``offset``
    bytes."""

    arg: int
    offset: int = 0


@dataclass(frozen=True)
class Scalar:
    """A double parameter: argument ``arg`` as a float."""

    arg: int


@dataclass(frozen=True)
class Map:
    """A tensor map parameter: ``blob`` (128 bytes encoded for ``address``), moved to the
    pointer of argument ``arg`` at each call."""

    arg: int
    blob: bytes
    address: int


def _load():
    """The C module, or None; ``_state["reason"]`` says why not, ``_state["where"]`` where it
    was found."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" in _state:
            return _state["module"]
        from ..settings import get_settings

        module = None
        try:
            settings = get_settings()
            if settings.launch == "python":
                _state["reason"] = "GE2JIT_LAUNCH=python"
            else:
                module = _import_or_build(settings)
        except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, said why
            _state["reason"] = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.info("ge2jit: the compiled launch path is unavailable (%s); prepared calls "
                     "launch from Python", _state["reason"])
        if module is not None:
            module.set_miss(MISS)
            _register_known(module)
        _state["module"] = module
        return module


def _register_known(module) -> None:
    """The array types every program of a framework reads: CuPy's ndarray, PyTorch's Tensor
    and Parameter (where imported); other types (subclasses) are registered by the first
    call that stores a program for them (``Table.put``)."""
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is not None:
        module.register_type(cupy.ndarray, _KINDS["cupy"])
    torch = sys.modules.get("torch")
    if torch is not None:
        for t in (torch.Tensor, torch.nn.Parameter):
            module.register_type(t, _KINDS["torch"])


def register(array_type: type, framework: str) -> None:
    """Read arrays of ``array_type`` as ``framework``'s ("cupy" or "torch"), once the C
    module is loaded (loading it registers the frameworks imported by then)."""
    module = _state.get("module")
    if module is not None:
        module.register_type(array_type, _KINDS[framework])


def _locate(settings, build: bool) -> Path | None:
    """The C module's file: the install's prebuilt one, else one a cache directory holds;
    else, with ``build``, one built now into the first cache directory (None without one:
    the disk cache disabled). Raises the build's RuntimeError or OSError."""
    prebuilt = importlib.util.find_spec("ge2jit.jit._fastlaunch")
    if prebuilt is not None:
        return Path(prebuilt.origin)
    dirs = [] if settings.disable_cache else [d / "launch" for d in settings.cache_dirs]
    name = f"_fastlaunch-{cbuild.source_hash()}{sysconfig.get_config_var('EXT_SUFFIX')}"
    found = next((d / name for d in dirs if (d / name).is_file()), None)
    if found is not None or not build or not dirs:
        return found
    log.info("ge2jit: building the compiled launch path into %s", dirs[0])
    cbuild.build(dirs[0] / name)
    return dirs[0] / name


def _import_or_build(settings):
    try:
        path = _locate(settings, build=True)
    except OSError:   # the cache directory cannot be written: this process's own copy
        path = None
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="ge2jit-launch-")) / "_fastlaunch.so"
        cbuild.build(path)
    loader = importlib.machinery.ExtensionFileLoader("ge2jit.jit._fastlaunch", str(path))
    spec = importlib.util.spec_from_file_location("ge2jit.jit._fastlaunch", path,
                                                  loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _state["where"] = path
    return module


def build_into_cache() -> Path | None:
    """Build the C module into the first cache directory unless a cache directory (or the
    install) has it: a warm-up leaves a cache from which a job starts without a compiler.
    The module's path, or None where it is not wanted (``GE2JIT_LAUNCH=python``, the disk
    cache disabled) or cannot be built (the reason is logged)."""
    from ..settings import get_settings

    settings = get_settings()
    if settings.launch == "python":
        return None
    try:
        return _locate(settings, build=True)
    except (RuntimeError, OSError) as e:
        log.info("ge2jit: the compiled launch path was not built into the cache (%s)", e)
        return None


def available() -> bool:
    """Whether the C module is in use (loads or builds it at the first question)."""
    return _load() is not None


def launch_path(build: bool = True) -> dict:
    """Which path prepared calls take: ``{"path": "compiled" or "python", "module": where the
    C module was loaded from, or None, "reason": why not compiled, or None}``. Loads (or
    builds) the C module if no call has yet; with ``build=False`` it writes nothing: a module
    not built yet is reported as ``compiled`` with no module and the reason "not built
    yet"."""
    if not build and "module" not in _state:
        from ..settings import get_settings

        settings = get_settings()
        if settings.launch == "python":
            return {"path": "python", "module": None, "reason": "GE2JIT_LAUNCH=python"}
        path = _locate(settings, build=False)
        if path is None:
            return {"path": "compiled", "module": None,
                    "reason": "not built yet: the first call builds it with the machine's C "
                              "compiler"}
        return {"path": "compiled", "module": str(path), "reason": None}
    module = _load()
    return {"path": "python" if module is None else "compiled",
            "module": None if module is None else str(_state.get("where")),
            "reason": _state.get("reason")}


def _miss(*args):
    return MISS


class Table:
    """One op's programs by signature. ``call(*args)``: the result, or ``MISS``. ``roles``:
    one letter an argument: ``A`` an array or None, ``V`` a value (its type and value: ``1``
    finds no program stored for ``True``), ``T`` a number (its type), ``Z`` a number (its type
    and whether it is 0)."""

    __slots__ = ("name", "roles", "call", "_table", "__weakref__")

    def __init__(self, name: str, roles: str):
        self.name, self.roles = name, roles
        self._table = None
        self.call = self._first
        _tables.add(self)

    def _resolve(self):
        if self._table is None:
            module = _load()
            if module is None:
                self.call = _miss
                return None
            self._table = module.Table(self.name, self.roles)
            self.call = self._table
        return self._table

    def _first(self, *args):
        return MISS if self._resolve() is None else self._table(*args)

    def put(self, args: tuple, program, framework: str) -> bool:
        """Store ``program`` (None: nothing) for calls with ``args``' signature; the arrays'
        types are read as ``framework``'s from now on. False where nothing was stored."""
        table = self._resolve()
        if table is None or program is None:
            return False
        module = _state["module"]
        for role, x in zip(self.roles, args):
            if role == "A" and x is not None:
                module.register_type(type(x), _KINDS[framework])
        key = table.key(*args)
        if key is None:
            return False
        table.put(key, program)
        return True

    def key(self, *args):
        table = self._resolve()
        return None if table is None else table.key(*args)

    def pack(self, *args):
        """The parameter bytes of each launch a call on ``args`` would make (launches
        nothing): ``MISS`` without a program, None without a signature."""
        table = self._resolve()
        return MISS if table is None else table.pack(*args)

    def clear(self) -> None:
        if self._table is not None:
            self._table.clear()

    def stats(self) -> dict:
        if self._table is None:
            return {"programs": 0, "hits": 0, "misses": 0}
        return self._table.stats()

    def __len__(self) -> int:
        return 0 if self._table is None else len(self._table)


def clear_all() -> None:
    """Forget every table's programs (the plans they launch changed)."""
    for table in list(_tables):
        table.clear()


def step(launcher, grid, block, smem: int, values: dict) -> tuple:
    """One launch of ``launcher``'s kernel (a ``ge2jit.jit.launch.Launcher``): ``values``
    gives every parameter by name, as a number (a constant), ``Ptr``, ``Scalar``, ``Map``
    or the 128 bytes of a tensor map that no argument moves."""
    names = {p.name for p in launcher.params}
    missing = [p.name for p in launcher.params if p.name not in values]
    unknown = [n for n in values if n not in names]
    if missing or unknown:
        raise TypeError(f"{launcher.name}: parameters missing {missing}, unknown {unknown}")
    ops = []
    for param, offset in zip(launcher.params, launcher.offsets):
        v = values[param.name]
        kind = param.kind
        if isinstance(v, Ptr) and kind is Kind.POINTER:
            ops.append((offset, 1, v.arg, v.offset))
        elif isinstance(v, Scalar) and kind is Kind.DOUBLE:
            ops.append((offset, 2, v.arg, 0))
        elif isinstance(v, Map) and kind is Kind.TENSOR_MAP:
            ops.append((offset, 3, v.arg, (v.blob, v.address)))
        elif isinstance(v, bytes) and kind is Kind.TENSOR_MAP and len(v) == 128:
            ops.append((offset, 3, _NO_ARG, (v, 0)))
        elif isinstance(v, float) and kind is Kind.DOUBLE:
            ops.append((offset, 0, 0, v))
        elif isinstance(v, int) and kind is Kind.DOUBLE:
            ops.append((offset, 0, 0, float(v)))
        elif isinstance(v, int) and kind in (Kind.INT64, Kind.POINTER):
            ops.append((offset, 0, 0, v))
        else:
            raise TypeError(f"{launcher.name}: parameter {param.name} ({kind.name}) cannot "
                            f"take {v!r}")
    return (launcher.fptr, tuple(grid), tuple(block), smem, launcher.size, launcher.offsets,
            tuple(ops))


def launch_failed(name: str):
    """``failed(status)`` of a program launching kernel ``name``: True (launch once more)
    after making the thread's context current, the first time a thread without one launched
    (PyTorch's autograd threads); else raises the KernelLaunchError."""

    def failed(status: int) -> bool:
        if status == _INVALID_CONTEXT:
            import cupy

            runtime = cupy.cuda.runtime
            runtime.setDevice(runtime.getDevice())
            return True
        raise KernelLaunchError(f"launch of {name} failed: CUresult {status}")

    return failed


def program(framework: str, steps, allocs=(), pairs=(), overlap=None, stream=None,
            failed=None, returns=(0,), slots: int = 0):
    """A ``Program`` of the C module, or None without one. ``steps``: ``step``'s tuples;
    ``allocs``: ``(arg, alloc, shape)``: ``alloc(shape)`` makes argument ``arg`` when it is
    None; ``pairs``: ``(out, olo, ohi, in, ilo, ihi, same_ok)`` byte ranges relative to the
    pointers of arguments ``out`` and ``in`` that must not meet (unless the same pointer
    with ``same_ok``); ``overlap(ptrs)`` raises the error of a pair that met; ``stream()``:
    the stream pointer to launch on; ``failed(status)``: see ``launch_failed``; ``returns``:
    the arguments returned (several: a tuple; an index past the call's arguments and slots
    returns None); ``slots``: the call's arguments and the slots after them, None at each
    call until ``allocs`` make them: a program of several launches keeps its intermediates
    and outputs there (0: the arguments alone)."""
    module = _load()
    if module is None:
        return None
    return module.Program(_KINDS[framework], list(steps), list(allocs), list(pairs),
                          overlap or _no_overlap, stream, failed or launch_failed("kernel"),
                          tuple(returns), slots)


def _no_overlap(ptrs) -> None:
    raise RuntimeError("an output overlaps an input")
