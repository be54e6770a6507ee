"""The example scripts without what they need (PyTorch, CuPy): one line naming it, exit
status 2, never a traceback; the mechanism (``ge2jit._deps.script_errors``) lets the error
through where a script is imported as a module. Runs without a GPU or PyTorch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ge2jit import ArgumentValueError, MissingDependencyError
from ge2jit._deps import script_errors

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NEEDS_TORCH = "it needs PyTorch, ge2jit.torch and a CUDA GPU"


def _run_without(example: str, *modules: str) -> subprocess.CompletedProcess:
    """``python examples/<example> --steps 1`` in a process where ``modules`` cannot be
    imported (whether or not they are installed here)."""
    code = (f"import runpy, sys\nfor m in {modules!r}:\n    sys.modules[m] = None\n"
            f"sys.argv = [{example!r}, '--steps', '1']\n"
            f"runpy.run_path({str(EXAMPLES / example)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=EXAMPLES.parent, timeout=300)


@pytest.mark.parametrize("example", ["train_gpt_block.py", "train_llama_block.py"])
def test_without_pytorch_an_example_says_so_in_one_line(example):
    r = _run_without(example, "torch")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == [f"{example}: cannot import torch (import of torch halted; "
                                     f"None in sys.modules); {NEEDS_TORCH}"]


def test_without_pytorch_or_transformers_train_hf_lm_says_so_in_one_line():
    needs = "it needs PyTorch, transformers, ge2jit.torch and a CUDA GPU"
    r = _run_without("train_hf_lm.py", "torch")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == ["train_hf_lm.py: cannot import torch (import of torch "
                                     f"halted; None in sys.modules); {needs}"]
    pytest.importorskip("torch")
    r = _run_without("train_hf_lm.py", "transformers")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == ["train_hf_lm.py: cannot import transformers (import of "
                                     f"transformers halted; None in sys.modules); {needs}"]


def test_without_cupy_train_mlp_names_the_extras_in_one_line():
    r = _run_without("train_mlp.py", "cupy", "cupy_backends")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == [
        'train_mlp.py: cupy is not installed; install ge2jit with a CUDA extra: pip install '
        '"ge2jit[cuda13]" (CUDA 13 drivers) or "ge2jit[cuda12]" (CUDA 12 drivers)']


def test_every_example_script_is_covered():
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert scripts == {"train_gpt_block.py", "train_hf_lm.py", "train_llama_block.py",
                       "train_mlp.py"}


def test_script_errors_is_one_line_and_2_in_a_script_and_lets_errors_through_otherwise(capsys):
    with pytest.raises(SystemExit) as info, script_errors("prog", "PyTorch"):
        import no_such_module_anywhere  # noqa: F401
    assert info.value.code == 2
    assert capsys.readouterr().err == ("prog: cannot import no_such_module_anywhere (No module "
                                       "named 'no_such_module_anywhere'); it needs PyTorch\n")
    for error in (MissingDependencyError("cupy is not installed"),
                  ArgumentValueError("arch: bad")):
        with pytest.raises(SystemExit), script_errors("prog"):
            raise error
        assert capsys.readouterr().err == f"prog: {error}\n"
        with pytest.raises(type(error)), script_errors("prog", as_script=False):
            raise error
    with pytest.raises(KeyError), script_errors("prog"):   # a bug: its traceback
        raise KeyError("x")
