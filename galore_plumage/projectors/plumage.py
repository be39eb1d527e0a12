"""PLUMAGE: r singular vectors sampled without replacement with min-variance probabilities, rescaled by 1/p.

With P = U[:, I] (or V[:, I]) and D = diag(p_I), Ĝ = P D⁻¹ Pᵀ G (left) or G P D⁻¹ Pᵀ (right) is unbiased,
E[Ĝ] = G, with the least trace variance Σ (1/p_i − 1) σ_i² of any such k-sparse estimator. Moments are
kept on the unscaled R = Pᵀ G; D⁻¹ is applied in project_back.

`max_inv_p` (default None: the paper's estimator) caps each 1/p at c, as truncated importance weights do: the
estimate becomes biased, E[Ĝ] = Σ min(1, c·p_i) σ_i u_i v_iᵀ, but no direction's step is amplified more than c
times. Why one would: an adaptive backend (Adam, Adafactor) normalizes every low-rank coordinate to O(1) before
D⁻¹, so a direction sampled with p = 1e-4 moves 1e4 times as far as a kept one although its gradient is tiny
(docs/results.md, "Capping 1/p").
"""

from __future__ import annotations

from .base import Basis, Projector
from .sampling import inclusion_probabilities, systematic_sample
from .svd import decompose


class PlumageProjector(Projector):
    name = "plumage"
    description = "PLUMAGE: singular vectors sampled with min-variance inclusion probabilities, 1/p-rescaled (unbiased)"
    proj_types = ("std", "reverse_std", "left", "right")  # one-sided: the estimator samples one side's vectors
    unbiased = True  # with max_inv_p unset
    from_spectrum = True
    rescales = True

    def _new_basis(self, grad, ranks, generator):
        decomposition = decompose(grad, tuple(ranks), self.solver)
        return None if decomposition is None else self._basis_from_spectrum(decomposition, ranks, generator)

    def _basis_from_spectrum(self, decomposition, ranks, generator):
        ((mode, rank),) = ranks.items()
        sigma = decomposition.sigma
        r_star, p = inclusion_probabilities(sigma, rank)
        chosen = systematic_sample(p, rank, generator)
        p_chosen = p[chosen]
        inv_p = 1.0 / p_chosen
        # max_inv_p in the stats is the estimator's own largest 1/p; "capped" counts the directions the cap cut
        stats = {"r_star": r_star, "min_p": p_chosen.min().item(), "max_inv_p": inv_p.max().item()}
        if self.max_inv_p is not None:
            stats["capped"] = int((inv_p > self.max_inv_p).sum())
            inv_p = inv_p.clamp(max=self.max_inv_p)
        factor = decomposition.factor(mode, chosen.to(sigma.device))
        return Basis({mode: factor}, inv_p=inv_p.to(device=sigma.device, dtype=sigma.dtype), stats=stats)
