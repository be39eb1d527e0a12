"""SGD with momentum (torch.optim.SGD's buffer: M ← μ M + g, first step M = g), decoupled weight decay.

The paper's debiasing study: without a second moment, the bias of a top-r projection shows most plainly.
"""

from __future__ import annotations

import torch

from .base import PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update, check_non_negative
from .options import option_defaults
from .realign import realign_dense


class SGDMomentumBackend(Backend):
    name = "sgdm"
    row_keys = ("momentum_buffer",)
    moments_key = "momentum_buffer"
    defaults = {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.0}

    def validate(self, group):
        check_non_negative(group, "lr", "weight_decay")
        if not 0.0 <= group["momentum"] < 1.0:
            raise ValueError(f"Invalid momentum value: {group['momentum']} - should be in [0.0, 1.0)")

    def update(self, state, grad, group, param, rows=None):
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = grad.clone()
        else:
            state["momentum_buffer"].mul_(group["momentum"]).add_(grad)
        return Update(state["momentum_buffer"], group["lr"], group["lr"] * group["weight_decay"])

    def update_together(self, states, grads, group, params, rows):
        """update() of several weights whose buffers exist, in two torch._foreach calls (the same numbers)."""
        buffers = [state["momentum_buffer"] for state in states]
        torch._foreach_mul_(buffers, group["momentum"])
        torch._foreach_add_(buffers, grads)
        return [Update(buffer, group["lr"], group["lr"] * group["weight_decay"]) for buffer in buffers]

    def realign(self, state, projector, rule):
        if "momentum_buffer" in state:
            state["momentum_buffer"], _ = realign_dense(state["momentum_buffer"], None, projector, rule)


class GaLoreSGDM(LowRankOptimizer):
    """SGD-momentum on GaLore's top-r projection."""

    backend = SGDMomentumBackend()


class PlumageSGDM(LowRankOptimizer):
    """SGD-momentum on PLUMAGE's projection; the momentum is realigned at refreshes (rule "m")."""

    backend = SGDMomentumBackend()
    # SGD momentum does not normalize before D⁻¹, so the paper's step is not amplified: it keeps the paper's estimator
    class_defaults = {**PLUMAGE_DEFAULTS, **option_defaults("plumage", normalizes=False), "realign": "m"}
