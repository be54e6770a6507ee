"""An op declared once (``declare``): it says how to check a call and how to choose its kernels,
and everything the tools ask of an ``Op`` (``plan``, ``candidates``, ``tuning_key``,
``call_specs``, ``specs_for_config``) is derived here from those two answers.

An op gives:

- ``arrays``: the names of its array arguments (inputs and outputs given with ``out=``);
- optionally ``parts``: an argument that holds several arrays (``out=(q_out, k_out)``) by
  name, with the function that checks it and returns its arrays, and their names: ``{"out":
  (outputs, ("q_out", "k_out"))}``; each is then an array argument of its own name;
- ``check(args) -> call``: the call's arguments checked as the call checks them, as one
  frozen object of the op's own (a ``NamedTuple`` or a frozen dataclass) with named fields.
  ``args`` is a ``Arguments`` mapping: the function's arguments by name, defaults filled in,
  each array replaced by a CuPy view of it (None stays None), with the ``device`` they are on;
- ``choose(call, device_id) -> Planned``: what that call runs (the kernels' specs, the launch
  shape, the config and why) without compiling or launching;
- optionally ``key(call) -> dict`` (the tuning database's key), ``configs`` (a ``Configs``:
  how the op's configs are parsed, enumerated and turned into kernels without a call), the
  warm-up tables, the layout cases and the kernel prefixes (``registry.Op``'s fields).

The op's public function keeps its own fast path (``runtime.prepared``): the derived functions
serve the tools (``explain``, ``tune``, ``inspect``, ``benchmark_configs``), which pay
``inspect.signature`` binding once a call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ArgumentValueError
from .registry import ConfigChoice, Explanation, Op, bind


@dataclass(frozen=True)
class Planned:
    """What one checked call runs, as an op's ``choose`` says: the kernels' specs (the main
    kernel first), the main kernel's launch shape and dynamic shared memory, the config by
    name and why it was taken ("pinned", "tuned", "heuristic", "fixed", ...), a detail for
    ``explain`` (the main kernel's name, say) and the call's floating-point operations where
    the op counts them."""

    specs: tuple
    config: str
    reason: str = "heuristic"
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_bytes: int = 0
    flops: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Configs:
    """An op's configs and kernels without a call.

    - ``specs(config, arch, **kwargs) -> [spec]``: the kernels a config compiles for
      ``arch`` and the op's keywords (``inspect("<config>", arch=...)``); ``config`` None:
      the op's default kernels, or refused.
    - ``parse(name_or_config) -> config``: one ArgumentValueError line for a bad one; None
      for an op whose kernels are not named by configs.
    - ``candidates(call) -> [config]``: what ``tune`` and ``benchmark_configs`` time.
    - ``types``: config objects taken besides names.
    """

    specs: Callable[..., Sequence]
    parse: Callable | None = None
    candidates: Callable | None = None
    types: tuple[type, ...] = ()


class Arguments(dict):
    """A call's arguments by name (defaults filled in), each array a CuPy view (None where
    absent); ``device``, the id of the device they are on, and ``fw``, their framework
    (``fw.view(x, name)`` views an argument that is an array only in some calls)."""

    device: int = 0
    fw = None


def declare(name: str, function: Callable, *, arrays: Sequence[str],
            check: Callable[[Arguments], object],
            choose: Callable[[object, int], Planned],
            key: Callable[[object], dict] | None = None,
            configs: Configs | None = None, warmup: Mapping | None = None,
            layout_cases: Callable | None = None, kernel_prefixes: Sequence[str] = (),
            parts: Mapping[str, tuple[Callable, Sequence[str]]] | None = None,
            **fields) -> Op:
    """The ``registry.Op`` of an op that states how to check a call and how to choose its
    kernels (see the module's docstring); ``fields`` are further ``Op`` fields (``tune``,
    ``clear_plans``) passed as they are."""
    parts = dict(parts or {})
    arrays = (*(a for a in arrays if a not in parts),
              *(n for _, names in parts.values() for n in names))

    def checked(args: tuple, kwargs: dict, config=None, pin: bool = False):
        """(the op's call object, the device id) of ``function(*args, **kwargs)``; with
        ``pin``, ``config`` replaces the call's own ``config=``."""
        from .arrays import call_arguments, views

        bound = Arguments(bind(function, args, kwargs))
        if pin:
            bound["config"] = config
        for argument, (split, names) in parts.items():
            bound.update(zip(names, split(bound[argument]), strict=True))
        fw, device_id, native = call_arguments({n: bound.get(n) for n in arrays})
        bound.update(views(fw, native))
        bound.device, bound.fw = device_id, fw
        with fw.context(device_id):
            return check(bound), device_id

    def plan(*args, **kwargs) -> Explanation:
        from ..jit.loader import get_kernel

        call, device_id = checked(args, kwargs)
        p = choose(call, device_id)
        return Explanation(ConfigChoice(p.config, p.reason, p.detail),
                           tuple(get_kernel(s, device_id) for s in p.specs), p.grid, p.block,
                           p.shared_bytes, flops=p.flops)

    def call_specs(config, *args, **kwargs) -> list:
        call, device_id = checked(args, kwargs, config, pin=True)
        return list(choose(call, device_id).specs)

    def candidates(*args, **kwargs) -> list[str]:
        call, _ = checked(args, kwargs)
        return [c.name for c in configs.candidates(call)]

    def tuning_key(*args, **kwargs) -> dict:
        return key(checked(args, kwargs)[0])

    def specs_for_config(config, arch: str, **kwargs) -> list:
        from ..jit.nvrtc import normalize_arch

        arch = normalize_arch(arch)
        if config is not None and configs.parse is None:
            raise ArgumentValueError(f"config: {name}'s kernels are not named by configs: "
                                     f"expected None, got {config!r}")
        return list(configs.specs(None if config is None else configs.parse(config), arch,
                                  **kwargs))

    if key is not None and (configs is None or configs.parse is None):
        raise ArgumentValueError(f"key: {name} has no configs to tune, so no tuning key")
    return Op(name=name, function=function, warmup=dict(warmup or {}), plan=plan,
              candidates=candidates if configs is not None and configs.candidates else None,
              tuning_key=tuning_key if key is not None else None,
              call_specs=call_specs,
              specs_for_config=specs_for_config if configs is not None else None,
              config_types=configs.types if configs is not None else (),
              kernel_prefixes=tuple(kernel_prefixes), layout_cases=layout_cases, **fields)
