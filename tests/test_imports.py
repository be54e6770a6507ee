"""Every ``from ge2jit... import name`` in the package names something that exists.

The modules that need PyTorch are never imported by the CPU tests, so a name moved from one
module to another would otherwise break them unseen; this reads their imports instead."""
import ast
import importlib
from pathlib import Path

import pytest

import ge2jit

PACKAGE = Path(ge2jit.__file__).parent


def _imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = "ge2jit." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").startswith("ge2jit"):
                target = node.module
            else:
                continue
            for alias in node.names:
                if alias.name != "*":
                    yield f"{path.relative_to(PACKAGE)}:{node.lineno}", target, alias.name


IMPORTS = list(_imports())


def test_found_the_torch_modules():
    assert any(where.startswith("ops/gemm/torch_ops.py") for where, _, _ in IMPORTS)


def _needs_torch(e: ModuleNotFoundError) -> bool:
    return e.name == "torch" or (e.name or "").startswith("torch.")


@pytest.mark.parametrize("where, target, name", IMPORTS, ids=[f"{w}:{n}" for w, _, n in IMPORTS])
def test_imported_name_exists(where, target, name):
    try:
        mod = importlib.import_module(target)
    except ModuleNotFoundError as e:
        if _needs_torch(e):
            pytest.skip(f"{target} needs PyTorch")
        raise
    if hasattr(mod, name):
        return
    try:   # a submodule not imported by its package yet
        importlib.import_module(f"{target}.{name}")
    except ModuleNotFoundError as e:
        if _needs_torch(e):
            pytest.skip(f"{target}.{name} needs PyTorch")
        pytest.fail(f"{where}: {target} has no {name!r}")
