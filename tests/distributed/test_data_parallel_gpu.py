"""ge2jit.distributed on GPUs: each rank a process on its own GPU, started with torchrun's
variables; the data-parallel gradients (the shards' gradients all-reduced in buckets on a side
stream, eagerly and replayed from a captured graph) equal the gradients of the whole batch on
one GPU. With one GPU, a world of one runs the same script (nothing to reduce)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ge2jit.distributed.launch import free_port, local_environments

pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

WORKER = Path(__file__).with_name("dp_worker.py")


def _run(world: int, tmp_path: Path) -> list[dict]:
    procs = []
    for rank, env in enumerate(local_environments(world, master_port=free_port())):
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]),
                                             env.get("PYTHONPATH", "")])
        procs.append(subprocess.Popen([sys.executable, str(WORKER),
                                       str(tmp_path / f"rank{rank}.json")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{out[-3000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_data_parallel_gradients_equal_the_whole_batchs(world, tmp_path):
    if _gpus() < world:
        pytest.skip(f"needs {world} GPUs, found {_gpus()}")
    results = _run(world, tmp_path)
    assert sorted(r["device"] for r in results) == list(range(world)), "one GPU a rank"
    for r in results:
        assert r["eager_err"] < 1e-5, r
        assert r["graph_err"] < 1e-5, r
        assert r["graph_equal"], r
        assert len(r["buckets"]) > 1, "the test's bucket size makes several buckets"
        # NCCL sums 16-bit numbers in their own type: within a few of their roundings
        assert r["half_errs"]["bfloat16"] < 4 * 2**-8 and r["half_errs"]["float16"] < 4 * 2**-11, r
        assert r["scatter_err"] < 1e-5 and r["gather_err"] < 1e-5, r   # float32 sums
