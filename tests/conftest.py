"""Shared helpers for the projector tests."""

from __future__ import annotations

import pytest
import torch


def _spectral_matrix(m: int, n: int, sigma, seed: int = 0, dtype: torch.dtype = torch.float64):
    """(G, U, sigma, V): G = U diag(sigma) Vᵀ with random orthonormal U (m × s), V (n × s), s = len(sigma)."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    s = sigma.numel()
    generator = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, s, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(n, s, generator=generator, dtype=torch.float64)).Q
    g = (u * sigma) @ v.T
    return g.to(dtype), u, sigma, v


@pytest.fixture(scope="session")
def spectral_matrix():
    """A factory: spectral_matrix(m, n, sigma, seed=0, dtype=float64) -> (G, U, sigma, V)."""
    return _spectral_matrix
