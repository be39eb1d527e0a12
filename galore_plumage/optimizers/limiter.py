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
    factor = torch.ones_like(size)
    previous = state.get(key)
    if previous is not None:
        limit = GROWTH_LIMIT * previous.to(size)
        factor = torch.where((limit > 0) & (size > limit), limit / size, factor)
    state[key] = (size * factor).detach().reshape(())
    return factor
