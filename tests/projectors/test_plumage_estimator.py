"""PLUMAGE's one-sided estimator Ĝ = P D⁻¹ Pᵀ G (left) or G P D⁻¹ Pᵀ (right), by Monte Carlo.

E[Ĝ] = G and E‖Ĝ − G‖² = V = Σ (1/p_i − 1) σ_i², which beats uniform sampling without replacement and
σ-proportional multinomial sampling with replacement of the same rank on the same G.

Tolerances: the mean of N independent estimates has E‖mean − G‖² = V/N, and N‖mean − G‖²/V is (by the CLT)
a weighted sum of χ²₁ variables with weights summing to 1, whose tail above 9 is at most that of a single
χ²₁ (P ≈ 0.27 %); a biased estimator misses by a bias² that does not shrink with N. Mean squared errors are
compared within 4 standard errors computed from the sample itself.
"""

from __future__ import annotations

import math

import pytest
import torch

from galore_plumage.projectors import PlumageProjector, inclusion_probabilities, refresh_generator, systematic_sample

M, N_COLS, K = 24, 16, 4
SIGMA = [1.0 / i for i in range(1, N_COLS + 1)]  # r* = 1 at k = 4: one direction kept, three sampled
N_DRAWS = 4000
N_PROJECTOR_DRAWS = 600
BIAS_FACTOR = 9.0
SE_FACTOR = 4.0


@pytest.fixture(scope="module")
def setup(spectral_matrix):
    g, _, _, _ = spectral_matrix(M, N_COLS, SIGMA, seed=0)
    u, sigma, vh = torch.linalg.svd(g, full_matrices=False)
    r_star, p = inclusion_probabilities(sigma, K)
    assert r_star == 1 and p[1:].max() < 1  # the test exercises real sampling
    variance = ((1.0 / p - 1.0) * sigma**2).sum().item()
    return g, u, sigma, vh.T, p, variance


def _estimate(g, u, v, chosen, inv_p, side):
    """Ĝ for each row of `chosen` (draws × k), written as the projector's formula on the given side."""
    if side == "left":
        basis = u[:, chosen].permute(1, 0, 2)  # draws × m × k
        return basis @ (inv_p.unsqueeze(-1) * (basis.transpose(1, 2) @ g))
    basis = v[:, chosen].permute(1, 0, 2)  # draws × n × k
    return ((g @ basis) * inv_p.unsqueeze(1)) @ basis.transpose(1, 2)


def _plumage_draws(p, n_draws, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([systematic_sample(p, K, generator) for _ in range(n_draws)])


def _squared_errors(estimates, g):
    return (estimates - g).flatten(1).square().sum(1)


def _assert_mean_within_se(errors, expected):
    se = errors.std().item() / math.sqrt(errors.numel())
    assert abs(errors.mean().item() - expected) < SE_FACTOR * se, (errors.mean().item(), expected, se)


def _assert_unbiased(estimates, g, variance):
    gap = (estimates.mean(0) - g).square().sum().item()
    assert gap < BIAS_FACTOR * variance / estimates.shape[0], (gap, variance / estimates.shape[0])


@pytest.mark.parametrize("side", ["left", "right"])
def test_unbiased_with_the_closed_form_variance(setup, side):
    g, u, sigma, v, p, variance = setup
    chosen = _plumage_draws(p, N_DRAWS, seed=1 if side == "left" else 2)
    estimates = _estimate(g, u, v, chosen, 1.0 / p[chosen], side)

    _assert_unbiased(estimates, g, variance)  # (a) E[Ĝ] = G
    _assert_mean_within_se(_squared_errors(estimates, g), variance)  # (b) E‖Ĝ − G‖² = Σ (1/p − 1) σ²

    # The check has power: the same draws without the D⁻¹ rescale are biased by Σ (1 − p_i)² σ_i².
    unscaled = _estimate(g, u, v, chosen, torch.ones_like(p[chosen]), side)
    gap = (unscaled.mean(0) - g).square().sum().item()
    assert gap > 10 * BIAS_FACTOR * variance / N_DRAWS


def test_beats_uniform_and_multinomial_sampling(setup):
    g, u, sigma, v, p, variance = setup
    n = sigma.numel()
    coefficients = torch.zeros(N_DRAWS, n, dtype=torch.float64)  # Ĝ = U diag(c) Vᵀ, so ‖Ĝ − G‖² = ‖c − σ‖²

    chosen = _plumage_draws(p, N_DRAWS, seed=3)
    plumage = coefficients.scatter(1, chosen, (sigma / p)[chosen])

    generator = torch.Generator().manual_seed(4)  # uniform without replacement, rescaled by n/k
    chosen = torch.stack([torch.randperm(n, generator=generator)[:K] for _ in range(N_DRAWS)])
    uniform = coefficients.scatter(1, chosen, (sigma * n / K)[chosen])

    q = sigma / sigma.sum()  # with replacement, q ∝ σ: Ĝ = (1/k) Σ_j σ_{i_j} u v ᵀ / q_{i_j}
    chosen = torch.multinomial(q.expand(N_DRAWS, n), K, replacement=True, generator=generator)
    multinomial = coefficients.scatter_add(1, chosen, (sigma / q)[chosen] / K)

    errors = {
        name: (c - sigma).square().sum(1)
        for name, c in [("plumage", plumage), ("uniform", uniform), ("multinomial", multinomial)]
    }
    closed_form = {
        "plumage": variance,
        "uniform": ((n / K - 1) * sigma**2).sum().item(),
        "multinomial": ((sigma.sum() ** 2 - sigma.square().sum()) / K).item(),
    }
    for name, err in errors.items():  # each Monte Carlo agrees with its closed form, so the baselines are right
        _assert_mean_within_se(err, closed_form[name])
    for name in ("uniform", "multinomial"):
        margin = math.sqrt(errors["plumage"].var().item() / N_DRAWS + errors[name].var().item() / N_DRAWS)
        assert errors["plumage"].mean().item() + SE_FACTOR * margin < errors[name].mean().item(), name
        assert closed_form["plumage"] < closed_form[name]


@pytest.mark.parametrize("side", ["left", "right"])
def test_projector_wiring(setup, side):
    """Through PlumageProjector: each refresh c samples with refresh_generator(seed, index, c), keeps the chosen
    singular vectors of `side`, and project_back(project(G)) is the D⁻¹-rescaled estimate; over refreshes
    it is unbiased with the closed-form variance."""
    g, u, sigma, v, p, variance = setup
    seed, index = 3, 1
    projector = PlumageProjector(K, proj_type=side, update_proj_gap=1, seed=seed, index=index)
    mode = 0 if side == "left" else 1
    estimates = []
    for step in range(N_PROJECTOR_DRAWS):
        assert projector.maybe_refresh(g, step)
        low = projector.project(g)
        assert low.shape == ((K, N_COLS) if side == "left" else (M, K))
        estimates.append(projector.project_back(low))
        if step < 20:
            chosen = systematic_sample(p, K, refresh_generator(seed, index, step))
            expected_factor = u[:, chosen] if side == "left" else v[:, chosen]
            assert list(projector.factors) == [mode]
            assert torch.equal(projector.factors[mode], expected_factor)
            torch.testing.assert_close(projector.inv_p, 1.0 / p[chosen], rtol=1e-12, atol=0)
            expected = _estimate(g, u, v, chosen[None], 1.0 / p[chosen][None], side)[0]
            torch.testing.assert_close(estimates[-1], expected, rtol=0, atol=1e-12)
    estimates = torch.stack(estimates)
    _assert_unbiased(estimates, g, variance)
    _assert_mean_within_se(_squared_errors(estimates, g), variance)
    assert projector.stats["r_star"] == 1
    assert projector.stats["max_inv_p"] == pytest.approx(projector.inv_p.max().item(), rel=1e-12)
