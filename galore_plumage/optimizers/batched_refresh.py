"""Refreshes decomposed together: the weights of one shape whose refresh falls on the same step (a model's q, k, v and
o projections share a shape, and without `stagger` every weight refreshes on the same steps) have their gradients'
singular vectors computed in one batched torch.linalg call instead of one call each.

A GPU runs a batched decomposition as one launch, where one weight at a time leaves it mostly idle on a model's
matrices. What each weight's refresh makes of its decomposition (GaLore's top r, PLUMAGE's draw), its checks and the
realignment of its moments are unchanged: the batch only hands each projector its decomposition (Projector.prepare), and
the projector's own refresh, in the optimizer's usual order, builds the basis from it.

Batched: weights of low-rank groups with refresh_batch > 1 and refresh_ema 0, held whole (not FSDP2-sharded), whose
projector builds bases from singular vectors (svd, plumage), stepped with their full gradient (not per-layer mode's
projected one), grouped by shape, dtype, device, projected side and solver, in calls of at most refresh_batch weights.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from ..projectors.base import compute_dtype
from ..projectors.spectrum import decompose_batch


def prepare_batched_refreshes(optimizer) -> int:
    """Decompose together the gradients of the weights whose refresh is due at this step (see the module's docstring)
    and hand each projector its decomposition. Returns the number of batched calls made."""
    due = defaultdict(list)
    for group in optimizer.param_groups:
        if "rank" not in group or group["refresh_batch"] < 2 or group["refresh_ema"] > 0:
            continue
        for param in group["params"]:
            grad = param.grad
            if grad is None or grad.dim() != 2 or not optimizer.held_whole(param):
                continue
            projector = optimizer.projector_for(param, group)
            step = optimizer.state[param].get("step", 0)
            if not projector.from_spectrum or not projector.due(step):
                continue
            modes = tuple(projector.ranks_for(grad.shape))
            key = (tuple(grad.shape), compute_dtype(grad), grad.device, modes, projector.solver_on(grad.device),
                   group["refresh_batch"])
            due[key].append((projector, grad, step))
    return sum(prepare_together(members, size) for (*_, size), members in due.items())


def prepare_together(members: list[tuple], size: int) -> int:
    """Decompose the gradients of `members` (projector, gradient, step: one shape, dtype, device, projected side and
    solver) in batched calls of at most `size`, and hand each projector its decomposition; a lone member is left to
    its own refresh. Returns the number of batched calls made."""
    projector, grad, _ = members[0]
    modes, dtype, solver = tuple(projector.ranks_for(grad.shape)), compute_dtype(grad), projector.solver_on(grad.device)
    calls = 0
    for start in range(0, len(members), size):
        chunk = members[start:start + size]
        if len(chunk) < 2:
            continue
        stack = torch.stack([grad.detach().to(dtype) for _, grad, _ in chunk])
        decompositions = decompose_batch(stack, modes, solver)
        calls += 1
        if decompositions is None:  # a member's gradient broke the call: each refresh decomposes its own
            continue
        for (projector, _, step), decomposition in zip(chunk, decompositions, strict=True):
            projector.prepare(decomposition, step)
    return calls
