"""PLUMAGE with max_inv_p = c: the same samples, each 1/p cut to min(1/p, c), and the bias that follows.

With inclusion indicators 1[i ∈ I] (P = p_i) and weights w_i = min(1/p_i, c), Ĝ = Σ_{i∈I} w_i σ_i u_i v_iᵀ has
    E[Ĝ] = Σ min(1, c·p_i) σ_i u_i v_iᵀ          and     E‖Ĝ − E Ĝ‖² = Σ w_i² σ_i² p_i (1 − p_i)
(the terms are Frobenius-orthogonal, so only the marginals matter). Both are checked by Monte Carlo through
the projector; the tolerance is test_plumage_estimator's: N‖mean − E Ĝ‖²/V is a weighted sum of χ²₁ with
weights summing to 1, so it exceeds 9 with probability at most ~0.27 %.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from galore_plumage.optimizers import build_optimizer
from galore_plumage.projectors import PlumageProjector, inclusion_probabilities
from galore_plumage.training.config import parse_config
from galore_plumage.training.loop import optimizer_options

M, N_COLS, K, CAP = 24, 16, 4, 2.0
SIGMA = [1.0 / i for i in range(1, N_COLS + 1)]  # r* = 1 at k = 4; sampled 1/p reach ~12, so a cap of 2 cuts most
N_DRAWS = 800
POWER = 90.0  # a biased mean must be this many times the bias tolerance away from G (conftest's BIAS_FACTOR is 9)


@pytest.fixture
def tiny_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 6))


@pytest.fixture(scope="module")
def setup(spectral_matrix):
    g, u, sigma, v = spectral_matrix(M, N_COLS, SIGMA, seed=0)
    _, p = inclusion_probabilities(sigma, K)
    weight = (1.0 / p).clamp(max=CAP)
    assert (1.0 / p).max() > 4 * CAP and (p == 1).any()  # the cap cuts some sampled directions and spares kept ones
    mean = u @ torch.diag((p * weight).clamp(max=1.0) * sigma) @ v.T
    spread = (weight.square() * sigma.square() * p * (1 - p)).sum().item()
    return g, mean, spread


@pytest.mark.parametrize("side", ["left", "right"])
def test_same_samples_with_each_inverse_probability_cut_at_the_cap(spectral_matrix, side):
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=1)
    plain = PlumageProjector(K, proj_type=side, update_proj_gap=1, seed=5, index=2)
    capped = PlumageProjector(K, proj_type=side, update_proj_gap=1, seed=5, index=2, max_inv_p=CAP)
    cut = 0
    for step in range(30):
        plain.refresh(g, step)
        capped.refresh(g, step)
        assert plain.factors.keys() == capped.factors.keys()
        for mode in plain.factors:
            assert torch.equal(plain.factors[mode], capped.factors[mode])  # the cap does not change the sampling
        assert torch.equal(capped.inv_p, plain.inv_p.clamp(max=CAP))
        assert capped.stats["capped"] == int((plain.inv_p > CAP).sum())
        assert capped.stats["max_inv_p"] == plain.stats["max_inv_p"]  # the estimator's own 1/p, for logging
        cut += capped.stats["capped"]
    assert cut > 0


@pytest.mark.parametrize("side", ["left", "right"])
def test_capped_estimate_has_the_closed_form_mean_and_spread(setup, check_draws, side):
    g, mean, spread = setup
    projector = PlumageProjector(K, proj_type=side, update_proj_gap=1, seed=7, max_inv_p=CAP)
    estimates = []
    for step in range(N_DRAWS):
        projector.refresh(g, step)
        estimates.append(projector.project_back(projector.project(g)))
    estimates = torch.stack(estimates)
    check_draws(estimates, mean, spread)
    # The check has power: the capped estimate is biased, its mean is far from G itself.
    assert (estimates.mean(0) - g).square().sum().item() > POWER * spread / N_DRAWS


def test_a_cap_of_one_is_the_sampled_basis_without_rescaling(spectral_matrix):
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=2)
    projector = PlumageProjector(K, seed=3, max_inv_p=1)
    projector.refresh(g, 0)
    assert torch.equal(projector.inv_p, torch.ones(K, dtype=projector.inv_p.dtype))


def test_optimizer_groups_carry_the_cap_to_their_projectors(tiny_mlp):
    optimizer = build_optimizer("plumage_adamw", tiny_mlp, lr=1e-3, rank=2, target_modules=("",), projector="plumage",
                                max_inv_p=CAP)
    tiny_mlp(torch.randn(8, tiny_mlp[0].in_features)).square().sum().backward()
    optimizer.step()
    projectors = list(optimizer._projectors.values())
    assert projectors and all(p.max_inv_p == CAP for p in projectors)
    assert all(bool((p.inv_p <= CAP).all()) for p in projectors)


def test_command_line_flag_reaches_the_optimizer_options():
    config = parse_config(["--optimizer", "plumage_adamw", "--projector", "plumage", "--max_inv_p", "3"])
    assert optimizer_options(config)["max_inv_p"] == 3.0
    assert "max_inv_p" not in optimizer_options(parse_config(["--optimizer", "plumage_adamw"]))
