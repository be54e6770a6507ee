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
