"""Process-group setup: torchrun's environment -> (rank, world size, device); gloo on CPU, nccl on CUDA."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed() -> Dist:
    """Plain `python` gives world size 1 and no process group; torchrun sets RANK/LOCAL_RANK/WORLD_SIZE."""
    world_size = world_size_from_env()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    return Dist(rank, local_rank, world_size, device)


def all_reduce_sum(*values: float, context: Dist) -> list[float]:
    """Sum scalars over ranks (float64, so token counts stay exact)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=context.device)
    if context.active:
        dist.all_reduce(tensor)
    return tensor.tolist()


def gather_floats(value: float, context: Dist) -> list[float]:
    """`value` of every rank, in rank order."""
    tensor = torch.tensor([value], dtype=torch.float64, device=context.device)
    if not context.active:
        return [value]
    gathered = [torch.zeros_like(tensor) for _ in range(context.world_size)]
    dist.all_gather(gathered, tensor)
    return [t.item() for t in gathered]


def computed_on_main(function, context: Dist):
    """function() run by the main rank only, its (picklable) result handed to every rank: for work every rank would
    repeat alike, such as hashing a checkpoint's files. Its exception is raised on the main rank and, as a
    RuntimeError that quotes it, on the others, so no rank waits for a result that will not come."""
    if not context.active:
        return function()
    shared = [None, None]  # result, error message
    error = None
    if context.is_main:
        try:
            shared[0] = function()
        except Exception as caught:  # noqa: BLE001 - whatever it is, the other ranks must hear of it
            error, shared[1] = caught, f"{type(caught).__name__}: {caught}"
    dist.broadcast_object_list(shared, src=0)
    if error is not None:
        raise error
    if shared[1] is not None:
        raise RuntimeError(f"rank 0 failed: {shared[1]}")
    return shared[0]


def barrier(context: Dist) -> None:
    if context.active:
        dist.barrier()


def shutdown(context: Dist, succeeded: bool = True) -> None:
    """Tear the process group down. After a success every rank first meets at a barrier and drops its garbage:
    a gloo rank that destroys the group while a peer still has collectives (or their work objects) in flight can
    die at exit with SIGABRT ("terminate called without an active exception") although training finished. After a
    failure there is no barrier, since a peer may never reach it."""
    if not (context.active and dist.is_initialized()):
        return  # one process: a group made for --fsdp is kept, so in-process callers can run again
    if succeeded:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()
