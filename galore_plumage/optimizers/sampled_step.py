"""How the sampled rows of a PLUMAGE step move: the paper's adaptive step, or a norm-matched raw gradient.

PLUMAGE keeps the r* top directions of a refresh (p = 1) and samples the rest with p < 1, rescaled by 1/p in
project_back. The rules for the low-rank direction Z that project_back receives (R = the projected gradient):

    adaptive       Z = the backend's update on every row (the paper). Under Adam every coordinate of Z is O(1),
                   so a sampled row moves 1/p times as far as a kept one whatever its gradient: with p = 0.02 it
                   moves 50x as far, in the same direction, for the whole refresh interval.
    norm_matched   kept rows: the backend's update; sampled rows: φ ⊙ R, where φ = ‖Z_kept‖ / ‖R_kept‖ is measured
                   per column of the other side (Fira's norm-based scaling, arXiv 2410.01623). A sampled row then
                   moves in proportion to its own gradient, at the step size Adam gives the kept ones, and
                   E[P D⁻¹ (φ ⊙ R)] = φ ⊙ (the gradient's component outside the kept rows): unbiased up to φ.
                   A norm-growth limiter (Fira's) keeps ‖D⁻¹ Z_sampled‖ within 1.01x its previous value inside a
                   refresh interval; a refresh draws new rows, so it starts a new series (without that reset the
                   limiter ratchets: one small value after a refresh freezes the sampled part for the whole run).
                   A draw between refreshes (resample_every) also brings new rows, so it restarts the series too:
                   with a draw before every update the limiter never holds anything.

With no kept row (r* = 0), φ is measured on all rows. Projectors that do not sample (svd, random) have no
sampled rows, and every rule is the backend's update.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .limiter import growth_factor

SAMPLED_STEPS = ("adaptive", "norm_matched")
# A row counts as sampled when 1/p exceeds 1 by more than this. A spectrum whose tail is rounding noise gives its last
# real direction p = 1 − O(ε) (float32: the SVD's ε·σ₁ values share its slot): in effect kept, and counted as kept, so
# it takes the backend's step as it would with exact σ (an FSDP2 refresh zeroes that noise and gets p = 1 exactly)
KEPT_TOLERANCE = 1e-3


def restart_limiter(state: dict) -> None:
    """At a refresh: the sampled rows are new, so the limiter's series starts again."""
    state.pop("sampled_norm", None)


def norm_matched(direction: torch.Tensor, low_grad: torch.Tensor, inv_p: torch.Tensor, mode: int, state: dict,
                 total: Callable[[torch.Tensor], torch.Tensor] = lambda x: x, unit: float = 1.0) -> torch.Tensor:
    """Z with its sampled rows (1/p > 1 + KEPT_TOLERANCE, along axis `mode`) replaced by φ ⊙ R, limited in norm growth.

    `state["sampled_norm"]` keeps the previous ‖D⁻¹ Z_sampled‖ / `unit` for the limiter (`unit`: what Z carries beyond
    the backend's normalized step, base.Update.unit, so that the lr schedule is not limited). `total` sums a squared
    norm over the pieces of a sharded tensor (identity for a whole one), so every shard scales alike.
    """
    sampled = inv_p > 1 + KEPT_TOLERANCE
    if not bool(sampled.any()):
        return direction
    shape = [1] * direction.dim()
    shape[mode] = -1
    reference = (~sampled if bool((~sampled).any()) else torch.ones_like(sampled)).view(shape)
    z_norm = (direction * reference).norm(dim=mode, keepdim=True)
    r_norm = (low_grad * reference).norm(dim=mode, keepdim=True)
    # a column with no kept gradient (a zero gradient) gives no scale: its sampled rows do not move (0 · ∞ is NaN)
    phi = torch.where(r_norm > 0, z_norm / r_norm.clamp_min(torch.finfo(r_norm.dtype).tiny), torch.zeros_like(z_norm))
    mask = sampled.view(shape)
    tail = low_grad * phi * mask
    size = total((tail * inv_p.view(shape).to(tail.dtype)).square().sum()).sqrt() / unit
    tail = tail * growth_factor(size, state, "sampled_norm")
    return torch.where(mask, tail, direction)
