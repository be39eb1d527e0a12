"""benchmarks/model_refresh.py times what it says: the staggered schedule it assumes is the optimizer's, its slowest
update adds the weights due together, its shapes are the model's projected weights, and every row refreshes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import model_refresh  # noqa: E402

from galore_plumage.optimizers import GaLoreAdamW  # noqa: E402


@pytest.mark.parametrize(("count", "tau"), [(7, 5), (12, 40)])
def test_staggered_offsets_are_the_optimizers(count, tau):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(6, 4)) for _ in range(count)]
    optimizer = GaLoreAdamW([{"params": params, "rank": 2, "update_proj_gap": tau, "stagger": True}], lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()  # every weight refreshes on the first update, then at its staggered offset
    projectors = [optimizer.projector_for(p, optimizer.param_groups[0]) for p in params]
    scheduled = [projector.next_refresh - projector.refreshed_at for projector in projectors]
    assert scheduled == model_refresh.staggered_offsets(count, tau)


def test_slowest_staggered_update_adds_the_weights_due_together():
    # four weights over τ = 2: offsets 2, 2, 1, 1, so updates 1 and 2 refresh two weights each
    assert model_refresh.staggered_offsets(4, 2) == [2, 2, 1, 1]
    assert model_refresh.slowest_staggered_update([1.0, 2.0, 4.0, 8.0], 2) == 12.0
    assert model_refresh.slowest_staggered_update([5.0], 3) == 5.0


def test_projected_shapes_follow_the_config():
    shapes = model_refresh.projected_shapes("60m")  # hidden 512, intermediate 1376, 8 layers
    assert len(shapes) == 56
    assert shapes[:7] == [(512, 512)] * 4 + [(1376, 512), (1376, 512), (512, 1376)]


def test_every_row_refreshes_a_small_gradient():
    grad = torch.randn(48, 32, generator=torch.Generator().manual_seed(0))
    for name, refresh in model_refresh.rows(rank=8).items():
        assert model_refresh.timed(refresh, grad) > 0, name


def test_every_batched_row_refreshes_same_shaped_gradients():
    grads = list(torch.randn(3, 48, 32, generator=torch.Generator().manual_seed(0)))
    for name, refresh in model_refresh.batched_rows(rank=8).items():
        assert model_refresh.timed(refresh, grads) > 0, name


def test_only_times_the_named_rows_and_leaves_the_ratios_blank_without_galore_torch(monkeypatch):
    monkeypatch.setitem(model_refresh.RANKS, "tiny", 4)
    monkeypatch.setattr(model_refresh, "projected_shapes", lambda size: [(24, 16), (16, 40), (24, 16)])
    lines = model_refresh.measure("tiny", reps=1, tau=3, device=torch.device("cpu"), only=["ours svd (gram)"])
    table = [line for line in lines if line.startswith("| ours") or line.startswith("| galore")]
    assert [line.split(" | ")[0] for line in table] == ["| ours svd (gram)", "| ours svd (gram), batched 8",
                                                       "| ours svd (gram), batched 32"]
    assert table[0].split(" | ")[2] == "—" and table[0].split(" | ")[4].rstrip(" |") == "—"
    with_reference = model_refresh.measure("tiny", reps=1, tau=3, device=torch.device("cpu"),
                                           only=["ours svd (gram)", "galore-torch"])
    row = next(line for line in with_reference if line.startswith("| ours svd (gram) |"))
    assert float(row.split(" | ")[2]) > 0  # a ratio against galore-torch's row, timed this time


def test_batches_none_drops_the_batched_rows_and_bad_sizes_are_refused(monkeypatch):
    monkeypatch.setitem(model_refresh.RANKS, "tiny", 4)
    monkeypatch.setattr(model_refresh, "projected_shapes", lambda size: [(24, 16), (24, 16)])
    lines = model_refresh.measure("tiny", reps=1, tau=2, device=torch.device("cpu"), only=["ours svd (gram)"],
                                  batches=model_refresh.batch_sizes("none"))
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ours")] == ["| ours svd (gram)"]
    assert model_refresh.batch_sizes("4,16") == (4, 16)
    for bad in ("1", "8,x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--batches"):
            model_refresh.batch_sizes(bad)
