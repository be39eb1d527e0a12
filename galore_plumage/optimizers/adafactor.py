"""Adafactor (galore-torch / transformers semantics): factored second moment, optional relative step.

The step size is computed per parameter: with relative_step it is min(1e-2, 1/√t) (or 1e-6·t with
warmup_init), times max(eps₂, RMS(W)) when scale_parameter; otherwise the group's lr. Decay is applied
before the update with that step size, as galore-torch does.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..projectors import projector_spec
from .base import PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update
from .compiled_update import Compiled, require_foreach
from .multi_tensor import runs
from .realign import realign_dense, realign_factored


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.norm(2) / (tensor.numel() ** 0.5)


def _inverse_sqrt_factored(row: torch.Tensor, col: torch.Tensor, row_mean: torch.Tensor) -> torch.Tensor:
    """1/√V̂ for V̂ = row ⊗ col / mean(row)."""
    r_factor = (row / row_mean).rsqrt_().unsqueeze(-1)
    c_factor = col.unsqueeze(-2).rsqrt()
    return torch.mul(r_factor, c_factor)


def adafactor_step_size(group: dict, step: int, rms: float) -> float:
    step_size = group["lr"]
    if group["relative_step"]:
        min_step = 1e-6 * step if group["warmup_init"] else 1e-2
        step_size = min(min_step, 1.0 / math.sqrt(step))
    scale = max(group["eps"][1], rms) if group["scale_parameter"] else 1.0
    return scale * step_size


def factored_directions_together(grads: list[torch.Tensor], row_factors: list[torch.Tensor],
                                 col_factors: list[torch.Tensor], beta2t: float, eps: float,
                                 clip_threshold: float) -> list[torch.Tensor]:
    """update()'s factored step of several matrices sharing β2ₜ (their step count), before its step size: the factors'
    EMAs advanced in place, then G / √V̂ clipped to RMS <= clip_threshold, in torch._foreach calls for all of them
    (the row and column means, the outer product of the factors and the clipping division one per weight). A
    function of tensors, which compile_update compiles (compiled_directions_together). Whole tensors' means: a
    row-sharded weight (ShardedAdafactor, whose means sum over ranks) steps one by one."""
    squares = torch._foreach_pow(grads, 2)
    torch._foreach_add_(squares, eps)
    for factors, means in ((row_factors, [square.mean(dim=-1) for square in squares]),
                           (col_factors, [_mean_over_rows(square) for square in squares])):
        if torch.compiler.is_compiling():  # torch.compile specializes a _foreach call's float (β2ₜ: new each step)
            for factor, mean in zip(factors, means, strict=True):
                factor.mul_(beta2t).add_(mean * (1.0 - beta2t))
        else:
            torch._foreach_mul_(factors, beta2t)
            torch._foreach_add_(factors, means, alpha=1.0 - beta2t)
    row_scaled = torch._foreach_div(row_factors, [_mean_of_row_factor(row) for row in row_factors])
    torch._foreach_rsqrt_(row_scaled)
    col_scaled = torch._foreach_rsqrt(col_factors)
    updates = [torch.mul(row.unsqueeze(-1), col.unsqueeze(-2)) for row, col in zip(row_scaled, col_scaled, strict=True)]
    torch._foreach_mul_(updates, grads)
    clips = torch._foreach_div(torch._foreach_norm(updates), [update.numel() ** 0.5 for update in updates])
    torch._foreach_div_(clips, clip_threshold)
    torch._foreach_clamp_min_(clips, 1.0)
    for update, clip in zip(updates, clips, strict=True):
        update.div_(clip)
    return updates


compiled_directions_together = Compiled(factored_directions_together, "Adafactor's factored step of the weights "
                                                                       "stepped together")


def _age_corrected(state: dict, row: torch.Tensor, col: torch.Tensor, rows: int,
                   beta2t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors with the basis's one (the row factor if `rows` is 0, the column factor if 1) divided entry by entry
    by each basis direction's own weight c ← β2ₜ c + (1 − β2ₜ) (row_bias_correction; c is carried like its factor at
    a refresh, realign). Adafactor's β2ₜ is 0 on its first update, so c = 1 for every direction in the basis since:
    the plain estimate. A direction that entered at a draw has its factor entry carried as 0, so its next V̂ would be
    (1 − β2ₜ) times its mean square and it would move t^0.4 times as far as a settled one (16x at update 1000), and
    the update clip would shrink every direction's step with it; with c = 1 − β2ₜ it reads its own mean square."""
    if "row_bias2" not in state:  # factors from before the option was on are settled: c = 1 (the next line keeps it)
        state["row_bias2"] = torch.ones_like(col if rows else row)
    weight = state["row_bias2"].mul_(beta2t).add_(1.0 - beta2t)
    corrected = (col if rows else row) / weight.clamp_min(torch.finfo(weight.dtype).tiny)
    return (row, corrected) if rows else (corrected, col)


def _mean_over_rows(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.mean(dim=-2)


def _mean_of_row_factor(row: torch.Tensor) -> torch.Tensor:
    return row.mean(dim=-1, keepdim=True)


class AdafactorBackend(Backend):
    """The three reductions that span a whole tensor (RMS, the mean over rows, the mean of the row factor) are
    methods, so a row-sharded variant (ShardedAdafactor, for FSDP2) can sum them over ranks; the rest is elementwise
    or along the last dimension, which a dim-0 shard holds whole."""

    name = "adafactor"
    decay_first = True
    row_keys = ("exp_avg", "exp_avg_sq_row", "exp_avg_sq")  # exp_avg_sq_col, a mean over rows, is the same on all
    moments_key = "RMS"
    defaults = {
        "lr": None,
        "eps": (1e-30, 1e-3),
        "clip_threshold": 1.0,
        "decay_rate": -0.8,
        "beta1": None,
        "weight_decay": 0.0,
        "scale_parameter": True,
        "relative_step": True,
        "warmup_init": False,
    }

    def validate(self, group):
        if group["lr"] is not None and group["relative_step"]:
            raise ValueError(f"Cannot combine manual lr={group['lr']} and relative_step=True; pass relative_step=False")
        if group["lr"] is None and not group["relative_step"]:
            raise ValueError("Adafactor needs an lr when relative_step=False")
        if group["warmup_init"] and not group["relative_step"]:
            raise ValueError("warmup_init=True requires relative_step=True")
        if group["lr"] is not None and group["lr"] < 0:
            raise ValueError(f"Invalid learning rate: {group['lr']} - should be >= 0.0")
        if group["beta1"] is not None and not 0.0 <= group["beta1"] < 1.0:
            raise ValueError(f"Invalid beta1: {group['beta1']} - should be in [0.0, 1.0) or None")
        require_foreach(group, "adafactor", "the factored step and the complement's arithmetic")
        if "rank" in group and group["realign"] in ("mv", "mv_meansplit") and projector_spec(group["projector"]).tensors:
            for param in group["params"]:  # else realign_factored fails at the second refresh, mid-run
                if param.dim() > 2:
                    raise ValueError(
                        f"realign={group['realign']!r} transports Adafactor's factored second moment exactly only "
                        f"for 2-D weights, got shape {tuple(param.shape)}: use realign='m' or 'none' for it"
                    )

    def update(self, state, grad, group, param, rows=None):
        grad = grad.float()
        factored = grad.dim() >= 2
        if "RMS" not in state:
            if group["beta1"] is not None:
                state["exp_avg"] = torch.zeros_like(grad)
            if factored:
                state["exp_avg_sq_row"] = torch.zeros(grad.shape[:-1], dtype=grad.dtype, device=grad.device)
                state["exp_avg_sq_col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:], dtype=grad.dtype, device=grad.device)
            else:
                state["exp_avg_sq"] = torch.zeros_like(grad)
        step = state["step"]
        if group["scale_parameter"] or "RMS" not in state:  # .item() syncs a GPU: only pay it when the RMS is used
            state["RMS"] = self._rms(param.float()).item()
        step_size = adafactor_step_size(group, step, state["RMS"])
        beta2t = 1.0 - math.pow(step, group["decay_rate"])

        update = grad**2 + group["eps"][0]
        if factored:
            row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
            col.mul_(beta2t).add_(self._mean_over_rows(update), alpha=1.0 - beta2t)
            if group.get("row_bias_correction") and rows is not None:
                row, col = _age_corrected(state, row, col, rows, beta2t)
            else:  # switched off since a checkpoint: realign goes back to the plain transport (the column rescaled)
                state.pop("row_bias2", None)
            update = _inverse_sqrt_factored(row, col, self._mean_of_row_factor(row)).mul_(grad)
        else:
            state["exp_avg_sq"].mul_(beta2t).add_(update, alpha=1.0 - beta2t)
            update = state["exp_avg_sq"].rsqrt().mul_(grad)
        update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        if step_size == 0:
            # lr 0 (a linear warm-up's first update) moves nothing and adds nothing to the momentum, but the limiters
            # of the complement and the sampled rows take their reference from this update's size per unit of the
            # step (Update.unit): a zero one would limit nothing on the next update. So return the unscaled step.
            if group["beta1"] is not None:
                state["exp_avg"].mul_(group["beta1"])
            return Update(update, 0.0, 0.0)
        update.mul_(step_size)
        if group["beta1"] is not None:
            state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
            update = state["exp_avg"]
        # the step carries step_size (the lr, or Adafactor's relative step): per unit of it for the limiters
        return Update(update, 1.0, group["weight_decay"] * step_size, unit=step_size)

    def update_together(self, states, grads, group, params, rows):
        """update() of several factored low-rank weights whose moments exist, the same arithmetic op for op: the
        elementwise steps in torch._foreach calls for all of them (factored_directions_together, once per run of
        weights sharing a step count, compiled with compile_update; each weight's step size as a list of scalars),
        the reductions along one axis (row and column means, the outer product of the factors, the clipping division)
        one per weight, and the parameters' RMS, where each update reads it, read back in one transfer instead of one
        per weight. One weight at a time where a step size is 0 (a warm-up's lr 0: update() keeps that update's
        unscaled step) or a weight is not a matrix."""
        if any(grad.dim() != 2 for grad in grads):
            return super().update_together(states, grads, group, params, rows)
        grads = [grad.float() for grad in grads]
        for state in states:  # a group steps together only without row_bias_correction: as update(), drop its weights
            state.pop("row_bias2", None)
        measured = [k for k, state in enumerate(states) if group["scale_parameter"] or "RMS" not in state]
        if measured:  # one read-back for all (update(): an .item() each)
            norms = torch._foreach_norm([params[k].float() for k in measured])
            sizes = torch._foreach_div(norms, [params[k].numel() ** 0.5 for k in measured])  # as _rms divides
            for k, rms in zip(measured, torch.stack(sizes).tolist(), strict=True):
                states[k]["RMS"] = rms
        step_sizes = [adafactor_step_size(group, state["step"], state["RMS"]) for state in states]
        if 0 in step_sizes:
            return super().update_together(states, grads, group, params, rows)
        beta2ts = [1.0 - math.pow(state["step"], group["decay_rate"]) for state in states]
        row_factors, col_factors = [s["exp_avg_sq_row"] for s in states], [s["exp_avg_sq_col"] for s in states]
        together = compiled_directions_together if group.get("compile_update") else factored_directions_together
        updates = []
        for beta2t, run in runs(beta2ts):  # one run unless the weights' step counts differ
            updates += together(grads[run], row_factors[run], col_factors[run], beta2t, group["eps"][0],
                                group["clip_threshold"])
        torch._foreach_mul_(updates, step_sizes)
        if group["beta1"] is not None:
            exp_avgs = [state["exp_avg"] for state in states]
            torch._foreach_mul_(exp_avgs, group["beta1"])
            torch._foreach_add_(exp_avgs, updates, alpha=1.0 - group["beta1"])
            updates = exp_avgs
        return [Update(update, 1.0, group["weight_decay"] * step_size, unit=step_size)
                for update, step_size in zip(updates, step_sizes, strict=True)]

    @staticmethod
    def _rms(tensor: torch.Tensor) -> torch.Tensor:
        return _rms(tensor)

    @staticmethod
    def _mean_over_rows(tensor: torch.Tensor) -> torch.Tensor:
        return _mean_over_rows(tensor)

    @staticmethod
    def _mean_of_row_factor(row: torch.Tensor) -> torch.Tensor:
        return _mean_of_row_factor(row)

    def over_ranks(self, process_group):
        return ShardedAdafactor(process_group)

    def realign(self, state, projector, rule):
        """The first moment (an average of updates, not gradients) moves with B; the factored V with B∘B.

        Adafactor keeps no gradient mean, so mv_meansplit has no mean to split off and equals mv.
        """
        # an unmoved basis carries nothing, and its B is stale or absent: checked once here, for the row weights too
        if "RMS" not in state or rule == "none" or not projector.moved:
            return
        if "exp_avg" in state:
            state["exp_avg"], _ = realign_dense(state["exp_avg"], None, projector, "m")
        if rule == "m":
            return
        if "exp_avg_sq_row" in state:
            corrected = "row_bias2" in state  # row_bias_correction: V̂ reads the basis's factor over its weight
            state["exp_avg_sq_row"], state["exp_avg_sq_col"] = realign_factored(
                state["exp_avg_sq_row"], state["exp_avg_sq_col"], projector, rescale_col=not corrected
            )
            if corrected:  # a direction's weight travels like its factor entry: what it inherits from the old ones
                (mode,) = projector.factors
                state["row_bias2"] = projector.transport_vector(state["row_bias2"], mode, squared=True)
        else:
            _, state["exp_avg_sq"] = realign_dense(None, state["exp_avg_sq"], projector, "mv")


class ShardedAdafactor(AdafactorBackend):
    """Adafactor on row-sharded tensors: its whole-tensor reductions are sums (and counts) all-reduced over ranks."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    # a shard's update reads sums over ranks; its weights step one at a time (multi_tensor takes whole weights only)
    update_together = Backend.update_together

    def _summed(self, sums: torch.Tensor, count: int) -> torch.Tensor:
        """(Σ over ranks of `sums`) / (Σ over ranks of `count`), computed in float64 so counts stay exact."""
        packed = torch.cat([sums.double().reshape(-1), sums.new_tensor([count], dtype=torch.float64)])
        dist.all_reduce(packed, group=self.group)
        return (packed[:-1] / packed[-1]).to(sums.dtype).reshape(sums.shape)

    def _rms(self, tensor):
        return self._summed(tensor.square().sum(), tensor.numel()).sqrt()

    def _mean_over_rows(self, tensor):
        return self._summed(tensor.sum(dim=-2), tensor.shape[-2])

    def _mean_of_row_factor(self, row):
        return self._summed(row.sum(dim=-1, keepdim=True), row.shape[-1])


class GaLoreAdafactor(LowRankOptimizer):
    """Drop-in for galore_torch.GaLoreAdafactor."""

    backend = AdafactorBackend()


# plumage_adafactor's setting since session 81: GaLore's top-r basis refreshed through the Gram's eigh (solver "auto"),
# moments kept at a refresh as GaLore keeps them, no complement, at GaLore's scale 0.25; in pretraining its regular
# group steps at 4x the lr (PRETRAIN_REGULAR_LR_RATIO). The plumage_* sampling options (κ = 1, 1/p capped at 1, the
# pool in bfloat16) stay PLUMAGE_DEFAULTS', for projector="plumage"; with it, name the moments' realignment and the
# complement too (PLUMAGE_ADAFACTOR_DRAWS below), as plumage_adamw's draws name theirs (PLUMAGE_SAMPLED).
PLUMAGE_ADAFACTOR_RECIPE = {"projector": "svd", "scale": 0.25, "realign": "none", "solver": "auto", "residual": "none"}
# The default of sessions 42-80, one dict away: PLUMAGE's draws before every update, the factored moments realigned
# (mv), the complement on the 10 updates after a refresh, each refresh by torch.linalg.svd.
PLUMAGE_ADAFACTOR_DRAWS = {"projector": "plumage", "realign": "mv", "solver": "svd", "residual": "norm_matched"}


class PlumageAdafactor(LowRankOptimizer):
    """Adafactor on a low-rank projection; the factored second moment is transported exactly where a realignment
    rule asks (projector="plumage" with realign="mv").

    GaLore's top-r basis with the regular group at 4x in pretraining since session 81 (PLUMAGE_ADAFACTOR_RECIPE).
    PLUMAGE's draws before every update at scale 0.25 with the regular group at 2x (the default of sessions 42-80) led
    GaLore's Adafactor recipe at 600 updates, but Adafactor clips each weight's update on its own, and their lead was
    the regular group's lr: GaLore's basis with a larger regular group is level with them there and ahead of both them
    and GaLore's recipe over 5000 updates of Python source read once (docs/results.md §3, sessions 80-81)."""

    backend = AdafactorBackend()
    class_defaults = {**PLUMAGE_DEFAULTS, **PLUMAGE_ADAFACTOR_RECIPE}
