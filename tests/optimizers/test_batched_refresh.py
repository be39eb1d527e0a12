"""refresh_batch: same-shaped weights refreshing on one step are decomposed in one batched call, and train exactly as
when each decomposes its own gradient (on a CPU the batched LAPACK call runs the same routine per matrix)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from galore_plumage import PlumageAdamW
from galore_plumage.optimizers import batched_refresh
from galore_plumage.optimizers.batched_refresh import prepare_batched_refreshes


class Layer(nn.Module):
    """Four same-shaped projections (q, k, v, o), two of another shape, one wider than tall."""

    def __init__(self):
        super().__init__()
        self.square = nn.ModuleList(nn.Linear(40, 40, bias=False) for _ in range(4))
        self.up = nn.ModuleList(nn.Linear(40, 72, bias=False) for _ in range(2))
        self.down = nn.Linear(72, 40, bias=False)
        self.norm = nn.LayerNorm(40)

    def matrices(self):
        return [*self.square.parameters(), *self.up.parameters(), self.down.weight]


def train(refresh_batch: int, steps: int = 9, nan_at: tuple[int, int] | None = None, **options):
    torch.manual_seed(0)
    layer = Layer()
    groups = [{"params": layer.matrices(), "rank": 6, "update_proj_gap": 3, "refresh_batch": refresh_batch, **options},
              {"params": list(layer.norm.parameters())}]
    optimizer = PlumageAdamW(groups, lr=1e-2)
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        for param in layer.parameters():
            param.grad = torch.randn(param.shape, generator=data)
        if nan_at is not None and step == nan_at[0]:
            layer.matrices()[nan_at[1]].grad[0, 0] = float("nan")
        optimizer.step()
    return layer, optimizer


@pytest.mark.parametrize("options", [
    {},  # the default: GaLore's top-r basis with v_floor
    {"solver": "gram"},
    {"solver": "gram64", "stagger": True},
    {"projector": "plumage", "realign": "mv_meansplit"},  # PLUMAGE's draws from the batched spectrum
], ids=["svd", "gram", "gram64-staggered", "plumage"])
def test_batched_refreshes_train_exactly_as_one_by_one(options, monkeypatch):
    sizes = []
    real = batched_refresh.decompose_batch
    monkeypatch.setattr(batched_refresh, "decompose_batch", lambda grads, *a: sizes.append(len(grads)) or real(grads, *a))
    batched, batched_optimizer = train(refresh_batch=3, **options)
    single, single_optimizer = train(refresh_batch=1, **options)
    assert sizes, "no refresh was batched"
    assert max(sizes) <= 3 and min(sizes) >= 2  # at most refresh_batch weights a call; a lone weight is not batched
    if "stagger" not in options:  # the four square weights in calls of 3 (and the lone fourth on its own), the two up
        assert sizes == [3, 2] * 3
    for a, b in zip(batched.parameters(), single.parameters(), strict=True):
        assert torch.equal(a, b)
    assert batched_optimizer.projector_stats() == single_optimizer.projector_stats()  # refreshes, energy, ρ, r*


def test_a_member_with_a_bad_gradient_is_skipped_alone():
    # the batched call fails on the NaN member: every member decomposes its own gradient, the NaN one keeps its basis
    batched, optimizer = train(refresh_batch=4, nan_at=(3, 1))
    single, _ = train(refresh_batch=1, nan_at=(3, 1))
    for a, b in zip(batched.parameters(), single.parameters(), strict=True):
        assert torch.equal(a, b) and torch.isfinite(a).all()
    stats = optimizer.projector_stats()
    skipped = [stats[i]["skipped_refreshes"] for i in range(7)]
    assert skipped == [0, 1, 0, 0, 0, 0, 0]


def test_nothing_is_batched_where_it_cannot_be():
    layer = Layer()
    for options in ({"refresh_batch": 1}, {"refresh_batch": 4, "projector": "random"},
                    {"refresh_batch": 4, "refresh_ema": 0.9}):
        optimizer = PlumageAdamW([{"params": layer.matrices(), "rank": 6, **options}], lr=1e-2)
        for param in layer.parameters():
            param.grad = torch.randn_like(param)
        assert prepare_batched_refreshes(optimizer) == 0, options


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "4", None])
def test_a_bad_refresh_batch_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"refresh_batch must be an integer >= 1.*got {bad!r}"):
        PlumageAdamW([{"params": Layer().matrices(), "rank": 6, "refresh_batch": bad}], lr=1e-2)
