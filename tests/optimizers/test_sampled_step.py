"""sampled_step='norm_matched': kept rows step as the backend says, sampled rows by φ ⊙ R, φ measured on the kept rows.

Checked against the definition computed here by hand (φ per column of the other side, the 1.01 norm-growth
limiter, φ from every row when none is kept), through the optimizer (a projector that samples nothing is left
alone), and for bad input.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from galore_plumage import GaLoreAdamW, PlumageAdamW
from galore_plumage.optimizers import PLUMAGE_SAMPLED
from galore_plumage.optimizers.limiter import GROWTH_LIMIT as NORM_GROWTH_LIMIT
from galore_plumage.optimizers.sampled_step import norm_matched
from galore_plumage.training.config import parse_config
from galore_plumage.training.loop import optimizer_options

R, N = 5, 7
INV_P = torch.tensor([1.0, 1.0, 4.0, 12.5, 40.0], dtype=torch.float64)  # two kept rows, three sampled


def _pair(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(R, N, generator=generator, dtype=torch.float64),
            torch.randn(R, N, generator=generator, dtype=torch.float64))


def _by_hand(z, r, inv_p):
    kept = inv_p == 1
    reference = kept if kept.any() else torch.ones_like(kept)
    phi = z[reference].norm(dim=0) / r[reference].norm(dim=0)  # one φ per column
    out = z.clone()
    out[~kept] = r[~kept] * phi
    return out


@pytest.mark.parametrize("mode", [0, 1])
def test_kept_rows_keep_the_backend_step_and_sampled_rows_take_the_scaled_gradient(mode):
    z, r = _pair(0)
    expected = _by_hand(z, r, INV_P)
    if mode == 1:  # right side: the rank axis is the columns
        z, r, expected = z.T, r.T, expected.T
    state = {}
    out = norm_matched(z, r, INV_P, mode, state)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=0)
    rows_first = out if mode == 0 else out.T
    sampled = rows_first[INV_P != 1] * INV_P[INV_P != 1].view(-1, 1)  # D⁻¹ applied: the size of the full-size step
    torch.testing.assert_close(state["sampled_norm"], sampled.norm(), rtol=1e-12, atol=0)


def test_no_kept_row_measures_phi_on_every_row():
    z, r = _pair(1)
    inv_p = torch.full((R,), 3.0, dtype=torch.float64)
    torch.testing.assert_close(norm_matched(z, r, inv_p, 0, {}), _by_hand(z, r, inv_p), rtol=1e-12, atol=0)


def test_nothing_sampled_leaves_the_direction_alone():
    z, r = _pair(2)
    assert norm_matched(z, r, torch.ones(R, dtype=torch.float64), 0, {}) is z


def test_the_limiter_lets_the_sampled_norm_grow_by_at_most_one_percent_a_step():
    z, r = _pair(3)
    state = {}
    norm_matched(z, r, INV_P, 0, state)
    first = state["sampled_norm"].clone()
    grown = norm_matched(10 * z, r, INV_P, 0, state)  # kept rows step 10x as far, so φ and the sampled part grow 10x
    torch.testing.assert_close(state["sampled_norm"], NORM_GROWTH_LIMIT * first, rtol=1e-12, atol=0)
    unlimited = _by_hand(10 * z, r, INV_P)
    kept = INV_P == 1
    torch.testing.assert_close(grown[kept], unlimited[kept], rtol=1e-12, atol=0)  # kept rows are never limited
    ratio = grown[~kept] / unlimited[~kept]
    torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0, 0].item()))  # one factor for the whole part
    assert ratio[0, 0] < 0.2
    before = state["sampled_norm"].clone()
    norm_matched(z, r, INV_P, 0, state)  # shrinking is never limited
    assert state["sampled_norm"] < before


def _linear_model(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(24, 16, bias=False)


def _train(cls, steps=8, **options):
    model = _linear_model()
    optimizer = cls([{"params": [model.weight], "rank": 4, "update_proj_gap": 3}], lr=1e-2, **options)
    generator = torch.Generator().manual_seed(4)
    for _ in range(steps):
        model.weight.grad = torch.randn(model.weight.shape, generator=generator)
        optimizer.step()
    return model.weight.detach().clone(), optimizer


def test_a_projector_that_samples_nothing_is_unaffected():
    plain, _ = _train(GaLoreAdamW, sampled_step="adaptive")
    matched, _ = _train(GaLoreAdamW, sampled_step="norm_matched")
    assert torch.equal(plain, matched)


def test_norm_matched_changes_a_plumage_run_and_keeps_its_limiter_state():
    paper, _ = _train(PlumageAdamW, **PLUMAGE_SAMPLED, sampled_step="adaptive", max_inv_p=None)
    # the limiter's state lives through an interval without draws (a draw, like a refresh, restarts it)
    matched, optimizer = _train(PlumageAdamW, **PLUMAGE_SAMPLED, sampled_step="norm_matched", max_inv_p=None,
                                resample_every=0)
    assert not torch.allclose(paper, matched)
    (state,) = optimizer.state.values()
    assert state["sampled_norm"].dim() == 0 and torch.isfinite(state["sampled_norm"])


def test_the_flag_reaches_the_optimizer_and_none_means_no_cap():
    config = parse_config(["--projector", "plumage", "--sampled_step", "norm_matched", "--max_inv_p", "none"])
    options = optimizer_options(config)
    assert options["sampled_step"] == "norm_matched"
    optimizer = PlumageAdamW([{"params": [_linear_model().weight], "rank": 4, "projector": "plumage"}], **options)
    _train_one(optimizer)
    (projector,) = optimizer._projectors.values()
    assert projector.max_inv_p is None  # 'none' is inf on the command line: the paper's uncapped estimator
    with pytest.raises(SystemExit):
        parse_config(["--sampled_step", "fira"])


def _train_one(optimizer):
    (param,) = optimizer.param_groups[0]["params"]
    param.grad = torch.randn(param.shape, generator=torch.Generator().manual_seed(5))
    optimizer.step()


def test_a_refresh_restarts_the_limiter_so_new_rows_are_not_held_to_the_old_norm():
    """A near-zero last norm holds the sampled part near zero inside an interval, but not past a refresh."""
    model = _linear_model()
    optimizer = PlumageAdamW([{"params": [model.weight], "rank": 4, "update_proj_gap": 3, **PLUMAGE_SAMPLED}], lr=1e-2,
                             sampled_step="norm_matched", max_inv_p=None, resample_every=0)
    generator = torch.Generator().manual_seed(6)
    state, tiny = optimizer.state[model.weight], torch.tensor(1e-12)
    norms = []
    for step in range(5):  # refreshes at steps 0 and 3
        model.weight.grad = torch.randn(model.weight.shape, generator=generator)
        if step in (2, 3):
            state["sampled_norm"] = tiny.clone()
        optimizer.step()
        norms.append(state["sampled_norm"].item())
    assert norms[2] <= NORM_GROWTH_LIMIT * 1e-12 * (1 + 1e-6)  # inside the interval: held by the limiter
    assert norms[3] > 1e-3  # at the refresh: a new series
