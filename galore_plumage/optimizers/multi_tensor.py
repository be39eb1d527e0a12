"""foreach: the steady updates of a group's low-rank weights taken together, as torch.optim's multi-tensor Adam does.

One weight's steady update is two matmuls (project, add back) around a dozen elementwise kernels on its r-row moments,
and Fira's complement (residual.py) some thirty more on per-column norms. On a GPU, at small and medium sizes,
launching those kernels one weight at a time costs more than running them; with `foreach` the moments of every weight
of the group that takes a steady update this step advance in a handful of torch._foreach calls for all of them, the
complement's weights are computed on all of their columns at once (residual.complement_weights_together), and the
decoupled decay of their weights is one more call. The matmuls and the reductions stay one per weight, and so does
everything a weight does on its own (a refresh, a draw).

Taken together: weights of a low-rank group with foreach on, on a backend with `update_together` (AdamW), held whole
(not FSDP2-sharded), stepped with their full gradient (not per-layer mode), whose moments exist, with no refresh due,
the complement's limiter holding a reference where the complement moves this update, PLUMAGE's sampled rows stepping
as the backend steps them (sampled_step 'adaptive'), and no row_bias_correction or refresh_ema; when no step observer
is attached. Every other weight steps one by one. The arithmetic is the one-by-one path's, op for op, so the weights
and moments are the same (tests/optimizers/test_multi_tensor.py, bit for bit on CPU).
"""

from __future__ import annotations

import torch

from ..projectors.base import Outside
from .residual import complement_weights_together


def foreach_on(group: dict, params: list[torch.Tensor]) -> bool:
    """The group's foreach, None resolved as torch.optim resolves it: on for weights on a GPU (where launches cost;
    on a CPU the batched calls were 3-6 % slower, docs/step_time.md), unless the group fuses each update instead."""
    if group["foreach"] is not None:
        return group["foreach"]
    return bool(params) and params[0].device.type == "cuda" and not group.get("compile_update")


def steady_together(optimizer, group: dict, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The weights of `group` (among `params`, which have gradients) whose update at this step is taken together; none
    when fewer than two qualify (one weight gains nothing)."""
    if ("rank" not in group or not foreach_on(group, params) or optimizer.step_observers or group["row_bias_correction"]
            or group["refresh_ema"] > 0 or getattr(optimizer.backend, "update_together", None) is None):
        return []
    chosen = []
    for param in params:
        state = optimizer.state[param]
        if "exp_avg" not in state or not optimizer.held_whole(param):  # AdamW's moments are made by its first update
            continue
        projector = optimizer.projector_for(param, group)
        step = state["step"]
        # the complement's first update has no reference for its limiter yet (residual.complement_weights)
        complement = optimizer.residual_now(group, projector, step) != "none"
        if (not projector.ready or projector.due(step) or (complement and "residual_norm" not in state)
                or (group["sampled_step"] != "adaptive" and projector.inv_p is not None)):
            continue
        chosen.append(param)
    return chosen if len(chosen) > 1 else []


def step_together(optimizer, group: dict, params: list[torch.Tensor], after) -> None:
    """One steady update of each of `params` (chosen by steady_together): projected one by one, moments advanced
    together, the complement's weights computed together for those it moves this update, added back one by one,
    decayed together; then after(backend, state, group, projector) for each weight (the optimizer's draw when one is
    due, base.resample_if_due)."""
    backend = optimizer.backend
    projectors = [optimizer.projector_for(param, group) for param in params]
    states = [optimizer.state[param] for param in params]
    low_grads = [projector.project(param.grad) for projector, param in zip(projectors, params, strict=True)]
    moved = [optimizer.residual_now(group, projector, state["step"]) != "none"
             for projector, state in zip(projectors, states, strict=True)]
    for state in states:
        state["step"] += 1
    updates = backend.update_together(states, low_grads, group)
    outside = [None] * len(params)
    if any(moved):
        chosen = [k for k, move in enumerate(moved) if move]
        phis = complement_weights_together(  # update_together's updates share one unit (AdamW's normalized step: 1)
            [updates[k].direction for k in chosen], [low_grads[k] for k in chosen], [params[k].grad for k in chosen],
            [next(iter(projectors[k].factors)) for k in chosen], [states[k] for k in chosen],
            unit=updates[chosen[0]].unit, cap=group["residual_cap"])
        for k, phi in zip(chosen, phis, strict=True):  # as base.apply_update moves the complement
            outside[k] = Outside(params[k].grad, low_grads[k], phi,
                                 -abs(updates[k].step_size) * group["residual_scale"])
    decay = updates[0].decay  # the group's lr × weight_decay, the same for every weight
    if backend.decay_first and decay:
        torch._foreach_add_(params, params, alpha=-decay)
    for param, projector, update, rest in zip(params, projectors, updates, outside, strict=True):
        projector.add_back(param, update.direction, -update.step_size, rest)
    if not backend.decay_first and decay:
        torch._foreach_add_(params, params, alpha=-decay)
    for projector, state in zip(projectors, states, strict=True):
        after(backend, state, group, projector)
