"""Per-layer mode: each weight steps inside its post-accumulate-grad hook, so full gradients never pile up.

galore-torch and HF step at every backward, which is wrong under gradient accumulation. Here a weight
steps only at the accumulation boundary. Between micro-steps, when its projection is fixed (no refresh
due), its gradient is projected at once and summed in the low-rank space — project is linear, so the sum
of projections equals the projection of the sum — and the full gradient is freed. When a refresh is due
the full gradient is kept until the boundary, because the new basis is built from all of it; with the complement
(residual='norm_matched') it is kept at every update, which reads it (a warning says so).

Global-norm gradient clipping needs every gradient at once, which this mode never has: it is refused.
"""

from __future__ import annotations

import warnings

import torch

from ..projectors import projector_spec
from .base import LowRankOptimizer
from .residual import residual_rule


def inner_optimizer(optimizer):
    """The optimizer that holds the groups and state: the one a wrapper (LayerwiseOptimizer, or anything else with
    an `optimizer` attribute, as accelerate's) holds, else the optimizer itself."""
    return getattr(optimizer, "optimizer", optimizer)


class LayerwiseOptimizer:
    """Wraps one LowRankOptimizer (which keeps all the state) and drives it from gradient hooks.

    `step()` and `zero_grad()` are no-ops kept so ordinary training loops run unchanged; attach LR
    schedulers to `.optimizer`.
    """

    def __init__(self, optimizer: LowRankOptimizer, accumulation_steps: int = 1):
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        low_rank = [g for g in optimizer.param_groups if "rank" in g]
        reasons = []  # what reads each low-rank weight's full gradient at every update
        if any(residual_rule(g, projector_spec(g["projector"]).cls) != "none" for g in low_rank):
            reasons.append("the complement (residual='norm_matched', plumage_*'s default) reads it: pass residual='none' "
                           "(--residual none)")
        if any(g["refresh_ema"] > 0 for g in low_rank):
            reasons.append("refresh_ema averages it at every step: pass refresh_ema=0")
        if accumulation_steps > 1 and reasons:
            warnings.warn("per-layer mode with gradient accumulation keeps each low-rank weight's full gradient until "
                          f"its update, because {'; and '.join(reasons)}, to sum projected gradients instead and free "
                          "the full ones at once", stacklevel=2)
        self._micro_steps: dict[torch.Tensor, int] = {}
        self._handles = [
            param.register_post_accumulate_grad_hook(self._hook_for(index))
            for index, group in enumerate(optimizer.param_groups)
            for param in group["params"]
        ]

    @staticmethod
    def refuse_clipping(max_norm: float) -> None:
        if max_norm and max_norm > 0:
            raise ValueError(
                f"gradient clipping (max norm {max_norm}) cannot apply in per-layer mode: each weight steps as "
                "soon as its own gradient is ready, so no global norm exists; set it to 0 or drop '_per_layer'"
            )

    def _hook_for(self, group_index: int):
        # look the group up at each call: load_state_dict replaces the group dicts, and an LR scheduler then
        # sets the lr on the new ones
        def hook(param: torch.Tensor) -> None:
            with torch.no_grad():
                self._on_grad(param, self.optimizer.param_groups[group_index])

        return hook

    def _on_grad(self, param: torch.Tensor, group: dict) -> None:
        optimizer, state = self.optimizer, self.optimizer.state[param]
        count = self._micro_steps.get(param, 0) + 1
        if count < self.accumulation_steps:
            self._micro_steps[param] = count
            if not optimizer.needs_full_grad(param, group):
                low = optimizer.projector_for(param, group).project(param.grad)
                state["grad_accum"] = low if "grad_accum" not in state else state["grad_accum"].add_(low)
                param.grad = None
            return
        self._micro_steps[param] = 0
        accumulated = state.pop("grad_accum", None)
        if accumulated is not None:
            low = accumulated.add_(optimizer.projector_for(param, group).project(param.grad))
            optimizer.step_param(param, group, low_grad=low)
        else:
            optimizer.step_param(param, group, grad=param.grad)
        param.grad = None

    # ----------------------------------------------------------------- the Optimizer-like surface
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def step(self, closure=None):
        """The weights already stepped in their hooks; this only runs the closure, if any."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients are freed by the hooks; clearing here would drop a partial accumulation."""

    def state_dict(self) -> dict:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return {
            "optimizer": self.optimizer.state_dict(),
            "micro_steps": [self._micro_steps.get(p, 0) for p in params],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self._micro_steps = dict(zip(params, state_dict["micro_steps"], strict=True))

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
