"""Warm-up tables (TOML ``[[op]]`` entries): the checks every op's table shares (each raises
one line naming the key, what was expected and what came), and ``Table``, a table declared by
its keys and the function that gives the kernels of one combination of their values."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from ..errors import ArgumentValueError

#: The largest multiprocessor count a table or the command takes (a 32-bit integer).
MAX_SMS = 2**31 - 1


def check_list(entry: dict, key: str, allowed, keys: dict) -> list:
    """``entry[key]`` (or its default in ``keys``, which maps each key to (description of the
    accepted values, default)): a non-empty list of ``allowed`` values
    (booleans only where booleans are allowed)."""
    value = entry.get(key, keys[key][1])
    allowed = list(allowed)
    if not isinstance(value, list) or not value or any(
            isinstance(v, bool) != isinstance(allowed[0], bool) or v not in allowed
            for v in value):
        raise ArgumentValueError(f"{key}: expected {keys[key][0]}, got {value!r}")
    return value


def check_keys(entry: dict, keys: dict) -> None:
    """Every key of ``entry`` must be one of ``keys``."""
    for key in entry:
        if key not in keys:
            raise ArgumentValueError(f"{key}: unknown key; accepted keys: {', '.join(keys)}")


def check_sizes(entry: dict, key: str, keys: dict, largest: int = 2**62) -> list:
    """``entry[key]``: a non-empty list of integers in [1, ``largest``] (row lengths, class
    counts)."""
    sizes = entry.get(key)
    if not isinstance(sizes, list) or not sizes or any(
            isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= largest
            for n in sizes):
        raise ArgumentValueError(f"{key}: expected {keys[key][0]}, got {sizes!r}")
    return sizes


def check_configs(entry: dict, keys: dict, parse) -> str | list[str]:
    """``entry["configs"]`` (default ``keys``'): "heuristic", "all", or a non-empty list of
    config names, each checked by ``parse`` (an op's ``parse_config``) and returned by name."""
    configs = entry.get("configs", keys["configs"][1])
    if isinstance(configs, list) and configs:
        return [parse(c).name for c in configs]
    if configs not in ("heuristic", "all"):
        raise ArgumentValueError(f"configs: expected {keys['configs'][0]}, got {configs!r}")
    return configs


# --- a warm-up table declared by its keys ----------------------------------------------------

#: a key's default that says the key must be given
REQUIRED = None


@dataclass(frozen=True)
class Key:
    """One key of a warm-up table: what it accepts (said in its error), its default
    (``REQUIRED``: none) and either the values a list of it may hold (a sequence, or a
    mapping whose keys are taken) or ``sizes`` (a list of integers in [1, ``sizes``])."""

    doc: str
    default: object = REQUIRED
    values: object = None
    sizes: int = 0


class Table:
    """A warm-up table (the ``registry.WarmupTable`` interface) declared by its keys and one
    function: ``kernels(values, config, *, arch, sms) -> [spec]``, the kernels of one
    combination of the list keys' values (``values``: their names as attributes, one value
    each) and one config (None: the op's heuristic). With ``configs`` (the op's
    ``parse_config`` and ``all_configs``) the table also takes a ``configs`` key:
    "heuristic" (the default), "all", or a list of names, each checked by ``parse``.
    ``min_arch``: architectures below it compile nothing (an entry is still checked)."""

    def __init__(self, keys: dict[str, Key], kernels: Callable, *,
                 configs: tuple[Callable, Callable] | None = None, config_example: str = "",
                 min_arch: int = 0):
        self.keys = dict(keys)
        self.kernels = kernels
        self.configs = configs
        self.min_arch = min_arch
        self._described = {name: (k.doc, k.default) for name, k in self.keys.items()}
        if configs is not None:
            self._described["configs"] = (
                "'heuristic', 'all' or a list of config names"
                + (f" such as {config_example!r}" if config_example else ""), "heuristic")

    def validate_entry(self, entry: dict) -> dict:
        """The table checked, with its defaults; ArgumentValueError naming the key."""
        check_keys(entry, self._described)
        out = {}
        for name, k in self.keys.items():
            if k.sizes:
                if name not in entry and k.default is not REQUIRED:
                    entry = {**entry, name: k.default}
                out[name] = check_sizes(entry, name, self._described, k.sizes)
            else:
                out[name] = check_list(entry, name, k.values, self._described)
        if self.configs is not None:
            parse = self.configs[0]
            out["configs"] = check_configs(entry, self._described, parse)
        return out

    def expand(self, entry: dict, arch: str, *, sms=None, tuned=()) -> list:
        """The kernels of a checked table for ``arch``, each once."""
        from ..jit.nvrtc import arch_number

        if arch_number(arch) < self.min_arch:
            return []
        if self.configs is None or entry["configs"] == "heuristic":
            chosen = [None]
        elif entry["configs"] == "all":
            chosen = list(self.configs[1]())
        else:
            chosen = [self.configs[0](c) for c in entry["configs"]]
        names = list(self.keys)
        specs = []
        for combo in itertools.product(*(entry[n] for n in names)):
            values = SimpleNamespace(**dict(zip(names, combo)))
            for config in chosen:
                specs += self.kernels(values, config, arch=arch, sms=sms or 132)
        return list(dict.fromkeys(specs))

    def tuned_entries(self, records, arch: str) -> list:
        """Nothing from the tuning database (an op whose warm-up takes its records has a
        table class of its own)."""
        return []
