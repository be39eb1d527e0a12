"""AdamW moments (galore-torch's defaults: eps=1e-6, bias correction on, decoupled decay after the step)."""

from __future__ import annotations

import math

import torch

from .base import (
    PLUMAGE_ADAM_RECIPE,
    PLUMAGE_DEFAULTS,
    Backend,
    LowRankOptimizer,
    Pending,
    Update,
    check_betas,
    check_non_negative,
)
from .compiled_update import Compiled, compiled_moments_and_direction
from .moment_floor import bound_scale, floor_second_moment, floor_second_moments
from .realign import realign_dense


def moments(state: dict, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """state's M and V, created at zero (shaped as `grad`) on first use."""
    if "exp_avg" not in state:
        state["exp_avg"] = torch.zeros_like(grad)
        state["exp_avg_sq"] = torch.zeros_like(grad)
    return state["exp_avg"], state["exp_avg_sq"]


def advance_moments(state: dict, grad: torch.Tensor, beta1: float, beta2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """M ← β1 M + (1 − β1) G and V ← β2 V + (1 − β2) G², in place (created at zero on first use)."""
    exp_avg, exp_avg_sq = moments(state, grad)
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    return exp_avg, exp_avg_sq


def adam_direction(state: dict, grad: torch.Tensor, beta1: float, beta2: float, eps: float,
                   scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Update the moments in place and return M / (√V + ε), written over `scratch` (a tensor of the moments' shape and
    dtype that nothing else reads) when one is given.

    The denominator's buffer becomes the direction (torch.div with out= one of its inputs): one fresh moment-sized
    tensor a step instead of two, or none with a scratch (a fresh one of a few MiB may be new pages the kernel
    zeroes on first touch; the whole change measured 0.97-0.99x of a steady step, docs/results.md §1, session 24);
    the numbers are the same bits."""
    exp_avg, exp_avg_sq = advance_moments(state, grad, beta1, beta2)
    denominator = exp_avg_sq.sqrt() if scratch is None else torch.sqrt(exp_avg_sq, out=scratch)
    denominator.add_(eps)
    return torch.div(exp_avg, denominator, out=denominator)


def adam_directions_together(grads: list[torch.Tensor], exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                             beta1: float, beta2: float, eps: float) -> list[torch.Tensor]:
    """adam_direction of several weights in torch._foreach calls for all of them: M and V advanced in place, M / (√V
    + ε) returned. A function of tensors, which compile_update compiles (compiled_directions_together)."""
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denominators, eps)
    return torch._foreach_div(exp_avgs, denominators)


compiled_directions_together = Compiled(adam_directions_together, "AdamW's moments of the weights stepped together")


class AdamWBackend(Backend):
    name = "adamw"
    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0, "correct_bias": True}
    row_keys = ("exp_avg", "exp_avg_sq")
    moments_key = "exp_avg"

    def validate(self, group):
        check_non_negative(group, "lr", "eps", "weight_decay")
        check_betas(group["betas"])
        if group.get("v_floor") == "m2_corrected" and group.get("row_bias_correction"):
            raise ValueError("v_floor='m2_corrected' bounds V by the global bias correction, which "
                             "row_bias_correction=True replaces per row: drop one of them")

    def update(self, state, grad, group, param, rows=None):
        beta1, beta2 = group["betas"]
        decay = group["lr"] * group["weight_decay"]
        floor = group.get("v_floor", "none")  # a group built by hand (not by an optimizer) may lack the key
        if group.get("compile_update"):
            return Update(_compiled_direction(state, grad, group, rows is not None and floor != "none"),
                          _step_size(group, state["step"]), decay)
        scratch = None  # the floor's M², free once V is floored: the direction is written over it
        if rows is not None and floor != "none":  # a low-rank weight (the floor is a low-rank group's option)
            scratch = floor_second_moment(state, _floor_rule(group), beta1, beta2, group.get("v_floor_horizon"))
        if group.get("row_bias_correction") and rows is not None and group["correct_bias"]:
            return Update(row_corrected_direction(state, grad, rows, beta1, beta2, group["eps"]), group["lr"], decay)
        direction = adam_direction(state, grad, beta1, beta2, group["eps"], scratch)
        return Update(direction, _step_size(group, state["step"]), decay)

    def update_together(self, states, grads, group, params, rows):
        """update() of several low-rank weights of one group, each with its moments and no row_bias_correction, in a
        few torch._foreach calls for all of them (the same arithmetic, so the same numbers), compiled with
        compile_update (the floor, when on, stays eager)."""
        updates, function, args = self.pending_together(states, group)
        together = compiled_directions_together if group.get("compile_update") else function
        return [update._replace(direction=direction)
                for update, direction in zip(updates, together(grads, *args), strict=True)]

    def pending_together(self, states, group):
        """The floor (when on) applied, eager; the moments' advance and the directions are adam_directions_together's
        to run, with the step sizes and decay already known."""
        beta1, beta2 = group["betas"]
        if group["v_floor"] != "none":
            floor_second_moments(states, _floor_rule(group), beta1, beta2, group["v_floor_horizon"])
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        decay = group["lr"] * group["weight_decay"]
        steps = [state["step"] for state in states]
        step_sizes = {step: _step_size(group, step) for step in set(steps)}  # one bias correction per step count
        updates = [Update(None, step_sizes[step], decay) for step in steps]
        return Pending(updates, adam_directions_together, (exp_avgs, exp_avg_sqs, beta1, beta2, group["eps"]))

    def realign(self, state, projector, rule):
        if "exp_avg" in state:
            state["exp_avg"], state["exp_avg_sq"] = realign_dense(state["exp_avg"], state["exp_avg_sq"], projector, rule)
        if "row_bias1" in state and rule != "none":
            # a row's bias-correction weight travels like its moment: what a new row inherits from the old ones
            (mode,) = projector.factors  # one-sided: the mode the basis moved along
            state["row_bias1"] = _along_rows(projector.transport(_as_rows(state["row_bias1"], mode), squared=True))
            if rule != "m":
                state["row_bias2"] = _along_rows(projector.transport(_as_rows(state["row_bias2"], mode), squared=True))


def _compiled_direction(state: dict, grad: torch.Tensor, group: dict, floored: bool) -> torch.Tensor:
    """adam_direction (after the group's v_floor when `floored`) as one compiled kernel (compile_update)."""
    beta1, beta2 = group["betas"]
    # as floor_second_moment: no floor before the first update (its moments are made at zero, which no floor moves)
    floored = floored and "exp_avg" in state
    floor_scale = (bound_scale(_floor_rule(group), state["step"], beta1, beta2, group["v_floor_horizon"]) if floored
                   else None)
    exp_avg, exp_avg_sq = moments(state, grad)
    return compiled_moments_and_direction(exp_avg, exp_avg_sq, grad, beta1, beta2, group["eps"], floor_scale)


def _floor_rule(group: dict) -> str:
    """The group's v_floor as applied: without bias correction the corrected bound is the raw one."""
    return "m2" if not group["correct_bias"] else group["v_floor"]


def _step_size(group: dict, step: int) -> float:
    """The lr, bias-corrected for `step` updates unless correct_bias is off."""
    if not group["correct_bias"]:
        return group["lr"]
    beta1, beta2 = group["betas"]
    return group["lr"] * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)


def row_corrected_direction(state: dict, grad: torch.Tensor, rows: int, beta1: float, beta2: float,
                            eps: float) -> torch.Tensor:
    """Adam's direction with each basis row bias-corrected by its own weight c_i instead of the global 1 − β^t.

    c ← β c + (1 − β) every step, and c ← (B∘B) c at a refresh, so a row of the old basis keeps c = 1 − β^t while a
    direction that just entered (near-zero transported M and V) starts from c ≈ 0: its first direction is
    m̂/√v̂ ≈ ±1 instead of (1 − β1)/√(1 − β2) ≈ 3.2 with the global correction.
    """
    if "row_bias1" not in state:
        state["row_bias1"] = grad.new_zeros(grad.shape[rows])
        state["row_bias2"] = grad.new_zeros(grad.shape[rows])
    bias1, bias2 = state["row_bias1"], state["row_bias2"]
    bias1.mul_(beta1).add_(1.0 - beta1)
    bias2.mul_(beta2).add_(1.0 - beta2)
    exp_avg, exp_avg_sq = advance_moments(state, grad, beta1, beta2)
    shape = [1] * grad.dim()
    shape[rows] = -1
    tiny = torch.finfo(bias1.dtype).tiny
    m_hat = exp_avg / bias1.clamp_min(tiny).view(shape)
    v_hat = exp_avg_sq / bias2.clamp_min(tiny).view(shape)
    return m_hat / v_hat.sqrt().add_(eps)


def _as_rows(vector: torch.Tensor, mode: int) -> torch.Tensor:
    """A per-row vector as a 2-D tensor whose axis `mode` is the rows, so the projector can transport it."""
    return vector.view(-1, 1) if mode == 0 else vector.view(1, -1)


def _along_rows(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.reshape(-1)


class GaLoreAdamW(LowRankOptimizer):
    """Drop-in for galore_torch.GaLoreAdamW: top-r SVD projector, moments kept as they are at a refresh."""

    backend = AdamWBackend()


class PlumageAdamW(LowRankOptimizer):
    """The library's recommended low-rank AdamW: the setting the fair protocols chose (docs/results.md §3).

    Defaults since session 17: GaLore's top-r basis (projector="svd", moments kept at a refresh, realign="none") with
    the floor V ← max(V, M²) before each low-rank update (v_floor="m2": in effect a slow warm-up, by √(1 − β2^t), of
    the low-rank weights' step), GaLore's recipe scale=0.25 and lr=1e-2, no complement. On llama_tiny it is ahead of
    GaLore's recipe and of PLUMAGE's draws at 600 and at 2000 updates.
    The presets (optimizers/presets.py) replace these defaults: PLUMAGE's draws, the default of sessions 14-16 and the
    best PLUMAGE-projector setting measured, are **PLUMAGE_SAMPLED; the paper's exact estimator is lr=1e-3,
    **PLUMAGE_PAPER."""

    backend = AdamWBackend()
    class_defaults = {**PLUMAGE_DEFAULTS, **PLUMAGE_ADAM_RECIPE}
