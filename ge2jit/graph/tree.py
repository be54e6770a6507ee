"""A step's arguments as leaves: arrays (each copied into the graph's input buffers or captured
by reference) and other values (fixed in the graph), inside lists, tuples, named tuples and
dicts; and the signature a captured graph is kept under.

Nothing here touches a GPU: what is an array, and what identifies one, come from the caller
(``ArrayKind``), so the logic runs on stand-in objects in the CPU tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ArgumentTypeError, ArgumentValueError


@dataclass(frozen=True)
class ArrayKind:
    """How the arrays of one framework are recognized and described.

    ``kind(x)``: the framework's name ("cupy", "torch") for one of its arrays, None for
    anything else; ``meta(x)``: (shape, dtype, device) as hashable values, what an input must
    keep from call to call; ``ptr(x)``: the address a graph captures; ``layout(x)``: strides
    (with the address, what a by-reference array must keep)."""

    kind: Callable[[Any], str | None]
    meta: Callable[[Any], tuple]
    ptr: Callable[[Any], int]
    layout: Callable[[Any], tuple]


@dataclass(frozen=True)
class Leaf:
    """One argument leaf: where it is (``path``, e.g. ``batch['x']``), the top-level argument
    it belongs to (``root``: a name or a position), and whether it is an array."""

    path: str
    root: str | int
    value: Any
    framework: str | None


def _flatten(obj, path: str, root, kind, leaves: list) -> tuple:
    """Appends ``obj``'s leaves; returns its structure (hashable)."""
    t = type(obj)
    if t is list or t is tuple:
        return (t.__name__, tuple(_flatten(x, f"{path}[{i}]", root, kind, leaves)
                                  for i, x in enumerate(obj)))
    if isinstance(obj, tuple) and hasattr(t, "_fields"):   # a named tuple (Gradients, ...)
        return (t, tuple(_flatten(x, f"{path}.{f}", root, kind, leaves)
                         for f, x in zip(t._fields, obj)))
    if t is dict:
        keys = tuple(obj)
        return ("dict", keys, tuple(_flatten(obj[k], f"{path}[{k!r}]", root, kind, leaves)
                                    for k in keys))
    fw = kind(obj)
    leaves.append(Leaf(path, root, obj, fw))
    return ("leaf",)


def _unflatten(structure, values) -> Any:
    tag = structure[0]
    if tag == "leaf":
        return next(values)
    if tag == "list":
        return [_unflatten(s, values) for s in structure[1]]
    if tag == "tuple":
        return tuple(_unflatten(s, values) for s in structure[1])
    if tag == "dict":
        return {k: _unflatten(s, values) for k, s in zip(structure[1], structure[2])}
    return tag(*(_unflatten(s, values) for s in structure[1]))   # a named tuple type


@dataclass(frozen=True)
class Arguments:
    """A call's arguments, flattened: ``structure`` (hashable: containers, keywords) and
    ``leaves`` in order."""

    structure: tuple
    leaves: tuple[Leaf, ...]
    nargs: int = 0

    def rebuild(self, values) -> tuple[tuple, dict]:
        """(args, kwargs) of the same structure with ``values`` for the leaves."""
        args, kwargs = _unflatten(self.structure, iter(values))
        return args, kwargs


def argument_names(fn, nargs: int) -> list[str | int]:
    """The names of ``fn``'s first ``nargs`` positional parameters, as far as its signature
    tells (a position where it does not: ``*args`` or no signature)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return list(range(nargs))
    names: list[str | int] = []
    for p in params:
        if len(names) == nargs or p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names.append(p.name)
    return names + list(range(len(names), nargs))


def flatten(fn, args: tuple, kwargs: dict, kind, names=None) -> Arguments:
    """The leaves of a call ``fn(*args, **kwargs)``; ``kind(x)`` names the framework of an
    array leaf (None: not an array); ``names``: ``argument_names(fn, len(args))`` if known."""
    leaves: list[Leaf] = []
    if names is None or len(names) != len(args):
        names = argument_names(fn, len(args))
    parts = []
    for name, x in zip(names, args):
        path = name if isinstance(name, str) else f"args[{name}]"
        parts.append(_flatten(x, path, name, kind, leaves))
    kw = []
    for key in kwargs:
        kw.append(_flatten(kwargs[key], key, key, kind, leaves))
    structure = ("tuple", (("tuple", tuple(parts)), ("dict", tuple(kwargs), tuple(kw))))
    return Arguments(structure, tuple(leaves), len(args))


def inputs_spec(inputs) -> tuple | None:
    """``inputs`` as a tuple of argument names (str) and positions (int), or None (every
    array argument is an input)."""
    if inputs is None:
        return None
    if isinstance(inputs, (str, int)) and not isinstance(inputs, bool):
        inputs = (inputs,)
    try:
        chosen = tuple(inputs)
    except TypeError:
        raise ArgumentTypeError(f"inputs: expected None or a list of argument names or "
                                f"positions, got {inputs!r}") from None
    for item in chosen:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ArgumentTypeError(f"inputs: expected argument names (str) or positions "
                                    f"(int), got {item!r}")
    return chosen


def check_inputs(inputs, args: Arguments, names: list) -> frozenset | None:
    """The roots (names or positions) ``inputs`` lists, checked against the call: None
    (every array argument is an input) or a collection of parameter names and positions."""
    chosen = inputs_spec(inputs)
    if chosen is None:
        return None
    roots = {leaf.root for leaf in args.leaves}
    known = set(names) | roots
    out = set()
    for item in chosen:
        if isinstance(item, int) and 0 <= item < len(names):
            item = names[item]   # a position of a named parameter: its name
        if item not in known:
            listed = ", ".join(repr(n) for n in names) or "none"
            raise ArgumentValueError(f"inputs: {item!r} is not an argument of this call "
                                     f"(its arguments: {listed})")
        out.add(item)
    return frozenset(out)


def value_key(x) -> tuple:
    """A non-array leaf in a signature: its type and value, or its identity where it is not
    hashable (the graph holds what the step read from it at capture)."""
    try:
        hash(x)
    except TypeError:
        return (type(x), "id", id(x))
    return (type(x), x)


def signature(args: Arguments, inputs: frozenset | None, kinds: dict, device) -> tuple:
    """The key of one captured graph: the structure; per array leaf its framework, shape,
    dtype and device, plus, for an array captured by reference, its address and strides; per
    other leaf its value (``value_key``); and the current device. ``kinds``: framework name
    -> ``ArrayKind``."""
    key = [args.structure, device]
    for leaf in args.leaves:
        if leaf.framework is None:
            key.append(value_key(leaf.value))
            continue
        k = kinds[leaf.framework]
        item = (leaf.framework, k.meta(leaf.value))
        if inputs is not None and leaf.root not in inputs:
            item += (k.ptr(leaf.value), k.layout(leaf.value))
        key.append(item)
    return tuple(key)


def is_input(leaf: Leaf, inputs: frozenset | None) -> bool:
    """Whether an array leaf is copied into the graph's input buffers (else captured by
    reference)."""
    return inputs is None or leaf.root in inputs
