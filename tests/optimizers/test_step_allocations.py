"""How many moment-sized tensors AdamW's low-rank update makes fresh: one, with or without v_floor.

On a CPU a fresh tensor of a few MiB may be new pages the kernel zeroes on first touch (docs/results.md §1, session 24:
0.97-0.99x of a steady step): the direction is written over the denominator's buffer,
and that buffer is the floor's M² once V is floored. Counted by intercepting every aten call and keeping the outputs
whose storage is none of the call's inputs'; the numbers must be the plain formula's, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from galore_plumage.optimizers.adamw import AdamWBackend

SHAPE = (48, 32)
BETAS = (0.9, 0.999)
EPS = 1e-6


class CountFreshTensors(TorchDispatchMode):
    """Counts the outputs of aten calls that have `numel` elements and a storage none of the call's inputs has."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel = numel
        self.fresh = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {leaf.untyped_storage().data_ptr() for leaf in tree_leaves((args, kwargs))
                  if isinstance(leaf, torch.Tensor)}
        out = func(*args, **kwargs)
        self.fresh += sum(1 for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)
                          and leaf.numel() == self.numel and leaf.untyped_storage().data_ptr() not in inputs)
        return out


def group(floor: str) -> dict:
    return {"lr": 1e-3, "betas": BETAS, "eps": EPS, "weight_decay": 0.0, "correct_bias": True, "v_floor": floor,
            "v_floor_horizon": None}


def moments_after_some_updates() -> dict:
    generator = torch.Generator().manual_seed(0)
    exp_avg = torch.randn(SHAPE, generator=generator)
    # some V below M² (the floor moves them), some above
    exp_avg_sq = exp_avg.square() * torch.rand(SHAPE, generator=generator) * 2
    return {"step": 5, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


@pytest.mark.parametrize("floor", ["m2", "none"])
def test_the_low_rank_update_makes_one_moment_sized_tensor(floor):
    state = moments_after_some_updates()
    grad = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    with CountFreshTensors(grad.numel()) as counter:
        update = AdamWBackend().update(state, grad, group(floor), param=None, rows=0)
    assert counter.fresh == 1  # the floor's M² or the denominator; the direction is written over it
    moment_pointers = {state[key].untyped_storage().data_ptr() for key in ("exp_avg", "exp_avg_sq")}
    assert update.direction.untyped_storage().data_ptr() not in moment_pointers | {grad.untyped_storage().data_ptr()}


@pytest.mark.parametrize("floor", ["m2", "none"])
def test_the_reused_buffer_gives_the_plain_formulas_bits(floor):
    state = moments_after_some_updates()
    grad = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    exp_avg, exp_avg_sq = state["exp_avg"].clone(), state["exp_avg_sq"].clone()
    if floor == "m2":
        exp_avg_sq = torch.maximum(exp_avg_sq, exp_avg.square())
    # galore-torch's calls, each result a new tensor
    exp_avg = exp_avg.mul(BETAS[0]).add(grad, alpha=1 - BETAS[0])
    exp_avg_sq = exp_avg_sq.mul(BETAS[1]).addcmul(grad, grad, value=1 - BETAS[1])
    expected = exp_avg / exp_avg_sq.sqrt().add(EPS)

    update = AdamWBackend().update(state, grad, group(floor), param=None, rows=0)
    assert torch.equal(state["exp_avg"], exp_avg) and torch.equal(state["exp_avg_sq"], exp_avg_sq)
    assert torch.equal(update.direction, expected)
