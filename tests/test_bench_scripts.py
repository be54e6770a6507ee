"""Every bench script imports without a GPU, PyTorch or matplotlib, and parses its options.

The bench scripts run only on a GPU machine (``bench/run_quick.sh`` runs each with
``--quick``), so an API change that breaks one would otherwise be seen only there. Each script
found in bench/ (a new one is covered without being listed) is imported as a module, its main
not run, and its ``parse_args(argv)`` is run: ``--help`` exits 0, and ``--quick`` parses for
every script that does GPU work (those that do none say so with ``RUNS_ON_GPU = False``: the
report and the plots). What each script names of ge2jit (``ge2jit.a.b``, ``from ge2jit.x
import y``, inside functions too) must exist, and a call's keywords must be the callee's.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
#: the scripts' shared module and a worker process's script, no benchmarks of their own
HELPERS = {"common.py", "warm_start_worker.py"}
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name not in HELPERS)


def _load(path: Path):
    """The script at ``path`` as a module (registered in sys.modules while it runs, as
    ``importlib`` does for one that is imported)."""
    name = f"bench_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def load(monkeypatch):
    """``load(path)``: the script as a module, with bench/ on the path as when it runs; the
    path and the modules loaded from bench/ are restored after the test."""
    monkeypatch.syspath_prepend(str(BENCH))
    before = set(sys.modules)
    yield _load
    for name in set(sys.modules) - before:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == BENCH:
            del sys.modules[name]


def test_found_the_scripts():
    names = {p.name for p in SCRIPTS}
    assert {"bench_gemm.py", "bench_torch_mlp.py", "report.py", "plot_gated.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_parses_its_options(path, load, capsys):
    module = load(path)
    assert callable(module.main)
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage:")
    if getattr(module, "RUNS_ON_GPU", True):
        assert "--quick" in usage
        args = module.parse_args(["--quick"])
        assert args.quick is True


def test_importing_them_loads_no_torch_nor_matplotlib():
    """In a fresh interpreter (this one may have imported PyTorch for other tests): importing
    every script leaves PyTorch and matplotlib unloaded, so that their absence or a machine
    without a GPU does not stop the scripts' argument parsing."""
    code = (f"import sys\nsys.path.insert(0, {str(BENCH)!r})\n"
            f"sys.path.insert(0, {str(Path(__file__).parent.parent)!r})\n"
            "from tests.test_bench_scripts import SCRIPTS, _load\n"
            "for path in SCRIPTS:\n    _load(path)\n"
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def _ge2jit_names(path: Path):
    """``(line, module, names, keywords)`` of what the script names of ge2jit: ``from ge2jit.x
    import y, z`` gives ("ge2jit.x", ["y", "z"], None), each name on its own; ``ge2jit.a.b``
    gives ("ge2jit", ["a", "b"], the keywords of a call of it, or None)."""
    tree = ast.parse(path.read_text(), str(path))
    keywords = {id(n.func): [k.arg for k in n.keywords if k.arg]
                for n in ast.walk(tree) if isinstance(n, ast.Call)}
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ge2jit"):
            yield node.lineno, node.module, [a.name for a in node.names], None
        elif isinstance(node, ast.Attribute) and id(node) not in inner:   # a whole a.b.c
            parts, root = [], node
            while isinstance(root, ast.Attribute):
                parts.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id == "ge2jit":
                yield node.lineno, "ge2jit", parts[::-1], keywords.get(id(node))


def _resolve(module: str, names: list[str], where: str):
    """The object ``module.names[0].names[1]...``; None where the module needs PyTorch (not
    installed here; checked where it is)."""
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == "torch":
            return None
        raise
    for i, name in enumerate(names):
        assert hasattr(obj, name), f"{where}: {module}.{'.'.join(names[:i + 1])}: no such name"
        obj = getattr(obj, name)
    return obj


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_what_it_names_of_ge2jit_exists(path):
    for line, module, names, keywords in _ge2jit_names(path):
        where = f"{path.name}:{line}"
        if module != "ge2jit":   # from MODULE import a, b
            for name in names:
                _resolve(module, [name], where)
            continue
        obj = _resolve(module, names, where)
        if keywords and callable(obj):
            params = inspect.signature(obj).parameters.values()
            if all(p.kind is not p.VAR_KEYWORD for p in params):
                unknown = sorted(set(keywords) - {p.name for p in params})
                assert not unknown, f"{where}: {'.'.join(names)} takes no {unknown}"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", ["run_quick.sh", "gpu_check.sh", "sanitize.sh",
                                    "multi_gpu_check.sh"])
def test_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_multi_gpu_check_refuses_an_unknown_variant(tmp_path):
    import os

    env = {**os.environ, "OUT": str(tmp_path), "TESTS": "0", "LLAMA": "0",
           "BENCH_VARIANTS": "default-ish"}
    done = subprocess.run(["bash", str(BENCH / "multi_gpu_check.sh")], capture_output=True,
                          text=True, env=env, cwd=BENCH.parent)
    assert done.returncode == 2
    assert done.stderr.strip() == ("multi_gpu_check.sh: BENCH_VARIANTS: unknown variant "
                                   "default-ish")


def test_the_attention_bench_redraws_its_plot_from_its_json(load, tmp_path, capsys):
    """``--replot`` draws from the committed results without PyTorch or a GPU; it needs
    ``--plot``."""
    module = load(BENCH / "bench_attention.py")
    results = str(BENCH / "results_attention.json")
    assert module.main(["--replot", results]) == 2
    assert capsys.readouterr().err.strip() == ("bench_attention: --replot needs --plot (the "
                                               "PNG to write)")
    pytest.importorskip("matplotlib")
    png = tmp_path / "a.png"
    assert module.main(["--replot", results, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
