"""SGD with momentum (torch.optim.SGD's buffer: M ← μ M + g, first step M = g), decoupled weight decay.

The paper's debiasing study: without a second moment, the bias of a top-r projection shows most plainly.
"""

from __future__ import annotations

import torch

from .base import PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update, check_non_negative
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
    """SGD-momentum on PLUMAGE's projection: its draws before every update as plumage_adafactor ran them in sessions
    42-80 (the plumage_* options: κ = 1, 1/p capped at 1, the complement on the 10 updates after a refresh) at GaLore's
    scale 0.25, the momentum realigned at a draw (rule "mv": the buffer is M).

    Until session 46 it kept the paper's estimator (SGD does not normalize before D⁻¹, so its step is not amplified as
    Adam's is). On the fair protocol under SGD momentum, five seeds at each of lr 0.05 and 0.07, that estimator trailed
    GaLore's recipe by 0.18 and 0.38 with 26x and 13x its seed spread (two seeds in five 0.25-1.2 nats behind), where
    the draws were level with it (-0.011 and -0.033, |t| <= 1.0) at 2-3x its spread (docs/results.md §3, session 46).
    Neither beats GaLore under SGD there; the paper's estimator is `preset="paper"` (PLUMAGE_PAPER). Its lr, 0.07, is
    the draws' best there unclipped (0.040 ahead of 0.05 over five seeds; 0.1 spiked on two of three, session 45);
    clipped at 1, as torchrun_main.py pretrains it since session 88, it takes 0.8 (optimizers.PRETRAIN_CLIPPED_LR)."""

    backend = SGDMomentumBackend()
    class_defaults = {**PLUMAGE_DEFAULTS, "scale": 0.25, "lr": 0.07}
