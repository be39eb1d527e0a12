"""AdamW moments (galore-torch's defaults: eps=1e-6, bias correction on, decoupled decay after the step)."""

from __future__ import annotations

import math

import torch

from .base import PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update, check_betas, check_non_negative
from .realign import realign_dense


def adam_direction(state: dict, grad: torch.Tensor, beta1: float, beta2: float, eps: float) -> torch.Tensor:
    """Update the moments in place and return M / (√V + ε)."""
    if "exp_avg" not in state:
        state["exp_avg"] = torch.zeros_like(grad)
        state["exp_avg_sq"] = torch.zeros_like(grad)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    return exp_avg / exp_avg_sq.sqrt().add_(eps)


class AdamWBackend(Backend):
    name = "adamw"
    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0, "correct_bias": True}

    def validate(self, group):
        check_non_negative(group, "lr", "eps", "weight_decay")
        check_betas(group["betas"])

    def update(self, state, grad, group, param):
        beta1, beta2 = group["betas"]
        direction = adam_direction(state, grad, beta1, beta2, group["eps"])
        step_size = group["lr"]
        if group["correct_bias"]:
            step = state["step"]
            step_size *= math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        return Update(direction, step_size, group["lr"] * group["weight_decay"])

    def realign(self, state, projector, rule):
        if "exp_avg" in state:
            state["exp_avg"], state["exp_avg_sq"] = realign_dense(state["exp_avg"], state["exp_avg_sq"], projector, rule)


class GaLoreAdamW(LowRankOptimizer):
    """Drop-in for galore_torch.GaLoreAdamW: top-r SVD projector, moments kept as they are at a refresh."""

    backend = AdamWBackend()


class PlumageAdamW(LowRankOptimizer):
    """AdamW on PLUMAGE's unbiased sampled projection, moments realigned (M and V) at every refresh."""

    backend = AdamWBackend()
    class_defaults = PLUMAGE_DEFAULTS
