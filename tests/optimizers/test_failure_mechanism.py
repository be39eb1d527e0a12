"""Why the paper's PLUMAGE-AdamW fails, on a hand-built gradient, and that the recommended setting keeps the step bounded.

A weight whose gradient has three strong directions and a long, decaying tail, fed the same gradient for one
refresh interval. Adam normalizes every low-rank coordinate to about ±1 before D⁻¹ multiplies it by 1/p, so under
the paper's estimator a sampled row moves 1/p times as far as a kept row, in the same direction, on every update of
the interval: the whole step grows many times larger than GaLore's top-r step on the same gradient.
The default since session 17 (GaLore's top-r basis with the floor V ← max(V, M²)) samples nothing and keeps the whole
step within GaLore's, at its scale (0.25) and at the paper's (1.0). So does PLUMAGE's projector as the default of
sessions 14-16 set it (PLUMAGE_SAMPLED: every drawn row takes Adam's step with no 1/p rescaling, max_inv_p=1, drawn
anew before every update), with each sampled row within a bound that does not grow with 1/p: no larger than a kept
row with the paper's realignment (mv, the default until session 14), at most Adam's first-step ratio 3.16 times one
with mv_meansplit. Every arm runs at the same lr, so the steps compare.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from galore_plumage import GaLoreAdamW, PlumageAdamW
from galore_plumage.optimizers import PLUMAGE_SAMPLED

M, N, K, STEPS = 64, 256, 8, 10
SIGMA = [1.0, 0.8, 0.6] + [0.01 * (1 - i / 200) for i in range(61)]  # r* = 3 at k = 8; every sampled 1/p is ~11
PAPER = {"projector": "plumage", "sampled_step": "adaptive", "max_inv_p": None, "row_bias_correction": False,
         "resample_every": 0, "realign": "mv", "residual": "none", "v_floor": "none"}


def _true_inv_p(projector) -> torch.Tensor:
    """Each basis row's 1/p before any cap: from the refresh's pool when rows are drawn from one (the row is the pool
    vector it equals), else the projector's own 1/p (no cap in the arms that have no pool)."""
    if projector.pool is None:
        return projector.inv_p if projector.inv_p is not None else torch.ones(K)
    (factor,) = projector.factors.values()
    match = (projector.pool.vectors.T @ factor).abs().argmax(dim=0)
    return 1.0 / projector.pool.p[match].to(factor.dtype)


def _run(cls, grad, **options):
    """Per update: (‖ΔW‖, per-row step norms, uncapped 1/p) of one interval on the constant gradient `grad`."""
    weight = nn.Parameter(torch.zeros(M, N))
    optimizer = cls([{"params": [weight], "rank": K, "update_proj_gap": STEPS}], lr=1e-3, **options)
    rows = []

    def observe(param, projector, update, state, refreshed):
        (mode,) = projector.factors
        assert mode == 0  # std projection of a wide matrix: the left side, rows of Pᵀ G
        applied = projector.inv_p if projector.inv_p is not None else torch.ones(K)  # the 1/p D⁻¹ multiplies by
        rows.append((update.direction.norm(dim=1) * abs(update.step_size) * applied, _true_inv_p(projector)))

    optimizer.step_observers.append(observe)
    steps = []
    for _ in range(STEPS):
        before = weight.detach().clone()
        weight.grad = grad.clone()
        optimizer.step()
        steps.append((weight.detach() - before).norm().item())
    return steps, rows


@pytest.fixture(scope="module")
def runs(spectral_matrix):
    grad, *_ = spectral_matrix(M, N, SIGMA, seed=0, dtype=torch.float32)
    return {"galore": _run(GaLoreAdamW, grad), "paper": _run(PlumageAdamW, grad, scale=1.0, **PAPER),
            "default": _run(PlumageAdamW, grad), "default at scale 1": _run(PlumageAdamW, grad, scale=1.0),
            "sampled": _run(PlumageAdamW, grad, **PLUMAGE_SAMPLED),
            "sampled at scale 1": _run(PlumageAdamW, grad, scale=1.0, **PLUMAGE_SAMPLED),
            "sampled, realign mv": _run(PlumageAdamW, grad, **{**PLUMAGE_SAMPLED, "realign": "mv"}),
            "sampled at scale 1, realign mv": _run(PlumageAdamW, grad, scale=1.0, **{**PLUMAGE_SAMPLED, "realign": "mv"})}


def test_under_the_paper_a_sampled_row_moves_one_over_p_times_as_far_as_a_kept_row(runs):
    _, rows = runs["paper"]
    for norms, inv_p in rows:  # a constant gradient: Adam's |Z| is the same on every coordinate, up to ε
        kept = norms[inv_p == 1].mean()
        ratio = norms[inv_p > 1] / kept
        torch.testing.assert_close(ratio, inv_p[inv_p > 1], rtol=0.15, atol=0)  # ε shaves the smallest coordinates
    assert rows[-1][1].max() > 10  # some sampled row moves over ten times as far as a kept one


def test_the_paper_step_is_many_times_galores_and_the_default_stays_within_it(runs):
    galore = max(runs["galore"][0])  # GaLoreAdamW's own scale, 1.0, as the paper's PLUMAGE
    assert max(runs["paper"][0]) > 5 * galore
    for arm in ("default", "default at scale 1", "sampled", "sampled at scale 1"):
        assert max(runs[arm][0]) <= galore, arm  # at scale 1 too: bounded by the step itself, not by the scale


@pytest.mark.parametrize("arm", ["sampled, realign mv", "sampled at scale 1, realign mv"])
def test_drawn_rows_with_the_papers_realignment_move_no_further_than_a_kept_row(runs, arm):
    """The default of sessions 7-13 (realign mv): a drawn row takes Adam's step and no 1/p."""
    _, rows = runs[arm]
    for norms, inv_p in rows:
        assert (inv_p > 1).any()  # drawn rows are there, and none moves further than a kept one (to rounding)
        assert norms[inv_p > 1].max() <= norms[inv_p == 1].min() * (1 + 1e-4)


@pytest.mark.parametrize("arm", ["sampled", "sampled at scale 1"])
def test_drawn_rows_with_meansplit_move_at_most_adams_first_step_ratio_times_a_kept_row(runs, arm):
    """The default of sessions 14-16 carries the moments' mean and variance apart at every draw (mv_meansplit): a row
    that stays in the basis gets V ← max(V, M²), which holds a coordinate with a steady gradient to Adam's bias-correction
    ratio √(1 − β2^t) / (1 − β1^t) (here < 1), while a row entering at a draw starts from zero moments, whose first
    normalized step is up to (1 − β1) / √(1 − β2) ≈ 3.16 times that. So a drawn row may move further than a kept one,
    by a bound that does not depend on 1/p (about 11 here, where the paper's rows move 1/p times as far)."""
    _, rows = runs[arm]
    first_step_ratio = (1 - 0.9) / math.sqrt(1 - 0.999)
    ratios = []
    for norms, inv_p in rows:
        assert (inv_p > 1).any()
        ratios.append(norms[inv_p > 1].max() / norms[inv_p == 1].min())
        assert ratios[-1] <= first_step_ratio * (1 + 1e-4)
    assert max(ratios) > 1.2  # the entering rows' larger step is there (measured 1.56): the bound is not idle
