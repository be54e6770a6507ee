"""examples/quickstart.ipynb runs top to bottom (executed with nbclient): on a GPU every cell;
without one, it says so, the GPU cells skip themselves and a kernel is compiled and inspected
for sm_90 by its config name."""

from __future__ import annotations

from pathlib import Path

import pytest

from ge2jit.jit.device import gpu_count

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))   # the kernel imports this checkout's ge2jit
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "wgmma_128x256_s4" in text and "sm_90a" in text and "registers / thread" in text
    if gpu_count():
        assert "relative difference from CuPy" in text and "No CUDA GPU" not in text
    else:
        first = "".join(o.get("text", "") for o in nb.cells[1].outputs)
        assert "No CUDA GPU here: the cells that run kernels skip themselves" in first
        assert "relative difference from CuPy" not in text
