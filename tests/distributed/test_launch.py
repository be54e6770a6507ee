"""ge2jit.distributed's launch without a GPU: a batch's shards, the environments of a job
started on this host, and its processes (plain Python children) run and waited for, the
others stopped when one fails, its output reported."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ge2jit import ArgumentValueError
from ge2jit.distributed import (
    ProcessInfo,
    free_port,
    launch_local,
    local_environments,
    process_info,
    shard,
)


def test_shards_are_equal_contiguous_and_cover_the_batch():
    assert [shard(12, r, 3) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert shard(2048, 0, 1) == slice(0, 2048)
    assert shard(0, 1, 2) == slice(0, 0)
    rows = list(range(2048))
    for world in (1, 2, 4, 8):
        parts = [rows[shard(2048, r, world)] for r in range(world)]
        assert sum(parts, []) == rows and {len(p) for p in parts} == {2048 // world}


@pytest.mark.parametrize("args, kwargs, match", [
    ((2048, 0, 3), {"what": "training points"},
     r"^world_size: expected a number of processes that divides the 2048 training points "
     r"into equal shards, got 3$"),
    ((8, 2, 2), {}, r"^rank: expected a rank in \[0, 2\), got 2$"),
    ((8, 0, 0), {}, r"^world_size: expected an integer >= 1, got 0$"),
    ((-1, 0, 1), {}, r"^total: expected an integer >= 0, got -1$"),
    ((8, True, 2), {}, r"^rank: expected an integer >= 0, got True$"),
])
def test_bad_shards_are_one_line_naming_the_argument(args, kwargs, match):
    with pytest.raises(ArgumentValueError, match=match):
        shard(*args, **kwargs)


def test_local_environments_are_torchruns_variables():
    envs = local_environments(2, master_port=1234, base={"PATH": "/bin"})
    assert envs[1] == {"PATH": "/bin", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1234"}
    for rank, env in enumerate(envs):   # what each rank reads back
        assert process_info(env) == ProcessInfo(rank, 2, rank, "127.0.0.1", 1234, "torchrun")
    # by default on top of this process's environment, which is left alone
    (env,) = local_environments(1, master_port=5, master_addr="10.0.0.1")
    assert env["PATH"] == os.environ["PATH"] and env["MASTER_ADDR"] == "10.0.0.1"


@pytest.mark.parametrize("world, port, match", [
    (0, 1234, r"^world_size: expected an integer >= 1, got 0$"),
    (2, 0, r"^master_port: expected a port in \[1, 65535\) \(the rendezvous uses it and the "
           r"next\), got 0$"),
    (2, 65535, r"got 65535$"),
    (2, "1234", r"got '1234'$"),
])
def test_bad_environments_are_refused(world, port, match):
    with pytest.raises(ArgumentValueError, match=match):
        local_environments(world, master_port=port)


def test_free_port_and_the_next_are_free():
    port = free_port()
    assert 1 <= port < 65534
    for p in (port, port + 1):   # free when asked (another process could take them since)
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


# A rank: writes its variables to <dir>/rank<R>.json and says hello on stdout and stderr;
# with "fail R": rank R exits with status 3 at once, the others wait for a minute.
CHILD = r"""
import json, os, sys, time
out, rank = sys.argv[1], os.environ["RANK"]
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({k: os.environ[k] for k in names}, f)
print(f"hello from {rank}", flush=True)
print(f"and on stderr from {rank}", file=sys.stderr, flush=True)
if sys.argv[2:] == ["fail", rank]:
    print("boom", file=sys.stderr)
    sys.exit(3)
if sys.argv[2:3] == ["fail"]:
    time.sleep(60)
"""


def test_every_rank_runs_with_its_variables(tmp_path, capfd):
    run = launch_local([sys.executable, "-c", CHILD, str(tmp_path)], 3)
    assert run.returncodes == (0, 0, 0) and run.failed is None and run.returncode == 0
    assert run.stopped == ()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [s["RANK"] for s in seen] == ["0", "1", "2"] == [s["LOCAL_RANK"] for s in seen]
    assert {s["WORLD_SIZE"] for s in seen} == {"3"} == {s["LOCAL_WORLD_SIZE"] for s in seen}
    assert len({s["MASTER_PORT"] for s in seen}) == 1
    assert {s["MASTER_ADDR"] for s in seen} == {"127.0.0.1"}
    # rank 0 wrote to this process's output; the others' was kept, stdout and stderr in order
    captured = capfd.readouterr()
    assert "hello from 0" in captured.out and "and on stderr from 0" in captured.err
    assert "from 1" not in captured.out + captured.err
    assert run.outputs[0] == ""
    assert run.outputs[2] == "hello from 2\nand on stderr from 2\n"
    assert run.report("prog") == ("[rank 1] hello from 1\n[rank 1] and on stderr from 1\n"
                                  "[rank 2] hello from 2\n[rank 2] and on stderr from 2")


def test_a_failing_rank_stops_the_others_and_its_output_is_reported(tmp_path):
    started = time.monotonic()
    run = launch_local([sys.executable, "-c", CHILD, str(tmp_path), "fail", "1"], 3,
                       stop_timeout_s=5)
    assert time.monotonic() - started < 30, "the waiting ranks were stopped, not waited for"
    assert run.failed == 1 and run.returncode == 3 and run.returncodes[1] == 3
    assert run.stopped == (0, 2)
    assert run.returncodes[0] < 0 and run.returncodes[2] < 0   # ended by a signal
    assert run.report("prog").splitlines() == [
        "prog: rank 1 of 3 failed (exit status 3); ranks 0, 2 stopped; its output:",
        "[rank 1] hello from 1", "[rank 1] and on stderr from 1", "[rank 1] boom"]


def test_a_failing_rank_0_points_at_its_output_above(tmp_path, capfd):
    run = launch_local([sys.executable, "-c", CHILD, str(tmp_path), "fail", "0"], 2,
                       stop_timeout_s=5)
    assert run.failed == 0 and run.returncode == 3
    assert "boom" in capfd.readouterr().err
    assert run.stopped == (1,)
    assert run.report("prog") == ("prog: rank 0 of 2 failed (exit status 3); rank 1 stopped; "
                                  "its output is above")


def test_a_job_of_one(tmp_path):
    run = launch_local([sys.executable, "-c", CHILD, str(tmp_path), "fail", "0"], 1)
    assert run.returncodes == (3,) and run.report("p") == ("p: rank 0 of 1 failed (exit "
                                                           "status 3); its output is above")
    ok = launch_local([sys.executable, "-c", "pass"], 1)
    assert ok.returncode == 0 and ok.report("p") == ""


def test_a_terminated_launcher_stops_its_ranks(tmp_path):
    """SIGTERM to the process that launched the ranks (a job's cancellation) stops them
    before it exits: none is left waiting for the others."""
    sleeper = ("import os, sys, time; open(os.path.join(sys.argv[1], os.environ['RANK']), "
               "'w').write(str(os.getpid())); time.sleep(60)")
    parent = ("import sys; from ge2jit.distributed import launch_local; "
              f"launch_local([sys.executable, '-c', {sleeper!r}, sys.argv[1]], 2, "
              "stop_timeout_s=5)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", parent, str(tmp_path)], env=env)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.iterdir())) < 2 or any(p.stat().st_size == 0
                                                   for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "the ranks did not start"
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
