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


def limit_together(sizes: list[torch.Tensor], previous: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """growth_factor of several weights at once, the same numbers in a fixed number of kernels, as a function of
    tensors (the caller records the references; torch.compile can fuse it): the vector of factors, one per weight,
    and each weight's limited size, its next reference, as a tensor of its own (never views of one vector: each
    is saved on its own)."""
    factor = _within_limit(torch.stack(sizes), torch.stack([size.to(sizes[0]) for size in previous]))
    return factor, torch._foreach_mul(sizes, list(factor.unbind()))


def _within_limit(size: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """The factor that scales `size` down to GROWTH_LIMIT x `previous` where it is above (1 elsewhere, and where the
    previous size is zero)."""
    limit = GROWTH_LIMIT * previous
    return torch.where((limit > 0) & (size > limit), limit / size, 1.0)
