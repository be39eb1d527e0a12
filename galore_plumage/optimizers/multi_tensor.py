"""foreach: the steady updates of a group's low-rank weights taken together, as torch.optim's multi-tensor Adam does.

One weight's steady update is two matmuls (project, add back) around a dozen elementwise kernels on its r-row moments,
and Fira's complement (residual.py) some thirty more on per-column norms. On a GPU, at small and medium sizes,
launching those kernels one weight at a time costs more than running them; with `foreach` the moments of every weight
of the group that takes a steady update this step advance in a handful of torch._foreach calls for all of them (AdamW,
Adafactor, SGD momentum; 8-bit AdamW advances each weight's own, Backend.update_together), the complement's weights
and its share of the low-rank update are computed on all of their columns laid side by side (complement_together),
as is β φ ⊙ G added to their weights (one _foreach call), and the decoupled decay of their weights is one more call.
What stays one per weight is its two matmuls and, where the complement moves, a norm of its gradient's columns; and
everything a weight does on its own (a refresh, a draw). With compile_update the moments' calls (AdamW's, Adafactor's
factored step; 8-bit's are bitsandbytes') and the complement's arithmetic (mixed_together, the norms of G's columns
and β φ ⊙ G included) are compiled, in one call with the projections where every weight moves the complement and
the moments are AdamW's (projected_and_mixed): on a CPU Inductor makes that three kernels (a _foreach_norm among
them) around the projections' matmuls, so a Llama layer's steady step of the large-batch default launches 17 (14 of
them matmuls, the add-backs' eager) against 65 eager and galore-torch's 79 (compiled_update.py).

Taken together: weights of a low-rank group with foreach on, on any backend, held whole (not FSDP2-sharded), stepped
with their full gradient (not per-layer mode), whose moments exist, with no refresh due, the complement's limiter
holding a reference where the complement moves this update, PLUMAGE's sampled rows stepping as the backend steps them
(sampled_step 'adaptive'), and no row_bias_correction or refresh_ema; when no step observer is attached. Every other
weight steps one by one. The arithmetic is the one-by-one path's, op for op, so the weights and moments are the same:
bit for bit on a CPU where the complement does not move, to float32 rounding where it does (its norms over columns
laid side by side may add in another order; tests/optimizers/test_multi_tensor.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import torch

from ..projectors.base import Projector
from ..projectors.modes import add_product, onto_basis
from .compiled_update import Compiled
from .residual import column_owners, complement_weights_together


def foreach_on(group: dict, params: list[torch.Tensor]) -> bool:
    """The group's foreach, None resolved as torch.optim resolves it: on for weights on a GPU (where launches cost;
    on a CPU the batched calls were 3-6 % slower, docs/step_time.md); with compile_update too, which then compiles
    the group's arithmetic (compiled_update.py)."""
    if group["foreach"] is not None:
        return group["foreach"]
    return bool(params) and params[0].device.type == "cuda"


class Member(NamedTuple):
    """A weight taken together at this step, with what steady_together looked up to choose it."""
    param: torch.Tensor
    projector: Projector
    state: dict
    moved: bool  # its update moves the complement


def steady_together(optimizer, group: dict, params: list[torch.Tensor]) -> list[Member]:
    """The weights of `group` (among `params`, which have gradients) whose update at this step is taken together; none
    when fewer than two qualify (one weight gains nothing)."""
    if ("rank" not in group or not foreach_on(group, params) or optimizer.step_observers or group["row_bias_correction"]
            or group["refresh_ema"] > 0):
        return []
    chosen = []
    for param in params:
        state = optimizer.state[param]
        if optimizer.backend.moments_key not in state or not optimizer.held_whole(param):  # made by its first update
            continue
        projector = optimizer.projector_for(param, group)
        step = state["step"]
        # the complement's first update has no reference for its limiter yet (residual.complement_weights)
        complement = optimizer.residual_now(group, projector, step) != "none"
        if (not projector.ready or projector.due(step) or (complement and "residual_norm" not in state)
                or (group["sampled_step"] != "adaptive" and projector.inv_p is not None)):
            continue
        chosen.append(Member(param, projector, state, complement))
    return chosen if len(chosen) > 1 else []


def step_together(optimizer, group: dict, members: list[Member], after) -> None:
    """One steady update of each of `members` (chosen by steady_together): projected one by one, moments advanced
    together, the complement (for the weights that move it this update) computed, folded into the low-rank update
    and its β φ ⊙ G added on all of their columns at once, the low-rank update added back one by one, decayed
    together; then after(backend, state, group, projector) for each weight (the optimizer's draw when one is due,
    base.resample_if_due). With compile_update, where every weight moves the complement and the backend's moments are
    a function of tensors (AdamW's), all of that but the add-backs and the decay is one compiled call
    (projected_and_mixed)."""
    backend = optimizer.backend
    params, projectors, states, moved = (list(column) for column in zip(*members, strict=True))
    for state in states:
        state["step"] += 1
    pending = backend.pending_together(states, group) if group.get("compile_update") and all(moved) else None
    if pending is None:
        low_grads = [projector.project(param.grad) for projector, param in zip(projectors, params, strict=True)]
        updates = backend.update_together(states, low_grads, group, params, [p.one_sided_mode for p in projectors])
    else:
        updates = pending.updates
    if backend.decay_first:  # before the complement, which writes the weights (its arithmetic does not read them)
        decay_together(params, [update.decay for update in updates])
    if pending is None:
        add_back_together(params, projectors, updates, low_grads, states, group, moved)
    else:
        step_whole(params, projectors, updates, states, group, pending)
    if not backend.decay_first:
        decay_together(params, [update.decay for update in updates])
    for projector, state in zip(projectors, states, strict=True):
        after(backend, state, group, projector)


def add_back_together(params: list[torch.Tensor], projectors: list, updates: list, low_grads: list[torch.Tensor],
                      states: list[dict], group: dict, moved: list[bool]) -> None:
    """The updates' low-rank parts added back to their weights, one matmul each, the complement's β φ ⊙ G first for
    the weights that move it this update (`moved`), their mixing done on all of their columns at once."""
    mixed = {}
    if any(moved):
        chosen = [k for k, move in enumerate(moved) if move]
        chosen_params, chosen_projectors = [params[k] for k in chosen], [projectors[k] for k in chosen]
        mixing = mixing_arguments(chosen_params, chosen_projectors, [p.one_sided_mode for p in chosen_projectors],
                                  [updates[k] for k in chosen], [states[k] for k in chosen], group)
        mix = mixed_compiled if group.get("compile_update") else mixed_together
        directions = [updates[k].direction for k in chosen]
        parts, references = mix(given, (directions,), [low_grads[k] for k in chosen], *mixing)
        record_references([states[k] for k in chosen], references)
        mixed = dict(zip(chosen, split_columns(parts, mixing), strict=True))
    for k, (param, projector, update) in enumerate(zip(params, projectors, updates, strict=True)):
        if k in mixed:
            projector.add_back_mixed(param, mixed[k])
        else:
            projector.add_back(param, update.direction, -update.step_size)


def step_whole(params: list[torch.Tensor], projectors: list, updates: list, states: list[dict], group: dict,
               pending) -> None:
    """Every weight moves the complement and the backend's moments are `pending` (a Pending): the projections, the
    moments and the complement in one compiled call (projected_and_mixed), then each weight's add-back, one addmm."""
    modes, factors, dtypes = zip(*(projector.one_sided_operands(param.grad)
                                   for projector, param in zip(projectors, params, strict=True)), strict=True)
    mixing = mixing_arguments(params, projectors, list(modes), updates, states, group)
    parts, references = whole_compiled(pending.function, pending.args, list(factors), list(dtypes), mixing)
    record_references(states, references)
    for param, factor, part, mode in zip(params, factors, parts.split_with_sizes(mixing.lengths, dim=1), modes,
                                         strict=True):
        add_columns_product(param, factor, part, mode)


def add_columns_product(target: torch.Tensor, factor: torch.Tensor, part: torch.Tensor, mode: int) -> None:
    """add_product of a low-rank part given as its columns (`columns`: r rows, as mixed_together returns them). On
    mode 1 add_product takes the part as Z (m × r) and adds Z Pᵀ, a transpose of the part and one of the factor, a
    view each that a launch-bound step pays on the host; here the weight's transpose takes P Zᵀ, one view, the same
    BLAS call and the same bits (tests/optimizers/test_multi_tensor.py)."""
    if target.dtype != part.dtype or factor.dtype != part.dtype:  # a bfloat16 weight or pool: add_product's casts
        add_product(target, factor, columns(part, mode), mode)
    elif mode == 0:
        target.addmm_(factor, part)  # P Z: (m × r)(r × n)
    else:
        target.T.addmm_(factor, part)  # (Z Pᵀ)ᵀ = P Zᵀ: (n × r)(r × m)


def given(low_grads: list[torch.Tensor], directions: list[torch.Tensor]) -> list[torch.Tensor]:
    """The directions a backend has computed already, as mixed_together takes its directions (a function of the
    low-rank gradients and its other arguments)."""
    return directions


class Mixing(NamedTuple):
    """mixed_together's arguments after the low-rank gradients, for weights whose update moves the complement."""
    inv_ps: list[torch.Tensor | None] | None  # each one's PLUMAGE 1/p, which rescales Z after φ is taken (None: none)
    grads: list[torch.Tensor]
    params: list[torch.Tensor]
    modes: list[int]
    lengths: list[int]  # how many columns each one has (column_counts)
    previous: list[torch.Tensor]  # each one's limiter reference
    units: list[float] | None  # each one's Update.unit (None: all 1)
    owners: torch.Tensor  # each column's weight (residual.column_owners)
    cap: float | None
    spans: list[tuple[int, int]]  # the columns of each run of weights sharing a pair (α, β) ...
    alphas: list[float]  # ... and that pair
    betas: list[float]


def mixing_arguments(params: list[torch.Tensor], projectors: list, modes: list[int], updates: list, states: list[dict],
                     group: dict) -> Mixing:
    """The Mixing of these weights' updates at this step (`modes`: each one's basis's, Projector.one_sided_mode)."""
    inv_ps = [projector.inv_p for projector in projectors]
    grads = [param.grad for param in params]
    # α = −step size · scale, β = −|step size| · residual_scale (base.apply_update): one pair for all weights unless
    # their step counts (so their bias corrections) differ; each run of weights sharing a pair is mixed in one go
    pairs = [(-update.step_size * projector.scale, -abs(update.step_size) * group["residual_scale"])
             for update, projector in zip(updates, projectors, strict=True)]
    lengths = column_counts(grads, modes)
    edges = [0, *itertools.accumulate(lengths)]
    pair_runs = list(runs(pairs))
    spans = [(edges[run.start], edges[run.stop]) for _, run in pair_runs]
    alphas, betas = zip(*(pair for pair, _ in pair_runs), strict=True)
    units = [update.unit for update in updates]
    return Mixing(None if all(inv_p is None for inv_p in inv_ps) else inv_ps, grads, params, modes, lengths,
                  [state["residual_norm"] for state in states], None if all(unit == 1.0 for unit in units) else units,
                  column_owners(tuple(lengths), grads[0].device), group["residual_cap"], spans, list(alphas),
                  list(betas))


def record_references(states: list[dict], references: list[torch.Tensor]) -> None:
    """Each weight's limiter's reference for its next update."""
    for state, reference in zip(states, references, strict=True):
        state["residual_norm"] = reference  # a tensor of its own, made under step()'s no_grad


def split_columns(parts: torch.Tensor, mixing: Mixing) -> list[torch.Tensor]:
    """The mixed low-rank parts of every weight's columns side by side (mixed_together's) as each weight's."""
    # split_with_sizes: Tensor.split's Python wrapper costs a launch-bound step more than the split
    return [columns(part, mode) for mode, part in zip(mixing.modes, parts.split_with_sizes(mixing.lengths, dim=1),
                                                      strict=True)]


def column_counts(grads: list[torch.Tensor], modes: list[int]) -> list[int]:
    """How many columns (of `columns`) each weight's low-rank gradient has: its weight's other side."""
    return [grad.shape[1 - mode] for grad, mode in zip(grads, modes, strict=True)]


def projected_and_mixed(directions_of, direction_args: tuple, factors: list[torch.Tensor], dtypes: list[torch.dtype],
                        mixing: Mixing) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """mixed_together with the projections before it, as a function of tensors (compiled with compile_update): each
    gradient projected (Projector.project's matmul, in its `dtypes` entry), then the directions, the complement and
    β φ ⊙ G. The add-backs stay outside: inside, Inductor writes each weight's addmm to a new buffer and copies it
    back (a weight-sized pass more each), where eager adds in place."""
    low_grads = [onto_basis(grad.to(dtype), factor.to(dtype), mode)
                 for grad, factor, dtype, mode in zip(mixing.grads, factors, dtypes, mixing.modes, strict=True)]
    return mixed_together(directions_of, direction_args, low_grads, *mixing)


def mixed_together(directions_of, direction_args: tuple, low_grads: list[torch.Tensor],
                   inv_ps: list[torch.Tensor | None] | None, grads: list[torch.Tensor], params: list[torch.Tensor],
                   modes: list[int], lengths: list[int], previous: list[torch.Tensor], units: list[float] | None,
                   owners: torch.Tensor, cap: float | None, spans: list[tuple[int, int]], alphas: list[float], betas: list[float]
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The complement's arithmetic, a function of tensors (which compile_update compiles): the directions Z =
    directions_of(low_grads, *direction_args) (a backend's moments, compiled in the same call, or `given`), φ of every weight's
    columns, β φ ⊙ G added to each weight (`params`, in place), and the mixed low-rank parts of every weight's columns
    side by side (the caller splits them: views made in a compiled function are made again on its way out, one call
    each), with each weight's limiter's next reference.

    Each weight's Z and R are laid side by side as the columns of one r-row matrix (`columns`), so φ's per-column
    norms, its arithmetic and the mixing are a fixed number of kernels for any number of weights (residual.
    complement_weights_together); what stays per weight is a pass over its G (the norms of its columns) and, eager,
    its two matmuls. `inv_ps`: each weight's PLUMAGE 1/p (None: no weight has one), which rescales Z after φ is
    taken; `spans`, `alphas`, `betas`: the columns of each run of weights sharing a pair (α, β) and that pair."""
    directions = directions_of(low_grads, *direction_args)
    z_columns = torch.cat([columns(direction, mode) for direction, mode in zip(directions, modes, strict=True)], dim=1)
    r_columns = torch.cat([columns(low, mode) for low, mode in zip(low_grads, modes, strict=True)], dim=1)
    phi, references = complement_weights_together(z_columns, r_columns, grads, modes, previous, units, owners, cap)
    if inv_ps is not None:  # D⁻¹Z as Projector.rescaled forms it: 1/p on the basis's rows, a column's r entries
        z_columns = torch.cat([columns(z, mode) if inv_p is None else columns(z, mode) * inv_p.unsqueeze(1)
                               for z, inv_p, mode in zip(directions, inv_ps, modes, strict=True)], dim=1)
    # β φ, a tensor: a float in a _foreach call (or in addcmul's value) is specialized by torch.compile, a recompile
    # a step as the lr changes
    beta_phi = [beta * phi[start:stop] for (start, stop), beta in zip(spans, betas, strict=True)]
    pieces = [alpha * z_columns[:, start:stop] - weights * r_columns[:, start:stop]
              for (start, stop), alpha, weights in zip(spans, alphas, beta_phi, strict=True)]
    weights = (beta_phi[0] if len(beta_phi) == 1 else torch.cat(beta_phi)).split(lengths)
    torch._foreach_addcmul_(params, grads, [
        w.view(_along_columns(grad.shape, mode)).to(grad.dtype) for w, grad, mode in zip(weights, grads, modes,
                                                                                       strict=True)])
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1), references


mixed_compiled = Compiled(mixed_together, "the complement's arithmetic of the weights stepped together")
whole_compiled = Compiled(projected_and_mixed, "the projections, moments and complement of the weights stepped together")


def decay_together(params: list[torch.Tensor], decays: list[float]) -> None:
    """W ← W − decay · W for each weight, as apply_update forms it, in one call per run of weights sharing a decay
    (AdamW's lr × weight_decay is the group's; Adafactor's scales with each weight's own step size)."""
    for decay, run in runs(decays):
        if decay:
            torch._foreach_add_(params[run], params[run], alpha=-decay)


def runs(values: list) -> Iterator[tuple[object, slice]]:
    """Each run of equal consecutive `values`, with the slice of the list it spans: a _foreach call takes one scalar
    (an alpha) for all its tensors, so weights whose scalars differ (a step count, a step size) go in one call a run."""
    first = 0
    for value, run in itertools.groupby(values):
        last = first + len(list(run))
        yield value, slice(first, last)
        first = last


def columns(low: torch.Tensor, mode: int) -> torch.Tensor:
    """A low-rank tensor (r × n on mode 0, m × r on mode 1) as the columns the complement weighs, those of the
    weight's other side, each of r entries: itself or its transpose (a view both ways)."""
    return low if mode == 0 else low.T


def _along_columns(shape: torch.Size, mode: int) -> tuple[int, int]:
    """The shape that broadcasts one number per column (of `columns`) over a weight of `shape` (or its low-rank
    gradient's)."""
    return (1, shape[1]) if mode == 0 else (shape[0], 1)
