"""FLORA's projector: a Gaussian N(0, 1/r) matrix, redrawn from the seed at each refresh.

E[P Pᵀ] = I, so G P Pᵀ (right) and P Pᵀ G (left) are unbiased estimates of G. Only the seed and the refresh
count are state: the matrix is regenerated on load, never stored in a checkpoint.

Where it is drawn: on the CPU, in float64 then rounded (the values of every run before GPU draws existed, the same on
every machine); on a GPU, by a generator on that GPU in the projection's dtype, so a refresh costs microseconds instead
of a CPU draw and a copy (50–110 ms a weight on an H100 host: ../shared/measurements/step_time_cuda_h100.md). Either
way it is a pure function of seed, weight and refresh count: every rank draws the same matrix and a resumed run
regenerates it where it left off, on the weight's device.
"""

from __future__ import annotations

import math

import torch

from .base import Projector
from .pool import Basis
from .seeding import refresh_generator


def gaussian_factors(shape, ranks, generator: torch.Generator, dtype, device) -> dict[int, torch.Tensor]:
    """One dim_k × r_k matrix of N(0, 1/r_k) entries per projected mode, drawn where `generator` lives: a CPU one
    in float64 (then rounded to `dtype` and moved to `device`), any other on its device in `dtype`."""
    on_cpu = generator.device.type == "cpu"
    factors = {}
    for mode, rank in ranks.items():
        draw = torch.randn(shape[mode], rank, generator=generator, dtype=torch.float64 if on_cpu else dtype,
                           device=generator.device)
        factors[mode] = (draw / math.sqrt(rank)).to(dtype=dtype, device=device)
    return factors


class RandomProjector(Projector):
    name = "random"
    description = "FLORA: Gaussian N(0, 1/r) projection regenerated from a seed (unbiased, no SVD)"
    unbiased = True
    stores_factors = False
    checks_after = True  # the draw reads nothing of the gradient: a bad gradient's basis is drawn, then rejected

    def _new_basis(self, grad, ranks, generator):
        # the refresh's CPU generator where the gradient is on the CPU; else the same seed on the gradient's device
        if grad.device.type != "cpu":
            generator = refresh_generator(self.seed, self.index, self.refresh_count, device=grad.device)
        return Basis(gaussian_factors(grad.shape, ranks, generator, grad.dtype, grad.device))

    def _regenerate(self, dtype, device):
        if self.refresh_count == 0:
            return {}
        generator = refresh_generator(self.seed, self.index, self.refresh_count - 1, device=device)
        return gaussian_factors(self.shape, self._rank_per_mode, generator, dtype, device)
