"""TuckerProjector on a 4-D (convolution-shaped) gradient, and the 2-D projectors' refusal of one."""

from __future__ import annotations

import pytest
import torch

from galore_plumage.projectors import TuckerProjector, build_projector, mode_product

SHAPE, RANK = (16, 12, 3, 3), 4  # modes 0 and 1 exceed the rank and are projected; 2 and 3 are kept


def _tucker_tensor(seed: int, dtype=torch.float32) -> torch.Tensor:
    """core ×₀ A ×₁ B: multilinear rank (4, 4, 3, 3) exactly."""
    generator = torch.Generator().manual_seed(seed)
    core = torch.randn(RANK, RANK, *SHAPE[2:], generator=generator, dtype=torch.float64)
    a = torch.randn(SHAPE[0], RANK, generator=generator, dtype=torch.float64)
    b = torch.randn(SHAPE[1], RANK, generator=generator, dtype=torch.float64)
    return mode_product(mode_product(core, a, 0), b, 1).to(dtype)


def _generic(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def test_project_shape_and_orthonormal_factors():
    projector = TuckerProjector(RANK, update_proj_gap=5)
    assert projector.refresh(_generic(0), 0)
    assert sorted(projector.factors) == [0, 1]
    for mode, factor in projector.factors.items():
        assert factor.shape == (SHAPE[mode], RANK)
        torch.testing.assert_close(factor.T @ factor, torch.eye(RANK), rtol=0, atol=1e-5)
    assert projector.project(_generic(1)).shape == (RANK, RANK, *SHAPE[2:])


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_reconstructs_a_low_multilinear_rank_tensor(dtype, tol):
    grad = _tucker_tensor(2, dtype)
    projector = TuckerProjector(RANK)
    projector.refresh(grad, 0)
    rebuilt = projector.project_back(projector.project(grad))
    assert rebuilt.dtype == dtype
    assert ((rebuilt - grad).norm() / grad.norm()).item() < tol
    # a generic tensor is not reproduced: the check has power
    generic = _generic(3).to(dtype)
    projector = TuckerProjector(RANK)
    projector.refresh(generic, 0)
    assert ((projector.project_back(projector.project(generic)) - generic).norm() / generic.norm()).item() > 0.1


def test_refreshes_every_update_proj_gap():
    gap = 3
    projector = TuckerProjector(RANK, update_proj_gap=gap)
    changed = []
    for step in range(10):
        before = {k: f.clone() for k, f in projector.factors.items()}
        refreshed = projector.maybe_refresh(_generic(10 + step), step)  # a new gradient every step
        assert refreshed == (step % gap == 0)
        same = bool(before) and all(torch.equal(before[k], f) for k, f in projector.factors.items())
        changed.append(not same)
    assert changed == [step % gap == 0 for step in range(10)]
    assert projector.refresh_count == 4 and projector.next_refresh == 12


def test_project_back_maps_back_its_argument():
    projector = TuckerProjector(RANK)
    projector.refresh(_generic(4), 0)
    projector.project(_generic(5))  # a projected gradient must not be what comes back
    update = torch.randn(RANK, RANK, *SHAPE[2:], generator=torch.Generator().manual_seed(6))
    expected = mode_product(mode_product(update, projector.factors[0], 0), projector.factors[1], 1)
    torch.testing.assert_close(projector.project_back(update), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(projector.project_back(2 * update), 2 * expected, rtol=1e-6, atol=1e-6)
    scaled = TuckerProjector(RANK, scale=0.25)
    scaled.refresh(_generic(4), 0)
    torch.testing.assert_close(scaled.project_back(update), 0.25 * projector.project_back(update), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["svd", "plumage", "random"])
def test_matrix_projectors_refuse_tensors(name):
    projector = build_projector(name, rank=RANK)
    with pytest.raises(ValueError, match="tucker") as info:
        projector.refresh(_generic(0), 0)
    assert str(tuple(SHAPE)) in str(info.value)
    assert not projector.ready
