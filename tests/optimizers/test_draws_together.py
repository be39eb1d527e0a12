"""PLUMAGE's draws of a group's weights made together after its updates (plumage.resample_together): the same bases,
1/p, pools and moments as each weight drawing right after its own update, for every backend that draws."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from galore_plumage import build_optimizer
from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS, base
from galore_plumage.projectors import PlumageProjector
from galore_plumage.projectors import plumage as plumage_module

DRAWS = {  # κ = 1: a draw after every update but a refresh's
    "plumage_adafactor": PLUMAGE_ADAFACTOR_DRAWS,  # its default of sessions 42-80
    "plumage_adamw": {"projector": "plumage", "resample_every": 1, "realign": "mv_meansplit", "v_floor": "none"},
    "plumage_adamw8bit": {"projector": "plumage", "resample_every": 1, "v_floor": "none"},
    "plumage_sgdm": {"projector": "plumage", "resample_every": 1},
}


def model() -> nn.Module:
    torch.manual_seed(0)  # three weights of one pool size and rank (2r = 12), one of another (8 x 72: a pool of 8)
    return nn.Sequential(nn.Linear(40, 40, bias=False), nn.Linear(40, 40, bias=False), nn.Linear(40, 40, bias=False),
                         nn.Linear(72, 8, bias=False), nn.LayerNorm(40))


def train(name: str, together: bool):
    """17 updates; together: optimizer.step(); else each weight by step_param, drawing right after its update."""
    net = model()
    optimizer = build_optimizer(name, net, rank=6, update_proj_gap=5, target_modules=("0", "1", "2", "3"),
                                stagger=True, **DRAWS[name])
    generator = torch.Generator().manual_seed(1)
    for _ in range(17):
        for param in net.parameters():
            param.grad = torch.randn(param.shape, generator=generator)
        if together:
            optimizer.step()
        else:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    optimizer.step_param(param, group, grad=param.grad)
    return net, optimizer


@pytest.mark.parametrize("name", DRAWS)
def test_draws_made_together_are_the_draws_made_one_by_one(name, monkeypatch):
    sizes = []
    real = plumage_module.resample_together
    monkeypatch.setattr(base, "resample_together", lambda projectors, steps: sizes.append(len(projectors))
                        or real(projectors, steps))
    together, together_optimizer = train(name, True)
    single, single_optimizer = train(name, False)
    assert sizes and max(sizes) >= 3, sizes  # the three same-sized weights drew together (staggered: not always all)
    for a, b in zip(together.parameters(), single.parameters(), strict=True):
        assert torch.equal(a, b)
        if b.dim() == 2:
            pa, pb = together_optimizer.projector_for(a, together_optimizer.param_groups[0]), \
                single_optimizer.projector_for(b, single_optimizer.param_groups[0])
            assert isinstance(pa, PlumageProjector) and pa.draws == pb.draws > 0
            assert torch.equal(pa.pool.order, pb.pool.order) and torch.equal(pa.pool.vectors, pb.pool.vectors)
            assert torch.equal(pa.inv_p, pb.inv_p)
        state_a, state_b = together_optimizer.state[a], single_optimizer.state[b]
        for key, value in state_a.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, state_b[key]), key


def test_a_group_of_one_pool_size_draws_once_for_all_and_others_alone(monkeypatch):
    """resample_together buckets by (pool size, rank): the bucket's probabilities are sampled in one call of
    systematic_samples; a projector alone in its bucket draws by its own resample."""
    calls = []
    real = plumage_module.systematic_samples
    monkeypatch.setattr(plumage_module, "systematic_samples", lambda p, k, generators: calls.append(p.shape[0])
                        or real(p, k, generators))
    alone = []
    real_resample = PlumageProjector.resample
    monkeypatch.setattr(PlumageProjector, "resample", lambda self, step: alone.append(self) or real_resample(self, step))
    net = model()
    optimizer = build_optimizer("plumage_adafactor", net, rank=6, update_proj_gap=50, target_modules=("0", "1", "2", "3"),
                                **PLUMAGE_ADAFACTOR_DRAWS)
    for _ in range(3):  # a refresh; a draw after each of the three updates
        for param in net.parameters():
            param.grad = torch.randn(param.shape)
        optimizer.step()
    assert calls == [3, 3, 3] and len(alone) == 3  # the 8 x 72 weight's pool holds its 8 vectors, not 12: alone
