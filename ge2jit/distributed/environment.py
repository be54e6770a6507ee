"""Which process of a job this is: rank, world size, local rank and the rendezvous address,
read from what the launcher sets (``torchrun``, Open MPI's or MPICH's ``mpirun``, Slurm's
``srun``). Pure Python: no GPU, no CuPy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ArgumentValueError

#: (launcher, rank, world size, local rank) variables, in the order they are looked for
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)
DEFAULT_ADDR = "127.0.0.1"
#: torchrun's default MASTER_PORT; the CuPy rendezvous listens one above it (torchrun's own
#: store holds MASTER_PORT itself)
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in a job. ``launcher`` is "torchrun", "openmpi", "mpich",
    "slurm" or "none" (one process: rank 0 of 1)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str

    @property
    def rendezvous_port(self) -> int:
        """The port rank 0's CuPy rendezvous listens on: ``master_port + 1``."""
        return self.master_port + 1


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None:
        if default is None:
            raise ArgumentValueError(f"{name}: expected an integer in the environment, "
                                     "got nothing")
        return default
    try:
        return int(text.strip())
    except ValueError:
        raise ArgumentValueError(f"{name}: expected an integer, got {text!r}") from None


def process_info(env: Mapping[str, str] | None = None) -> ProcessInfo:
    """This process's rank, world size and local rank from the launcher's variables
    (``env``: default ``os.environ``): torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``,
    Open MPI's ``OMPI_COMM_WORLD_*``, MPICH's ``PMI_RANK``/``PMI_SIZE``/``MPI_LOCALRANKID``,
    Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``, the first found; without
    any, one process. The rendezvous is ``MASTER_ADDR`` (default 127.0.0.1, one host) and
    ``MASTER_PORT`` (default 29500), which every launcher's job must agree on.

    Raises:
        ArgumentValueError: a variable that is not an integer, a rank outside the world, a
            world size below 1, or a rank without its world size; the message names it.
    """
    env = os.environ if env is None else env
    found = next((names for names in LAUNCHERS if names[1] in env or names[2] in env), None)
    if found is None:
        launcher, rank, size, local = "none", 0, 1, 0
    else:
        launcher, rank_var, size_var, local_var = found
        rank, size = _int(env, rank_var), _int(env, size_var)
        if size < 1:
            raise ArgumentValueError(f"{size_var}: expected a world size of at least 1, "
                                     f"got {size}")
        if not 0 <= rank < size:
            raise ArgumentValueError(f"{rank_var}: expected a rank in [0, {size}) "
                                     f"({size_var} is {size}), got {rank}")
        local = _int(env, local_var, rank)
        if local < 0:
            raise ArgumentValueError(f"{local_var}: expected a local rank of at least 0, "
                                     f"got {local}")
    port = _int(env, "MASTER_PORT", DEFAULT_PORT)
    if not 1 <= port < 65535:
        raise ArgumentValueError(f"MASTER_PORT: expected a port in [1, 65535) (the "
                                 f"rendezvous uses it and the next), got {port}")
    addr = env.get("MASTER_ADDR", DEFAULT_ADDR).strip() or DEFAULT_ADDR
    return ProcessInfo(rank, size, local, addr, port, launcher)
