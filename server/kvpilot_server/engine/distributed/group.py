"""A tensor-parallel group as one rank sees it: its rank, the groups its collectives use, and
how it joins them.

All ranks run on one node (one pod): rank 0 listens on the loopback interface and ranks
1..size-1 (distributed/workers.py starts them) join it. The all-reduces that sum the
row-parallel projections' partial outputs (distributed/sharding.py says which) go over NCCL on
CUDA; step plans and start-up agreements always go over gloo, on the CPU.
"""

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # the torch.distributed group of the all-reduces (NCCL on CUDA)
    control: Any = None  # a gloo group: step plans and start-up agreements

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            x = x.contiguous()  # the split product hands back a transposed view
            dist.all_reduce(x, group=self.group)
        return x


SINGLE = TensorParallel()


# A worker waits in a broadcast for rank 0's next step for as long as the server stays idle:
# the group must not time out. A dead peer is noticed by the supervision instead
# (engine/distributed/workers.py), within a fraction of a second.
_IDLE_TIMEOUT = timedelta(days=365)


def join(rank: int, size: int, port: int, device: torch.device) -> TensorParallel:
    """Join the group of `size` ranks whose rank 0 listens on 127.0.0.1:port. NCCL carries the
    all-reduces on CUDA; plans and start-up agreements always travel over gloo, on the CPU, so
    pickled plans never wait for a GPU."""
    # One pod, one node: rendezvous and gloo's traffic stay on the loopback interface.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=_IDLE_TIMEOUT,
    )
    world = dist.group.WORLD
    control = world if backend == "gloo" else dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
    return TensorParallel(rank, size, world, control)


def agree_min(value: int, tp: TensorParallel) -> int:
    """The smallest of every rank's value (e.g. KV blocks: each rank must hold every block)."""
    if tp.size == 1:
        return value
    found = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(found, op=dist.ReduceOp.MIN, group=tp.control)
    return int(found.item())
