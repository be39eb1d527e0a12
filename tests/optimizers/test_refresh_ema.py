"""refresh_ema: a refresh decomposes a running average of the full gradients instead of the step's own gradient."""

from __future__ import annotations

import pytest
import torch
from accumulation_helpers import assert_same_weights, train_alike

from galore_plumage import GaLoreAdamW, PlumageAdamW, build_optimizer
from galore_plumage.optimizers.base import refresh_target

RANK, GAP = 2, 3


def _gradients(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(8, 12, generator=generator, dtype=torch.float64) for _ in range(count)]


def _run(optimizer_cls, factor: float, gradients: list[torch.Tensor], **keys):
    weight = torch.nn.Parameter(torch.zeros(8, 12, dtype=torch.float64))
    optimizer = optimizer_cls([{"params": [weight], "rank": RANK, "update_proj_gap": GAP, "refresh_ema": factor, **keys}],
                              lr=1e-3)
    for grad in gradients:
        weight.grad = grad.clone()
        optimizer.step()
    return optimizer, weight


def _span(basis: torch.Tensor) -> torch.Tensor:
    return basis @ basis.T


@pytest.mark.parametrize("factor", [0.5, 0.9])
def test_the_second_refresh_fits_the_running_average_of_every_gradient_so_far(factor):
    gradients = _gradients(GAP + 1)  # steps 0..GAP: refreshes at step 0 and at step GAP
    optimizer, weight = _run(GaLoreAdamW, factor, gradients)
    average = gradients[0]
    for grad in gradients[1:]:
        average = factor * average + (1 - factor) * grad
    (basis,) = optimizer._projectors[weight].factors.values()
    expected = torch.linalg.svd(average, full_matrices=False).U[:, :RANK]
    torch.testing.assert_close(_span(basis), _span(expected), atol=1e-10, rtol=0)
    torch.testing.assert_close(optimizer.state[weight]["refresh_ema"], average, atol=1e-12, rtol=0)
    # ... and not the last gradient's, which is what refresh_ema = 0 (galore-torch) fits
    last = torch.linalg.svd(gradients[-1], full_matrices=False).U[:, :RANK]
    assert (_span(basis) - _span(last)).abs().max() > 0.1
    plain, plain_weight = _run(GaLoreAdamW, 0.0, gradients)
    (plain_basis,) = plain._projectors[plain_weight].factors.values()
    torch.testing.assert_close(_span(plain_basis), _span(last), atol=1e-10, rtol=0)
    assert "refresh_ema" not in plain.state[plain_weight]


def test_plumage_draws_its_pool_from_the_average_too():
    gradients = _gradients(GAP + 1)
    optimizer, weight = _run(PlumageAdamW, 0.5, gradients, projector="plumage")
    projector = optimizer._projectors[weight]
    average = gradients[0]
    for grad in gradients[1:]:
        average = 0.5 * average + 0.5 * grad
    pool = projector.pool.vectors.double()
    top = torch.linalg.svd(average, full_matrices=False).U[:, : pool.shape[1]]
    torch.testing.assert_close(_span(pool), _span(top), atol=1e-2, rtol=0)  # the pool is stored in bfloat16


def test_it_needs_the_full_gradient_at_every_step_in_per_layer_mode():
    weight = torch.nn.Parameter(torch.zeros(8, 12))
    group = {"params": [weight], "rank": RANK, "update_proj_gap": GAP, "refresh_ema": 0.9, "residual": "none"}
    optimizer = PlumageAdamW([group])
    weight.grad = torch.randn(8, 12)
    optimizer.step()  # not due for GAP steps: only the average needs the full gradient now
    assert optimizer.needs_full_grad(weight, optimizer.param_groups[0])
    optimizer.param_groups[0]["refresh_ema"] = 0.0
    assert not optimizer.needs_full_grad(weight, optimizer.param_groups[0])


def test_a_weight_sharded_over_ranks_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"refresh_ema=0.9 .*FSDP2.*set refresh_ema=0"):
        refresh_target({}, torch.ones(2, 2), 0.9, whole=False)


def test_a_non_finite_gradient_leaves_the_average_as_it_was():
    state = {}
    refresh_target(state, torch.ones(2, 3), 0.5, whole=True)
    refresh_target(state, torch.full((2, 3), float("nan")), 0.5, whole=True)
    torch.testing.assert_close(state["refresh_ema"], torch.ones(2, 3))
    refresh_target(state, torch.full((2, 3), 3.0), 0.5, whole=True)
    torch.testing.assert_close(state["refresh_ema"], torch.full((2, 3), 2.0))


def test_per_layer_accumulation_with_the_average_equals_normal_mode():
    accumulation, updates = 3, 5
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(torch.nn.Sequential(torch.nn.Linear(24, 16, bias=False), torch.nn.Tanh(),
                                          torch.nn.Linear(16, 20, bias=False)).double())
    options = {"lr": 1e-2, "rank": 4, "update_proj_gap": 2, "refresh_ema": 0.5, "residual": "none",
               "target_modules": ["0", "2"]}
    normal = build_optimizer("plumage_adamw", models[0], **options)
    with pytest.warns(UserWarning, match="because refresh_ema averages it"):
        per_layer = build_optimizer("plumage_adamw_per_layer", models[1], accumulation_steps=accumulation, **options)
    train_alike(models, normal, accumulation, updates, in_dim=24, out_dim=20)
    assert_same_weights(models[0], models[1])
    assert [s["refreshes"] for s in per_layer.optimizer.projector_stats().values()] == [3, 3]  # the hooks stepped
