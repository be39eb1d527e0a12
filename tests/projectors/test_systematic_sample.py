"""systematic_sample(p, k, generator): k distinct sorted indices with P(i chosen) = p_i."""

from __future__ import annotations

import math

import pytest
import torch

from galore_plumage.projectors import inclusion_probabilities, systematic_sample


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


def _tiny_tail(n: int = 400, k: int = 10) -> torch.Tensor:
    """9 near-certain items and n − 9 items sharing the last ~1 slot: many tiny p (about 2.5e-3 each)."""
    head = torch.full((9,), 0.9995, dtype=torch.float64)
    tail = torch.full((n - 9,), (k - head.sum().item()) / (n - 9), dtype=torch.float64)
    return torch.cat([head, tail])[torch.randperm(n, generator=torch.Generator().manual_seed(5))]


CASES = {
    # exact ones and zeros mixed with fractions: Σ = 1 + 1 + .5 + .5 + .25 + .75 = 4
    "ones_and_zeros": (_f64([1, 1, 0.5, 0, 0.5, 0.25, 0, 0.75]), 4),
    "min_variance": (inclusion_probabilities(_f64([2.0 ** (-i / 3) for i in range(30)]), 6)[1], 6),
    "uniform": (torch.full((20,), 0.25, dtype=torch.float64), 5),
    "tiny_tail": (_tiny_tail(), 10),
    # values a rounding step away from 1 (allowed up to 1 + 1e-9), where a careless wheel puts two pointers
    # in one item or runs past the end
    "near_one": (_f64([1 + 1e-10, 1 - 1e-10, 1 + 1e-10, 1 - 1e-10, 1e-12, 1e-12]), 4),
    "k_equals_n": (_f64([1.0] * 5), 5),
    "k_one": (_f64([0.1] * 10), 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exactly_k_distinct_sorted_indices(case):
    p, k = CASES[case]
    certain = (p >= 1 - 1e-9).nonzero().flatten().tolist()
    generator = torch.Generator().manual_seed(11)
    for _ in range(1000):
        chosen = systematic_sample(p, k, generator)
        assert chosen.dtype == torch.int64 and chosen.shape == (k,)
        assert (chosen[1:] > chosen[:-1]).all(), chosen  # sorted and distinct
        assert 0 <= chosen[0] and chosen[-1] < p.numel()
        assert not (p[chosen] == 0).any()  # zero-probability items are never chosen
        assert set(certain) <= set(chosen.tolist())  # items with p = 1 always are


@pytest.mark.parametrize("case", ["ones_and_zeros", "min_variance", "tiny_tail"])
def test_inclusion_frequencies_match_p(case):
    """Over N independent draws the count of item i is Binomial(N, p_i): each frequency lies within
    5 binomial standard errors sqrt(p(1−p)/N) of p_i (exactly on p_i for p_i ∈ {0, 1}), and the aggregate
    chi-square Σ (count_i − N p_i)² / (N p_i (1 − p_i)) over the fractional items stays below its mean
    (the number of items) plus 5 of its standard deviations (sqrt of twice the number of items)."""
    p, k = CASES[case]
    n_draws = 10_000
    generator = torch.Generator().manual_seed(2024)
    counts = torch.zeros_like(p)
    for _ in range(n_draws):
        counts[systematic_sample(p, k, generator)] += 1
    freq = counts / n_draws
    se = (p * (1 - p) / n_draws).clamp(min=0).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq - p).abs().max()

    fractional = (p > 0) & (p < 1)
    dof = int(fractional.sum())
    chi2 = ((counts - n_draws * p)[fractional] ** 2 / (n_draws * p * (1 - p))[fractional]).sum().item()
    assert chi2 < dof + 5 * math.sqrt(2 * dof), (chi2, dof)


def test_same_generator_seed_same_indices():
    p, k = CASES["min_variance"]
    draws = []
    for _ in range(2):
        generator = torch.Generator().manual_seed(77)
        draws.append([systematic_sample(p, k, generator) for _ in range(5)])
    for a, b in zip(*draws, strict=True):
        assert torch.equal(a, b)
    # ...and the draws do depend on the seed
    others = [systematic_sample(p, k, torch.Generator().manual_seed(s)) for s in range(10)]
    assert len({tuple(x.tolist()) for x in others}) > 1


def test_does_not_touch_global_rng():
    p, k = CASES["min_variance"]
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    systematic_sample(p, k, torch.Generator().manual_seed(0))
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize(
    "p, k, match",
    [
        ([0.5, 0.5, 0.5, 0.25], 2, "sum to k=2"),  # sums to 1.75
        ([0.5, 0.5, 0.5, 0.5], 3, "sum to k=3"),  # sums to 2
        ([1.5, 0.5, 0.0, 0.0], 2, r"\[0, 1\]"),  # sums to k but p > 1
        ([1.0, 1.5, -0.5, 0.0], 2, r"\[0, 1\]"),  # sums to k but p < 0
        ([0.5, float("nan"), 0.5, 1.0], 2, "sums to nan"),  # NaN compares false with everything
        ([0.5, float("inf"), 0.5, 1.0], 2, "sums to inf"),
        ([0.5, 0.5], 3, r"k must be in \[1, 2\]"),
        ([0.5, 0.5], 0, r"k must be in \[1, 2\]"),
    ],
)
def test_bad_p_raises(p, k, match):
    with pytest.raises(ValueError, match=match):
        systematic_sample(_f64(p), k, torch.Generator().manual_seed(0))
