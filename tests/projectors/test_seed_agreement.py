"""Sampled bases are a pure function of (seed, parameter index, refresh count), never of the global RNG.

That is what lets data-parallel ranks agree without communicating: two optimizers on copies of the same
weights, fed the same gradients, must draw identical bases however the global RNG is used in between.
"""

from __future__ import annotations

import pytest
import torch

from galore_plumage import PlumageAdamW
from galore_plumage.optimizers import PLUMAGE_SAMPLED

SHAPES = [(48, 32), (32, 40)]
STEPS, GAP, RANK = 9, 2, 6  # refreshes at steps 0, 2, 4, 6, 8


def _run(seed, projector, rng_disturbance):
    generator = torch.Generator().manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]
    group = {"params": weights, "rank": RANK, "update_proj_gap": GAP, "seed": seed, "projector": projector}
    optimizer = PlumageAdamW([group], lr=1e-2, weight_decay=0.1)
    grads = torch.Generator().manual_seed(1)
    bases = []
    for step in range(STEPS):
        rng_disturbance(step)
        for w in weights:
            # A flat spectrum (plain Gaussian), so no direction is kept with certainty (r* = 0) and
            # every sampled slot is a real random choice.
            w.grad = torch.randn(w.shape, generator=grads)
        optimizer.step()
        bases.append([dict(optimizer.projector_for(w, group).factors) for w in weights])
    return optimizer, weights, bases


def _reseed_each_step(step):
    torch.manual_seed(1000 + step)


def _consume_unevenly(step):
    torch.randn(17 * (step + 1))
    torch.randperm(5 + step)


@pytest.mark.parametrize("projector", ["plumage", "random"])
def test_same_seed_same_bases_and_weights_whatever_the_global_rng(projector):
    first, weights_a, bases_a = _run(seed=3, projector=projector, rng_disturbance=_reseed_each_step)
    second, weights_b, bases_b = _run(seed=3, projector=projector, rng_disturbance=_consume_unevenly)
    for step_a, step_b in zip(bases_a, bases_b, strict=True):
        for factors_a, factors_b in zip(step_a, step_b, strict=True):
            assert factors_a.keys() == factors_b.keys()
            assert all(torch.equal(factors_a[k], factors_b[k]) for k in factors_a)
    for a, b in zip(weights_a, weights_b, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(first.param_groups[0]["params"], second.param_groups[0]["params"], strict=True):
        inv_a, inv_b = first.state[a]["projector"].get("inv_p"), second.state[b]["projector"].get("inv_p")
        assert (inv_a is None) == (inv_b is None) and (inv_a is None or torch.equal(inv_a, inv_b))


@pytest.mark.parametrize("projector", ["plumage", "random"])
def test_a_different_seed_draws_different_bases(projector):
    _, _, bases_a = _run(seed=3, projector=projector, rng_disturbance=_reseed_each_step)
    _, _, bases_b = _run(seed=4, projector=projector, rng_disturbance=_reseed_each_step)
    # The first refresh sees the same gradient in both runs, so any difference is the seed's doing.
    for factors_a, factors_b in zip(bases_a[0], bases_b[0], strict=True):
        for mode in factors_a:
            assert not torch.equal(factors_a[mode], factors_b[mode])
            if projector == "plumage":  # sampled singular vectors: compare which ones (up to sign)
                overlap = (factors_a[mode].T @ factors_b[mode]).abs()
                assert (overlap.amax(dim=1) < 0.5).any()  # some direction of one run is absent from the other


def test_parameters_draw_independently():
    """Two weights with identical gradients in one optimizer still sample different directions (index j)."""
    generator = torch.Generator().manual_seed(0)
    grad = torch.randn(48, 32, generator=generator)
    weights = [torch.nn.Parameter(torch.zeros(48, 32)) for _ in range(2)]
    group = {"params": weights, "rank": RANK, "update_proj_gap": GAP, "seed": 3, **PLUMAGE_SAMPLED}
    optimizer = PlumageAdamW([group], lr=1e-2)
    for w in weights:
        w.grad = grad.clone()
    optimizer.step()
    first, second = (optimizer.projector_for(w, group).factors[1] for w in weights)
    assert not torch.equal(first, second)
