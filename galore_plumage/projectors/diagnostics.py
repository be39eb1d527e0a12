"""How good a projector's gradient estimate is: Monte Carlo bias and error, and each projector's closed form.

For one gradient G and Ĝ = project_back(project(G)) at scale 1, with a fresh projector (seed s) per draw:

    bias  = ‖mean_s Ĝ_s − G‖ / ‖G‖          error = mean_s ‖Ĝ_s − G‖² / ‖G‖²

Closed forms of the expected error, with σ the singular values of G, k the rank, d the projected side's size:
    svd      Σ_{i>k} σ_i² / Σ σ_i²                  (deterministic: error = bias²)
    random   (d + 1) / k                            (P of N(0, 1/k) entries: E[(P Pᵀ − I)²] = (d + 1)/k · I)
    plumage  Σ_i (1/p_i − 1) σ_i² / Σ σ_i²          (the least of any unbiased k-sparse estimator)
An unbiased estimator's Monte Carlo bias is noise of size about √(error / draws): `bias_floor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .modes import projected_modes
from .sampling import inclusion_probabilities


@dataclass(frozen=True)
class EstimateQuality:
    bias: float  # ‖mean Ĝ − G‖ / ‖G‖
    error: float  # mean ‖Ĝ − G‖² / ‖G‖²
    error_sem: float  # standard error of `error` over the draws (0 for one draw)
    draws: int

    @property
    def bias_floor(self) -> float:
        """The bias an unbiased estimator shows from Monte Carlo noise alone, √(error / draws)."""
        return math.sqrt(self.error / self.draws)


def closed_form_error(name: str, sigma: torch.Tensor, rank: int, side: int) -> float | None:
    """E‖Ĝ − G‖² / ‖G‖² for `name` (svd, random, plumage); None for a projector without one."""
    sigma = sigma.to(torch.float64)
    energy = sigma.square()
    total = energy.sum().item()
    if name == "svd":
        return energy[rank:].sum().item() / total
    if name == "random":
        return (side + 1) / min(rank, side)
    if name == "plumage":
        _, p = inclusion_probabilities(sigma, rank)
        kept = p > 0
        return ((1.0 / p[kept] - 1.0) * energy[kept]).sum().item() / total
    return None


def projected_side(shape: tuple[int, int], proj_type: str = "std") -> int:
    """The size of the side a one-sided projector projects for this shape and proj_type."""
    (mode,) = projected_modes(shape, proj_type)
    return shape[mode]


def monte_carlo(build, grad: torch.Tensor, draws: int) -> EstimateQuality:
    """Bias and error of Ĝ over `draws` projectors `build(seed)` (seeds 0..draws-1), each refreshed on `grad`."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    grad64 = grad.to(torch.float64)
    norm2 = grad64.square().sum().item()
    total = torch.zeros_like(grad64)
    errors = []
    for seed in range(draws):
        projector = build(seed)
        if not projector.refresh(grad, step=0):
            raise ValueError("the projector kept no basis for this gradient (non-finite or all zero)")
        estimate = projector.project_back(projector.project(grad)).to(torch.float64)
        total += estimate
        errors.append((estimate - grad64).square().sum().item() / norm2)
    errors_t = torch.tensor(errors, dtype=torch.float64)
    sem = errors_t.std().item() / math.sqrt(draws) if draws > 1 else 0.0
    bias = ((total / draws - grad64).norm() / math.sqrt(norm2)).item()
    return EstimateQuality(bias, errors_t.mean().item(), sem, draws)
