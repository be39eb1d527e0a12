"""PLUMAGE: r singular vectors sampled without replacement with min-variance probabilities, rescaled by 1/p.

With P = U[:, I] (or V[:, I]) and D = diag(p_I), Ĝ = P D⁻¹ Pᵀ G (left) or G P D⁻¹ Pᵀ (right) is unbiased,
E[Ĝ] = G, with the least trace variance Σ (1/p_i − 1) σ_i² of any such k-sparse estimator. Moments are
kept on the unscaled R = Pᵀ G; D⁻¹ is applied in project_back.
"""

from __future__ import annotations

from .base import Basis, Projector
from .sampling import inclusion_probabilities, systematic_sample
from .svd import decompose


class PlumageProjector(Projector):
    name = "plumage"
    description = "PLUMAGE: singular vectors sampled with min-variance inclusion probabilities, 1/p-rescaled (unbiased)"
    proj_types = ("std", "reverse_std", "left", "right")  # one-sided: the estimator samples one side's vectors
    unbiased = True
    from_spectrum = True

    def _new_basis(self, grad, ranks, generator):
        decomposition = decompose(grad, tuple(ranks), self.solver)
        return None if decomposition is None else self._basis_from_spectrum(decomposition, ranks, generator)

    def _basis_from_spectrum(self, decomposition, ranks, generator):
        ((mode, rank),) = ranks.items()
        sigma = decomposition.sigma
        r_star, p = inclusion_probabilities(sigma, rank)
        chosen = systematic_sample(p, rank, generator)
        p_chosen = p[chosen]
        inv_p = (1.0 / p_chosen).to(device=sigma.device, dtype=sigma.dtype)
        factor = decomposition.factor(mode, chosen.to(sigma.device))
        stats = {"r_star": r_star, "min_p": p_chosen.min().item(), "max_inv_p": (1.0 / p_chosen).max().item()}
        return Basis({mode: factor}, inv_p=inv_p, stats=stats)
