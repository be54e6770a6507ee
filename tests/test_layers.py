"""The layering rules, read from the sources: the shared machinery (``ge2jit/jit``,
``ge2jit/runtime``, ``ge2jit/tune``) imports no op, and no op imports another op's modules
(what two ops need lives in the shared layer)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ge2jit"
OPS = sorted(p.name for p in (PACKAGE / "ops").iterdir()
             if p.is_dir() and (p / "__init__.py").exists())


def _imports(path: Path) -> list[str]:
    """The absolute module names ``path`` imports (relative imports resolved)."""
    package = list(path.relative_to(PACKAGE.parent).parts[:-1])   # of a module or __init__
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [module] if node.module else [f"{module}.{a.name}" for a in node.names]
    return names


def _sources(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


@pytest.mark.parametrize("layer", ["jit", "runtime", "tune"])
def test_shared_layers_import_no_op(layer):
    for path in _sources(PACKAGE / layer):
        bad = [m for m in _imports(path) if m.startswith("ge2jit.ops")]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize("op", OPS)
def test_no_op_imports_another_op(op):
    others = [o for o in OPS if o != op]
    for path in _sources(PACKAGE / "ops" / op):
        bad = [m for m in _imports(path)
               if any(m == f"ge2jit.ops.{o}" or m.startswith(f"ge2jit.ops.{o}.") for o in others)]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_import_reader_sees_relative_imports():
    # ops/optim/__init__.py imports the shared kit relatively: resolved to absolute names
    names = _imports(PACKAGE / "ops" / "optim" / "__init__.py")
    assert "ge2jit.runtime.checks" in names and "ge2jit.jit.launch" in names
