"""How far a basis moved between refreshes, and the paper's adaptive refresh interval (S/MP/A).

The overlap rho of two bases is the mean cosine of the principal angles between their spans
(1 = same subspace, 0 = orthogonal). A basis that barely moves can be refreshed less often; one that
turned over should be refreshed soon. The controller has a dead band (0.4 <= rho <= 0.6) so tau does
not oscillate.
"""

from __future__ import annotations

import torch

MAX_OVERLAP_COLUMNS = 64  # the leading columns compared: enough to tell, cheap to orthonormalize

RESET_BELOW = 0.3  # the subspace turned over: back to the shortest interval
HALVE_BELOW = 0.4
DOUBLE_ABOVE = 0.6


def mean_principal_cosine(old: torch.Tensor, new: torch.Tensor, max_columns: int = MAX_OVERLAP_COLUMNS) -> float:
    """Mean cosine of the principal angles between span(old[:, :c]) and span(new[:, :c]), as a float."""
    return principal_cosine_mean(old, new, max_columns).item()


def principal_cosine_mean(old: torch.Tensor, new: torch.Tensor, max_columns: int = MAX_OVERLAP_COLUMNS,
                          orthonormal: bool = False) -> torch.Tensor:
    """mean_principal_cosine as a float64 0-d tensor on the bases' device (cosine_mean of principal_overlap)."""
    return cosine_mean(principal_overlap(old, new, max_columns, orthonormal))


def principal_overlap(old: torch.Tensor, new: torch.Tensor, max_columns: int = MAX_OVERLAP_COLUMNS,
                      orthonormal: bool = False) -> torch.Tensor:
    """Q_oldᵀ Q_new (c × c, float64, on the bases' device), whose singular values are the cosines of the principal
    angles: a refresh reads it from the device with its other figures and takes cosine_mean on the host, because an SVD
    on CUDA synchronises for its error check (one host synchronisation per refresh instead of two, issue 15).

    The QR makes this right also for bases that are not orthonormal (FLORA's Gaussian ones). orthonormal=True: both
    bases' columns are orthonormal to their dtype's rounding (singular vectors): they are Q as they are, unless one is
    held in a 16-bit type, whose rounding (~4e-3) would show in the cosines. The two QRs were 4 % of a 130M layer's
    refresh on a CPU.
    """
    if old.dim() != 2 or new.dim() != 2 or old.shape[0] != new.shape[0]:
        raise ValueError(f"bases must be 2-D with equal row counts, got {tuple(old.shape)} and {tuple(new.shape)}")
    columns = min(max_columns, old.shape[1], new.shape[1])
    q_old, q_new = old[:, :columns].double(), new[:, :columns].to(old.device).double()
    if not (orthonormal and {old.dtype, new.dtype} <= {torch.float32, torch.float64}):
        q_old, q_new = torch.linalg.qr(q_old).Q, torch.linalg.qr(q_new).Q
    # a basis from a non-finite gradient (an eigh of its Gram returns NaN where an SVD fails) is rejected with this
    # figure, read together with the check (checks_after): svdvals, which raises on NaN, must not stop the refresh first
    return torch.nan_to_num(q_old.T @ q_new, nan=0.0)


def cosine_mean(overlap: torch.Tensor) -> torch.Tensor:
    """The mean of an overlap matrix's singular values (principal cosines, clamped to 1 against rounding)."""
    return torch.linalg.svdvals(overlap).clamp(max=1.0).mean()


def next_interval(rho: float, tau: int, tau_min: int, tau_max: int) -> int:
    """The paper's hysteresis rule: reset, halve, keep or double the refresh interval tau."""
    if rho < RESET_BELOW:
        return tau_min
    if rho < HALVE_BELOW:
        return max(tau // 2, tau_min)
    if rho > DOUBLE_ABOVE:
        return min(2 * tau, tau_max)
    return tau
