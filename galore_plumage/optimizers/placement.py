"""Where a weight lives, as the optimizer's one step sees it: whole in this process, or split by rows over ranks.

LowRankOptimizer.step_param is written once. The few things that differ for a weight that FSDP2 shards are asked of a
placement object, so the sharded path (optimizers/sharded.py, class Sharding) supplies its shard-local tensors, its
all-reduced sums and its Gram refresh to the same step instead of repeating it:

    local(t)                       the tensor this process steps (a DTensor's own rows)
    backend(backend, param)        the backend for it (Adafactor's whole-tensor reductions summed over ranks)
    group_for(group, backend, param, local)   the group as the backend should see it (8-bit decides on the whole size)
    total_for(param)               a function summing a partial sum over the weight's ranks (norm_matched's norms)
    projector_options(param, group)   overrides of the projector's options (a shard is projected on the right)
    refresh(projector, grad, param, step)     a new basis from the local gradient (a Gram all-reduce when sharded)
    all_finite(grad, param)        whether the whole gradient is finite (the same answer on every rank)
    check_step(grad, low_grad)     refuses what the placement cannot step (sharded: projected gradients)

`Whole` below is the identity for all of them.
"""

from __future__ import annotations

import torch


def _unchanged(value: torch.Tensor) -> torch.Tensor:
    return value


class Whole:
    """A weight held whole by this process."""

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def backend(self, backend, param: torch.Tensor):
        return backend

    def group_for(self, group: dict, backend, param: torch.Tensor, local: torch.Tensor) -> dict:
        return group

    def total_for(self, param: torch.Tensor):
        return _unchanged

    def projector_options(self, param: torch.Tensor, group: dict) -> dict:
        return {}

    def refresh(self, projector, grad: torch.Tensor, param: torch.Tensor, step: int) -> bool:
        return projector.refresh(grad, step)

    def all_finite(self, grad: torch.Tensor, param: torch.Tensor) -> bool:
        return bool(torch.isfinite(grad).all())

    def check_step(self, grad: torch.Tensor | None, low_grad: torch.Tensor | None) -> None:
        return None


WHOLE = Whole()
