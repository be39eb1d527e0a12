"""FLORA's random projector: N(0, 1/r) factors, unbiased over seeds, regenerated from (seed, index, refresh count)."""

from __future__ import annotations

import io
import math

import pytest
import torch

from galore_plumage.projectors import RandomProjector

SIDES = {"left": 0, "right": 1}


def _refreshed(rank=4, proj_type="left", seed=0, index=0, refreshes=1, grad=None, dtype=torch.float64):
    grad = torch.ones(12, 8, dtype=dtype) if grad is None else grad
    projector = RandomProjector(rank, proj_type=proj_type, update_proj_gap=1, seed=seed, index=index)
    for step in range(refreshes):
        assert projector.refresh(grad, step)
    return projector


@pytest.mark.parametrize("side", sorted(SIDES))
def test_entries_are_gaussian_with_variance_one_over_r(side):
    """n entries: the sample mean lies within 5 sqrt(1/(r n)) of 0 and the sample variance within
    5 sqrt(2/(n − 1)) / r of 1/r (the standard errors of a Gaussian sample's mean and variance)."""
    rank = 8
    projector = _refreshed(rank, side, seed=5, grad=torch.ones(600, 500))
    factor = projector.factors[SIDES[side]].double()
    assert factor.shape == ((600, rank) if side == "left" else (500, rank))
    entries = factor.flatten()
    n = entries.numel()
    assert abs(entries.mean().item()) < 5 * math.sqrt(1 / (rank * n))
    assert abs(entries.var().item() - 1 / rank) < 5 * math.sqrt(2 / (n - 1)) / rank


@pytest.mark.parametrize("side", sorted(SIDES))
def test_unbiased_over_seeds(side):
    """Ĝ = P Pᵀ G (left) or G P Pᵀ (right) with P having N(0, 1/r) entries: E[P Pᵀ] = I, and for the
    d × r factor E[(P Pᵀ)²] = (r + d + 1)/r · I, so E‖Ĝ − G‖² = V = (d + 1)/r · ‖G‖². Over N seeds,
    ‖mean − G‖² stays below 9 V/N (its mean is V/N, and 9 is past the 0.3 % tail of a χ²₁) and the
    mean squared error is V within 4 of its own standard errors."""
    rank, n_seeds = 3, 3000
    grad = torch.randn(10, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    d = grad.shape[SIDES[side]]
    variance = (d + 1) / rank * grad.square().sum().item()
    estimates = []
    for seed in range(n_seeds):
        projector = _refreshed(rank, side, seed=seed, grad=grad)
        estimates.append(projector.project_back(projector.project(grad)))
    estimates = torch.stack(estimates)
    gap = (estimates.mean(0) - grad).square().sum().item()
    assert gap < 9 * variance / n_seeds, (gap, variance / n_seeds)
    errors = (estimates - grad).flatten(1).square().sum(1)
    se = errors.std().item() / math.sqrt(n_seeds)
    assert abs(errors.mean().item() - variance) < 4 * se


def test_factor_is_a_function_of_seed_index_and_refresh_count():
    a = _refreshed(seed=7, index=2, refreshes=3)
    b = _refreshed(seed=7, index=2, refreshes=3)
    assert torch.equal(a.factors[0], b.factors[0])
    assert not torch.equal(a.factors[0], _refreshed(seed=7, index=3, refreshes=3).factors[0])
    assert not torch.equal(a.factors[0], _refreshed(seed=8, index=2, refreshes=3).factors[0])
    assert not torch.equal(a.factors[0], _refreshed(seed=7, index=2, refreshes=2).factors[0])
    # the gradient's values do not enter: only its shape
    c = _refreshed(seed=7, index=2, refreshes=3, grad=torch.randn(12, 8, dtype=torch.float64))
    assert torch.equal(a.factors[0], c.factors[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("side", sorted(SIDES))
def test_factors_not_stored_but_regenerated_exactly(side, dtype):
    original = _refreshed(4, side, seed=3, index=5, refreshes=4, dtype=dtype)
    state = original.state_dict()
    assert "factors" not in state
    assert not any(isinstance(v, torch.Tensor) and v.numel() > 1 for v in state.values())

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = RandomProjector(4, proj_type=side, update_proj_gap=1)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    mode = SIDES[side]
    assert list(restored.factors) == [mode]
    assert restored.factors[mode].dtype == dtype
    assert torch.equal(restored.factors[mode], original.factors[mode])

    grad = torch.randn(12, 8, generator=torch.Generator().manual_seed(0), dtype=dtype)
    assert torch.equal(restored.project(grad), original.project(grad))
    # and the next refresh draws the same matrix in both
    assert restored.refresh(grad, 4) and original.refresh(grad, 4)
    assert torch.equal(restored.factors[mode], original.factors[mode])
