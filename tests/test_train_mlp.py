"""examples/train_mlp.py: the MLP trains on ge2jit alone, and its first steps follow a float64
NumPy implementation of the same network."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ge2jit.jit.device import gpu_count

gpu = pytest.mark.gpu

#: Bounds on the final loss after 400 steps (measured on an H200: 0.002 in float32 and bfloat16,
#: from about 0.64 at the start) and on the training accuracy.
LOSS_F32 = 0.02
LOSS_BF16 = 0.05

_path = Path(__file__).resolve().parent.parent / "examples" / "train_mlp.py"
_spec = importlib.util.spec_from_file_location("train_mlp", _path)
train_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_mlp)


@gpu
def test_first_steps_match_numpy_float64():
    got, _ = train_mlp.train(6, seed=3, progress=False)
    want = train_mlp.numpy_losses(6, seed=3)
    np.testing.assert_allclose(got, want, rtol=2e-4)


@gpu
def test_float32_adam_learns_the_spirals():
    losses, acc = train_mlp.train(400, seed=0, progress=False)
    assert losses[0] > 0.5 and losses[-1] < LOSS_F32, losses[::50]
    assert acc > 0.99


@gpu
def test_bfloat16_and_sgd_learn_too():
    losses, acc = train_mlp.train(400, dtype="bfloat16", seed=1, progress=False)
    assert losses[-1] < LOSS_BF16 and acc > 0.99, losses[::50]
    sgd, _ = train_mlp.train(6, optimizer="sgd", lr=0.05, seed=2, progress=False)
    want = train_mlp.numpy_losses(6, seed=2, optimizer="sgd", lr=0.05)
    np.testing.assert_allclose(sgd, want, rtol=2e-4)


@gpu
@pytest.mark.parametrize("dtype,optimizer", [("float32", "adam"), ("bfloat16", "adam"),
                                             ("float32", "sgd")])
def test_the_step_captured_as_a_graph_trains_as_the_eager_one(dtype, optimizer):
    lr = None if optimizer == "adam" else 0.05
    eager, acc = train_mlp.train(8, dtype=dtype, optimizer=optimizer, lr=lr, seed=4,
                                 progress=False)
    graph, acc_graph = train_mlp.train(8, dtype=dtype, optimizer=optimizer, lr=lr, seed=4,
                                       progress=False, graph=True)
    assert graph == eager and acc_graph == acc   # bit for bit: the same kernels, replayed


@gpu
def test_graph_training_learns_the_spirals():
    timings = {}
    losses, acc = train_mlp.train(400, seed=0, progress=False, graph=True, timings=timings)
    assert losses[0] > 0.5 and losses[-1] < LOSS_F32, losses[::50]
    assert acc > 0.99
    assert timings["steps_timed"] == 399 and timings["per_step_s"] > 0


@gpu
def test_the_script_with_graph_prints_both_times():
    env = {**os.environ, "PYTHONPATH": str(_path.parent.parent)}   # this checkout's ge2jit
    r = subprocess.run([sys.executable, str(_path), "--graph", "--steps", "50"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "accuracy" in r.stdout and "as a CUDA graph" in r.stdout and "eagerly" in r.stdout


@pytest.mark.skipif(gpu_count() > 0, reason="with a GPU the script trains")
def test_without_gpu_says_so_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(_path.parent.parent)}   # this checkout's ge2jit
    r = subprocess.run([sys.executable, str(_path), "--steps", "1"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("train_mlp.py: no CUDA GPU found; training needs one.")
    assert "python -m ge2jit.demo --arch sm_90" in r.stderr
    assert 'ge2jit.inspect("128x128x16_w32x64_s3", arch="sm_90")' in r.stderr
