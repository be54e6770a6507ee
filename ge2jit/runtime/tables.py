"""Checks of one warm-up table (a TOML ``[[op]]`` entry), shared by every op's warm-up module:
each raises one line naming the key, what was expected and what came."""

from __future__ import annotations

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
