"""examples/train_mlp.py data parallel. Without a GPU: ``--gpus`` and the launcher's world
size read and checked (one line naming the option or the variable), and the processes the
script would start. With GPUs: the data-parallel losses are one GPU's on the whole batch
(world sizes 1 and 2, eagerly and as CUDA graphs), and a job on a warmed, read-only kernel
cache compiles nothing on any rank."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ge2jit.distributed as dist
from ge2jit import ArgumentValueError
from ge2jit.distributed import ProcessInfo
from ge2jit.distributed.environment import LAUNCHERS
from ge2jit.jit.device import gpu_count

_path = Path(__file__).resolve().parent.parent / "examples" / "train_mlp.py"
_spec = importlib.util.spec_from_file_location("train_mlp_dp", _path)
train_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_mlp)

#: every variable a launcher sets, and the rendezvous
LAUNCH_VARIABLES = sorted({v for names in LAUNCHERS for v in names[1:]} |
                          {"MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"})


@pytest.fixture
def no_launcher(monkeypatch):
    """This process started by no launcher, whatever started the tests."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _info(world: int = 1, launcher: str = "torchrun") -> ProcessInfo:
    return ProcessInfo(0, world, 0, "127.0.0.1", 29500, launcher)


# --- without a GPU -------------------------------------------------------------------------

def test_the_world_size_is_gpus_or_the_launchers():
    none = _info(1, "none")
    assert train_mlp.world_size(none, None) == 1
    assert train_mlp.world_size(none, 1) == 1 and train_mlp.world_size(none, 8) == 8
    assert train_mlp.world_size(_info(2), None) == 2 and train_mlp.world_size(_info(2), 2) == 2
    assert train_mlp.world_size(_info(4, "slurm"), None) == 4


@pytest.mark.parametrize("info, gpus, message", [
    (_info(1, "none"), 3, "--gpus: expected a number of processes that divides the 2048 "
                          "training points into equal shards, got 3"),
    (_info(3), None, "WORLD_SIZE: expected a number of processes that divides the 2048 "
                     "training points into equal shards, got 3"),
    (_info(6, "openmpi"), None, "OMPI_COMM_WORLD_SIZE: expected a number of processes that "
                                "divides the 2048 training points into equal shards, got 6"),
    (_info(2), 4, "--gpus: expected the launcher's number of processes (WORLD_SIZE=2), got 4"),
    (_info(2, "slurm"), 1, "--gpus: expected the launcher's number of processes "
                           "(SLURM_NTASKS=2), got 1"),
])
def test_a_bad_world_size_is_one_line_naming_its_source(info, gpus, message):
    with pytest.raises(ArgumentValueError) as e:
        train_mlp.world_size(info, gpus)
    assert str(e.value) == message


def _main(argv, capsys):
    code = train_mlp.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_gpus_below_one_is_a_usage_error(no_launcher, capsys):
    with pytest.raises(SystemExit) as e:
        train_mlp.main(["--gpus", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("train_mlp.py: error: --gpus: expected "
                                                        "at least 1, got 0")


@pytest.mark.parametrize("argv, env, line", [
    (["--gpus", "3"], {}, "train_mlp.py: --gpus: expected a number of processes that divides "
                          "the 2048 training points into equal shards, got 3"),
    (["--gpus", "4"], {"RANK": "0", "WORLD_SIZE": "2"},
     "train_mlp.py: --gpus: expected the launcher's number of processes (WORLD_SIZE=2), got 4"),
    ([], {"RANK": "5", "WORLD_SIZE": "2"}, "train_mlp.py: RANK: expected a rank in [0, 2) "
                                           "(WORLD_SIZE is 2), got 5"),
])
def test_bad_world_sizes_exit_2_with_one_line_before_any_gpu_is_looked_for(
        argv, env, line, no_launcher, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(train_mlp, "gpu_available", lambda: pytest.fail("looked for a GPU"))
    code, out, err = _main(argv, capsys)
    assert (code, out, err.splitlines()) == (2, "", [line])


def test_more_gpus_than_visible_exit_2_with_one_line(no_launcher, monkeypatch, capsys):
    monkeypatch.setattr(train_mlp, "gpu_available", lambda: True)
    monkeypatch.setattr(train_mlp, "visible_gpus", lambda: 1)
    monkeypatch.setattr(dist, "launch_local", lambda *a, **k: pytest.fail("launched"))
    code, out, err = _main(["--gpus", "2"], capsys)
    assert (code, out, err.splitlines()) == (
        2, "", ["train_mlp.py: --gpus: expected at most the 1 GPU visible here, got 2"])


@pytest.mark.skipif(gpu_count() > 0, reason="with a GPU the ranks train")
@pytest.mark.parametrize("argv, env", [(["--gpus", "2"], {}),
                                       ([], {"RANK": "1", "WORLD_SIZE": "2"})])
def test_without_gpu_a_data_parallel_run_says_so_in_one_line(argv, env, no_launcher,
                                                             monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = _main([*argv, "--steps", "1"], capsys)
    assert (code, out, err.splitlines()) == (2, "", [train_mlp.NO_GPU])


def test_gpus_without_a_launcher_starts_the_script_once_a_gpu(no_launcher, monkeypatch,
                                                               capsys):
    calls = []

    def launch_local(argv, world):
        calls.append((argv, world))
        return dist.LocalRun((0, 0, 0, 0), ("", "", "a warning\n", ""), None)

    monkeypatch.setattr(train_mlp, "gpu_available", lambda: True)
    monkeypatch.setattr(train_mlp, "visible_gpus", lambda: 8)
    monkeypatch.setattr(dist, "launch_local", launch_local)
    code, out, err = _main(["--gpus", "4", "--steps", "5", "--graph"], capsys)
    assert code == 0 and out == ""
    assert calls == [([sys.executable, str(_path), "--gpus", "4", "--steps", "5", "--graph"], 4)]
    assert err.splitlines() == ["[rank 2] a warning"]   # what the other ranks wrote


def test_a_failing_rank_fails_the_script_with_its_output(no_launcher, monkeypatch, capsys):
    failed = dist.LocalRun((-15, 7), ("", "Traceback (most recent call last):\nboom\n"), 1,
                           (0,))
    monkeypatch.setattr(train_mlp, "gpu_available", lambda: True)
    monkeypatch.setattr(train_mlp, "visible_gpus", lambda: 2)
    monkeypatch.setattr(dist, "launch_local", lambda argv, world: failed)
    code, out, err = _main(["--gpus", "2"], capsys)
    assert code == 7 and out == ""
    assert err.splitlines() == [
        "train_mlp.py: rank 1 of 2 failed (exit status 7); rank 0 stopped; its output:",
        "[rank 1] Traceback (most recent call last):", "[rank 1] boom"]


def test_the_kernel_line_names_each_rank():
    one = [{"rank": 0, "loaded": 23, "compiled": 0}]
    assert train_mlp.describe_kernels(one) == "kernel cache: 23 kernels loaded, 0 compiled"
    two = one + [{"rank": 1, "loaded": 20, "compiled": 3}]
    assert train_mlp.describe_kernels(two) == ("kernel cache: rank 0: 23 kernels loaded, 0 "
                                               "compiled; rank 1: 20 kernels loaded, 3 "
                                               "compiled")


# --- with GPUs -----------------------------------------------------------------------------

STEPS = 20


def _needs(world: int) -> None:
    if gpu_count() < world:
        pytest.skip(f"needs {world} GPUs, found {gpu_count()}")


def _run(args, tmp_path: Path, name: str, **env) -> tuple[dict, str]:
    """The script run with ``args`` (and ``--json``) and ``env`` added to this process's
    environment; its results and its stdout."""
    out = tmp_path / f"{name}.json"
    full = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    full.update(env, PYTHONPATH=os.pathsep.join(   # this checkout's ge2jit first
        [str(_path.parent.parent), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(_path), *args, "--json", str(out)], env=full,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{name}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(out.read_text()), r.stdout


def _launched_world_of_one() -> dict:
    """A launcher's variables for a job of one process."""
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(dist.free_port())}


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2, 4])
def test_data_parallel_losses_are_one_gpus_on_the_whole_batch(world, tmp_path):
    """Each rank's loss and gradients are means over its shard; averaged over the ranks they
    are the whole batch's, so the losses follow one GPU's on the whole batch. A world of one
    (under a launcher's variables: the data-parallel code with nothing to reduce) gives the
    same bits; two ranks, rank 0 with all of one class and rank 1 with the other, agree within
    float32 rounding carried through the Adam steps, eagerly and as CUDA graphs (bit for bit
    with each other: the same kernels and the same two-term sums)."""
    _needs(world)
    want, acc = train_mlp.train(STEPS, seed=5, progress=False)
    if world == 1:
        got, out = _run(["--steps", str(STEPS), "--seed", "5"], tmp_path, "dp",
                        **_launched_world_of_one())
        assert got["world_size"] == 1 and len(got["kernels"]) == 1
        assert got["losses"] == want and got["accuracy"] == acc
        return
    got, out = _run(["--gpus", str(world), "--steps", str(STEPS), "--seed", "5"], tmp_path,
                    "dp")
    graph, _ = _run(["--gpus", str(world), "--steps", str(STEPS), "--seed", "5", "--graph"],
                    tmp_path, "dp-graph")
    assert got["world_size"] == world
    assert [k["rank"] for k in got["kernels"]] == list(range(world))
    np.testing.assert_allclose(got["losses"], want, rtol=2e-4)
    assert want[-1] < want[0] - 0.05, want   # the run learns: the comparison means something
    assert abs(got["accuracy"] - acc) <= 2 / 2048
    assert graph["losses"] == got["losses"]
    assert out.count("final loss") == 1
    assert f"({world} GPUs, {2048 // world} points each)" in out


def _read_only(root: Path, writable: bool) -> None:
    """Take away (or give back) every write permission under ``root``."""
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
        path.chmod((mode | stat.S_IWUSR) if writable else (mode & ~write))


def _entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*.cubin"))


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_on_a_warmed_read_only_cache_compile_nothing(world, tmp_path):
    """The job run once into an empty cache directory warms it; made read-only and listed
    after a fresh, empty directory of the rank's own (GE2JIT_CACHE_DIR="fresh:warmed"), the
    same job compiles nothing on any rank (each rank's process_misses is 0), finds every
    kernel in it, writes nothing to the fresh directory, and trains to the same losses. The
    first step's times are reported, not checked."""
    _needs(world)
    warmed, fresh = tmp_path / "warmed", tmp_path / "fresh"
    warmed.mkdir(mode=0o700)
    fresh.mkdir(mode=0o700)
    args = ["--steps", "10", "--gpus", str(world)]
    first, _ = _run(args, tmp_path, "warming", GE2JIT_CACHE_DIR=str(warmed))
    assert sum(k["compiled"] for k in first["kernels"]) > 0, first["kernels"]
    assert _entries(warmed)
    _read_only(warmed, writable=False)
    try:
        again, out = _run(args, tmp_path, "warmed", GE2JIT_CACHE_DIR=f"{fresh}:{warmed}")
    finally:
        _read_only(warmed, writable=True)
    assert [k["rank"] for k in again["kernels"]] == list(range(world))
    for k in again["kernels"]:
        assert k["compiled"] == 0 and k["loaded"] > 0, again["kernels"]
    assert _entries(fresh) == []
    assert again["losses"] == first["losses"]
    assert "0 compiled" in out
    print(f"\nworld {world}: first step {first['first_step_s']:.3f} s compiling, "
          f"{again['first_step_s']:.3f} s from the warmed cache; later steps "
          f"{first['per_step_s'] * 1e3:.3f} and {again['per_step_s'] * 1e3:.3f} ms")
