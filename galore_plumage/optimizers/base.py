"""The low-rank optimizer: one projector per low-rank weight, composed with a moment backend.

A param group with a `rank` key is low-rank (galore-torch's convention); every other group gets the
backend's plain full-rank update. For a low-rank weight W with gradient G, one step is

    if the projector is due: refresh it from G, then realign the moments through B = P_newᵀ P_old
    R = project(G)                          (r-dimensional side, fp32)
    Z, step_size, decay = backend(R)        (the backend owns and updates its moments on R)
    W ← W − step_size · project_back(Z)     (project_back applies `scale` and PLUMAGE's D⁻¹)
    W ← W − |step_size| · φ ⊙ (G − P R)     (only with residual="norm_matched": Fira's complement, residual.py)
    W ← W − decay · W                       (decoupled; before the update for Adafactor, as galore-torch)

The state of every parameter is plain tensors and numbers (the projector's included, under "projector"),
so checkpoints load with torch.load(weights_only=True) and resume exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch
from torch.optim import Optimizer

from ..projectors import Projector, build_projector, projector_spec
from ..projectors.base import Outside, compute_dtype
from ..projectors.plumage import resample_together
from .batched_refresh import prepare_batched_refreshes
from .moment_floor import check_horizon
from .multi_tensor import steady_together, step_together
from .options import BY_KEY, OPTIONS, check_options, option_defaults, projector_keys
from .placement import WHOLE
from .realign import check_rule
from .residual import complement_weights, residual_rule
from .sampled_step import norm_matched, restart_limiter

try:  # FSDP2's sharded parameters; absent from torch builds without distributed support
    from .sharded import Sharding, is_sharded
except ImportError:  # pragma: no cover
    Sharding, is_sharded = None, lambda tensor: False

LOW_RANK_DEFAULTS: dict[str, Any] = {  # galore-torch's keys, then ours (the options table: optimizers/options.py)
    "update_proj_gap": 200,
    "scale": 1.0,
    "proj_type": "std",
    "projector": "svd",
    "realign": "none",
    "seed": 0,
    **option_defaults(),
}
PLUMAGE_DEFAULTS: dict[str, Any] = {"projector": "plumage", "realign": "mv", "scale": 1.0,
                                    **option_defaults("plumage")}
# plumage_adamw(8bit) at the setting the fair protocol chose in session 17 (docs/results.md §3): GaLore's top-r basis
# with the floor V ← max(V, M²) before each low-rank update (v_floor, in effect a slow warm-up of the low-rank step),
# moments kept at a refresh as GaLore keeps them, no complement, GaLore's recipe (scale 0.25, one lr on every group).
# Ahead of GaLore's recipe and of the PLUMAGE-projector default it replaced (PLUMAGE_SAMPLED) at 600 and 2000 updates.
PLUMAGE_ADAM_RECIPE: dict[str, Any] = {"projector": "svd", "lr": 1e-2, "scale": 0.25, "realign": "none",
                                       **option_defaults("plumage", adam=True)}  # v_floor "m2", residual "none"


def projector_options(group: dict, **overrides) -> dict[str, Any]:
    """The build_projector keyword arguments a low-rank group sets (name and rank are passed apart).

    A plumage_* default that does not apply to the group's projector (resample_every under projector='svd') is left
    out, so the projector keeps its own default; any other value reaches the projector, which refuses what it cannot do.
    """
    options = {key: group[key] for key in ("proj_type", "update_proj_gap", "scale", "seed")}
    projector_cls = projector_spec(group["projector"]).cls
    for key in projector_keys():
        option = BY_KEY[key]
        harmless = group[key] == option.plumage_default() and option.applies and option.applies("", projector_cls)
        if not harmless:
            options[key] = group[key]
    return {**options, **overrides}


class Update(NamedTuple):
    direction: torch.Tensor  # low-rank (or full-size) tensor Z
    step_size: float  # the weight moves by −step_size · project_back(Z)
    decay: float  # decoupled weight decay: W ← W − decay · W
    complement: torch.Tensor | None = None  # φ of residual="norm_matched": W also moves by −|step_size| · φ ⊙ G⊥
    # what `direction` carries beyond the backend's normalized step (8-bit returns its finished step, lr · bias
    # correction times AdamW's M/√V; Adafactor its step size times its own): divided out where sizes are compared
    # from step to step (the complement's and the sampled rows' limiters), so that every backend limits the same
    # series, free of the lr schedule
    unit: float = 1.0


class Pending(NamedTuple):
    """Updates of weights stepped together whose directions are not computed yet, and the function of tensors that
    computes them, function(low_grads, *args) (and advances the moments): what compile_update compiles with the
    projections before it and the complement's arithmetic after it, in one call (Backend.pending_together,
    multi_tensor.step_together)."""
    updates: list[Update]  # their `direction` None
    function: Callable[..., list[torch.Tensor]]
    args: tuple


class Backend:
    """Moments and their update. Holds no state of its own: everything lives in optimizer.state[p]."""

    name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]
    decay_first: ClassVar[bool] = False

    def validate(self, group: dict) -> None:
        """Raise ValueError naming any bad hyper-parameter of `group`."""

    def update(self, state: dict, grad: torch.Tensor, group: dict, param: torch.Tensor,
               rows: int | None = None) -> Update:
        """Advance the moments in `state` with `grad` (state["step"] already counts this step). `rows`: the axis of a
        low-rank `grad` that indexes the basis vectors (None for a full-rank one)."""
        raise NotImplementedError

    # the state key a weight's first update makes (its moments): until it exists, the weight steps alone (foreach)
    moments_key: ClassVar[str]

    def update_together(self, states: list[dict], grads: list[torch.Tensor], group: dict,
                        params: list[torch.Tensor], rows: list[int | None]) -> list[Update]:
        """update() of several low-rank weights of one group whose moments exist, with `rows` as update() takes it
        (multi_tensor.step_together): here one weight at a time; AdamW, Adafactor and SGD momentum advance the moments
        of all of them in torch._foreach calls (the same arithmetic, so the same numbers)."""
        return [self.update(state, grad, group, param, rows=row)
                for state, grad, param, row in zip(states, grads, params, rows, strict=True)]

    def pending_together(self, states: list[dict], group: dict) -> Pending | None:
        """update_together's updates with their directions not computed yet, and the function of tensors (with its
        arguments but the low-rank gradients, which it takes first) that computes them: a Pending, which
        compile_update compiles with the projections and the complement's arithmetic in one call
        (multi_tensor.step_together). None where this backend computes its directions otherwise (8-bit's
        kernel a weight, Adafactor's call per run of step counts, SGD momentum's buffers)."""
        return None

    def realign(self, state: dict, projector: Projector, rule: str) -> None:
        """Carry the moments through the projector's latest transition (see realign.py)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- FSDP2 (optimizers/sharded.py)
    # Each rank steps its own rows of a sharded weight. A backend that supports it names the state tensors whose dim 0
    # is the weight's rows (saved as row shards); None: no sharded support.
    row_keys: ClassVar[tuple[str, ...] | None] = None
    # state tensors holding one list of values per rank rather than per row (8-bit's absmax: one per block of the rank's
    # own rows), saved padded to the longest rank's list
    per_rank_keys: ClassVar[tuple[str, ...]] = ()

    def per_rank_length(self, state: dict, rows: int) -> int:
        """The length of a per_rank_keys tensor for a shard of `rows` rows laid out as `state`."""
        raise NotImplementedError(f"backend {self.name!r} keeps no per-rank state")

    def reblocked(self, state: dict, first_row: int, rows: int, saved_world: int) -> dict:
        """A sharded checkpoint written by `saved_world` processes, in this rank's layout: `state` holds this rank's rows
        of the row keys (from first_row on, of `rows` in all) and, for each per-rank key, the lists of every saved rank
        (torch.chunk's split of the rows), concatenated; returns the row and per-rank keys laid out for this rank."""
        raise NotImplementedError(f"backend {self.name!r} keeps no per-rank state")

    def over_ranks(self, process_group) -> Backend:
        """This backend stepping row shards over `process_group`: itself, unless it reduces over a whole tensor."""
        return self

    def group_for_numel(self, group: dict, numel: int) -> dict:
        """The group as this backend should see it for a tensor of `numel` elements in all, of which a rank steps a
        part (so that every rank decides as one process holding the whole tensor would)."""
        return group

    def full_step(self, param: torch.Tensor, grad: torch.Tensor, group: dict, state: dict) -> None:
        apply_update(param, self.update(state, grad, group, param), None, self.decay_first)


def low_rank_update(backend: Backend, state: dict, low_grad: torch.Tensor, group: dict, param: torch.Tensor,
                    projector: Projector, total=lambda x: x, grad: torch.Tensor | None = None,
                    residual: str = "none", fitted: bool = False) -> Update:
    """The backend's update of a low-rank weight, its sampled rows moved as `group["sampled_step"]` says, and the
    complement's weights when `residual` (the group's, as residual_rule reads it) moves the gradient outside the basis
    (it needs the full `grad`)."""
    modes = tuple(projector.factors)
    update = backend.update(state, low_grad, group, param, rows=projector.one_sided_mode)
    if residual != "none":
        if grad is None:
            raise ValueError(f"residual={residual!r} moves the gradient outside the basis, so it needs the "
                             "full gradient: step with grad=, not a projected low_grad")
        (mode,) = modes
        phi = complement_weights(update.direction, low_grad, grad, mode, state, total, unit=update.unit, fitted=fitted,
                                 limiter=group["residual_limiter"], cap=group["residual_cap"])
        update = update._replace(complement=phi)
    if group["sampled_step"] == "norm_matched" and projector.inv_p is not None:
        (mode,) = modes
        # the weight moves by −step_size · Z: a backend that returns the finished step (8-bit: step_size −1) has Z
        # pointing up the gradient, so the sampled rows' R takes the same orientation
        oriented = low_grad if update.step_size >= 0 else -low_grad
        direction = norm_matched(update.direction, oriented, projector.inv_p, mode, state, total, unit=update.unit)
        update = update._replace(direction=direction)
    return update


def refresh_target(state: dict, grad: torch.Tensor, factor: float, whole: bool) -> torch.Tensor:
    """What a refresh decomposes: the step's gradient, or with `factor` (refresh_ema) > 0 the running average
    E ← f E + (1 − f) G, advanced every step (a single batch's top-r subspace is partly that batch's noise)."""
    if factor == 0:
        return grad
    if not whole:
        raise ValueError(f"refresh_ema={factor} keeps a full-size average of each weight's gradient, which a weight "
                         "sharded by FSDP2 does not support: set refresh_ema=0")
    if "refresh_ema" not in state:
        state["refresh_ema"] = grad.detach().to(compute_dtype(grad), copy=True)  # the dtype a refresh computes in
    else:
        average = state["refresh_ema"]
        # a non-finite gradient (a step the optimizer skips) must not poison every later refresh; no host sync
        advanced = average.mul(factor).add_(grad, alpha=1.0 - factor)
        average.copy_(torch.where(torch.isfinite(grad).all(), advanced, average))
    return state["refresh_ema"]


def resample_if_due(backend: Backend, state: dict, group: dict, projector: Projector) -> None:
    """PLUMAGE's κ (resample_every): after an update, draw the sampled rows again from the refresh's pool for the
    next one, and carry the moments to the new rows as a refresh would."""
    if projector.resample_due(state["step"]):
        projector.resample(state["step"])
        carry_moments_to_draw(backend, state, group, projector)


def resample_together_if_due(updated: list[tuple[Backend, dict, dict, Projector]]) -> None:
    """resample_if_due of each (backend, state, group, projector) updated in this step, the draws made together
    (plumage.resample_together): a weight's draw reads nothing another weight's update wrote, so drawing all of them
    after the group's updates gives each the basis it would have drawn right after its own."""
    due = [entry for entry in updated if entry[3].resample_due(entry[1]["step"])]
    if due:
        resample_together([projector for *_, projector in due], [state["step"] for _, state, _, _ in due])
    for backend, state, group, projector in due:
        carry_moments_to_draw(backend, state, group, projector)


def carry_moments_to_draw(backend: Backend, state: dict, group: dict, projector: Projector) -> None:
    """After a draw: the moments carried to the new rows, the limiters restarted, the projector's state saved."""
    backend.realign(state, projector, group["realign"])
    restart_limiter(state)
    state["projector"] = projector.state_dict()


def apply_update(param: torch.Tensor, update: Update, projector: Projector | None, decay_first: bool,
                 grad: torch.Tensor | None = None, low_grad: torch.Tensor | None = None,
                 residual_scale: float = 1.0) -> None:
    """W ← W − step_size · project_back(Z) (and the complement −|step_size| · residual_scale · φ ⊙ (G − P R) when the
    update carries φ), with the decoupled decay W ← W − decay · W before or after it (each its own pass, in
    galore-torch's order, so its parity holds)."""
    if decay_first and update.decay:
        param.add_(param, alpha=-update.decay)
    if projector is not None:
        # |step_size|: a backend returning its finished step (8-bit: step_size −1) has Z pointing up the gradient, but
        # φ is a ratio of norms, so the complement moves down the gradient either way
        outside = None
        if update.complement is not None:
            outside = Outside(grad, low_grad, update.complement, -abs(update.step_size) * residual_scale)
        projector.add_back(param, update.direction, -update.step_size, outside)
    else:
        param.add_(update.direction, alpha=-update.step_size)
    if not decay_first and update.decay:
        param.add_(param, alpha=-update.decay)


def check_non_negative(group: dict, *keys: str) -> None:
    for key in keys:
        value = group[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"Invalid {key}: {value!r} - should be a finite number >= 0.0")


def check_betas(betas) -> None:
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta} - should be in [0.0, 1.0)")


class LowRankOptimizer(Optimizer):
    """A torch Optimizer whose groups with a `rank` key are trained through a low-rank projector.

    Subclasses fix `backend` and may change the low-rank defaults (`class_defaults`); any option can also
    be set per group: rank, update_proj_gap, scale, proj_type, projector, realign, seed, and the options of
    optimizers/options.py.
    """

    backend: ClassVar[Backend]
    class_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, params, lr: float | None = None, **options):
        options.pop("no_deprecation_warning", None)  # galore-torch's AdamW flag; nothing is deprecated here
        if lr is not None:
            options["lr"] = lr
        known = {**self.backend.defaults, **LOW_RANK_DEFAULTS}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected options {unknown}; accepted: {sorted(known)}")
        self._projectors: dict[torch.Tensor, Projector] = {}
        self._indices: dict[torch.Tensor, int] = {}
        self._sharding = None  # optimizers.sharded.Sharding once a DTensor (FSDP2) parameter is added
        # diagnostics: each is called as observe(param, projector, update, state, refreshed) after a low-rank
        # weight's update is computed and before it is applied (benchmarks/step_anatomy.py); empty in training
        self.step_observers: list = []
        # torch fills the defaults into the group dicts it is given: copy them, so the caller's groups can build
        # another optimizer (GaLoreAdamW(groups), then PlumageAdamW(groups)) without inheriting this one's settings
        params = [dict(group) if isinstance(group, dict) else group for group in params]
        super().__init__(params, {**known, **self.class_defaults, **options})

    # ----------------------------------------------------------------- groups
    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self.backend.validate(group)
        for param in group["params"]:
            self._indices.setdefault(param, len(self._indices))
        if "rank" in group:
            self._validate_low_rank(group, len(self.param_groups) - 1)
        if self._sharding is None and any(is_sharded(p) for p in group["params"]):
            self._sharding = Sharding(self)
        if self._sharding is not None:
            self._sharding.validate_group(group, len(self.param_groups) - 1)

    def _validate_low_rank(self, group: dict, index: int) -> None:
        spec, backend = projector_spec(group["projector"]), self.backend  # unknown names fail here, listing the choices
        check_rule(group["realign"])
        where = f"low-rank group {index}: "
        check_options({o.key: group[o.key] for o in OPTIONS}, where=where)
        try:
            check_horizon(group["v_floor_horizon"], group["v_floor"])
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        # a row-bias correction, a floor on V or a residual switched on must fit this backend (the table's rule) and
        # have one set of rows (plumage_*'s residual default is off where it cannot apply: residual_rule)
        switched_on = {"row_bias_correction": group["row_bias_correction"], "v_floor": group["v_floor"] != "none",
                       "v_floor_horizon": group["v_floor_horizon"] is not None,
                       "residual": residual_rule(group, spec.cls) != "none"}
        for key in (key for key, on in switched_on.items() if on):
            check_options({key: group[key]}, backend.name, spec.cls, where)
            if spec.tensors or group["proj_type"] == "full":
                raise ValueError(f"{key}={group[key]!r} (low-rank group {index}) needs a one-sided projection; got "
                                 f"projector {spec.name!r}, proj_type {group['proj_type']!r}: drop {key}, or set "
                                 f"{key}={BY_KEY[key].default!r} where it is the optimizer's default")
        if group["compile_update"] and group["row_bias_correction"]:
            raise ValueError(f"{where}compile_update=True fuses the backend's plain update; row_bias_correction=True "
                             "takes another path: drop one of them")
        # the projector validates rank, gap, scale, proj_type, and tau_max against the gap
        build_projector(spec.name, group["rank"], **projector_options(group))
        for position, param in enumerate(group["params"]):
            if param.dim() < 2 or (param.dim() > 2 and not spec.tensors):
                raise ValueError(
                    f"param {position} of low-rank group {index} has shape {tuple(param.shape)}, but projector "
                    f"{spec.name!r} needs 2-D weights: move it to a group without 'rank'"
                    + (" or use projector='tucker'" if param.dim() > 2 else "")
                )

    # ----------------------------------------------------------------- stepping
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        prepare_batched_refreshes(self)  # same-shaped weights due for a refresh: one decomposition call (refresh_batch)
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            updated = []  # (backend, state, group, projector) of each low-rank update: PLUMAGE's draws after them all

            def defer_draw(*entry, updated=updated):
                updated.append(entry)

            together = steady_together(self, group, params)  # foreach: plain steady updates in _foreach calls
            if together:
                step_together(self, group, together, after=defer_draw)
            done = {id(member.param) for member in together}
            for param in params:
                if id(param) not in done:
                    self._step_param(param, group, grad=param.grad, after=defer_draw)
            resample_together_if_due(updated)
        return loss

    @torch.no_grad()
    def step_param(self, param: torch.Tensor, group: dict, grad: torch.Tensor | None = None,
                   low_grad: torch.Tensor | None = None) -> None:
        """One update of one weight, from its full gradient or from an already projected one (per-layer mode).

        A weight that FSDP2 shards is stepped by the same code on each rank's own rows: its placement (placement.py,
        sharded.py) supplies the local tensors, the sums over ranks and the refresh from the all-reduced Gram."""
        self._step_param(param, group, grad, low_grad)

    def _step_param(self, param: torch.Tensor, group: dict, grad: torch.Tensor | None = None,
                    low_grad: torch.Tensor | None = None, after=resample_if_due) -> None:
        """step_param without its own no_grad context (step() holds one for every weight: entering it once per weight
        cost ~10 µs, a tenth of a small weight's step); after(backend, state, group, projector) follows a low-rank
        update (the draw, or step()'s note of it for the draws made together)."""
        where = self._placement(param)
        where.check_step(grad, low_grad)
        state = self.state[param]
        state.setdefault("step", 0)
        weight, backend = where.local(param), where.backend(self.backend, param)
        grad = where.local(grad) if grad is not None else None
        if "rank" not in group:
            state["step"] += 1
            backend.full_step(weight, grad, where.group_for(group, backend, param, weight), state)
            return
        projector = self.projector_for(param, group)
        refreshed = False
        if low_grad is None:
            target = refresh_target(state, grad, group["refresh_ema"], where is WHOLE)
            if projector.due(state["step"]):
                count = projector.refresh_count
                if not self._refresh(param, projector, target, group, state, where, backend):
                    return
                refreshed = projector.refresh_count > count
            low_grad = projector.project(grad)
        residual = self.residual_now(group, projector, state["step"])
        state["step"] += 1
        group = where.group_for(group, backend, param, low_grad)
        update = low_rank_update(backend, state, low_grad, group, weight, projector, total=where.total_for(param),
                                 grad=grad, residual=residual, fitted=refreshed)
        for observe in self.step_observers:
            observe(param, projector, update, state, refreshed)
        apply_update(weight, update, projector, backend.decay_first, grad, low_grad, group["residual_scale"])
        after(backend, state, group, projector)

    def _refresh(self, param, projector: Projector, grad, group, state, where, backend: Backend) -> bool:
        """Refresh (as the weight's placement `where` does it) and realign; False when there is nothing sound to apply
        this step."""
        first = not projector.ready
        # B = F_newᵀ F_old only where something reads it: a realignment of the moments, or an observer (diagnostics)
        projector.keeps_transition = group["realign"] != "none" or bool(self.step_observers)
        if where.refresh(projector, grad, param, state["step"]):
            if projector.moved:
                backend.realign(state, projector, group["realign"])
            restart_limiter(state)
            if first and group["stagger"]:
                projector.next_refresh = state["step"] + self._staggered_interval(param, projector.tau)
            state["projector"] = projector.state_dict()
            return True
        # No new basis: with none at all, or with a gradient that would put NaN into the moments, skip.
        return projector.ready and where.all_finite(grad, param)

    def _staggered_interval(self, param: torch.Tensor, tau: int) -> int:
        low_rank = [p for g in self.param_groups if "rank" in g for p in g["params"]]
        order = next(i for i, p in enumerate(low_rank) if p is param)
        return tau - (order * tau) // len(low_rank)

    def needs_full_grad(self, param: torch.Tensor, group: dict) -> bool:
        """True when the next step of `param` must see its full gradient (a refresh is due, or a residual reads it)."""
        if "rank" not in group:
            return True
        projector = self.projector_for(param, group)
        step = self.state[param].get("step", 0)
        return self.residual_now(group, projector, step) != "none" or group["refresh_ema"] > 0 or projector.due(step)

    def residual_for(self, group: dict, projector: Projector) -> str:
        """The group's `residual` as it applies to `projector` (plumage_*'s default is left out where it cannot)."""
        return residual_rule(group, type(projector))

    def residual_now(self, group: dict, projector: Projector, step: int) -> str:
        """The residual rule of the update that follows `step` updates: "none" beyond the group's residual_horizon (the
        basis's age, 0 on a refresh's update, must be below it). A refresh due now makes the age 0."""
        horizon = group["residual_horizon"]
        if horizon is not None and not projector.due(step) and projector.age(step) >= horizon:
            return "none"
        return self.residual_for(group, projector)

    def projector_for(self, param: torch.Tensor, group: dict) -> Projector:
        projector = self._projectors.get(param)
        if projector is None:
            overrides = self._placement(param).projector_options(param, group)
            projector = build_projector(
                group["projector"], group["rank"], **projector_options(group, index=self._indices[param], **overrides)
            )
            if "projector" in self.state[param]:
                projector.load_state_dict(self.state[param]["projector"], device=self._placement(param).local(param).device)
            self._projectors[param] = projector
        return projector

    def projector_stats(self) -> dict[int, dict[str, float]]:
        """Per low-rank weight (by its index in the param groups): r*, ρ, τ, max 1/p, refresh counts."""
        return {self._indices[p]: dict(proj.stats) for p, proj in self._projectors.items()}

    def held_whole(self, param: torch.Tensor) -> bool:
        """True when this process holds all of `param` (not FSDP2 rows of it)."""
        return self._placement(param) is WHOLE

    def _placement(self, param: torch.Tensor):
        """How `param` is held: whole, or (FSDP2) by rows over ranks; see placement.py."""
        return self._sharding if self._sharding is not None and is_sharded(param) else WHOLE

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """As torch's; the state of FSDP2-sharded weights comes as DTensors (see optimizers/sharded.py)."""
        state_dict = super().state_dict()
        return self._sharding.wrap_state_dict(state_dict) if self._sharding is not None else state_dict

    def prepare_for_load(self) -> None:
        """Give every FSDP2-sharded weight without state a state of the right layout (placeholder values), so that
        this optimizer's state dict is a complete template for torch.distributed.checkpoint.load; no-op otherwise."""
        if self._sharding is not None:
            self._sharding.prepare_for_load()

    def saved_layout(self, state_dict: dict, saved_world: int) -> dict:
        """This optimizer's state dict as the template for a sharded checkpoint of `saved_world` processes (only
        per-rank states, 8-bit's block scales, are laid out by the number of processes; optimizers/sharded.py)."""
        return self._sharding.saved_layout(state_dict, saved_world) if self._sharding is not None else state_dict

    def reblocked(self, state_dict: dict, saved_world: int) -> dict:
        """A state dict loaded into saved_layout's template, laid out for this number of processes."""
        return self._sharding.reblocked(state_dict, saved_world) if self._sharding is not None else state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, but tensors keep their saved dtype (fp32 bases and moments, uint8 8-bit states):
        torch would cast every floating state tensor to the parameter's dtype."""
        if self._sharding is not None:
            state_dict = self._sharding.unwrap_state_dict(state_dict)
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        super().load_state_dict(state_dict)
        before_the_key = option_defaults()  # a checkpoint from before an option existed runs as it was written
        for group in self.param_groups:
            for key in LOW_RANK_DEFAULTS.keys() & self.defaults.keys():
                group.setdefault(key, before_the_key.get(key, self.defaults[key]))
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, param in zip(saved_ids, params, strict=True):
            if saved_id in state_dict["state"]:
                self.state[param] = _on_device(state_dict["state"][saved_id], param.device)
        self._projectors = {}


def _on_device(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device=device)
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_on_device(v, device) for v in value]
    return value
