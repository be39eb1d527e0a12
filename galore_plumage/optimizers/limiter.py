"""Fira's norm-growth limiter (arXiv 2410.01623): a step's norm may grow by at most 1 % over its previous value.

Used where a step is made from raw gradients at a borrowed step size (sampled_step.norm_matched, residual.py), so one
gradient spike cannot move the weight at once.
"""

from __future__ import annotations

import torch

GROWTH_LIMIT = 1.01  # Fira's γ


def growth_factor(size: torch.Tensor, state: dict, key: str) -> torch.Tensor:
    """The factor (a 0-d tensor, <= 1) that keeps `size` within GROWTH_LIMIT x `state[key]`; records the limited size
    under `key`. Tensor ops only: no host synchronisation in a steady step. A zero previous size limits nothing: it
    would hold the step at zero for good."""
    previous = state.get(key)
    factor = torch.ones_like(size) if previous is None else _within_limit(size, previous.to(size))
    state[key] = (size * factor).detach().reshape(())
    return factor


def growth_factors(sizes: list[torch.Tensor], states: list[dict], key: str) -> torch.Tensor:
    """growth_factor of several weights at once (each state holding its previous size under `key`), the same numbers
    in a fixed number of kernels: a vector of factors, one per weight; each state records its own limited size."""
    factor = _within_limit(torch.stack(sizes), torch.stack([state[key].to(sizes[0]) for state in states]))
    for state, limited in zip(states, torch._foreach_mul(sizes, list(factor.unbind())), strict=True):
        state[key] = limited.detach()  # one tensor per weight (never views of one vector: each is saved on its own)
    return factor


def _within_limit(size: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """The factor that scales `size` down to GROWTH_LIMIT x `previous` where it is above (1 elsewhere, and where the
    previous size is zero)."""
    limit = GROWTH_LIMIT * previous
    return torch.where((limit > 0) & (size > limit), limit / size, 1.0)
