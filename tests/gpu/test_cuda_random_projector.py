"""FLORA's random bases on a GPU: drawn there from a seeded CUDA generator (skipped without a GPU; issue 15).

What a CPU draw gave and must still give: the same matrix on every rank (a pure function of seed, weight index and
refresh count), exactly the same matrix after a resume, and no host synchronisation (the draw queues on the device).
"""

import copy

import pytest
import torch
from torch import nn

from galore_plumage import GaLoreAdamW
from galore_plumage.projectors import build_projector, refresh_generator
from galore_plumage.projectors.random import gaussian_factors

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _refreshed(index=0, seed=0):
    projector = build_projector("random", 16, update_proj_gap=10, seed=seed, index=index)
    projector.refresh(torch.randn(64, 96, device="cuda"), 0)
    return projector


def test_the_basis_is_drawn_on_the_gradients_device_in_its_dtype():
    (factor,) = _refreshed().factors.values()
    assert factor.device.type == "cuda" and factor.dtype == torch.float32
    assert abs(factor.square().mean().item() * 16 - 1) < 0.1  # N(0, 1/r) entries


def test_the_draw_depends_on_seed_and_index_alone_and_regenerates_on_load():
    first, again, other = _refreshed(), _refreshed(), _refreshed(index=1)
    torch.testing.assert_close(first.factors, again.factors, rtol=0, atol=0)  # every rank draws the same matrix
    assert not torch.equal(first.factors[0], other.factors[0])
    loaded = build_projector("random", 16, update_proj_gap=10)
    loaded.load_state_dict(first.state_dict(), device="cuda")
    torch.testing.assert_close(loaded.factors, first.factors, rtol=0, atol=0)


def test_a_resumed_run_repeats_the_uninterrupted_one():
    def model():
        torch.manual_seed(0)
        return nn.Linear(96, 64, bias=False).cuda()

    def step(net, optimizer, seed):
        optimizer.zero_grad()
        x = torch.randn(8, 96, generator=torch.Generator().manual_seed(seed)).cuda()
        net(x).square().mean().backward()
        optimizer.step()

    def optimizer_for(net):
        return GaLoreAdamW([{"params": list(net.parameters()), "rank": 16, "update_proj_gap": 3, "projector": "random"}],
                           lr=1e-2)

    net, twin = model(), model()
    optimizer = optimizer_for(net)
    for seed in range(4):
        step(net, optimizer, seed)
    twin.load_state_dict(net.state_dict())
    twin_optimizer = optimizer_for(twin)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for seed in range(4, 8):  # a refresh at update 6 draws from the restored count
        step(net, optimizer, seed)
        step(twin, twin_optimizer, seed)
    torch.testing.assert_close(twin.weight, net.weight, rtol=0, atol=0)


def test_the_draw_does_not_synchronise_with_the_host():
    """The draw itself queues on the device (a refresh's one check that G is finite is another matter)."""
    generator = refresh_generator(0, 0, 0, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        factors = gaussian_factors((4096, 11008), {1: 1024}, generator, torch.float32, torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert factors[1].shape == (11008, 1024) and factors[1].device.type == "cuda"
