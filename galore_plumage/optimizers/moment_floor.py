"""v_floor: raise Adam's second moment to at least the square of its mean before each low-rank update (AdamW, and
8-bit AdamW on its dequantized moments).

    none           Adam's moments as they are (galore-torch)
    m2             V ← max(V, M²) on the raw moments
    m2_corrected   V ← max(V, M² (1 − β2^k) / (1 − β1^k)²), k updates in the moments: V̂ ≥ M̂² after bias correction

Why it exists: PLUMAGE's default realigns with LDAdam's mv_meansplit at every draw (every update), and on a row that
stays in the basis that rule is exactly `m2`: the protocol traced all of the default's lead over GaLore's recipe to it
(docs/results.md §3, session 15). As a group option any one-sided projection can have it, GaLore's svd included
(a two-sided or Tucker one is refused: its moments have no rows to floor one by one).

What `m2` does: the raw moments carry different bias (M ≈ (1 − β1^k) E[g], V ≈ (1 − β2^k) E[g²]), so on a
coordinate whose gradient keeps its sign the floor holds V near E[g]², and Adam's bias-corrected step there becomes
lr · √(1 − β2^k) instead of lr: a slow warm-up, over about 1 / (1 − β2) = 1000 updates, of the low-rank weights
alone (noisy coordinates, where E[g²] ≫ E[g]², are untouched). `m2_corrected` keeps only what the floor does after
bias correction (no coordinate's normalized step above 1) without that warm-up: the two tell the mechanisms apart.

`v_floor_horizon` H (with m2) sets how long that warm-up lasts: the bound becomes M² (1 − β2^k) / (1 − β_H^k) with
β_H = 1 − 1/H, so the step on such a coordinate is lr · √(1 − β_H^t), a warm-up over about H updates instead of
1 / (1 − β2). H = 1 / (1 − β2) is m2 itself; None (the default) is m2 as above. A shorter H ends the warm-up sooner
but not on that curve: V then grows past the bound at Adam's own pace. Longer ones first (the floor's gain over
GaLore's recipe fades as its warm-up ends, docs/results.md §3): at 5000 updates (session 24, one seed) H = 3000 ends
within seed noise of m2 and H = 5000 behind it. Then shorter: on an H200 at llama_60m, 64 × 256 tokens an update
(session 35), m2's warm-up left the default 0.087 behind GaLore's recipe, and on the CPU H = 200 is level with m2 at
8 × 64 tokens an update and ahead of it at 8 × 256 and 16 × 256 (+0.05, +0.03), with the regular group at 2× the
lr: torchrun_main.py pretrains plumage_adamw8bit with H = 200 since session 36 (optimizers.PRETRAIN_V_FLOOR_HORIZON),
from 2048 tokens an update since session 53: below that m2's own led H = 200 on llama_35m's shape (0.042, three seeds).
That lead at 8 x 256 was the lr (1e-2): m2's own wants about twice it there, and at 2e-2 it leads H = 200 at 1e-2 on
llama_35m's shape (0.035, three seeds), so plumage_adamw pretrains with m2's own at 2e-2 from 2048 tokens an update
since session 56 (optimizers.PRETRAIN_LR).
The option's default stays None: at one lr H = 200 trailed m2 at 8 × 64 tokens (−0.024 float32, −0.037 8-bit).
On the H200 again (session 37) H = 200 left the default 0.055 behind GaLore's recipe and no floor 0.008 (level): the
floor's gain over none falls as the batch grows (+0.034, +0.017, −0.006, −0.047 at 512, 2048, 4096 and 16384 tokens
an update), so torchrun_main.py pretrains plumage_adamw without it from 4096 tokens an update, and plumage_adamw8bit
since session 41 (optimizers.PRETRAIN_NO_FLOOR_FROM_TOKENS); plumage_adamw from 2048 in a run of 1000 updates or more
since session 66, where the warm-up's gain has faded (optimizers.PRETRAIN_LONG_RUN_LARGE_BATCH).
"""

from __future__ import annotations

import torch

V_FLOORS = ("none", "m2", "m2_corrected")


def floor_second_moment(state: dict, floor: str, beta1: float, beta2: float,
                        horizon: int | None = None) -> torch.Tensor | None:
    """Apply `floor` (with v_floor_horizon `horizon`) to state's exp_avg_sq in place, before this step's gradient
    enters (state["step"] counts it). Returns the bound's buffer, which nothing holds (the caller may write over it:
    AdamW's direction does), or None where no floor was applied."""
    if floor == "none" or "exp_avg" not in state:
        return None
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    bound = exp_avg.square()
    scale = bound_scale(floor, state["step"], beta1, beta2, horizon)
    if scale != 1.0:  # m2's bound is M² itself: no kernel spent multiplying it by 1
        bound.mul_(scale)
    torch.maximum(exp_avg_sq, bound, out=exp_avg_sq)
    return bound


def floor_second_moments(states: list[dict], floor: str, beta1: float, beta2: float,
                         horizon: int | None = None) -> None:
    """floor_second_moment over several states that all hold moments, in torch._foreach calls (the same numbers)."""
    exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
    bounds = torch._foreach_mul(exp_avgs, exp_avgs)
    scales = [bound_scale(floor, s["step"], beta1, beta2, horizon) for s in states]
    if any(scale != 1.0 for scale in scales):
        torch._foreach_mul_(bounds, scales)
    torch._foreach_maximum_(exp_avg_sqs, bounds)


def bound_scale(floor: str, step: int, beta1: float, beta2: float, horizon: int | None = None) -> float:
    """The factor on M² of `floor`'s bound ('m2' or 'm2_corrected') before update `step`: 1, corrected_bound, or
    with a horizon (m2 only) horizon_bound."""
    if floor == "m2_corrected":
        return corrected_bound(step, beta1, beta2)
    return 1.0 if horizon is None else horizon_bound(step, beta2, horizon)


def horizon_bound(step: int, beta2: float, horizon: int) -> float:
    """m2's factor on M² for a warm-up over `horizon` updates: (1 − β2^k) / (1 − β_H^k), β_H = 1 − 1/horizon, for
    the k = step − 1 updates already in the moments (1 when the horizon is Adam's own, 1 / (1 − β2))."""
    done = step - 1
    return (1.0 - beta2**done) / (1.0 - (1.0 - 1.0 / horizon) ** done)


def check_horizon(horizon, floor: str) -> None:
    """v_floor_horizon: None, or a whole number of updates >= 1 with v_floor='m2'."""
    if horizon is None:
        return
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"v_floor_horizon must be a whole number of updates >= 1 (or None for Adam's own warm-up, "
                         f"1 / (1 − β2) updates), got {horizon!r}")
    if floor != "m2":
        raise ValueError(f"v_floor_horizon={horizon} sets how long v_floor='m2' holds the low-rank step back; with "
                         f"v_floor={floor!r} it has no effect: set v_floor='m2' or v_floor_horizon=None")


def corrected_bound(step: int, beta1: float, beta2: float) -> float:
    """m2_corrected's factor on M²: (1 − β2^k) / (1 − β1^k)² for the k = step − 1 updates already in the moments."""
    done = step - 1
    return (1.0 - beta2**done) / (1.0 - beta1**done) ** 2
