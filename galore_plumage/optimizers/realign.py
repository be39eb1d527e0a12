"""Moment realignment: carrying Adam's moments into a new projection basis.

Moments live on R = Pᵀ G. When the basis changes, B = P_newᵀ P_old (r × r) maps old coordinates to new
ones: R_new ≈ B R_old (left side; the projector applies it along the projected mode, so the right side
gets R Bᵀ). The rules:

    none           keep M and V as they are (galore-torch)
    m              M ← B M                                   (the paper's MP)
    mv             M ← B M,  V ← (B∘B) V                     (the paper's S/MP; PLUMAGE's default)
    mv_meansplit   M ← B M,  V ← (B M)² + (B∘B)·max(V − M², 0)   (LDAdam: transport the mean and the
                                                                 variance apart; V ≥ M² after it)
"""

from __future__ import annotations

import torch

from ..projectors import Projector

RULES = ("none", "m", "mv", "mv_meansplit")


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"unknown realign rule {rule!r}; choose one of {', '.join(RULES)}")
    return rule


def realign_dense(
    m: torch.Tensor | None, v: torch.Tensor | None, projector: Projector, rule: str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """New (M, V) for dense first and second moments after `projector`'s latest refresh."""
    if rule == "none" or not projector.moved:
        return m, v
    m_new = projector.transport(m) if m is not None else None
    if rule == "m" or v is None:
        return m_new, v
    if rule == "mv" or m is None:
        return m_new, projector.transport(v, squared=True)
    spread = (v - m.square()).clamp_(min=0)
    return m_new, projector.transport(spread, squared=True).add_(m_new.square())


def realign_factored(
    row: torch.Tensor, col: torch.Tensor, projector: Projector, rescale_col: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adafactor's factored second moment carried exactly through (B∘B) along the projected modes.

    Adafactor estimates V̂ = row ⊗ col / mean(row) for a 2-D low-rank tensor (row: length R, col: length C).
    Mode 1 (right side): V̂ (B∘B)ᵀ = row ⊗ ((B∘B) col) / mean(row), so col ← (B∘B) col.
    Mode 0 (left side): (B∘B) V̂ = ((B∘B) row) ⊗ col / mean(row); with row' = (B∘B) row the estimate needs
    col' = col · mean(row') / mean(row) to keep the same normalisation. Not with `rescale_col` False: Adafactor's
    row_bias_correction reads V̂ = (row / c) ⊗ col / mean(row / c), c carried like the row, and a new row's 0 / 0 is its
    next update's own mean square, so mean(row / c) and the column factor keep their scale through a refresh.
    """
    if not projector.moved:
        return row, col
    if row.dim() != 1:
        raise ValueError("exact factored transport is defined for 2-D low-rank tensors; got a row factor of "
                         f"shape {tuple(row.shape)}")
    for mode in projector.factors:
        if mode == 1:
            col = projector.transport_vector(col, mode, squared=True)
        else:
            new_row = projector.transport_vector(row, mode, squared=True)
            if rescale_col:
                col = col * (new_row.mean() / row.mean())
            row = new_row
    return row, col
