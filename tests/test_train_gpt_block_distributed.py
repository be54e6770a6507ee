"""examples/train_gpt_block.py under ``torchrun`` (``python -m torch.distributed.run
--standalone --nproc-per-node W``): DistributedDataParallel over the ge2jit.torch layers,
each rank on its shard of the batch, follows one GPU's losses on the whole batch. A
PyTorch-only module: skipped without PyTorch or a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .training_examples import (
    EXAMPLES,
    check_printed,
    close,
    exact_float32,  # noqa: F401 - autouse here
    load_example,
    torch_on_gpu,
)

torch, pytestmark = torch_on_gpu()

example = load_example("train_gpt_block")

#: the size of the example's other tests (tests/test_train_gpt_block.py), as options
SMALL = dict(d=64, layers=1, heads=2, seq=32, batch=32, vocab=64, lr=3e-3)
STEPS = 10


@pytest.mark.parametrize("world", [1, 2, 4])
def test_torchrun_follows_one_gpus_losses_on_the_whole_batch(world, tmp_path):
    """Each rank's loss is a mean over its rows and DDP averages the gradients, so the ranks
    train as one GPU on the whole batch; the logged loss is the ranks' mean. They agree
    within float32 rounding carried through a few AdamW steps (the attention's backward
    may sum in any order, as in the single-GPU tests)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, PyTorch sees {torch.cuda.device_count()}")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("needs torch.distributed with NCCL")
    out = tmp_path / "result.json"
    # (--d-model: torchrun's parser refuses "--d" as an ambiguous prefix of its own options)
    options = [a for k, v in SMALL.items() for a in ("--d-model" if k == "d" else f"--{k}", str(v))]
    env = {**os.environ,   # this checkout's ge2jit first
           "PYTHONPATH": os.pathsep.join([str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={world}", str(EXAMPLES / "train_gpt_block.py"),
                        "--steps", str(STEPS), *options, "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    lines = r.stdout.splitlines()
    check_printed(lines)
    assert sum(line.startswith("final loss") for line in lines) == 1, "rank 0 reports"
    got = json.loads(out.read_text())
    assert got["config"]["world_size"] == world and got["config"]["batch"] == SMALL["batch"]
    want = example.train(steps=STEPS, seed=0, progress=False, **SMALL)
    assert len(got["losses"]) == STEPS
    close(got["losses"], want.losses, 1e-4)
