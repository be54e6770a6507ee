"""ge2jit.distributed without a GPU: the launcher's environment read into a ProcessInfo, and
gradients planned into all-reduce buckets."""

from __future__ import annotations

import pytest

from ge2jit import ArgumentValueError
from ge2jit.distributed import BUCKET_BYTES, ProcessInfo, plan_buckets, process_info


def test_no_launcher_is_one_process():
    assert process_info({}) == ProcessInfo(0, 1, 0, "127.0.0.1", 29500, "none")


@pytest.mark.parametrize("env, want", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0",
      "MASTER_PORT": "1234"}, ProcessInfo(3, 8, 1, "node0", 1234, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
      "OMPI_COMM_WORLD_LOCAL_RANK": "2", "MASTER_ADDR": "10.0.0.1"},
     ProcessInfo(5, 6, 2, "10.0.0.1", 29500, "openmpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"},
     ProcessInfo(1, 2, 1, "127.0.0.1", 29500, "mpich")),
    ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "MASTER_PORT": "4000"},
     ProcessInfo(9, 16, 1, "127.0.0.1", 4000, "slurm")),
    # no local rank: one process a host, the local rank is the rank
    ({"RANK": "0", "WORLD_SIZE": "2"}, ProcessInfo(0, 2, 0, "127.0.0.1", 29500, "torchrun")),
    # torchrun's variables win over a Slurm allocation's
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_PROCID": "0",
      "SLURM_NTASKS": "1"}, ProcessInfo(1, 2, 1, "127.0.0.1", 29500, "torchrun")),
])
def test_launchers(env, want):
    got = process_info(env)
    assert got == want
    assert got.rendezvous_port == want.master_port + 1


@pytest.mark.parametrize("env, match", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, r"RANK: expected a rank in \[0, 2\)"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK: expected an integer, got 'x'"),
    ({"RANK": "0"}, "WORLD_SIZE: expected an integer in the environment, got nothing"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE: expected a world size of at least 1"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "-1"}, "OMPI_COMM_WORLD_LOCAL_RANK: expected a local"),
    ({"MASTER_PORT": "65535"}, r"MASTER_PORT: expected a port in \[1, 65535\)"),
])
def test_bad_environment_is_one_line_naming_the_variable(env, match):
    with pytest.raises(ArgumentValueError, match=match) as info:
        process_info(env)
    assert "\n" not in str(info.value)


def test_buckets_fill_from_the_last_layer():
    # a 3-layer MLP's (W, b) pairs: the last layer's gradients come first in the backward
    sizes = [4096, 64, 8192, 128, 2048, 32]
    assert plan_buckets(sizes, 10_000) == [[5, 4, 3], [2, 1], [0]]
    assert plan_buckets(sizes, 2**30) == [[5, 4, 3, 2, 1, 0]]
    # a gradient larger than a bucket is a bucket of its own; empty ones ride along
    assert plan_buckets([10, 500, 0, 10], 100) == [[3, 2], [1], [0]]
    assert plan_buckets([], 100) == []
    assert BUCKET_BYTES == 25 * 2**20


def test_buckets_hold_one_kind():
    sizes = [4, 4, 4, 4]
    assert plan_buckets(sizes, 100, ["f32", "f16", "f16", "f32"]) == [[3], [2, 1], [0]]


def test_every_gradient_in_exactly_one_bucket():
    import random

    rng = random.Random(0)
    for _ in range(50):
        sizes = [rng.randrange(0, 1000) for _ in range(rng.randrange(1, 30))]
        cap = rng.randrange(1, 3000)
        buckets = plan_buckets(sizes, cap)
        flat = [i for b in buckets for i in b]
        assert flat == list(reversed(range(len(sizes))))
        for b in buckets:
            assert len(b) == 1 or sum(sizes[i] for i in b) <= cap


@pytest.mark.parametrize("args, match", [
    (([1, 2], 0), "bucket_bytes: expected a positive integer, got 0"),
    (([1, -2], 10), "nbytes: expected sizes in bytes .* got -2 at index 1"),
    (([1, 2], 10, ["a"]), r"kinds: expected one per gradient \(2\), got 1"),
])
def test_bad_plans_are_refused(args, match):
    with pytest.raises(ArgumentValueError, match=match):
        plan_buckets(*args)


def test_the_first_bucket_may_be_smaller():
    """``first_bucket_bytes`` caps the bucket the backward completes first (so that its
    reduction starts early); the others fill up to ``bucket_bytes``."""
    sizes = [4096, 64, 8192, 128, 2048, 32]
    assert plan_buckets(sizes, 10_000, first_bucket_bytes=100) == [[5], [4, 3], [2, 1], [0]]
    assert plan_buckets(sizes, 10_000, first_bucket_bytes=10_000) == \
        plan_buckets(sizes, 10_000)
    with pytest.raises(ArgumentValueError, match="first_bucket_bytes: expected a positive "
                                                 "integer, got 0"):
        plan_buckets(sizes, 100, first_bucket_bytes=0)


# --- the rendezvous (sockets only) ----------------------------------------------------------

def _join(world: int, ranks, port: int, timeout_s: float = 20.0, worlds=None):
    """``rendezvous`` of the given ranks, each in a thread; their results (or errors)."""
    import threading

    from ge2jit.distributed.environment import ProcessInfo
    from ge2jit.distributed.group import rendezvous

    out = {}

    def one(rank):
        info = ProcessInfo(rank, (worlds or {}).get(rank, world), rank, "127.0.0.1", port,
                           "torchrun")
        try:
            out[rank] = rendezvous(info, lambda: bytes(range(128)), timeout_s)
        except Exception as e:  # noqa: BLE001 - returned for the test to look at
            out[rank] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in reversed(threads):   # the others first: they wait for rank 0 to listen
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_gets_rank_0s_nccl_id(world):
    from ge2jit.distributed.launch import free_port

    out = _join(world, range(world), free_port())
    assert all(out[r] == bytes(range(128)) for r in range(world)), out


def test_a_rank_of_another_world_is_refused_in_one_line():
    from ge2jit.distributed.launch import free_port

    out = _join(2, [0, 1], free_port(), timeout_s=5.0, worlds={1: 3})
    assert isinstance(out[0], ArgumentValueError)
    assert str(out[0]) == ("WORLD_SIZE: rank 1 was started with 3, rank 0 with 2; every "
                           "rank of a job needs the same")


def test_a_missing_rank_times_out_naming_it():
    from ge2jit.distributed.launch import free_port

    port = free_port()
    out = _join(3, [0, 1], port, timeout_s=1.0)
    assert isinstance(out[0], TimeoutError)
    assert str(out[0]) == (f"rendezvous: ranks [2] of 3 did not join rank 0 at "
                           f"127.0.0.1:{port + 1} (MASTER_ADDR, MASTER_PORT + 1) within 1 s")
    alone = _join(2, [1], free_port(), timeout_s=0.5)[1]
    assert isinstance(alone, TimeoutError) and "rank 1 could not reach rank 0" in str(alone)


def test_nccl_connects_at_init_unless_the_user_said_otherwise():
    from ge2jit.distributed.group import connect_at_init

    env = {}
    assert connect_at_init(env) and env == {"NCCL_RUNTIME_CONNECT": "0"}
    env = {"NCCL_RUNTIME_CONNECT": "1"}
    assert not connect_at_init(env) and env == {"NCCL_RUNTIME_CONNECT": "1"}
