"""Canonical signs for singular vectors, so a basis does not depend on which sign an SVD routine returned.

A singular vector is defined up to its sign, and LAPACK (CPU) and cuSOLVER (CUDA) may return opposite ones for
the same matrix. A projector that moves its moments to the new basis (PLUMAGE's realignment) is unaffected: the
transition B = F_newᵀ F_old carries the sign. GaLore keeps Adam's moments across a refresh as they are, so a
direction whose sign flipped starts its next interval with its momentum pointing backwards, and the trajectory
depends on the device (tests/gpu/test_cuda_optimizers.py) and on the LAPACK build. With `align_signs` each new
vector takes the sign that agrees with the previous basis, which makes the kept moments mean the same direction.
"""

from __future__ import annotations

import torch

# below this overlap with every old vector, a new vector is a new direction: its sign comes from its own entries
NEW_DIRECTION_OVERLAP = 0.1


def largest_entry_positive(factor: torch.Tensor) -> torch.Tensor:
    """Each column's sign chosen so that its entry of largest magnitude is positive (the first such entry on a tie)."""
    rows = factor.abs().argmax(dim=0)
    signs = torch.sign(factor[rows, torch.arange(factor.shape[1], device=factor.device)])
    return factor * torch.where(signs == 0, torch.ones_like(signs), signs)


def aligned_signs(new: torch.Tensor, old: torch.Tensor | None) -> torch.Tensor:
    """`new` (dim × r) with each column's sign chosen to agree with the old basis (dim × r_old).

    A column takes the sign of its largest overlap with an old vector, (F_oldᵀ f_j)[k*]; a column with no overlap
    above NEW_DIRECTION_OVERLAP (and every column of a first basis) gets largest_entry_positive, which is the same
    on every device too.
    """
    canonical = largest_entry_positive(new)
    if old is None:
        return canonical
    overlaps = old.to(new).T @ canonical  # r_old × r
    best = overlaps.gather(0, overlaps.abs().argmax(dim=0, keepdim=True)).squeeze(0)
    flip = (best < 0) & (best.abs() >= NEW_DIRECTION_OVERLAP)
    return canonical * torch.where(flip, -1.0, 1.0).to(new)
