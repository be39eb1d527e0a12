"""How often a step reads a value back from the tensors it computes (on a GPU, each read waits for the device).

A steady step reads nothing; a refresh of GaLore's top-r basis or FLORA's Gaussian one reads once (the gradient's
check and the refresh's figures, energy captured and the overlap matrix whose singular values give ρ, in one transfer;
that SVD then runs on the host, since on a GPU one would wait for its error check: tests/gpu counts the waits).
Counted on the CPU by intercepting the Tensor methods that return Python values: the same calls synchronise a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from galore_plumage.optimizers import build_optimizer
from galore_plumage.projectors import build_projector

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
         torch.Tensor.__index__, torch.Tensor.numpy}


class CountReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.reads += 1
        return func(*args, **(kwargs or {}))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(32, 48, bias=False)  # low-rank
        self.norm = nn.LayerNorm(32)  # full-rank


def reads_per_step(name: str, steps: int = 6, gradients=None) -> list[int]:
    torch.manual_seed(0)
    model = Block()
    optimizer = build_optimizer(name, model, rank=8, update_proj_gap=3)
    counts = []
    for step in range(steps):
        for param in model.parameters():
            param.grad = gradients(step, param) if gradients else torch.randn_like(param)
        with CountReads() as counter:
            optimizer.step()
        counts.append(counter.reads)
    return counts


@pytest.mark.parametrize("name", ["plumage_adamw", "plumage_adamw8bit", "galore_adamw", "galore_adamw8bit",
                                  "galore_sgdm", "flora_adamw"])
def test_one_read_per_refresh_none_in_a_steady_step(name):
    assert reads_per_step(name) == [1, 0, 0, 1, 0, 0]


def test_a_rejected_gradient_keeps_the_basis_at_two_reads_at_most():
    torch.manual_seed(0)
    model = Block()
    optimizer = build_optimizer("plumage_adamw", model, rank=8, update_proj_gap=3)
    counts = []
    for step in range(4):
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        if step == 3:
            model.attn.weight.grad[0, 0] = float("nan")
            kept, weight = dict(optimizer.projector_for(model.attn.weight, optimizer.param_groups[0]).factors), \
                model.attn.weight.detach().clone()
        with CountReads() as counter:
            optimizer.step()
        counts.append(counter.reads)
    projector = optimizer.projector_for(model.attn.weight, optimizer.param_groups[0])
    assert projector.stats["refreshes"] == 1 and projector.stats["skipped_refreshes"] == 1
    assert all(torch.equal(projector.factors[k], kept[k]) for k in kept)
    assert torch.equal(model.attn.weight, weight)  # the NaN update skipped
    # the refresh's verdict (where the SVD returns NaN instead of failing, as on a GPU), then the optimizer's check of
    # the gradient before it skips the update
    assert counts[:3] == [1, 0, 0] and 1 <= counts[3] <= 2


@pytest.mark.parametrize("projector", ["svd", "plumage", "random"])
def test_the_gradients_check_is_never_read_on_its_own(projector, monkeypatch):
    """The check (finite, not zero) travels with what the refresh reads anyway: GaLore's and FLORA's figures, and
    PLUMAGE's σ, which its draw needs on the host. (PLUMAGE's own reads on the host, where it samples, are not device
    reads; on a CPU they cannot be told apart, so this counts reads of the check itself.)"""
    from galore_plumage.projectors import base

    flags = []
    real = base.gradient_usable
    monkeypatch.setattr(base, "gradient_usable", lambda grad: flags.append(real(grad)) or flags[-1])

    class CountFlagReads(TorchFunctionMode):
        reads = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in READS and args and any(args[0] is flag for flag in flags):
                CountFlagReads.reads += 1
            return func(*args, **(kwargs or {}))

    projector_ = build_projector(projector, 4, update_proj_gap=1)
    with CountFlagReads():
        for step in range(3):
            assert projector_.refresh(torch.randn(24, 16), step)
    assert len(flags) == 3 and CountFlagReads.reads == 0


@pytest.mark.parametrize("projector", ["svd", "plumage"])
def test_a_bad_gradient_leaves_the_basis(projector):
    built = build_projector(projector, 4, update_proj_gap=1, solver="gram")
    assert built.refresh(torch.randn(24, 16), 0)
    kept = {mode: factor.clone() for mode, factor in built.factors.items()}
    for bad in (float("nan"), float("inf")):
        grad = torch.randn(24, 16)
        grad[3, 5] = bad
        assert not built.refresh(grad, 1)
    assert not built.refresh(torch.zeros(24, 16), 1)
    assert all(torch.equal(built.factors[mode], kept[mode]) for mode in kept)
    assert built.stats["skipped_refreshes"] == 3 and built.refresh_count == 1
