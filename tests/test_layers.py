"""The layering rules, read from the sources: the shared machinery (``ge2jit/jit``,
``ge2jit/runtime``, ``ge2jit/tune``) and the tools above it (warm-up, notebook helpers, the
command, bundles) import no op and name none (they find ops in ``runtime.registry``), and no
op imports another op's modules (what two ops need lives in the shared layer)."""

from __future__ import annotations

import ast
import re
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


#: what may know no op: the shared layers and the tools, which use the registry
OP_FREE = ["jit", "runtime", "tune", "distributed", "precompile.py", "notebook.py", "cli.py",
           "bundle.py"]


def _op_free(layer: str) -> list[Path]:
    path = PACKAGE / layer
    return _sources(path) if path.is_dir() else [path]


@pytest.mark.parametrize("layer", OP_FREE)
def test_shared_layers_and_tools_import_no_op(layer):
    for path in _op_free(layer):
        bad = [m for m in _imports(path) if m.startswith("ge2jit.ops")]
        assert not bad, f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize("layer", OP_FREE)
def test_shared_layers_and_tools_name_no_op(layer):
    from ge2jit.runtime.registry import ops

    names = ["gemm", *(op.name for op in ops()), *(t for op in ops() for t in op.warmup)]
    for path in _op_free(layer):
        text = path.read_text().lower()
        # a name as a word of its own or a part of an identifier ("gemm_bias", "_rope"), not
        # inside a longer word ("rope" in "property")
        bad = sorted({name for name in names
                      if re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", text)})
        assert not bad, f"{path.relative_to(PACKAGE)} names {bad}"


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
    assert "ge2jit.runtime.checks" in names and "ge2jit.jit.loader" in names


#: GEMM's modules in layers: each imports only modules of the layers below it (no circles)
GEMM_LAYERS = {"plans": {"backward", "op", "tuning", "registration"},
               "tuning": {"backward", "op", "registration"},
               "op": {"backward", "registration"}}


@pytest.mark.parametrize("module", sorted(GEMM_LAYERS))
def test_gemm_modules_import_no_module_above_them(module):
    imported = {name.rsplit(".", 1)[-1] for name in _imports(PACKAGE / "ops" / "gemm" /
                                                              f"{module}.py")
                if name.startswith("ge2jit.ops.gemm.")}
    assert not imported & GEMM_LAYERS[module], (module, imported & GEMM_LAYERS[module])
