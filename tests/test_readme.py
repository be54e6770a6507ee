"""The README's first example: every name it uses is defined in it (a reader can paste it)."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _undefined(code: str) -> list[str]:
    """The names ``code`` reads before any statement of it binds them (builtins aside)."""
    bound, missing = set(dir(builtins)), []
    for stmt in ast.parse(code).body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and (
                    node.id not in bound):
                missing.append(node.id)
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
    return missing


def test_the_first_example_defines_every_name_it_uses():
    first = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "gemm_bias_act" in first
    assert _undefined(first) == []


def test_undefined_names_are_found():
    assert _undefined("import cupy as cp\nx = cp.ones(3)\ny = f(x, w2.T, c=res)\n") == [
        "f", "w2", "res"]
