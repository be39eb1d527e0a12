"""sample_until: PLUMAGE samples at refreshes before that update and keeps GaLore's top-r basis (1/p = 1) from it on,
which every later draw keeps; before it, nothing differs from sampling throughout."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from galore_plumage import build_optimizer
from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS
from galore_plumage.projectors import build_projector

RANK, GAP = 6, 4


def gradients(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(30, 24, generator=generator) for _ in range(count)]


def follow(projector, grads: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(basis, 1/p) after each update's refresh or draw (1/p None for GaLore's projector)."""
    seen = []
    for step, grad in enumerate(grads):
        if projector.due(step):
            projector.refresh(grad, step)
        elif projector.resample_due(step):
            projector.resample(step)
        seen.append((projector.factors[1].clone(), None if projector.inv_p is None else projector.inv_p.clone()))
    return seen


@pytest.mark.parametrize("resample_every", [0, 1])
def test_sampling_until_the_switch_then_galores_basis(resample_every):
    until = 2 * GAP + 1  # the refreshes at 0, 4 and 8 sample; the one at 12 switches
    grads = gradients(20)
    options = dict(proj_type="right", update_proj_gap=GAP, resample_every=resample_every, seed=5)
    switched = build_projector("plumage", RANK, sample_until=until, **options)
    sampled = build_projector("plumage", RANK, **options)
    galore = build_projector("svd", RANK, proj_type="right", update_proj_gap=GAP)
    seen_switched, seen_sampled, seen_galore = follow(switched, grads), follow(sampled, grads), follow(galore, grads)

    for step in range(3 * GAP):  # the same draws until the first refresh at or after `until`
        assert torch.equal(seen_switched[step][0], seen_sampled[step][0]), step
        assert torch.equal(seen_switched[step][1], seen_sampled[step][1]), step
    assert (seen_sampled[3 * GAP][1] > 1).any()  # sampling throughout still rescales
    for step in range(3 * GAP, len(grads)):  # from the switch on, after every draw: GaLore's top-r basis, 1/p = 1
        basis, inv_p = seen_switched[step]
        assert torch.equal(basis, seen_galore[step][0]) and torch.equal(inv_p, torch.ones(RANK)), step
    assert switched.stats.get("resamples", 0) == sampled.stats.get("resamples", 0)  # the draws were made, changing nothing
    grad = grads[-1]
    # the same estimate (to float32 rounding: PLUMAGE's project_back multiplies by 1/p = 1 in its own order)
    torch.testing.assert_close(switched.project_back(switched.project(grad)), galore.project_back(galore.project(grad)),
                               rtol=1e-6, atol=1e-6)


def test_switched_projector_resumes_with_galores_basis():
    grads = gradients(14)
    projector = build_projector("plumage", RANK, proj_type="right", update_proj_gap=GAP, resample_every=1,
                                sample_until=GAP)
    follow(projector, grads[: GAP + 2])
    restored = build_projector("plumage", RANK, proj_type="right", update_proj_gap=GAP, resample_every=1,
                               sample_until=GAP)
    restored.load_state_dict(projector.state_dict())
    kept = projector.factors[1].clone()
    assert restored.resample_due(GAP + 2)
    restored.resample(GAP + 2)  # a draw after the load keeps the top-r basis and 1/p = 1
    assert torch.equal(restored.factors[1], kept) and torch.equal(restored.inv_p, torch.ones(RANK))
    assert not restored.moved or restored.transport(torch.ones(3, RANK)).equal(torch.ones(3, RANK))


def test_optimizer_passes_sample_until_to_its_projectors():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(24, 30, bias=False), nn.Linear(30, 24, bias=False))
    optimizer = build_optimizer("plumage_adafactor", net, rank=RANK, update_proj_gap=GAP, target_modules=("0", "1"),
                                sample_until=GAP, **PLUMAGE_ADAFACTOR_DRAWS)
    generator = torch.Generator().manual_seed(2)
    for _ in range(GAP + 3):
        for param in net.parameters():
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    projectors = [optimizer.projector_for(p, optimizer.param_groups[0]) for p in net.parameters()]
    for projector in projectors:
        assert projector.sample_until == GAP and projector.refresh_count == 2
        assert torch.equal(projector.inv_p, torch.ones(RANK, dtype=projector.inv_p.dtype))
    assert all(torch.isfinite(p).all() for p in net.parameters())


@pytest.mark.parametrize("name", ["svd", "random"])
def test_sample_until_refused_by_a_projector_that_does_not_sample(name):
    with pytest.raises(ValueError, match=r"sample_until=100 .* does not sample"):
        build_projector(name, RANK, sample_until=100)


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "1000"])
def test_bad_sample_until_named(value):
    with pytest.raises(ValueError, match=rf"sample_until must be an integer >= 1 .* got {value!r}"):
        build_projector("plumage", RANK, sample_until=value)
