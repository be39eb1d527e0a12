"""The subspace overlap rho and the paper's adaptive refresh interval (S/MP/A)."""

from __future__ import annotations

import math

import pytest
import torch

from galore_plumage.projectors import RandomProjector, SVDProjector, mean_principal_cosine, next_interval
from galore_plumage.projectors.interval import principal_cosine_mean


def _e(d: int, *indices: int) -> torch.Tensor:
    return torch.eye(d, dtype=torch.float64)[:, list(indices)]


def count_qr_calls(monkeypatch) -> list:
    """torch.linalg.qr patched to record the shape of each matrix it is given; the list of those shapes."""
    calls = []
    real_qr = torch.linalg.qr

    def counted(matrix, *args, **kwargs):
        calls.append(matrix.shape)
        return real_qr(matrix, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "qr", counted)
    return calls


def test_identical_bases_give_one():
    basis = torch.linalg.qr(torch.randn(20, 5, generator=torch.Generator().manual_seed(0))).Q
    assert mean_principal_cosine(basis, basis) == pytest.approx(1.0, abs=1e-6)


def test_orthogonal_bases_give_zero():
    assert mean_principal_cosine(_e(8, 0, 1), _e(8, 2, 3)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("theta", [0.0, 0.3, math.pi / 4, 1.2, math.pi / 2])
def test_rotation_by_theta_gives_cos_theta(theta):
    old = _e(6, 0)
    new = math.cos(theta) * _e(6, 0) + math.sin(theta) * _e(6, 1)
    assert mean_principal_cosine(old, new) == pytest.approx(math.cos(theta), abs=1e-12)
    # two planes turned by different angles: the mean of the two cosines
    old2 = _e(6, 0, 2)
    new2 = torch.cat([new, math.cos(0.5) * _e(6, 2) + math.sin(0.5) * _e(6, 3)], dim=1)
    assert mean_principal_cosine(old2, new2) == pytest.approx((math.cos(theta) + math.cos(0.5)) / 2, abs=1e-12)


def test_non_orthonormal_input():
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(30, 4, generator=generator, dtype=torch.float64)
    mix = torch.randn(4, 4, generator=generator, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
    assert mean_principal_cosine(a, a @ mix) == pytest.approx(1.0, abs=1e-9)  # same span, other basis
    theta = 0.7
    old = 3.0 * _e(6, 0)
    new = 5.0 * (math.cos(theta) * _e(6, 0) + math.sin(theta) * _e(6, 1))
    assert mean_principal_cosine(old, new) == pytest.approx(math.cos(theta), abs=1e-12)
    skew = torch.cat([_e(6, 0), _e(6, 0) + _e(6, 1)], dim=1)  # spans the same plane as e0, e1
    assert mean_principal_cosine(_e(6, 0, 1), skew) == pytest.approx(1.0, abs=1e-12)


def test_only_leading_columns_compared():
    old, new = _e(8, 0, 1), _e(8, 0, 2)
    assert mean_principal_cosine(old, new) == pytest.approx(0.5, abs=1e-12)
    assert mean_principal_cosine(old, new, max_columns=1) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_orthonormal_bases_skip_the_qr_unless_held_in_16_bits(dtype, monkeypatch):
    """Singular vectors are their own Q: the cosines are the same without the two QRs, which only a 16-bit basis, whose
    rounding would show in the cosines, still takes."""
    generator = torch.Generator().manual_seed(2)
    old = torch.linalg.qr(torch.randn(40, 6, generator=generator, dtype=torch.float64)).Q
    new = torch.linalg.qr(old + 0.8 * torch.randn(40, 6, generator=generator, dtype=torch.float64)).Q
    old, new = old.to(dtype), new.to(dtype)
    with_qr = principal_cosine_mean(old, new)
    qr_calls = count_qr_calls(monkeypatch)
    without = principal_cosine_mean(old, new, orthonormal=True)
    assert len(qr_calls) == (2 if dtype == torch.bfloat16 else 0)
    assert 0.2 < with_qr.item() < 0.95  # bases that moved: a comparison that could tell the routes apart
    torch.testing.assert_close(without, with_qr, rtol=0, atol=1e-6)


def test_a_refresh_takes_the_qr_only_for_bases_that_are_not_orthonormal(monkeypatch):
    """SVD bases (singular vectors) are compared as they are; FLORA's Gaussian ones are orthonormalized first."""
    qr_calls = count_qr_calls(monkeypatch)
    generator = torch.Generator().manual_seed(3)
    grads = [torch.randn(24, 40, generator=generator) for _ in range(2)]
    for projector, expected in ((SVDProjector(4, update_proj_gap=1), 0), (RandomProjector(4, update_proj_gap=1), 2)):
        qr_calls.clear()
        projector.refresh(grads[0], 0)
        projector.refresh(grads[1], 1)
        assert len(qr_calls) == expected, projector.name
        assert 0.0 <= projector.stats["rho"] <= 1.0


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"\(8, 2\) and \(7, 2\)"):
        mean_principal_cosine(torch.zeros(8, 2), torch.zeros(7, 2))


@pytest.mark.parametrize(
    "rho, tau, expected",
    [
        (0.0, 80, 10),  # turned over: back to tau_min
        (0.29, 80, 10),
        (0.3, 80, 40),  # 0.3 <= rho < 0.4: halve
        (0.39, 80, 40),
        (0.35, 15, 10),  # halving stops at tau_min
        (0.4, 40, 40),  # dead band 0.4 <= rho <= 0.6: keep
        (0.5, 40, 40),
        (0.6, 40, 40),
        (0.61, 40, 80),  # rho > 0.6: double
        (1.0, 20, 40),
        (0.9, 50, 80),  # doubling stops at tau_max
        (0.9, 80, 80),
    ],
)
def test_next_interval(rho, tau, expected):
    assert next_interval(rho, tau, tau_min=10, tau_max=80) == expected


def _rotating_gradients(cosines, m=40, n=8):
    """G_j = Q_j diag(3, 1) Wᵀ with span(Q_j) turned from span(Q_{j−1}) by angle arccos(c_j) in both
    directions, into directions never used before: the principal cosines between consecutive left bases
    are exactly c_j."""
    generator = torch.Generator().manual_seed(0)
    w = torch.linalg.qr(torch.randn(n, 2, generator=generator, dtype=torch.float64)).Q
    q = _e(m, 0, 1)
    grads = [(q * torch.tensor([3.0, 1.0], dtype=torch.float64)) @ w.T]
    for j, c in enumerate(cosines):
        fresh = _e(m, 2 * j + 2, 2 * j + 3)
        q = c * q + math.sqrt(1 - c * c) * fresh
        grads.append((q * torch.tensor([3.0, 1.0], dtype=torch.float64)) @ w.T)
    return [g.float() for g in grads]


def test_adaptive_projector_follows_rho():
    # rho at each refresh after the first, and the tau it should lead to (gap 10, tau_max 80)
    plan = [(1.0, 20), (1.0, 40), (0.35, 20), (0.5, 20), (1.0, 40), (1.0, 80), (1.0, 80), (0.1, 10), (0.9, 20)]
    grads = _rotating_gradients([rho for rho, _ in plan])
    projector = SVDProjector(2, proj_type="left", update_proj_gap=10, adaptive_interval=True, tau_max=80)

    refreshed_at, seen = [], []
    for step in range(360):
        if projector.maybe_refresh(grads[len(refreshed_at)], step):
            refreshed_at.append(step)
            assert projector.next_refresh == step + projector.tau
            seen.append((projector.stats.get("rho"), projector.stats["tau"]))
            if len(refreshed_at) == len(grads):
                break

    assert seen[0] == (None, 10)
    for (rho, tau), (expected_rho, expected_tau) in zip(seen[1:], plan, strict=True):
        assert rho == pytest.approx(expected_rho, abs=1e-5)
        assert tau == expected_tau
    expected_steps = [0]
    for _, tau in [(None, 10)] + plan[:-1]:
        expected_steps.append(expected_steps[-1] + tau)
    assert refreshed_at == expected_steps == [0, 10, 30, 70, 90, 110, 150, 230, 310, 320]


def test_fixed_interval_still_reports_rho():
    grads = _rotating_gradients([0.5, 0.2])
    projector = SVDProjector(2, proj_type="left", update_proj_gap=10)
    refreshed = [step for step in range(30) if projector.maybe_refresh(grads[step // 10], step)]
    assert refreshed == [0, 10, 20]
    assert projector.tau == 10 and projector.next_refresh == 30
    assert projector.stats["rho"] == pytest.approx(0.2, abs=1e-5)
    assert projector.stats["tau"] == 10
