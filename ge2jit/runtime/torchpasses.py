"""Graph passes for ``ge2jit.torch``'s compiler backend (``ge2jit/torch/compiler.py``): the
pattern registry and the rewrite of a captured FX graph. Shared by the ops' PyTorch
integrations (each op's ``torch_patterns.py`` registers its patterns here), imported only by
them and the backend; it knows no op.

A pattern is a ``Pattern``: ``match(node)`` looks at one node of the graph (its target, its
arguments and, through ``node.meta["example_value"]``, the fake tensors TorchDynamo recorded)
and returns ``None`` (not its kind of node), a ``Skip`` (its kind, but not replaceable: the
reason is reported) or a ``Fusion`` that ``rewrite`` applies.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx

#: what a replacement takes over of a replaced node's metadata
_META = ("example_value", "val", "stack_trace", "nn_module_stack")

__all__ = ["Pattern", "Fusion", "Skip", "Report", "register_pattern", "patterns", "rewrite",
           "tensor_of", "argument", "is_call", "binary_args", "ADD", "MUL"]

#: the targets a graph records for a sum and for a product of two values
ADD = frozenset({operator.add, torch.add})
MUL = frozenset({operator.mul, torch.mul})


@dataclass(frozen=True)
class Skip:
    """A node a pattern recognized but left alone, and why (one line)."""

    pattern: str
    node: str
    reason: str


@dataclass
class Fusion:
    """What a pattern found: the nodes it replaces and ``build(graph) -> fx.Node``, which
    inserts the replacement (before the last of ``nodes``, or right after ``after``).
    ``outputs``: [(old node, index)]: the old node's users get the new node's value (index
    None) or its element ``index``; by default the last node's users get the new value. The
    replaced nodes left without users are erased."""

    pattern: str
    nodes: list
    op: str
    build: Callable[[fx.Graph], fx.Node]
    outputs: list | None = None
    after: fx.Node | None = None


@dataclass(frozen=True)
class Pattern:
    """A rewrite: ``name``, the ge2jit op it calls (``op``, for reports) and ``match(node) ->
    None | Skip | Fusion``. Patterns run in ``priority`` order (lower first).
    ``left_to_inductor``: where Inductor makes as good a kernel of what the pattern matches,
    why (one line); the pattern then applies only where Inductor does not compile the graph
    or where ``only`` names it."""

    name: str
    op: str
    match: Callable[[fx.Node], object]
    priority: int = 100
    left_to_inductor: str | None = None


@dataclass
class Report:
    """One graph's rewrite: ``fused`` (pattern, the replaced nodes' names, op), ``skipped``
    (``Skip`` records), in the graph's order; ``modules``: what was replaced on the model's
    modules before tracing (an object whose ``str`` lists it, ``explain``'s), or None."""

    fused: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    modules: object = None

    def __str__(self) -> str:
        lines = [f"fused {len(self.fused)}, left {len(self.skipped)}"]
        lines += [f"  {p}: {', '.join(nodes)} -> ge2jit.{op}" for p, nodes, op in self.fused]
        lines += [f"  left {s.node} ({s.pattern}): {s.reason}" for s in self.skipped]
        if self.modules is not None:
            lines += ["modules, before tracing: " + str(self.modules)]
        return "\n".join(lines)


_patterns: dict[str, Pattern] = {}


def register_pattern(pattern: Pattern) -> Pattern:
    """Add ``pattern`` to the backend's passes (an op's torch module calls this once)."""
    if pattern.name in _patterns:
        raise ValueError(f"pattern {pattern.name!r} is already registered")
    _patterns[pattern.name] = pattern
    return pattern


def patterns() -> list[Pattern]:
    """The registered patterns in the order they run."""
    return sorted(_patterns.values(), key=lambda p: p.priority)


def tensor_of(node) -> torch.Tensor | None:
    """The (fake) tensor a graph node produces, as TorchDynamo recorded it (or a shape
    propagation stored it), else None."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    return value if isinstance(value, torch.Tensor) else None


def is_call(node, functions=(), methods=()) -> bool:
    """Whether ``node`` is a graph node calling one of ``functions`` or of ``methods`` (by
    name); False for constants and None."""
    return (isinstance(node, fx.Node)
            and ((node.op == "call_function" and node.target in functions)
                 or (node.op == "call_method" and node.target in methods)))


def binary_args(node, functions) -> tuple | None:
    """The two positional arguments of a call of one of ``functions`` without keywords (``a
    + b``, ``a * b`` with ``ADD``, ``MUL``), else None."""
    if is_call(node, functions) and len(node.args) == 2 and not node.kwargs:
        return node.args
    return None


def argument(node: fx.Node, index: int, name: str, default=None):
    """A call node's argument by position or keyword, else ``default``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def rewrite(gm: fx.GraphModule, only: list[str] | None = None, *,
            inductor: bool = False) -> Report:
    """Apply the registered patterns (or those named in ``only``) to ``gm`` in place, each
    node at most once; returns what was fused and what was left. With ``inductor`` (Inductor
    compiles the graph next) and no ``only``, the patterns ``left_to_inductor`` only report
    what they match."""
    report = Report()
    chosen = [p for p in patterns() if only is None or p.name in only]
    graph = gm.graph
    gone: set = set()
    for pattern in chosen:
        for node in list(graph.nodes):
            if node in gone:   # erased by an earlier fusion
                continue
            found = pattern.match(node)
            if found is None:
                continue
            if isinstance(found, Skip):
                report.skipped.append(found)
                continue
            if inductor and only is None and pattern.left_to_inductor:
                report.skipped.append(Skip(pattern.name, node.name, pattern.left_to_inductor))
                continue
            outputs = found.outputs or [(found.nodes[-1], None)]
            anchor = found.after.next if found.after is not None else found.nodes[-1]
            with graph.inserting_before(anchor):
                new = found.build(graph)
            order = {n: i for i, n in enumerate(graph.nodes)}
            for arg in new.all_input_nodes:   # a parameter read later in the graph (FX's
                if arg.op == "get_attr" and order[arg] > order[new]:   # get_attr): moved up
                    new.prepend(arg)
            with graph.inserting_after(new):
                values = [new if i is None else graph.call_function(operator.getitem, (new, i))
                          for _, i in reversed(outputs)][::-1]
            for (old, _), value in zip(outputs, values):
                value.meta.update({k: v for k, v in old.meta.items() if k in _META})
                old.replace_all_uses_with(value)
            for old in reversed(found.nodes):
                if not old.users:
                    graph.erase_node(old)
                    gone.add(old)
            report.fused.append((found.pattern, [n.name for n in found.nodes], found.op))
    graph.lint()
    gm.recompile()
    return report
