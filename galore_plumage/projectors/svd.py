"""GaLore's projector: the top-r singular vectors of the gradient, refreshed every update_proj_gap steps."""

from __future__ import annotations

import torch

from .base import Basis, Projector


def thin_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """U, σ, Vᴴ of a finite float matrix (σ descending), or None if no solver converges.

    The same call galore-torch makes, so bases match it exactly. When the solver fails to converge (it
    happens on ill-conditioned gradients) it is retried in float64 before giving up; the caller then keeps
    the previous basis instead of stalling or crashing the run.
    """
    try:
        return torch.linalg.svd(matrix, full_matrices=False)
    except RuntimeError:
        pass
    try:
        u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    except RuntimeError:
        return None
    return u.to(matrix.dtype), s.to(matrix.dtype), vh.to(matrix.dtype)


def singular_factor(u: torch.Tensor, vh: torch.Tensor, mode: int, columns: torch.Tensor | slice) -> torch.Tensor:
    """Chosen singular vectors of one side as a dim × r factor: U[:, columns] (mode 0) or V[:, columns].

    Copied out of U / Vᴴ so the full decomposition is not kept alive; the right factor is a transposed view
    of a compact r × n block, the layout galore-torch multiplies with.
    """
    return u[:, columns].clone() if mode == 0 else vh[columns].clone().T


class SVDProjector(Projector):
    name = "svd"
    description = "GaLore: top-r singular vectors of the gradient (biased, deterministic)"

    def _new_basis(self, grad, ranks, generator):
        decomposition = thin_svd(grad)
        if decomposition is None:
            return None
        u, sigma, vh = decomposition
        rank = next(iter(ranks.values()))
        energy = sigma.double().square()
        captured = (energy[:rank].sum() / energy.sum()).item()
        factors = {mode: singular_factor(u, vh, mode, slice(0, r)) for mode, r in ranks.items()}
        return Basis(factors, stats={"energy_captured": captured})
