"""PLUMAGE: r singular vectors sampled without replacement with min-variance probabilities, rescaled by 1/p.

With P = U[:, I] (or V[:, I]) and D = diag(p_I), Ĝ = P D⁻¹ Pᵀ G (left) or G P D⁻¹ Pᵀ (right) is unbiased,
E[Ĝ] = G, with the least trace variance Σ (1/p_i − 1) σ_i² of any such k-sparse estimator. Moments are
kept on the unscaled R = Pᵀ G; D⁻¹ is applied in project_back.

`max_inv_p` (default None: the paper's estimator) caps each 1/p at c, as truncated importance weights do: the
estimate becomes biased, E[Ĝ] = Σ min(1, c·p_i) σ_i u_i v_iᵀ, but no direction's step is amplified more than c
times. Why one would: an adaptive backend (Adam, Adafactor) normalizes every low-rank coordinate to O(1) before
D⁻¹, so a direction sampled with p = 1e-4 moves 1e4 times as far as a kept one although its gradient is tiny
(docs/results.md, "Capping 1/p").

`resample_every` = κ > 0 (the paper's κ) keeps the top K = pool_factor · r (default 2r) singular vectors of a refresh as
a pool and draws the r
directions again from it every κ updates (Projector.resample; the optimizer carries the moments along), so a tail
direction is not followed for a whole refresh interval. p is then the min-variance one for σ[:K]: each draw is
unbiased for G's rank-K truncation, and the pool's p (K values) and vectors (dim × K) are saved with the projector.

`sample_until` = N (default None: sample throughout, the paper) ends the sampling at update N: a refresh from then on
gives p = 1 to the top r singular vectors and 0 to the rest, so it keeps GaLore's basis with 1/p = 1 and no draw changes
it. Why one would: on the CPU protocol the draws led GaLore's basis over the first ~1000 updates of a 5000-update run
and trailed it after; drawing until update 1000 ended 0.036 ahead of drawing throughout (docs/results.md, sessions
76-77).
"""

from __future__ import annotations

import torch

from .base import Projector
from .pool import Basis, Pool
from .sampling import inclusion_probabilities, systematic_sample, systematic_samples, top_k_probabilities


class PlumageProjector(Projector):
    name = "plumage"
    description = "PLUMAGE: singular vectors sampled with min-variance inclusion probabilities, 1/p-rescaled (unbiased)"
    proj_types = ("std", "reverse_std", "left", "right")  # one-sided: the estimator samples one side's vectors
    unbiased = True  # with max_inv_p unset
    from_spectrum = True
    signed = True
    rescales = True
    checks_after = True  # the check is read with σ, before the draw (which refuses NaN σ)

    def auto_solver(self, device):
        if self.resample_every and self.pool_factor <= 2:
            # p over the pool's top 2r σ only, which float32's Gram gives to 1e-4 as it gives the top-r basis (the
            # protocol: within seed noise of the SVD, docs/results.md §3, session 15)
            return "gram"
        # the paper's p read the whole spectrum, whose tail float32 squaring loses. In float64 the Gram keeps it (p to
        # 1e-4 down to σ = 1e-6 σ₁, tests/projectors/test_solver_accuracy.py), in 0.59-0.68x an SVD's time on a CPU
        # (docs/step_time.md) and 0.25x (350M layer) to 0.32x (130M) on an H200 (docs/step_time_cuda.md, session 35;
        # a GPU whose float64 runs at 1/64 of float32's speed is unmeasured)
        return "gram64"

    def _basis_from_spectrum(self, decomposition, ranks, generator, step):
        ((mode, rank),) = ranks.items()
        sigma = decomposition.sigma
        device, dtype = sigma.device, sigma.dtype  # of the vectors and of 1/p; σ itself may move to the host below
        if decomposition.usable is not None:  # the gradient's check comes to the host with σ, which the draw needs there
            on_host = torch.cat([sigma.double(), decomposition.usable.double().reshape(1)]).cpu()
            if not on_host[-1]:
                return None
            sigma = on_host[:-1]
        if self.resample_every:
            # later draws choose among the top K vectors only, so this refresh's p is the min-variance one for
            # σ[:K]: the estimate is unbiased for G's rank-K truncation (the tail past K is not in the pool)
            sigma = sigma[: min(sigma.numel(), self.pool_factor * rank)]
        sampling = self.sample_until is None or step < self.sample_until
        r_star, p = inclusion_probabilities(sigma, rank) if sampling else top_k_probabilities(sigma.numel(), rank)
        chosen = systematic_sample(p, rank, generator)
        chosen_p = p[chosen]
        pool = None
        if self.resample_every:  # kept even when every slot is (no draw then): a checkpoint's layout stays fixed
            pool, factor = Pool(decomposition.factor(mode, slice(0, sigma.numel())), p).arranged(chosen)
        else:
            factor = decomposition.factor(mode, chosen.to(device))
        inv_p = self._inv_p(chosen_p, device, dtype)
        # max_inv_p in the stats is the estimator's own largest 1/p; "capped" counts the directions the cap cut
        stats = {"r_star": r_star, "min_p": chosen_p.min().item(), "max_inv_p": 1.0 / chosen_p.min().item()}
        if self.max_inv_p is not None:
            stats["capped"] = int((1.0 / chosen_p > self.max_inv_p).sum())
        return Basis({mode: factor}, inv_p=inv_p, stats=stats, pool=pool)

    def _draw(self, pool, generator, mode, rank):
        """`rank` of the pool's vectors drawn with its probabilities (side `mode`), swapped in place into the pool's
        first columns (the basis is a view of them); their 1/p (capped) in column order; the columns that changed."""
        chosen = systematic_sample(pool.canonical(), rank, generator)
        entering = pool.swap_in(chosen)
        return {mode: pool.vectors[:, :rank]}, self._inv_p(pool.p[:rank], pool.vectors.device, self._dtype), entering

    def _inv_p(self, chosen_p: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """1/p of `chosen_p` (capped at max_inv_p), in `dtype` on `device`, without waiting on the device."""
        inv_p = 1.0 / chosen_p
        if self.max_inv_p is not None:
            inv_p = inv_p.clamp(max=self.max_inv_p)
        return inv_p.to(dtype=dtype).to(device, non_blocking=True)  # a draw's: no host synchronisation

    # ----------------------------------------------------------------- draws made together (resample_together)
    def draw_layout(self) -> tuple:
        """What a draw's arithmetic shares with another's when made together: the pool's size and the rank, and 1/p's
        cap, dtype and device."""
        ((_, rank),) = self._rank_per_mode.items()
        return self.pool.p.numel(), rank, self.max_inv_p, self._dtype, self.pool.vectors.device

    def inverse_probabilities_of_draws(self, pools: list[Pool]) -> list[torch.Tensor]:
        """1/p of the drawn vectors of each of `pools` (of this projector's draw_layout), computed on all at once."""
        ((_, rank),) = self._rank_per_mode.items()
        rows = self._inv_p(torch.stack([pool.p[:rank] for pool in pools]), torch.device("cpu"), self._dtype)
        return [row.to(self.pool.vectors.device, non_blocking=True, copy=True) for row in rows]  # each its own tensor

    def install_draw(self, step: int, entering: torch.Tensor, inv_p: torch.Tensor) -> None:
        """Install a draw already swapped into this projector's pool (Pool.swap_in_together) and its 1/p."""
        ((mode, rank),) = self._rank_per_mode.items()
        self._drawn(step, {mode: self.pool.vectors[:, :rank]}, inv_p, entering)


def resample_together(projectors: list[Projector], steps: list[int]) -> None:
    """Projector.resample(step) of each of `projectors`, each at its own step (their draws due after this update),
    the draws of PLUMAGE's projectors that share a draw_layout made together: their probabilities reordered, sampled
    (sampling.systematic_samples, each from its own generator), the columns to swap found and 1/p computed for all at
    once, the swaps themselves pool by pool. The same bases, 1/p and changed columns as one by one
    (tests/optimizers/test_draws_together.py); at κ = 1 a draw before every update of every weight is a few dozen
    small host operations each, which on a GPU the step waits for (docs/step_time_cuda.md)."""
    buckets: dict[tuple, list[tuple[PlumageProjector, int]]] = {}
    for projector, step in zip(projectors, steps, strict=True):
        if isinstance(projector, PlumageProjector):
            buckets.setdefault(projector.draw_layout(), []).append((projector, step))
        else:
            projector.resample(step)
    for (_, rank, *_), bucket in buckets.items():
        if len(bucket) == 1:
            projector, step = bucket[0]
            projector.resample(step)
            continue
        pools = [projector.pool for projector, _ in bucket]
        generators = [projector.next_draw_generator() for projector, _ in bucket]
        chosen = systematic_samples(Pool.canonical_together(pools), rank, generators)
        enterings = Pool.swap_in_together(pools, chosen)
        inv_ps = bucket[0][0].inverse_probabilities_of_draws(pools)
        for (projector, step), entering, inv_p in zip(bucket, enterings, inv_ps, strict=True):
            projector.install_draw(step, entering, inv_p)
