"""The estimator diagnostics behind benchmarks/estimator_lab.py: Monte Carlo error meets each closed form."""

import pytest
import torch

from galore_plumage.projectors import build_projector
from galore_plumage.projectors.diagnostics import closed_form_error, monte_carlo, projected_side


def power_law_gradient(m, n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, m, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64)).Q
    k = min(m, n)
    return (u[:, :k] * torch.arange(1, k + 1, dtype=torch.float64).pow(-0.6)) @ v[:, :k].T


@pytest.mark.parametrize("shape", [(40, 24), (24, 40)])  # tall: right side projected; wide: left side
@pytest.mark.parametrize("name", ["random", "plumage"])
def test_unbiased_projectors_meet_their_closed_form(name, shape):
    grad, rank, draws = power_law_gradient(*shape), 6, 600
    quality = monte_carlo(lambda seed: build_projector(name, rank=rank, seed=seed), grad, draws)
    expected = closed_form_error(name, torch.linalg.svdvals(grad), rank, projected_side(shape))
    # the mean of 600 draws is within 4 standard errors of its expectation (seeded: this never flakes)
    assert abs(quality.error - expected) < 4 * quality.error_sem
    # unbiased: the mean estimate is off only by Monte Carlo noise, of size √(error/draws)
    assert quality.bias < 2 * quality.bias_floor


def test_random_error_depends_on_the_projected_side_only():
    assert projected_side((40, 24)) == 24 and projected_side((24, 40)) == 24
    assert closed_form_error("random", torch.ones(24), 6, 24) == pytest.approx(25 / 6)


def test_svd_is_deterministic_and_biased_by_its_tail():
    grad = power_law_gradient(30, 20)
    quality = monte_carlo(lambda seed: build_projector("svd", rank=5, seed=seed), grad, draws=3)
    tail = closed_form_error("svd", torch.linalg.svdvals(grad), 5, 20)
    assert quality.error == pytest.approx(tail, rel=1e-9)
    assert quality.bias == pytest.approx(tail**0.5, rel=1e-9)  # every draw is the same best rank-5 approximation
    assert quality.error_sem < 1e-12


def test_plumage_error_lies_between_svd_and_random():
    sigma = torch.linalg.svdvals(power_law_gradient(40, 24))
    svd, plumage, random = (closed_form_error(n, sigma, 6, 24) for n in ("svd", "plumage", "random"))
    assert svd < plumage < random


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="draws must be >= 1, got 0"):
        monte_carlo(lambda seed: build_projector("svd", rank=2), torch.ones(4, 3), 0)
    with pytest.raises(ValueError, match="non-finite or all zero"):
        monte_carlo(lambda seed: build_projector("svd", rank=2), torch.zeros(4, 3), 1)
    assert closed_form_error("tucker", torch.ones(3), 2, 3) is None
