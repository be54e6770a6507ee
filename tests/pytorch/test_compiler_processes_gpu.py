"""A compiled model's kernels and their choices persist across processes: a second process on
the same kernel cache compiles nothing (no miss, no write: ge2jit's choices come from the
shapes, so nothing is tuned either) and computes the same loss, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("compiled_step_worker.py")


def _run(cache: Path, inductor: Path) -> dict:
    env = dict(os.environ, GE2JIT_CACHE_DIR=str(cache), TORCHINDUCTOR_CACHE_DIR=str(inductor))
    out = subprocess.run([sys.executable, str(WORKER)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path):
    first = _run(tmp_path / "kernels", tmp_path / "inductor")
    assert first["misses"] > 0 and first["writes"] > 0, first
    assert first["fused"] == ["attention", "gemm_bias_act", "linear_cross_entropy"], first
    second = _run(tmp_path / "kernels", tmp_path / "inductor")
    assert second["misses"] == 0 and second["writes"] == 0 and second["hits"] > 0, second
    assert second["loss"] == first["loss"]
