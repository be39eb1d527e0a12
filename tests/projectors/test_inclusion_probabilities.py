"""inclusion_probabilities(sigma, k): PLUMAGE's min-variance marginals, checked on hand-worked spectra.

r* = min { r : (k − r) σ_{r+1} < Σ_{i>r} σ_i } (1-based σ), p_i = 1 for i ≤ r*, p_i = (k − r*) σ_i / Σ_{j>r*} σ_j.
"""

from __future__ import annotations

import pytest
import torch

from galore_plumage.projectors import inclusion_probabilities, systematic_sample


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


def _trace_variance(sigma, p):
    """Σ (1/p_i − 1) σ_i² of the 1/p-rescaled sparse estimator (terms with σ_i = 0 contribute nothing)."""
    keep = sigma > 0
    return ((1.0 / p[keep] - 1.0) * sigma[keep] ** 2).sum().item()


# (sigma, k, expected r*, expected p), each worked out by hand:
HAND_WORKED = {
    # flat: r = 0 already qualifies (3·2 = 6 < 16 = Σσ), so r* = 0 and every p = 3·2/16 = k/n = 0.375.
    "flat": ([2.0] * 8, 3, 0, [0.375] * 8),
    # Zipf σ_i = 1/i, i = 1..6, k = 3, Σσ = 49/20 = 2.45.
    #   r = 0: 3·1 = 3 < 2.45? no.   r = 1: 2·(1/2) = 1 < 2.45 − 1 = 1.45 = 29/20? yes → r* = 1.
    #   p_i = 2 σ_i / (29/20) = 40 σ_i / 29 → 20/29, 40/87, 10/29, 8/29, 20/87;  1 + 174/87 = 3.
    "zipf": ([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6], 3, 1, [1, 20 / 29, 40 / 87, 10 / 29, 8 / 29, 20 / 87]),
    # geometric σ = 16, 8, 4, 2, 1 (Σ = 31), k = 3.
    #   r = 0: 48 < 31? no.   r = 1: 2·8 = 16 < 15? no.   r = 2: 1·4 = 4 < 7? yes → r* = 2.
    #   p = 1, 1, 4/7, 2/7, 1/7;  2 + 7/7 = 3.
    "geometric": ([16, 8, 4, 2, 1], 3, 2, [1, 1, 4 / 7, 2 / 7, 1 / 7]),
    # one dominant σ = 100, 1 × 5 (Σ = 105), k = 2.
    #   r = 0: 200 < 105? no.   r = 1: 1·1 < 5? yes → r* = 1;  p = 1, then 1·1/5 = 0.2 each;  1 + 5·0.2 = 2.
    "dominant": ([100, 1, 1, 1, 1, 1], 2, 1, [1, 0.2, 0.2, 0.2, 0.2, 0.2]),
    # rank-deficient σ = 3, 1, 0, 0, 0, 0 with k = 4: no r < 4 qualifies
    #   (r = 0: 12 < 4, r = 1: 3 < 1, r = 2: 0 < 0, r = 3: 0 < 0 are all false) → r* = k = 4,
    #   the two non-zero directions and the first two zero ones get p = 1, the rest 0.
    "rank_deficient": ([3, 1, 0, 0, 0, 0], 4, 4, [1, 1, 1, 1, 0, 0]),
    # k = n and k > n: everything is kept, r* = n.
    "k_equals_n": ([3, 2, 1], 3, 3, [1, 1, 1]),
    "k_above_n": ([3, 2, 1], 5, 3, [1, 1, 1]),
}


@pytest.mark.parametrize("case", sorted(HAND_WORKED))
def test_hand_worked_spectra(case):
    sigma, k, r_expected, p_expected = HAND_WORKED[case]
    r_star, p = inclusion_probabilities(_f64(sigma), k)
    assert r_star == r_expected
    assert p.dtype == torch.float64
    torch.testing.assert_close(p, _f64(p_expected), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n, k", [(16, 1), (16, 4), (64, 8), (7, 6)])
def test_invariants_on_random_spectra(seed, n, k):
    generator = torch.Generator().manual_seed(seed)
    sigma = (torch.rand(n, generator=generator, dtype=torch.float64) ** (1 + seed)).sort(descending=True).values
    r_star, p = inclusion_probabilities(sigma, k)
    assert p.dtype == torch.float64 and p.shape == (n,)
    assert abs(p.sum().item() - k) < 1e-12 * k
    assert (p >= 0).all() and (p <= 1).all()
    assert (p[:r_star] == 1).all()
    assert (p[1:] <= p[:-1]).all()  # ordered like sigma
    if r_star < k:
        assert (p[r_star:] < 1).all()

    # r* is the smallest r of the rule (1-based σ_{r+1} is sigma[r] here).
    def qualifies(r):
        return (k - r) * sigma[r].item() < sigma[r:].sum().item()

    assert all(not qualifies(r) for r in range(r_star))
    assert r_star == k or qualifies(r_star)

    # Water filling, an independent characterisation: p_i = min(1, c σ_i) for the c that makes Σp = k.
    lo, hi = 0.0, 1e12
    for _ in range(200):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if (c * sigma).clamp(max=1).sum() < k else (lo, c)
    torch.testing.assert_close(p, (hi * sigma).clamp(max=1), rtol=0, atol=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_minimises_trace_variance(seed):
    """No other feasible marginals (Σq = k, 0 < q ≤ 1) give a smaller Σ (1/q_i − 1) σ_i²."""
    generator = torch.Generator().manual_seed(seed)
    n, k = 12, 4
    sigma = torch.rand(n, generator=generator, dtype=torch.float64).pow(3).sort(descending=True).values
    _, p = inclusion_probabilities(sigma, k)
    best = _trace_variance(sigma, p)
    uniform = torch.full((n,), k / n, dtype=torch.float64)
    assert best < _trace_variance(sigma, uniform)
    for _ in range(200):
        # A random feasible point: a convex mix of p with a random feasible q (the feasible set is convex).
        q = torch.rand(n, generator=generator, dtype=torch.float64) + 0.05
        q = q * k / q.sum()
        while (q > 1).any():  # cap and redistribute, keeps Σq = k
            excess = (q - 1).clamp(min=0).sum()
            q = q.clamp(max=1)
            free = q < 1
            q[free] += excess * q[free] / q[free].sum()
        t = torch.rand((), generator=generator, dtype=torch.float64)
        mixed = t * q + (1 - t) * p
        assert _trace_variance(sigma, mixed) >= best - 1e-12


def test_scale_invariant():
    sigma = _f64([5, 3, 2, 2, 1, 0.5, 0.1])
    r1, p1 = inclusion_probabilities(sigma, 3)
    r2, p2 = inclusion_probabilities(sigma * 1e-6, 3)
    assert r1 == r2
    torch.testing.assert_close(p1, p2, rtol=0, atol=1e-12)


def test_accepts_float32_and_returns_float64():
    r_star, p = inclusion_probabilities(torch.tensor([4.0, 2.0, 1.0, 1.0]), 2)
    assert p.dtype == torch.float64
    assert r_star == 1  # r = 0: 2·4 = 8 < 8? no. r = 1: 1·2 < 4? yes.
    torch.testing.assert_close(p, _f64([1, 0.5, 0.25, 0.25]), rtol=0, atol=0)


def test_rank_deficient_estimate_is_exact(spectral_matrix):
    """Fewer than k non-zero σ: the sampled directions include all of them, so Ĝ = G on every draw."""
    g, u, sigma, v = spectral_matrix(10, 6, [3.0, 1.0, 0.0, 0.0, 0.0, 0.0], seed=1)
    k = 4
    r_star, p = inclusion_probabilities(sigma, k)
    assert r_star == k
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        chosen = systematic_sample(p, k, generator)
        assert set(chosen.tolist()) == {0, 1, 2, 3}
        estimate = (u[:, chosen] * (sigma[chosen] / p[chosen])) @ v[:, chosen].T
        torch.testing.assert_close(estimate, g, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "sigma, k, match",
    [
        ([1.0, 2.0, 3.0], 2, "sorted in descending order"),
        ([3.0, 1.0, -0.5], 2, "non-negative"),
        ([3.0, float("nan"), 1.0], 2, "finite"),
        ([3.0, float("inf"), 1.0], 2, "finite"),
        ([], 1, "non-empty"),
        ([3.0, 2.0, 1.0], 0, "k must be >= 1, got 0"),
        ([3.0, 2.0, 1.0], -2, "k must be >= 1, got -2"),
    ],
)
def test_bad_input_names_the_problem(sigma, k, match):
    with pytest.raises(ValueError, match=match):
        inclusion_probabilities(_f64(sigma), k)
