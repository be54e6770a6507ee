"""Data-parallel training on CuPy across GPUs: one process a GPU, started by ``torchrun``,
``mpirun`` or ``srun``; NCCL through ``cupyx.distributed``; gradients all-reduced in buckets
on a side stream under the backward.

    import ge2jit.distributed as dist
    group = dist.init()                                   # rank, GPU and NCCL from the env
    group.broadcast(params)                               # every replica starts equal
    reducer = dist.GradientAllReduce(group, [p.nbytes for p in params])
    ...   # backward: reducer.ready(i, grad_i) as each gradient is written
    reducer.wait()                                        # then the optimizer step

Without a launcher, ``launch_local(argv, n)`` starts ``argv`` as ``n`` processes on this host
with torchrun's variables; ``shard(rows, rank, world_size)`` is a rank's slice of a batch.

(PyTorch users take ``torch.nn.parallel.DistributedDataParallel`` over ``ge2jit.torch``
layers: their parameters are ordinary tensors.)
"""

from __future__ import annotations

from .buckets import BUCKET_BYTES, plan_buckets
from .environment import ProcessInfo, process_info
from .group import REDUCIBLE, GradientAllReduce, Group, init
from .launch import LocalRun, free_port, launch_local, local_environments, shard

__all__ = ["init", "Group", "GradientAllReduce", "ProcessInfo", "process_info", "plan_buckets",
           "BUCKET_BYTES", "REDUCIBLE", "launch_local", "LocalRun", "local_environments",
           "free_port", "shard"]
