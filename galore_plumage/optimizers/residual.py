"""The gradient outside the basis: dropped (GaLore, the paper), or moved at the basis's step size (Fira).

A one-sided low-rank step moves the weight only inside span(P): the part of the gradient outside it, G⊥ = G − P R
(R = Pᵀ G, P orthonormal), is lost until a refresh brings it in. The rules (`residual`):

    none           G⊥ is dropped.
    norm_matched   the weight also moves by −φ ⊙ G⊥, where φ = ‖Z‖ / ‖R‖ is measured per column of the other side
                   on the backend's low-rank step Z and the projected gradient R (Fira's norm-based scaling, arXiv
                   2410.01623): each column of G⊥ moves at the step size Adam gave the same column inside the
                   basis, in the direction of its own gradient. As in Fira, `scale` multiplies the low-rank step only,
                   and a norm-growth limiter keeps ‖φ ⊙ G⊥‖ within 1.01x its previous value (a loss spike cannot move
                   the whole complement at once). Unlike Fira's code, which subtracts the *scaled* projection
                   (G − scale · P R), G⊥ here is the exact complement: the basis's directions move by Adam's step
                   alone. No state but one number per weight; G⊥ is never written out (Projector.add_back with an Outside).

The basis's rows are all measured for φ (PLUMAGE's D⁻¹ rescales the low-rank step after φ is taken).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .limiter import growth_factor, limit_together

RESIDUALS = ("none", "norm_matched")
# where the norm-growth limiter takes its reference: "fira" every step; "steady" every step but a refresh's, where the
# basis was just fitted to this very gradient, so G⊥ is near zero (~1 % of ‖G‖² on llama_tiny) and, as the reference,
# would hold the complement near zero for hundreds of steps (the limiter lets it regrow by 1 % a step)
LIMITERS = ("fira", "steady")
PLUMAGE_RESIDUAL = "norm_matched"  # plumage_*'s default where the backend normalizes (options.py; docs/results.md §3)
# ... moved at a quarter of Fira's step and limited steadily (session 12): as good as Fira's limiter at the protocol's
# τ = 40, where that limiter keeps 3-5 % of the complement anyway, and far better at τ = 200, where it lets the complement
# regrow to full size, which costs 0.1 nats (docs/results.md §3)
PLUMAGE_LIMITER, PLUMAGE_RESIDUAL_SCALE = "steady", 0.25
# ... and no column of it longer than half the basis's step on that column (session 13): Fira's φ moves a column by
# ‖G⊥‖/‖R‖ times that step, which grows as the basis goes stale; capped, the complement stops costing at τ = 200 what it
# gains at τ = 40 (docs/results.md §3)
PLUMAGE_RESIDUAL_CAP = 0.5
# ... and moved only on the first 10 updates after each refresh (session 14). Its gain is there: over the first 10 it
# carries on the directions the refresh dropped while their momentum would still have moved them (1 / (1 − β1) = 10
# updates); later G⊥ is mostly what the stale basis misses, moved without momentum. At τ = 40 it keeps all the
# complement's gain (a horizon of 5 loses part), at τ = 200 it removes its cost (docs/results.md §3)
PLUMAGE_RESIDUAL_HORIZON = 10


def why_no_complement(projector_cls) -> str | None:
    """Why `projector_cls` makes no basis whose complement G − P R this module can move (None: it makes one)."""
    if not projector_cls.signed:
        return (f"it moves the gradient outside an orthonormal basis, but projector {projector_cls.name!r} does not make "
                "one (its G − P Pᵀ G is not the complement)")
    if projector_cls.tensors:
        return f"it needs a one-sided projection of a matrix, but projector {projector_cls.name!r} projects every mode"
    return None


def residual_rule(group: dict, projector_cls) -> str:
    """The group's `residual`, or "none" where plumage_*'s default cannot apply: a basis that is not orthonormal
    (FLORA's) or not one-sided (Tucker, proj_type "full"). A family default that does nothing for another projector
    is harmless, as the projector's own options are (base.projector_options); an option given by name is refused
    where it cannot apply before it reaches a group (options.check_optimizer_options)."""
    value = group["residual"]
    fits = why_no_complement(projector_cls) is None and group["proj_type"] != "full"
    return value if fits or value != PLUMAGE_RESIDUAL else "none"


def column_weights(z_norm: torch.Tensor, r_norm_sq: torch.Tensor, grad_norm: torch.Tensor | None,
                   cap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """φ_j = ‖Z_j‖ / ‖R_j‖ (capped by `cap`) and ‖G⊥_j‖² from the columns' norms (elementwise, so any layout of
    columns, one weight's or several concatenated, gives the same numbers); ‖G⊥‖² is None without `grad_norm`."""
    r_norm = r_norm_sq.sqrt()
    # a column with no gradient in the basis gives no step size to copy: its complement does not move (0 · ∞ is NaN)
    phi = torch.where(r_norm > 0, z_norm / r_norm.clamp_min(torch.finfo(r_norm.dtype).tiny), 0.0)
    outside_sq = None
    if grad_norm is not None:
        # ‖G⊥_j‖² = ‖G_j‖² − ‖R_j‖² for an orthonormal basis (clamped: a bfloat16-stored basis is orthonormal to ~1e-3)
        outside_sq = (grad_norm.square() - r_norm_sq).clamp_min(0)
    if cap is not None:
        ratio = cap * r_norm / outside_sq.sqrt().clamp_min(torch.finfo(r_norm.dtype).tiny)  # ‖G⊥_j‖ = 0: no cap needed
        phi = phi * ratio.clamp(max=1.0)
    return phi, outside_sq


def complement_weights(direction: torch.Tensor, low_grad: torch.Tensor, grad: torch.Tensor, mode: int, state: dict,
                       total: Callable[[torch.Tensor], torch.Tensor] = lambda x: x, unit: float = 1.0,
                       fitted: bool = False, limiter: str = "fira", cap: float | None = None) -> torch.Tensor:
    """φ, shaped to broadcast along axis `mode` (the basis's axis): ‖Z‖ / ‖R‖ per column, limited in norm growth.

    `state["residual_norm"]` keeps the previous ‖φ ⊙ G⊥‖ / `unit` for the limiter (`unit`: what Z carries beyond the
    backend's normalized step, base.Update.unit; Fira limits AdamW's M/√V, before lr and bias correction); `total`
    sums a squared norm over the pieces of a sharded tensor (identity for a whole one). `fitted`: the basis was made
    from `grad` this step (a refresh); with limiter "steady" that step is neither limited nor the next reference.
    `cap` (residual_cap): no column of φ ⊙ G⊥ longer than `cap` × the same column of Z, i.e. φ_j ≤ cap ‖Z_j‖ / ‖G⊥_j‖:
    Fira's φ moves a column of G⊥ by ‖G⊥_j‖ / ‖R_j‖ times the basis's step, which grows without bound as the basis
    goes stale and the gradient leaves it."""
    z_norm = direction.norm(dim=mode, keepdim=True)
    r_norm_sq = low_grad.square().sum(dim=mode, keepdim=True)
    unreferenced = fitted and limiter == "steady"
    grad_norm = None
    if cap is not None or not unreferenced:  # ‖G⊥‖ is needed (one pass over G, skipped when nothing reads it)
        grad_norm = torch.linalg.vector_norm(grad, dim=mode, keepdim=True, dtype=low_grad.dtype)  # no temporary
    phi, outside_sq = column_weights(z_norm, r_norm_sq, grad_norm, cap)
    if unreferenced:
        # no reference from this update; a zero one (the first update's) limits nothing and keeps the state's layout
        state.setdefault("residual_norm", torch.zeros((), dtype=phi.dtype, device=phi.device))
        return phi
    size = total((phi.square() * outside_sq).sum()).sqrt() / unit
    return phi * growth_factor(size, state, "residual_norm")


def complement_weights_together(z_columns: torch.Tensor, r_columns: torch.Tensor, grads: list[torch.Tensor],
                                modes: list[int], previous: list[torch.Tensor], units: list[float] | None,
                                owners: torch.Tensor, cap: float | None = None
                                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """complement_weights of several whole weights on a steady update (no refresh this step, each with its limiter's
    reference in `previous`), in a number of kernels that does not grow with the weights but for one norm of each G.

    `z_columns`, `r_columns`: the weights' Z and R side by side as the columns of one r-row matrix, each weight's in
    the order of `grads` (multi_tensor.columns: a weight projected on its rows gives its n columns, one projected on
    its columns its m rows); `units`: each weight's Update.unit (None: all 1); `owners`: each column's weight
    (column_owners). Returns φ of every one of those columns, limited, as one vector in the same order, and each
    weight's limited size, its limiter's next reference. A function of tensors alone (the caller keeps the
    references), so compile_update can fuse it. The numbers are complement_weights' to rounding (a reduction over a
    concatenated matrix may add in another order).
    On a GPU, one weight at a time, the complement's ~35 small kernels cost far more to launch than to run (a 350M
    layer's steady step took 3.9x galore-torch's, docs/step_time_cuda.md)."""
    z_norm = torch.linalg.vector_norm(z_columns, dim=0)
    r_norm_sq = (r_columns * r_columns).sum(dim=0)
    grad_norm = torch.cat([torch.linalg.vector_norm(grad, dim=mode, dtype=r_columns.dtype)
                           for grad, mode in zip(grads, modes, strict=True)])
    lengths = [grad.shape[1 - mode] for grad, mode in zip(grads, modes, strict=True)]
    phi, outside_sq = column_weights(z_norm, r_norm_sq, grad_norm, cap)  # elementwise: every weight's columns at once
    # ‖φ ⊙ G⊥‖ of each weight, one norm per piece in one call (φ >= 0, so √(Σ φ² ‖G⊥_j‖²) = ‖φ ⊙ ‖G⊥_j‖‖)
    sizes = torch._foreach_norm(list((phi * outside_sq.sqrt()).split(lengths)))
    if units is not None:  # per unit of each weight's step (Update.unit)
        if torch.compiler.is_compiling():  # torch.compile specializes a _foreach call's list of floats (8-bit's units
            sizes = [size / unit for size, unit in zip(sizes, units, strict=True)]  # change each step), not a float
        else:
            sizes = torch._foreach_div(sizes, units)
    factors, limited = limit_together(sizes, previous)
    return phi * factors[owners], limited


@functools.lru_cache(maxsize=64)
def column_owners(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """For each column of weights laid side by side with these `lengths`, the index of its weight: made once per
    layout (a tensor made from a list each step would be a copy to the device each step), and copied there without
    waiting on it (non_blocking: a new layout mid-run, a weight resting, does not synchronise the step)."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device, non_blocking=True)


def add_placeholder(state: dict, like: torch.Tensor) -> None:
    """The state the complement keeps (its limiter's last norm) at a placeholder value, in `like`'s dtype and device:
    what a fresh optimizer needs to be a template for torch.distributed.checkpoint.load."""
    state["residual_norm"] = torch.zeros((), dtype=like.dtype, device=like.device)
