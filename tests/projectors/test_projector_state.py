"""Every registered projector: checkpoint round trips, the basis transition, and RNG independence."""

from __future__ import annotations

import pytest
import torch

from galore_plumage.projectors import build_projector, list_projectors, mode_product

NAMES = list_projectors()
GAP, TAU_MAX = 2, 8


def _shape(name):
    return (10, 8, 3, 3) if name == "tucker" else (24, 16)


def _build(name, adaptive=False, seed=7):
    return build_projector(
        name, rank=3, update_proj_gap=GAP, scale=0.5, seed=seed, index=4, adaptive_interval=adaptive, tau_max=TAU_MAX
    )


def _gradients(name, count, seed=0):
    """A dominant fixed part plus noise, so bases drift (rho high enough that an adaptive tau grows)."""
    generator = torch.Generator().manual_seed(seed)
    shape = _shape(name)
    base = torch.randn(shape, generator=generator) * torch.linspace(3, 0.1, shape[-1])
    return [base + 0.3 * torch.randn(shape, generator=generator) for _ in range(count)]


def _save_load(state, path):
    torch.save(state, path)
    return torch.load(path, weights_only=True)


def _assert_same_basis(a, b):
    assert a.factors.keys() == b.factors.keys()
    for mode in a.factors:
        assert torch.equal(a.factors[mode], b.factors[mode])
    assert (a.inv_p is None) == (b.inv_p is None)
    if a.inv_p is not None:
        assert torch.equal(a.inv_p, b.inv_p)
    assert (a.refresh_count, a.next_refresh, a.tau) == (b.refresh_count, b.next_refresh, b.tau)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_continues_exactly(name, adaptive, tmp_path):
    grads = _gradients(name, 24)
    original = _build(name, adaptive)
    for step in range(7):
        original.maybe_refresh(grads[step], step)
        original.project(grads[step])

    restored = build_projector(name, rank=1, adaptive_interval=adaptive, tau_max=TAU_MAX, update_proj_gap=GAP)
    restored.load_state_dict(_save_load(original.state_dict(), tmp_path / "projector.pt"))
    _assert_same_basis(original, restored)
    assert restored.stats == original.stats

    generator = torch.Generator().manual_seed(1)
    refreshes_after_load = 0
    for step in range(7, len(grads)):
        changed = original.maybe_refresh(grads[step], step)
        assert restored.maybe_refresh(grads[step], step) == changed
        refreshes_after_load += changed
        _assert_same_basis(original, restored)
        low = original.project(grads[step])
        assert torch.equal(restored.project(grads[step]), low)
        update = torch.randn(low.shape, generator=generator)
        assert torch.equal(restored.project_back(update), original.project_back(update))
        if changed:
            for mode, b in original.transition.items():
                assert torch.equal(restored.transition[mode], b)
    assert refreshes_after_load >= 2
    assert restored.stats == original.stats


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_before_the_first_refresh(name, tmp_path):
    original = _build(name)
    restored = _build(name, seed=0)
    restored.load_state_dict(_save_load(original.state_dict(), tmp_path / "projector.pt"))
    assert not restored.ready
    grad = _gradients(name, 1)[0]
    assert original.refresh(grad, 0) and restored.refresh(grad, 0)
    _assert_same_basis(original, restored)


def test_load_refuses_another_projectors_state():
    state = _build("svd").state_dict()
    with pytest.raises(ValueError, match="'svd'.*'plumage'"):
        _build("plumage").load_state_dict(state)


@pytest.mark.parametrize("name", NAMES)
def test_transition_after_a_refresh(name):
    grads = _gradients(name, 2)
    projector = _build(name)
    low = torch.randn(1)
    assert projector.transport(low) is low  # nothing to move before any transition
    assert projector.refresh(grads[0], 0)
    assert projector.transition is None  # the first basis has no predecessor
    old = {k: f.clone() for k, f in projector.factors.items()}
    assert projector.refresh(grads[1], 2)
    assert projector.transition.keys() == old.keys()
    low = projector.project(grads[1])
    expected, expected_sq = low, low
    for mode, b in projector.transition.items():
        assert b.shape == (projector.factors[mode].shape[1], old[mode].shape[1])
        torch.testing.assert_close(b, projector.factors[mode].T @ old[mode], rtol=0, atol=1e-6)
        expected, expected_sq = mode_product(expected, b, mode), mode_product(expected_sq, b * b, mode)
    torch.testing.assert_close(projector.transport(low), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(projector.transport(low, squared=True), expected_sq, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["svd", "tucker"])  # deterministic, orthonormal bases
def test_transport_between_identical_bases_is_identity(name):
    grad = _gradients(name, 1)[0]
    projector = _build(name)
    projector.refresh(grad, 0)
    projector.refresh(grad, 2)
    low = projector.project(grad)
    for b in projector.transition.values():
        torch.testing.assert_close(b, torch.eye(b.shape[0]), rtol=0, atol=1e-5)
    torch.testing.assert_close(projector.transport(low), low, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(projector.transport(low, squared=True), low, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_refresh_randomness_ignores_the_global_rng(name):
    grads = _gradients(name, 5)
    runs = []
    for global_seed in (0, 12345):
        torch.manual_seed(global_seed)
        projector = _build(name)
        bases = []
        for step, grad in enumerate(grads):
            torch.rand(1000)  # consume global randomness between refreshes
            projector.refresh(grad, step)
            bases.append({k: f.clone() for k, f in projector.factors.items()})
        runs.append(bases)
    for a, b in zip(*runs, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)

    if name in ("random", "plumage"):  # the seed does steer the draws
        other = _build(name, seed=8)
        differs = False
        for step, grad in enumerate(grads):
            other.refresh(grad, step)
            differs |= any(not torch.equal(other.factors[k], runs[0][step][k]) for k in other.factors)
        assert differs
