"""solver="gram": singular vectors from eigh of the projected side's Gram matrix instead of a full SVD.

It must give the same singular values and (up to sign) the same top singular vectors as torch.linalg.svd on
a spectrum with gaps, take the eigh route only when the projected side is the smaller one, and keep PLUMAGE
unbiased with the closed-form variance — by Monte Carlo, with the tolerances of test_plumage_estimator.py.
"""

from __future__ import annotations

import pytest
import torch

from galore_plumage import build_optimizer
from galore_plumage.projectors import PlumageProjector, SVDProjector, inclusion_probabilities
from galore_plumage.projectors import svd as svd_module
from galore_plumage.projectors.svd import decompose, gram_eigh

SIGMA = [1.0 / i for i in range(1, 17)]  # distinct, gapped: vectors are defined up to sign
K, DRAWS = 4, 600


@pytest.mark.parametrize("mode", [0, 1])
def test_gram_eigh_matches_svd(spectral_matrix, mode):
    """Singular values to float32 rounding; each top singular vector of the projected side up to its sign."""
    g, u, sigma, v = spectral_matrix(16, 40, SIGMA, seed=3, dtype=torch.float32)
    g = g if mode == 0 else g.T  # the projected side is the smaller one (16)
    vectors, values = gram_eigh(g, mode)
    torch.testing.assert_close(values[:16].double(), sigma, rtol=1e-4, atol=1e-5)
    assert torch.all(values[16:] < 1e-3)  # the rank-16 matrix has no more energy
    cosines = (vectors[:, :8].double() * u[:, :8]).sum(0).abs()
    torch.testing.assert_close(cosines, torch.ones(8, dtype=torch.float64), rtol=0, atol=1e-4)
    identity = vectors.T @ vectors
    torch.testing.assert_close(identity, torch.eye(identity.shape[0]), rtol=0, atol=1e-5)  # orthonormal


def test_gram_route_only_for_a_single_smaller_side(spectral_matrix, monkeypatch):
    """The larger side, or both sides ('full'), would need the big Gram matrix: those fall back to the SVD."""
    g, *_ = spectral_matrix(16, 40, SIGMA, seed=0, dtype=torch.float32)
    calls = []
    real_svd, real_gram = svd_module.thin_svd, svd_module.gram_eigh
    monkeypatch.setattr(svd_module, "thin_svd", lambda m: calls.append("svd") or real_svd(m))
    monkeypatch.setattr(svd_module, "gram_eigh", lambda m, k: calls.append("gram") or real_gram(m, k))
    for modes, expected in [((0,), "gram"), ((1,), "svd"), ((0, 1), "svd")]:
        calls.clear()
        decompose(g, modes, "gram")
        assert calls == [expected], modes
    calls.clear()
    decompose(g, (0,), "svd")
    assert calls == ["svd"]


def test_svd_projector_with_gram_spans_the_same_subspace(spectral_matrix):
    """GaLore's projector through either solver keeps the same top-r subspace: P Pᵀ G agrees."""
    g, *_ = spectral_matrix(16, 40, SIGMA, seed=1, dtype=torch.float32)
    backs = []
    for solver in ("svd", "gram"):
        projector = SVDProjector(K, proj_type="std", update_proj_gap=10, solver=solver)
        projector.refresh(g, 0)
        backs.append(projector.project_back(projector.project(g)))
    torch.testing.assert_close(backs[1], backs[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_plumage_with_gram_is_unbiased_with_the_closed_form_variance(spectral_matrix, check_draws, side):
    """Over refreshes, project_back(project(G)) averages to G, and its mean squared error is Σ(1/p − 1)σ²."""
    g, _, sigma, _ = spectral_matrix(24, 16, SIGMA, seed=0)
    g = g.T.contiguous() if side == "left" else g  # left projects rows: make them the smaller side (16 × 24)
    _, p = inclusion_probabilities(sigma, K)
    variance = ((1.0 / p - 1.0) * sigma**2).sum().item()
    projector = PlumageProjector(K, proj_type=side, update_proj_gap=1, seed=5, solver="gram")
    estimates = []
    for step in range(DRAWS):
        assert projector.maybe_refresh(g, step)
        estimates.append(projector.project_back(projector.project(g)))
    check_draws(torch.stack(estimates), g, variance)


def test_solver_reaches_the_projectors_and_bad_values_are_named():
    model = torch.nn.Sequential()
    model.add_module("attn", torch.nn.Linear(32, 16))
    optimizer = build_optimizer("plumage_adamw", model, lr=1e-3, rank=4, solver="gram")
    model(torch.randn(3, 32)).square().sum().backward()
    optimizer.step()
    projector = optimizer.projector_for(model.attn.weight, optimizer.param_groups[-1])
    assert projector.solver == "gram" and projector.ready
    with pytest.raises(ValueError, match="'qr'"):
        build_optimizer("plumage_adamw", model, lr=1e-3, rank=4, solver="qr")
