"""PLUMAGE's sampling: min-variance inclusion probabilities and a systematic k-of-n sampler.

For G = Σ σ_i u_i v_iᵀ and an unbiased k-sparse estimator Ĝ = Σ_{i∈I} σ_i u_i v_iᵀ / p_i, the error terms
are orthogonal, so E‖Ĝ − G‖² = Σ (1/p_i − 1) σ_i² depends only on the marginals p_i = P(i ∈ I). Minimising
it under Σ p_i = k, 0 ≤ p_i ≤ 1 gives p_i ∝ σ_i, capped at 1 ("water filling"): the r* largest directions
are always kept and the rest share the remaining k − r* slots in proportion to σ.
"""

from __future__ import annotations

import torch


def inclusion_probabilities(sigma: torch.Tensor, k: int) -> tuple[int, torch.Tensor]:
    """Min-variance inclusion probabilities for choosing k of the directions with singular values sigma.

    sigma must be non-negative and sorted descending. Returns (r_star, p) with p float64, Σp = k,
    0 ≤ p ≤ 1, and p_i = 1 exactly for i < r_star (0-based):

        r* = min { r : (k − r) σ_{r+1} < Σ_{i>r} σ_i }   (1-based σ; r* = k when no r < k qualifies)
        p_i = (k − r*) σ_i / Σ_{j>r*} σ_j               for i > r*

    A spectrum with fewer than k non-zero values keeps them all and fills the free slots with zero-σ
    directions at p = 1: they carry nothing, so the estimate is exact.
    """
    sigma = sigma.detach().to(device="cpu", dtype=torch.float64).flatten()
    n = sigma.numel()
    if not 1 <= k:
        raise ValueError(f"k must be >= 1, got {k}")
    if n == 0 or not torch.isfinite(sigma).all() or (sigma < 0).any():
        raise ValueError(f"sigma must be a non-empty, finite, non-negative vector, got {sigma.tolist()[:8]}...")
    if (sigma[1:] > sigma[:-1]).any():
        raise ValueError("sigma must be sorted in descending order (as torch.linalg.svd returns it)")
    if k >= n:
        return n, torch.ones(n, dtype=torch.float64)

    tail = sigma.flip(0).cumsum(0).flip(0)  # tail[r] = Σ_{i>=r} σ_i (0-based)
    r = torch.arange(k, dtype=torch.float64)
    qualifies = (k - r) * sigma[:k] < tail[:k]
    r_star = int(qualifies.to(torch.int8).argmax()) if qualifies.any() else k

    p = torch.zeros(n, dtype=torch.float64)
    p[:r_star] = 1.0
    if r_star < k:
        p[r_star:] = ((k - r_star) * sigma[r_star:] / tail[r_star]).clamp(max=1.0)
    return r_star, p


def top_k_probabilities(n: int, k: int) -> tuple[int, torch.Tensor]:
    """inclusion_probabilities' (r_star, p) for an estimator that always keeps the k largest of n directions and never
    another (GaLore's top-k basis): p = 1 for the first min(k, n), 0 after. Biased, but in the same form, so a pool
    keeps its layout."""
    if not 1 <= k:
        raise ValueError(f"k must be >= 1, got {k}")
    kept = min(k, n)
    p = torch.zeros(n, dtype=torch.float64)
    p[:kept] = 1.0
    return kept, p


def systematic_sample(p: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k distinct indices, index i included with probability p[i] (Σp = k, 0 ≤ p ≤ 1): the wheel of fortune.

    The items are shuffled, laid end to end on [0, k) with lengths p, and hit by k pointers spaced 1 apart
    after one uniform offset. An item shorter than 1 can hold at most one pointer, so the k hits are
    distinct, and each item is hit with probability equal to its length. Returns a sorted LongTensor[k]
    (so sampled columns come out in descending-σ order). O(n) after the shuffle; no Python loop.
    """
    p = p.detach().to(device="cpu", dtype=torch.float64).flatten()
    return systematic_samples(p.unsqueeze(0), k, [generator])[0]


def systematic_samples(p: torch.Tensor, k: int, generators: list[torch.Generator]) -> torch.Tensor:
    """systematic_sample for each row of `p` (W × n, float64 on the CPU) with its own generator, the same draws
    (each row's shuffle and offset come from its generator, in that order), the arithmetic on all rows at once:
    PLUMAGE's draws of a model's weights at each update cost a few dozen small operations for all of them instead of
    for each (on a GPU those operations are the host's, and a step waits for them). Returns W × k sorted indices."""
    rows, n = p.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}] for {n} items, got {k}")
    if len(generators) != rows:
        raise ValueError(f"one generator per row of p: got {len(generators)} for {rows} rows")
    totals = p.sum(dim=1)
    misfit = (~torch.isfinite(p).all(dim=1)) | (p < 0).any(dim=1) | (p > 1 + 1e-9).any(dim=1)
    misfit |= (totals - k).abs() > 1e-6 * k
    if misfit.any():
        row = int(misfit.to(torch.int8).argmax())
        raise ValueError(f"p must lie in [0, 1] and sum to k={k}; it sums to {totals[row].item():.9g}"
                         + (f" (row {row})" if rows > 1 else ""))

    orders, offsets = [], []
    for generator in generators:  # each row's two draws from its own generator, in systematic_sample's order
        orders.append(torch.randperm(n, generator=generator))
        offsets.append(torch.rand((), dtype=torch.float64, generator=generator))
    order = torch.stack(orders)
    edges = p.gather(1, order).cumsum(1)
    edges *= k / edges[:, -1:]  # the last edge is exactly k, so no pointer falls past the end
    pointers = torch.stack(offsets).unsqueeze(1) + torch.arange(k, dtype=torch.float64)
    slots = torch.searchsorted(edges, pointers, right=True).clamp_(max=n - 1)

    # Rounding could in principle put two pointers in one item of length 1 + ε; push repeats apart
    # (strictly increasing from the left, then within range from the right). A no-op in exact arithmetic.
    steps = torch.arange(k)
    slots = torch.cummax(slots - steps, 1).values + steps
    slots = torch.minimum(slots, steps + (n - k))
    return order.gather(1, slots).sort(dim=1).values
