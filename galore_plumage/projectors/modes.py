"""Which modes of a gradient a projector projects (GaLore's proj_type rules), and the mode products that move a tensor
into a basis and back."""

from __future__ import annotations

import torch

PROJ_TYPES = ("std", "reverse_std", "left", "right", "full")


def projected_modes(shape: torch.Size | tuple[int, ...], proj_type: str) -> tuple[int, ...]:
    """The modes a matrix gradient is projected on, as galore-torch chooses them (0 = left, 1 = right)."""
    m, n = shape
    sides = {
        "std": (1,) if m >= n else (0,),
        "reverse_std": (0,) if m >= n else (1,),
        "left": (0,),
        "right": (1,),
        "full": (0, 1),
    }
    if proj_type not in sides:
        raise ValueError(f"unknown proj_type {proj_type!r}; choose one of {', '.join(PROJ_TYPES)}")
    return sides[proj_type]


def mode_product(x: torch.Tensor, matrix: torch.Tensor, mode: int) -> torch.Tensor:
    """x ×_mode matrix: replaces axis `mode` of x (length b) by matrix @ that axis (matrix is a × b)."""
    if x.dim() == 2:
        return matrix @ x if mode == 0 else x @ matrix.T
    return torch.movedim(torch.tensordot(matrix, x, dims=([1], [mode])), 0, mode)


def onto_basis(x: torch.Tensor, factor: torch.Tensor, mode: int) -> torch.Tensor:
    """x ×_mode factorᵀ, the coordinates of x's mode-`mode` fibres in the basis of factor's columns: mode_product's
    arithmetic, a matrix's in one matmul of factor as stored (no transpose of factorᵀ back: a view costs a GPU's
    launch-bound step host time)."""
    if x.dim() == 2:
        return factor.T @ x if mode == 0 else x @ factor
    return mode_product(x, factor.T, mode)


def add_product(target: torch.Tensor, factor: torch.Tensor, low: torch.Tensor, mode: int, alpha: float = 1.0) -> None:
    """target ← target + alpha · (low ×_mode factor), a one-sided basis's product added to a matrix without writing it
    out where the dtypes allow (one addmm)."""
    if factor.dtype != low.dtype:  # the pool stored in bfloat16
        factor = factor.to(low.dtype)
    if target.dtype != low.dtype:  # a bfloat16 weight with the outside: the float32 product, rounded once
        target.add_(mode_product(low, factor, mode).to(target.dtype), alpha=alpha)
    elif mode == 0:
        target.addmm_(factor, low, alpha=alpha)  # P Z: (m × r)(r × n)
    else:
        target.addmm_(low, factor.T, alpha=alpha)  # Z Pᵀ: (m × r)(r × n)


def along(vector: torch.Tensor, mode: int, ndim: int) -> torch.Tensor:
    """Reshape a vector so it broadcasts along axis `mode` of an ndim-tensor."""
    shape = [1] * ndim
    shape[mode] = -1
    return vector.view(shape)
