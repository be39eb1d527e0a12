"""Shared helpers for the projector tests."""

from __future__ import annotations

import pytest
import torch


def _spectral_matrix(m: int, n: int, sigma, seed: int = 0, dtype: torch.dtype = torch.float64):
    """(G, U, sigma, V): G = U diag(sigma) Vᵀ with random orthonormal U (m × s), V (n × s), s = len(sigma)."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    s = sigma.numel()
    generator = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, s, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(n, s, generator=generator, dtype=torch.float64)).Q
    g = (u * sigma) @ v.T
    return g.to(dtype), u, sigma, v


@pytest.fixture(scope="session")
def spectral_matrix():
    """A factory: spectral_matrix(m, n, sigma, seed=0, dtype=float64) -> (G, U, sigma, V)."""
    return _spectral_matrix


# Monte Carlo tolerances of the estimator tests. With N draws of an estimate Ĝ of mean E and trace variance V,
# N‖mean − E‖²/V is a weighted sum of χ²₁ with weights summing to 1: above 9 with probability at most ~0.27 %.
# The mean squared error is checked to 4 standard errors of its own sample.
BIAS_FACTOR = 9.0
SE_FACTOR = 4.0


def _check_draws(estimates: torch.Tensor, mean: torch.Tensor, spread: float) -> None:
    """Draws (N × shape) have mean `mean` and E‖Ĝ − mean‖² = `spread`, to Monte Carlo tolerance."""
    draws = estimates.shape[0]
    gap = (estimates.mean(0) - mean).square().sum().item()
    assert gap < BIAS_FACTOR * spread / draws, (gap, spread / draws)
    errors = (estimates - mean).flatten(1).square().sum(1)
    se = errors.std().item() / draws**0.5
    assert abs(errors.mean().item() - spread) < SE_FACTOR * se, (errors.mean().item(), spread, se)


@pytest.fixture(scope="session")
def check_draws():
    """check_draws(estimates, mean, spread): the Monte Carlo check of an estimator's mean and spread."""
    return _check_draws
