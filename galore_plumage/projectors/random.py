"""FLORA's projector: a Gaussian N(0, 1/r) matrix, redrawn from the seed at each refresh.

E[P Pᵀ] = I, so G P Pᵀ (right) and P Pᵀ G (left) are unbiased estimates of G. Only the seed and the refresh
count are state: the matrix is regenerated on load, never stored in a checkpoint.
"""

from __future__ import annotations

import math

import torch

from .base import Basis, Projector, refresh_generator


def gaussian_factors(shape, ranks, generator, dtype, device) -> dict[int, torch.Tensor]:
    """One dim_k × r_k matrix of N(0, 1/r_k) entries per projected mode, drawn in float64 on the CPU."""
    factors = {}
    for mode, rank in ranks.items():
        draw = torch.randn(shape[mode], rank, generator=generator, dtype=torch.float64)
        factors[mode] = (draw / math.sqrt(rank)).to(dtype=dtype, device=device)
    return factors


class RandomProjector(Projector):
    name = "random"
    description = "FLORA: Gaussian N(0, 1/r) projection regenerated from a seed (unbiased, no SVD)"
    unbiased = True
    stores_factors = False

    def _new_basis(self, grad, ranks, generator):
        return Basis(gaussian_factors(grad.shape, ranks, generator, grad.dtype, grad.device))

    def _regenerate(self, dtype):
        if self.refresh_count == 0:
            return {}
        generator = refresh_generator(self.seed, self.index, self.refresh_count - 1)
        return gaussian_factors(self.shape, self._rank_per_mode, generator, dtype, "cpu")
