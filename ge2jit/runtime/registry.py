"""The op registry: each op describes itself once (``Op``) and every tool (warm-up, explain,
tune, inspect, benchmark_configs, ``ge2jit cache list``) finds it here, by its name, its
public function or its ``Op``. (No op is named here: ``ge2jit/ops/__init__.py`` imports each op
package, which calls ``register`` for its ops.)"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import ArgumentTypeError, ArgumentValueError


class WarmupTable(Protocol):
    """What the warm-up does with one TOML array of tables (``[[name]]``) of an op."""

    def validate_entry(self, entry: dict) -> dict:
        """One table checked (ArgumentValueError naming the key), with its defaults."""

    def expand(self, entry: dict, arch: str, *, sms: int | None, tuned: list = ()) -> list:
        """The kernel specs a validated table compiles for ``arch``."""

    def tuned_entries(self, records, arch: str) -> list:
        """What of the tuning database's records ``expand`` takes as ``tuned``."""


@dataclass(frozen=True)
class ConfigChoice:
    """A configuration by name and why it was chosen: "heuristic", "tuned", "pinned",
    "fallback", or "fixed" (an op without configs). An op may put its own object with the same
    ``name``, ``reason``, ``detail`` and ``str()`` in an ``Explanation`` instead."""

    name: str
    reason: str = "heuristic"
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.name} ({self.reason}{': ' + self.detail if self.detail else ''})"


@dataclass(frozen=True)
class Explanation:
    """What one call runs, without launching it: an op's ``plan`` makes it and
    ``ge2jit.explain`` returns it. ``kernels`` are the loaded kernels (``jit.loader``), each
    once; ``grid``, ``block`` and ``shared_bytes`` are the main (first) kernel's launch;
    ``flops``, where the op counts them, the call's floating-point operations (for rates)."""

    choice: object
    kernels: tuple = ()
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_bytes: int = 0
    flops: float | None = None

    @property
    def config(self) -> str:
        return self.choice.name

    @property
    def reason(self) -> str:
        return self.choice.reason

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(k.spec.kernel_name for k in self.kernels)

    @property
    def specs(self) -> tuple:
        return tuple(k.spec for k in self.kernels)

    @property
    def registers(self) -> tuple[int, ...]:
        return tuple(k.entry.registers for k in self.kernels)

    @property
    def spill_bytes(self) -> tuple[int, ...]:
        return tuple(k.entry.spill_bytes for k in self.kernels)

    def __str__(self) -> str:
        lines = [f"config {self.choice}"]
        for name, regs, spill in zip(self.kernel_names, self.registers, self.spill_bytes):
            lines.append(f"  kernel {name}: {regs} registers, {spill} spill bytes")
        lines.append(f"  grid {self.grid}, block {self.block}, {self.shared_bytes} B shared")
        return "\n".join(lines)


@dataclass(frozen=True)
class Op:
    """One op as the tools see it. Only ``name`` and ``function`` are required; an op fills
    what applies to it (an op without configs leaves the config fields None).

    - ``name``: the public function's name; also its warm-up table's and the tuning
      database's ``"op"``.
    - ``function``: the public callable (taking ``config=`` where the op has configs).
    - ``warmup``: warm-up TOML table name -> ``WarmupTable``.
    - ``plan(*args, **kwargs) -> Explanation``: what a call with these arguments runs
      (compiles, launches nothing); ``explain`` and ``inspect`` of a call use it.
    - ``candidates(*args, **kwargs) -> [config name]``: what ``tune`` and
      ``benchmark_configs`` try for these arguments.
    - ``tuning_key(*args, **kwargs) -> dict``: what keys the tuning database for these
      arguments (``tools.tuned_config`` adds the op, device, arch and ge2jit version).
    - ``call_specs(config, *args, **kwargs) -> [KernelSpec]``: the kernels a call with
      ``config=`` compiles, without compiling; ``tune`` compiles the candidates' in parallel.
    - ``specs_for_config(config, arch, **kwargs) -> [KernelSpec]``: the kernels a config
      (None for an op without configs) compiles for ``arch``, for the op's keywords (dtype,
      act, ...), main kernel first: ``inspect("<config>", arch=...)``.
    - ``config_types``: objects besides names that ``specs_for_config`` takes as a config.
    - ``kernel_prefixes``: how the op's kernel names start (the longest match labels a cache
      entry in ``ge2jit cache list``).
    - ``tune(*args, reps, processes, **kwargs)``: the op's own tuner, in place of the generic
      one (which times ``function(*args, config=name, **kwargs)``).
    - ``clear_plans()``: forget the op's cached choices (``tune`` calls it after storing).
    - ``layout_cases(n) -> [runtime.cases.Case]``: calls of the op whose varying extent
      (a row's length, a matrix's width or depth) is ``n``, each with its float64
      reference; the shared layout test runs them on every layout the op accepts.
    """

    name: str
    function: Callable
    warmup: Mapping[str, WarmupTable] = field(default_factory=dict)
    plan: Callable[..., Explanation] | None = None
    candidates: Callable[..., Sequence[str]] | None = None
    tuning_key: Callable[..., dict] | None = None
    call_specs: Callable[..., Sequence] | None = None
    specs_for_config: Callable[..., Sequence] | None = None
    config_types: tuple[type, ...] = ()
    kernel_prefixes: tuple[str, ...] = ()
    tune: Callable | None = None
    clear_plans: Callable[[], None] | None = None
    layout_cases: Callable[[int], Sequence] | None = None

    def __repr__(self) -> str:
        return f"Op({self.name!r})"


_ops: dict[str, Op] = {}
_default: list[Op] = []


def register(op: Op, *, default: bool = False) -> Op:
    """Add ``op`` to the registry (``default``: the op the tools use when given arrays first,
    one at most). Its name and warm-up table names must be new."""
    if not isinstance(op, Op):
        raise ArgumentTypeError(f"op: expected an Op, got {type(op).__name__}")
    if _ops.get(op.name) is op:
        return op
    if op.name in _ops:
        raise ArgumentValueError(f"op: {op.name!r} is registered already")
    tables = warmup_tables()
    taken = [t for t in op.warmup if t in tables or t == "archs"]
    if taken:
        raise ArgumentValueError(f"op: the warm-up table {taken[0]!r} of {op.name!r} is "
                                 "taken already")
    if default and _default:
        raise ArgumentValueError(f"op: {op.name!r} as the default op: {_default[0].name!r} is "
                                 "already")
    _ops[op.name] = op
    if default:
        _default.append(op)
    return op


def ops() -> tuple[Op, ...]:
    """Every registered op, in the order of registration."""
    return tuple(_ops.values())


def find(obj) -> Op | None:
    """The registered op ``obj`` is (an ``Op``, its name or its function), or None."""
    if isinstance(obj, str):
        return _ops.get(obj)
    for op in _ops.values():
        if obj is op or obj is op.function:
            return op
    return None


def get(obj) -> Op:
    """The registered op ``obj`` names: an ``Op``, its name or its public function."""
    op = find(obj)
    if op is None:
        what = obj if isinstance(obj, str) else getattr(obj, "__name__", obj)
        raise ArgumentValueError(f"op: expected a registered op, one of {', '.join(_ops)} (by "
                                 f"name, function or Op), got {what!r}")
    return op


def default_op() -> Op:
    """The op registered with ``default=True``."""
    if not _default:
        raise ArgumentValueError("op: no default op is registered; name the op first")
    return _default[0]


def warmup_tables() -> dict[str, WarmupTable]:
    """Every registered warm-up table: its TOML name -> the table."""
    return {name: table for op in _ops.values() for name, table in op.warmup.items()}


def label(kernel_name: str) -> str | None:
    """The name of the op whose kernel prefix ``kernel_name`` starts with (the longest), or
    None."""
    best, length = None, 0
    for op in _ops.values():
        for prefix in op.kernel_prefixes:
            if len(prefix) > length and kernel_name.startswith(prefix):
                best, length = op.name, len(prefix)
    return best


def bind(function: Callable, args: tuple, kwargs: dict) -> dict:
    """``function``'s arguments by name for a call with ``args`` and ``kwargs``, defaults
    included (an op's ``plan`` and ``tuning_key`` read them so)."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except TypeError as e:
        raise ArgumentTypeError(f"{function.__name__}: {e}") from None
    bound.apply_defaults()
    return dict(bound.arguments)
