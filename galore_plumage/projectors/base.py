"""What every projector shares: which modes it projects, when it refreshes, how it moves between bases.

A projector keeps, for each projected mode k of the gradient, a factor F_k (dim_k × r) whose columns span
the kept subspace. For a matrix, mode 0 is GaLore's left side (R = Pᵀ G) and mode 1 its right side
(R = G P); a Tucker projector uses every mode of a tensor.

    project(G)      = G ×_k F_kᵀ                        the low-rank gradient R
    project_back(Z) = scale · (D⁻¹ Z) ×_k F_k           D⁻¹: PLUMAGE's 1/p along the sampled mode
    transition      = {k: B_k = F_newᵀ F_old}           r × r, moves low-rank moments to the new basis

Subclasses only say how a new basis is made (`_new_basis`, or `_basis_from_spectrum` from singular values and
vectors); the schedule, the guards against bad
gradients, the adaptive interval, the transition and the state live here.
"""

from __future__ import annotations

import math
import warnings
from typing import ClassVar, NamedTuple

import torch

from .checks import check_bool, check_max_inv_p, check_pool_factor, check_resample_every, check_sample_until, check_solver
from .interval import cosine_mean, next_interval, principal_overlap
from .modes import PROJ_TYPES, add_product, along, mode_product, onto_basis, projected_modes
from .pool import Basis, Pool, stored_in_bf16
from .seeding import refresh_generator
from .signs import aligned_signs
from .spectrum import Singular, decompose, eigh_gram

DEFAULT_TAU_MAX_FACTOR = 4  # tau_max defaults to 4 × update_proj_gap when adaptive_interval is on


class Outside(NamedTuple):
    """The gradient's part outside a one-sided basis F, weighted, for add_back: alpha · weights ⊙ (G − F R), with
    R = project(G) and `weights` broadcast along the projected axis (optimizers/residual.py makes them)."""

    grad: torch.Tensor
    low_grad: torch.Tensor
    weights: torch.Tensor
    alpha: float


class Projector:
    """Base class. Subclasses set the class attributes (the registry reads them) and `_new_basis` (or, from_spectrum,
    `_basis_from_spectrum`)."""

    name: ClassVar[str] = "base"
    description: ClassVar[str] = ""
    proj_types: ClassVar[tuple[str, ...]] = PROJ_TYPES
    unbiased: ClassVar[bool] = False  # E[project_back(project(G))] = G (at scale 1)
    tensors: ClassVar[bool] = False  # accepts gradients with more than 2 dims
    stores_factors: ClassVar[bool] = True  # False: factors are regenerated from the seed on load
    from_spectrum: ClassVar[bool] = False  # True: a basis is made from singular values/vectors alone (sharded refresh)
    rescales: ClassVar[bool] = False  # True: project_back applies 1/p of sampled directions (max_inv_p may cap it)
    signed: ClassVar[bool] = False  # True: bases are singular vectors, each defined up to its sign (align_signs)
    # True: a bad gradient's basis is made and then rejected (refresh), so the check costs no host read of its own; only
    # for a projector whose basis-making tolerates NaN (an SVD does; PLUMAGE reads the check with σ before sampling)
    checks_after: ClassVar[bool] = False

    def __init__(
        self,
        rank: int,
        proj_type: str = "std",
        update_proj_gap: int = 200,
        scale: float = 1.0,
        seed: int = 0,
        index: int = 0,
        adaptive_interval: bool = False,
        tau_max: int | None = None,
        solver: str = "svd",
        max_inv_p: float | None = None,
        resample_every: int = 0,
        pool_factor: int = 2,
        align_signs: bool = False,
        pool_bf16: bool = False,
        sample_until: int | None = None,
    ):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be an integer >= 1, got {rank!r}")
        if isinstance(update_proj_gap, bool) or not isinstance(update_proj_gap, int) or update_proj_gap < 1:
            raise ValueError(f"update_proj_gap must be an integer >= 1, got {update_proj_gap!r}")
        if proj_type not in self.proj_types:
            raise ValueError(
                f"projector {self.name!r} does not support proj_type={proj_type!r}; "
                f"choose one of {', '.join(self.proj_types)}"
            )
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a positive finite number, got {scale!r}")
        check_solver(solver)
        check_max_inv_p(max_inv_p)
        if max_inv_p is not None and not self.rescales:
            raise ValueError(f"max_inv_p={max_inv_p!r} caps PLUMAGE's 1/p rescaling, but projector {self.name!r} "
                             "does not rescale; use projector='plumage' or leave max_inv_p unset")
        check_resample_every(resample_every)
        if resample_every and not self.rescales:
            raise ValueError(f"resample_every={resample_every!r} draws PLUMAGE's sample again, but projector "
                             f"{self.name!r} does not sample; use projector='plumage' or leave resample_every at 0")
        check_sample_until(sample_until)
        if sample_until is not None and not self.rescales:
            raise ValueError(f"sample_until={sample_until!r} ends PLUMAGE's sampling, but projector {self.name!r} "
                             "does not sample; use projector='plumage' or leave sample_until unset")
        check_pool_factor(pool_factor)
        check_bool("pool_bf16")(pool_bf16)
        if pool_bf16 and not self.rescales:
            raise ValueError(f"pool_bf16=True stores PLUMAGE's pool of sampled vectors, but projector {self.name!r} "
                             "keeps no pool; leave pool_bf16 unset")
        check_bool("align_signs")(align_signs)
        if align_signs and not self.signed:
            raise ValueError(f"align_signs=True fixes the signs of singular vectors, but projector {self.name!r} "
                             "does not use any; leave align_signs unset")
        tau_max = DEFAULT_TAU_MAX_FACTOR * update_proj_gap if tau_max is None else tau_max
        if isinstance(tau_max, bool) or not isinstance(tau_max, int) or tau_max < update_proj_gap:
            raise ValueError(f"tau_max must be an integer >= update_proj_gap={update_proj_gap}, got {tau_max!r}")

        self.rank, self.proj_type, self.scale = rank, proj_type, float(scale)
        self.seed, self.index = int(seed), int(index)
        self.adaptive_interval, self.tau_min, self.tau_max = bool(adaptive_interval), update_proj_gap, tau_max
        self.tau = update_proj_gap
        self.solver = solver  # "auto" is resolved per refresh, by the gradient's device (solver_on)
        self.max_inv_p = None if max_inv_p is None or max_inv_p == math.inf else float(max_inv_p)  # inf: no cap
        self.resample_every, self.pool_factor, self.pool_bf16 = resample_every, pool_factor, pool_bf16
        self.sample_until = sample_until
        # the dtype projections are computed in (float32, or float64 for float64 gradients): the factors' own dtype,
        # unless they are views of a pool stored in bfloat16
        self._compute: torch.dtype | None = None
        self.align_signs = align_signs
        self.pool: Pool | None = None
        self.draws = 0  # resamples since the last refresh
        self.next_resample = 0
        self.shape: tuple[int, ...] | None = None
        self._rank_per_mode: dict[int, int] = {}
        self.factors: dict[int, torch.Tensor] = {}
        self.inv_p: torch.Tensor | None = None
        # the latest basis change, in one of two forms (see `transition`): B per mode after a refresh, or after a draw
        # from the pool only (mode, the rows whose vector changed), what transport zeroes
        self._transition: dict[int, torch.Tensor] | None = None
        self._selection: tuple[int, torch.Tensor] | None = None
        # whether a refresh computes B = F_newᵀ F_old (an r × n × r product per mode, ~1 % of a CPU refresh): only a
        # reader of the moments' transport needs it, so an optimizer that keeps its moments at a refresh (realign
        # "none", GaLore's way and plumage_adamw's default) turns it off; `moved` still tells that the basis changed
        self.keeps_transition = True
        self._moved_untracked = False  # the latest refresh changed the basis and kept no B (keeps_transition off)
        self._prepared: tuple[Singular, int] | None = None  # prepare(): a batched decomposition for the next refresh
        self.refresh_count = 0
        self.next_refresh = 0
        self.refreshed_at = 0  # the step of the latest refresh (the basis's age counts from it)
        self.stats: dict[str, float] = {"refreshes": 0, "skipped_refreshes": 0, "tau": self.tau}

    def solver_on(self, device: torch.device) -> str:
        """The solver a refresh of a gradient on `device` uses: the configured one, or for "auto" auto_solver's."""
        return self.auto_solver(device) if self.solver == "auto" else self.solver

    # ----------------------------------------------------------------- what subclasses provide
    def auto_solver(self, device: torch.device) -> str:
        """What solver="auto" means for this projector on `device`: the fastest solver measured there whose spectrum is
        accurate where the basis reads it (tests/projectors/test_solver_accuracy.py). The base keeps galore-torch's SVD."""
        return "svd"

    def _new_basis(self, grad: torch.Tensor, ranks: dict[int, int], generator: torch.Generator) -> Basis | None:
        """A new basis for `grad` (float32/64; finite and non-zero unless `checks_after`); None keeps the previous one.
        A projector that is `from_spectrum` provides _basis_from_spectrum instead: refresh decomposes for it."""
        raise NotImplementedError

    def _basis_from_spectrum(self, decomposition, ranks: dict[int, int], generator: torch.Generator,
                             step: int) -> Basis | None:
        """A new basis from a `spectrum.Singular` (σ descending and a way to cut singular vectors) at the refresh of
        update `step`; from_spectrum only."""
        raise NotImplementedError(f"projector {self.name!r} does not build its basis from a spectrum")

    def _ranks(self, shape: tuple[int, ...]) -> dict[int, int]:
        """Rank per projected mode. Matrices: rank clamped to min(m, n), with a warning."""
        smallest = min(shape)
        if self.rank >= smallest:
            warnings.warn(
                f"{self.name} projector: rank {self.rank} >= min(m, n) = {smallest} for a gradient of shape "
                f"{tuple(shape)}; using rank {smallest}: a projection this wide saves no memory",
                stacklevel=3,
            )
        return {mode: min(self.rank, smallest) for mode in projected_modes(shape, self.proj_type)}

    # ----------------------------------------------------------------- schedule
    @property
    def ready(self) -> bool:
        """True once a basis exists (the first refresh may be deferred by a bad gradient)."""
        return self.refresh_count > 0

    def due(self, step: int) -> bool:
        return not self.ready or step >= self.next_refresh

    def age(self, step: int) -> int:
        """Updates since the latest refresh, counted as `due` counts them: 0 on the refresh's own update."""
        return step - self.refreshed_at

    def maybe_refresh(self, grad: torch.Tensor, step: int) -> bool:
        return self.refresh(grad, step) if self.due(step) else False

    def refresh(self, grad: torch.Tensor, step: int) -> bool:
        """Make a new basis from `grad`. Returns True if the basis changed (then `moved`, and `transition` is set
        unless keeps_transition is off).

        A non-finite or all-zero gradient keeps the previous basis (or defers the first one) and is
        retried at the next call: a basis built from it would put NaN or noise into every later step.
        A projector that `checks_after` decomposes first and rejects such a basis afterwards, reading the
        check together with the basis's figures: one host synchronisation per refresh instead of two or three.
        """
        self._check_shape(grad)
        usable = gradient_usable(grad)
        if not self.checks_after and not bool(usable):
            self.stats["skipped_refreshes"] += 1
            return False
        ranks = self._rank_per_mode or self._ranks(tuple(grad.shape))
        generator = refresh_generator(self.seed, self.index, self.refresh_count)
        prepared, self._prepared = self._prepared, None
        if self.from_spectrum:  # singular values and vectors, decomposed here or with other weights (prepare)
            decomposition = (prepared[0] if prepared is not None and prepared[1] == step
                             else decompose(grad.detach().to(compute_dtype(grad)), tuple(ranks), self.solver_on(grad.device)))
            basis = None
            if decomposition is not None:
                basis = self._basis_from_spectrum(decomposition._replace(usable=usable if self.checks_after else None),
                                                  ranks, generator, step)
        else:
            basis = self._new_basis(grad.detach().to(compute_dtype(grad)), ranks, generator)
        if basis is None:
            self.stats["skipped_refreshes"] += 1
            return False
        return self.install(basis, tuple(grad.shape), ranks, step, usable if self.checks_after else None)

    def prepare(self, decomposition: Singular, step: int) -> None:
        """The decomposition of the gradient that the refresh of update `step` is to be made from, computed together
        with other weights' (optimizers/batched_refresh.py): that refresh then skips its own decomposition."""
        if not self.from_spectrum:
            raise TypeError(f"projector {self.name!r} does not build its basis from a spectrum")
        self._prepared = (decomposition, step)

    def install(self, basis: Basis, shape: tuple[int, ...], ranks: dict[int, int], step: int,
                usable: torch.Tensor | None = None) -> bool:
        """Make `basis` (built for a gradient of `shape`) the current one: transition, ρ, τ, schedule, stats. `usable`
        (a 0-d bool tensor, read with the figures): False leaves everything as it was and counts a skipped refresh.
        Returns whether the basis was installed."""
        old = self.factors
        factors = basis.factors
        if self.align_signs:
            factors = {k: aligned_signs(f, old.get(k)) for k, f in factors.items()}
        # singular vectors (signed projectors' bases) are orthonormal: no QR needed to compare their spans
        overlaps = [principal_overlap(old[k], factors[k], orthonormal=self.signed) for k in factors] if old else []
        figures = _read_together(usable, overlaps, basis.stats)  # the refresh's one read from the device
        if usable is not None and not figures.pop("usable"):
            self.stats["skipped_refreshes"] += 1
            return False
        if self.shape is None:
            self.shape, self._rank_per_mode = shape, ranks
        basis.factors = factors
        self._transition, self._selection, self._moved_untracked = None, None, False
        self._compute = next(iter(factors.values())).dtype
        if old:
            if self.keeps_transition:
                self._transition = _transition(factors, old, self._compute)
            else:
                self._moved_untracked = True
            self.stats["rho"] = figures.pop("rho")
            if self.adaptive_interval:
                self.tau = next_interval(self.stats["rho"], self.tau, self.tau_min, self.tau_max)
        if self.pool_bf16 and basis.pool is not None:
            basis = stored_in_bf16(basis)
        self.factors, self.inv_p = basis.factors, basis.inv_p
        self.pool, self.draws = basis.pool, 0
        self.refresh_count += 1
        self.next_refresh, self.refreshed_at = step + self.tau, step
        self.next_resample = step + self.resample_every
        self.stats.update(figures, refreshes=self.refresh_count, tau=self.tau)
        return True

    # ----------------------------------------------------------------- refreshes without the whole gradient
    # A weight split by rows over processes (FSDP2, optimizers/sharded.py) never has G in one place. What the ranks can
    # agree on without moving G is its Gram Gᵀ G = Σ_k G_kᵀ G_k (one all-reduce), or, for a basis drawn from the seed
    # alone, only G's shape. Every rank then builds the same basis (the generator is a pure function of seed, index and
    # refresh count), so nothing else is communicated.
    def ranks_for(self, shape: tuple[int, ...]) -> dict[int, int]:
        """Rank per projected mode for a gradient of `shape` (fixed by the first refresh)."""
        return self._rank_per_mode or self._ranks(tuple(shape))

    def refresh_from_gram(self, gram: torch.Tensor, shape: tuple[int, ...], step: int, dtype: torch.dtype) -> bool:
        """A new right-side basis for a gradient of `shape` from its Gram Gᵀ G (n × n) alone; bases in `dtype`.

        The eigh of spectrum.eigh_gram with its noise floor (λ below the Gram's rounding error count as σ = 0). True if
        installed; False (the basis kept) when the Gram is not finite, is zero, or its eigh fails."""
        if not self.from_spectrum:
            raise TypeError(f"projector {self.name!r} does not build its basis from a spectrum; it cannot refresh from "
                            "a Gram matrix")
        ranks = self.ranks_for(shape)
        if tuple(ranks) != (1,) or gram.shape != (shape[1], shape[1]):
            raise ValueError(f"a Gram Gᵀ G of shape {tuple(gram.shape)} gives right-side (mode 1) bases of a gradient of "
                             f"shape {tuple(shape)}; this projector projects modes {tuple(ranks)}: use proj_type='right'")
        # not read here: it travels with the refresh's figures (or PLUMAGE's σ), as in refresh
        usable = torch.isfinite(gram).all() & (gram.diagonal().sum() > 0)
        decomposition = eigh_gram(gram, dtype, noise_floor=True)  # None if eigh fails (a NaN Gram may make it fail)
        basis = None
        if decomposition is not None:
            generator = refresh_generator(self.seed, self.index, self.refresh_count)
            spectrum = Singular(decomposition.sigma,
                                lambda mode, columns: _row_major(decomposition.factor(mode, columns)), usable)
            basis = self._basis_from_spectrum(spectrum, ranks, generator, step)
        return self._install_or_skip(basis, shape, ranks, step, usable)

    def refresh_seeded(self, shape: tuple[int, ...], step: int, dtype: torch.dtype, device: torch.device) -> bool:
        """A new basis that reads nothing of the gradient but its shape (a projector that stores no factors: drawn from
        the seed). The caller has checked that G is finite and non-zero."""
        if self.stores_factors:
            raise TypeError(f"projector {self.name!r} builds its basis from the gradient; it cannot refresh from the "
                            "shape alone")
        ranks = self.ranks_for(shape)
        shaped = torch.zeros((), dtype=dtype, device=device).expand(shape)  # the shape, dtype and device, no memory
        basis = self._new_basis(shaped, ranks, refresh_generator(self.seed, self.index, self.refresh_count))
        return self._install_or_skip(basis, shape, ranks, step)

    def install_placeholder(self, shape: tuple[int, ...], like: torch.Tensor) -> None:
        """Install a basis with the real layout (factor shapes, 1/p, pool) for a gradient of `shape` and `like`'s dtype
        and device, with meaningless values: a state template that a checkpoint is then loaded into
        (torch.distributed.checkpoint loads into existing tensors)."""
        dtype, device = compute_dtype(like), like.device
        if not self.from_spectrum:
            self.refresh_seeded(shape, 0, dtype, device)
            return
        ranks = self.ranks_for(shape)
        (mode,) = ranks  # one-sided, as every sharded weight is
        n = shape[mode]
        vectors = torch.eye(n, dtype=dtype, device=device)  # no decomposition: a large one would take minutes
        sigma = torch.linspace(1.0, 0.5, n, dtype=dtype, device=device)
        spectrum = Singular(sigma, lambda mode, columns: _row_major(vectors[:, columns]))
        basis = self._basis_from_spectrum(spectrum, ranks, refresh_generator(self.seed, self.index, 0), 0)
        self._install_or_skip(basis, shape, ranks, 0)

    def _install_or_skip(self, basis: Basis | None, shape: tuple[int, ...], ranks: dict[int, int], step: int,
                         usable: torch.Tensor | None = None) -> bool:
        if basis is None:
            self.stats["skipped_refreshes"] += 1
            return False
        return self.install(basis, tuple(shape), ranks, step, usable)

    def resample_due(self, step: int) -> bool:
        """True when the sampled rows are to be drawn again before update `step` (never on a refresh's own step, and
        never when every direction of the pool is kept: a draw would repeat the basis)."""
        return (self.pool is not None and self.resample_every > 0 and self.next_resample <= step < self.next_refresh
                and self.pool.leaves_some_out)

    def resample(self, step: int) -> None:
        """Draw the basis again from the last refresh's pool (sets `transition`, as a refresh does)."""
        ((mode, rank),) = self._rank_per_mode.items()
        self._drawn(step, *self._draw(self.pool, self.next_draw_generator(), mode, rank))

    def next_draw_generator(self) -> torch.Generator:
        """Counts a draw; the generator it is made with (a pure function of seed, index, refresh and draw)."""
        self.draws += 1
        return refresh_generator(self.seed, self.index, self.refresh_count - 1, self.draws)

    def _drawn(self, step: int, factors: dict[int, torch.Tensor], inv_p: torch.Tensor, entering: torch.Tensor) -> None:
        """Install a draw's basis, 1/p and changed columns (the bookkeeping after _draw)."""
        ((mode, _),) = self._rank_per_mode.items()
        self.factors, self.inv_p = factors, inv_p
        # Both draws are columns of one orthonormal pool and a vector drawn again keeps its column, so
        # B = F_newᵀ F_old is the identity but for a zero row (and column) at each column whose vector changed: kept as
        # those indices, exact, and applied by transport as a fill instead of two r × r × n products per step
        entering = entering.to(self.factors[mode].device, non_blocking=True)  # no host sync in a steady step
        self._transition, self._selection, self._moved_untracked = None, (mode, entering), False
        self.next_resample = step + self.resample_every
        self.stats["resamples"] = self.stats.get("resamples", 0) + 1

    def _draw(self, pool: Pool, generator: torch.Generator, mode: int,
              rank: int) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor]:
        """Draw `rank` vectors from `pool` (rearranging it in place): the basis, its 1/p, the columns that changed."""
        raise NotImplementedError(f"projector {self.name!r} does not resample")

    # ----------------------------------------------------------------- the maps
    def project(self, grad: torch.Tensor) -> torch.Tensor:
        """R = G ×_k F_kᵀ, in float32 (float64 for float64 gradients)."""
        self._require_ready("project")
        self._follow_device(grad.device)
        x = grad if grad.dtype == self._dtype else grad.to(self._dtype)  # the test is cheaper than a no-op .to
        for mode, factor in self.factors.items():
            if factor.dtype != x.dtype:  # the pool stored in bfloat16
                factor = factor.to(x.dtype)
            x = onto_basis(x, factor, mode)
        return x

    def project_back(self, low: torch.Tensor) -> torch.Tensor:
        """scale · (D⁻¹ Z) ×_k F_k: a full-size update from a low-rank one."""
        self._require_ready("project_back")
        self._follow_device(low.device)
        x = self.rescaled(low)
        for mode, factor in self.factors.items():
            x = mode_product(x, factor.to(x.dtype), mode)
        return x * self.scale if self.scale != 1.0 else x

    @property
    def one_sided_mode(self) -> int | None:
        """The mode a one-sided basis projects, i.e. the axis of a low-rank gradient that indexes its vectors (the
        backends' `rows`); None for a basis on every mode (Tucker)."""
        return next(iter(self.factors)) if len(self.factors) == 1 else None

    def rescaled(self, low: torch.Tensor) -> torch.Tensor:
        """D⁻¹Z: PLUMAGE's 1/p on the basis's rows of a low-rank tensor (itself for a basis without 1/p)."""
        if self.inv_p is None:
            return low
        (mode,) = self.factors
        return low * along(self.inv_p, mode, low.dim())

    def add_back(self, target: torch.Tensor, low: torch.Tensor, alpha: float, outside: Outside | None = None) -> None:
        """target ← target + alpha · project_back(low), in place; with `outside`, also + β · w ⊙ (G − F R).

        For a one-sided projection of a weight held in the compute dtype this is one addmm: the full-size update is
        never written out, scaled and then added (three passes over a weight-sized tensor; without them a steady step
        takes 0.92–0.98× the time on a CPU, benchmarks/fused_update.py). Other cases (Tucker, both sides, a bfloat16
        weight) compute project_back and add it."""
        self._require_ready("add_back")
        self._follow_device(low.device)
        one_sided = len(self.factors) == 1 and target.dim() == 2
        if outside is not None and not one_sided:
            raise ValueError(f"the gradient outside the basis needs a one-sided projection of a matrix; this projector "
                             f"has factors on modes {sorted(self.factors)} of a {target.dim()}-D weight")
        if not one_sided or (outside is None and target.dtype != low.dtype):
            target.add_(self.project_back(low), alpha=alpha)
            return
        low = self.rescaled(low)
        alpha *= self.scale
        if outside is not None:  # F's two terms share one product, F (α·scale·D⁻¹Z − β·w ⊙ R): G − F R is never written
            beta_weights = outside.alpha * outside.weights  # (β w) ⊙ ·, formed as the weights stepped together form it
            low, alpha = alpha * low - beta_weights * outside.low_grad, 1.0
            self._add_weighted_grad(target, outside.grad, beta_weights)
        self._add_product(target, low, alpha)

    def one_sided_operands(self, grad: torch.Tensor) -> tuple[int, torch.Tensor, torch.dtype]:
        """What project() and add_back_mixed() multiply a matrix `grad` and its low-rank part by, for a caller that
        does both inside one compiled function (multi_tensor.projected_and_mixed): the basis's mode, its factor as
        stored (on `grad`'s device; in bfloat16 where the pool is) and the dtype projections are computed in. Called for
        every weight of a launch-bound step, so the checks that pass cost one test each."""
        if not self.ready or len(self.factors) != 1 or grad.dim() != 2:
            self._require_ready("one_sided_operands")
            self._require_one_sided("one_sided_operands", grad)
        ((mode, factor),) = self.factors.items()
        if factor.device != grad.device:
            self._follow_device(grad.device)
            ((mode, factor),) = self.factors.items()
        return mode, factor, self._dtype

    def add_back_mixed(self, target: torch.Tensor, mixed: torch.Tensor) -> None:
        """target ← target + F mixed, where the caller formed the low-rank part, mixed = α·scale·D⁻¹Z − β·w ⊙ R, and
        added β·w ⊙ G (multi_tensor.py: on the columns of many weights at once): add_back with an Outside, in two
        parts. One-sided projections of matrices only."""
        self._require_ready("add_back_mixed")  # not _follow_device: `mixed` came from this step's project()
        self._require_one_sided("add_back_mixed", target)
        self._add_product(target, mixed, 1.0)

    def _require_one_sided(self, what: str, matrix: torch.Tensor) -> None:
        """Refuse (naming `what`) a basis that is not one-sided, or a `matrix` that is not a matrix."""
        if len(self.factors) != 1 or matrix.dim() != 2:
            raise ValueError(f"{what} needs a one-sided projection of a matrix; this projector has factors on modes "
                             f"{sorted(self.factors)} of a {matrix.dim()}-D weight")

    @staticmethod
    def _add_weighted_grad(target: torch.Tensor, grad: torch.Tensor, beta_weights: torch.Tensor) -> None:
        """target ← target + (β w) ⊙ G, before F's product, as the weights stepped together add it (multi_tensor.
        mixed_together: a bfloat16 weight rounds its two sums in the same order either way, β w rounded to G's dtype
        as there)."""
        target.addcmul_(grad, beta_weights.to(grad.dtype))

    def _add_product(self, target: torch.Tensor, low: torch.Tensor, alpha: float) -> None:
        """target ← target + alpha · F low, F one-sided (add_product)."""
        ((mode, factor),) = self.factors.items()
        add_product(target, factor, low, mode, alpha)

    @property
    def moved(self) -> bool:
        """True when the latest refresh or draw changed the basis (the moments then travel by `transport`)."""
        return self._transition is not None or self._selection is not None or self._moved_untracked

    @property
    def transition(self) -> dict[int, torch.Tensor] | None:
        """B_k = F_newᵀ F_old per projected mode for the latest basis change (None: no change since the last load).
        After a draw from the pool it is built here from the changed rows, only for a reader that needs it dense
        (Adafactor's factored transport, row bias weights, diagnostics): `transport` applies those rows as a fill.
        Raises after a refresh made with keeps_transition off, which computed no B."""
        if self._moved_untracked:
            raise RuntimeError("the latest refresh kept no transition B (keeps_transition was False, as an optimizer "
                               "with realign='none' sets it): set keeps_transition = True before a refresh whose B you "
                               "read (realign 'm', 'mv' or 'mv_meansplit' do)")
        if self._transition is None and self._selection is not None:
            mode, entering = self._selection
            b = torch.eye(self._rank_per_mode[mode], dtype=self._dtype, device=entering.device)
            b[entering, entering] = 0.0
            self._transition = {mode: b}
        return self._transition

    @transition.setter
    def transition(self, value: dict[int, torch.Tensor] | None) -> None:
        self._transition, self._selection, self._moved_untracked = value, None, False

    def transport_vector(self, vector: torch.Tensor, mode: int, squared: bool = False) -> torch.Tensor:
        """A vector indexed by mode `mode`'s basis columns carried through the latest transition: B_k v (or (B_k∘B_k) v);
        after a draw from the pool, the entering entries zeroed without building B."""
        if self._selection is not None and self._selection[0] == mode:
            return vector.index_fill(0, self._selection[1], 0)
        b = self.transition[mode]
        return ((b * b) if squared else b).to(vector.dtype) @ vector  # the vector keeps its dtype, whatever the basis's

    def transport(self, low: torch.Tensor, squared: bool = False) -> torch.Tensor:
        """Carry a low-rank tensor through the latest transition: Z ×_k B_k (or B_k∘B_k if squared)."""
        if not self.moved:
            return low
        if self._selection is not None:  # a draw from the pool: B is the identity with the entering rows zeroed (B∘B = B)
            mode, entering = self._selection
            return low.index_fill(mode, entering, 0)
        x = low
        for mode, b in self.transition.items():
            b = b.to(x.dtype)  # states keep their own dtype (8-bit and Adafactor states are float32 for float64 weights)
            x = mode_product(x, b * b if squared else b, mode)
        return x

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Plain tensors, numbers and lists: loads with torch.load(weights_only=True)."""
        state = {
            "name": self.name,
            "rank": self.rank,
            "proj_type": self.proj_type,
            "scale": self.scale,
            "seed": self.seed,
            "index": self.index,
            "tau": self.tau,
            "refresh_count": self.refresh_count,
            "next_refresh": self.next_refresh,
            "refreshed_at": self.refreshed_at,
            "shape": list(self.shape) if self.shape is not None else None,
            "rank_per_mode": dict(self._rank_per_mode),
            "stats": dict(self.stats),
            "dtype": str(self._dtype).removeprefix("torch."),
        }
        if self.stores_factors:
            state["factors"] = dict(self.factors)
        if self.inv_p is not None:
            state["inv_p"] = self.inv_p
        if self.pool is not None:
            state["pool"] = {"vectors": self.pool.vectors, "p": self.pool.p, "order": self.pool.order,
                             "draws": self.draws, "next_resample": self.next_resample}
        return state

    def load_state_dict(self, state: dict, device: torch.device | str = "cpu") -> None:
        """Load `state_dict()`'s output; a basis regenerated from the seed (FLORA's) is drawn on `device`, where it is
        used (a basis stored in the state stays where the state's tensors are)."""
        if state.get("name") != self.name:
            raise ValueError(f"state was saved by projector {state.get('name')!r}, not {self.name!r}")
        self.rank, self.proj_type, self.scale = state["rank"], state["proj_type"], state["scale"]
        self.seed, self.index, self.tau = state["seed"], state["index"], state["tau"]
        self.refresh_count, self.next_refresh = state["refresh_count"], state["next_refresh"]
        # a checkpoint written before the key existed: one interval before the next refresh (exact but for a staggered
        # first interval or an adaptive τ that changed since)
        self.refreshed_at = state.get("refreshed_at", self.next_refresh - self.tau)
        self.shape = tuple(state["shape"]) if state["shape"] is not None else None
        self._rank_per_mode = {int(k): int(v) for k, v in state["rank_per_mode"].items()}
        self.stats = dict(state["stats"])
        if self.stores_factors:
            self.factors = {int(k): v for k, v in state["factors"].items()}
        else:
            self.factors = self._regenerate(getattr(torch, state["dtype"]), torch.device(device))
        self.inv_p = state.get("inv_p")
        pool = state.get("pool")
        # the draws are made on the host (p and order on the CPU, as a refresh makes them), whichever device the
        # optimizer moved the state's tensors to (its load_state_dict puts every one on the weight's)
        self.pool = (Pool(pool["vectors"], pool["p"].cpu(), _on_cpu(pool.get("order"))) if pool is not None else None)
        if self.pool is not None:
            self._share_pool_storage()
        self.draws, self.next_resample = (pool["draws"], pool["next_resample"]) if pool is not None else (0, 0)
        self._transition, self._selection, self._moved_untracked = None, None, False
        self._compute = getattr(torch, state["dtype"]) if self.factors else None

    def _regenerate(self, dtype: torch.dtype, device: torch.device) -> dict[int, torch.Tensor]:
        raise NotImplementedError(f"projector {self.name!r} stores its factors")

    # ----------------------------------------------------------------- helpers
    @property
    def _dtype(self) -> torch.dtype:
        """The dtype projections are computed in (set by every install and load; float32 before any basis)."""
        return self._compute if self._compute is not None else torch.float32

    def _require_ready(self, what: str) -> None:
        if not self.ready:
            raise RuntimeError(f"{self.name} projector: {what}() before any basis exists; call refresh(grad, step) first")

    def _follow_device(self, device: torch.device) -> None:
        if self.factors and next(iter(self.factors.values())).device != device:
            self.inv_p = self.inv_p.to(device) if self.inv_p is not None else None
            if self.pool is not None:
                self.pool = Pool(self.pool.vectors.to(device), self.pool.p, self.pool.order)
                ((mode, factor),) = self.factors.items()
                self.factors = {mode: self.pool.vectors[:, : factor.shape[1]]}  # still a view of the pool
            else:
                self.factors = {k: f.to(device) for k, f in self.factors.items()}

    def _share_pool_storage(self) -> None:
        """Make the basis a view of the pool's first columns (after a load: an older checkpoint kept the basis as a
        copy and the pool in descending-σ order; its columns are found in the pool, exactly)."""
        ((mode, factor),) = self.factors.items()
        pool = self.pool.vectors
        if factor.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr():
            return
        chosen = (pool.T @ factor.to(pool)).abs().argmax(dim=0).cpu()
        self.pool, view = self.pool.arranged(self.pool.order[chosen])
        self.factors = {mode: view}

    def _check_shape(self, grad: torch.Tensor) -> None:
        if grad.dim() < 2 or (grad.dim() > 2 and not self.tensors):
            hint = "use the 'tucker' projector" if grad.dim() > 2 else "keep 1-D parameters (biases, norms) in a regular group"
            raise ValueError(
                f"projector {self.name!r} needs a {'2-D' if not self.tensors else '>= 2-D'} gradient, "
                f"got shape {tuple(grad.shape)}: {hint}"
            )
        if self.shape is not None and tuple(grad.shape) != self.shape:
            raise ValueError(f"{self.name} projector was built for shape {self.shape}, got {tuple(grad.shape)}")


def _transition(new: dict[int, torch.Tensor], old: dict[int, torch.Tensor],
                dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """B_k = F_newᵀ F_old per mode, in the compute `dtype`: what moves low-rank moments from the old basis to the new
    one."""
    return {k: new[k].T.to(dtype) @ old[k].to(device=new[k].device, dtype=dtype) for k in new}


def _row_major(matrix: torch.Tensor) -> torch.Tensor:
    """A copy in row-major layout: the layout a checkpoint loads back into, so a resumed run multiplies with the very
    same memory layout (another layout rounds matmuls differently)."""
    return matrix.clone(memory_format=torch.contiguous_format)


def gradient_usable(grad: torch.Tensor) -> torch.Tensor:
    """Whether every entry of `grad` is finite and one is not zero, as a 0-d bool tensor on its device (not read
    back): one pass (aminmax carries a NaN or an infinity into its min or max), instead of the three of
    isfinite().all() and any()."""
    if grad.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=grad.device)
    low, high = torch.aminmax(grad)
    extremes = torch.stack([low, high])
    return torch.isfinite(extremes).all() & extremes.ne(0).any()


def _read_together(usable: torch.Tensor | None, overlaps: list[torch.Tensor], stats: dict) -> dict:
    """The refresh's figures as Python numbers, read from the device in one transfer: `usable` (as "usable"), the
    basis's stats that are 0-d tensors (the others pass through), and ρ (as "rho", where there are `overlaps`): the
    mean over projected modes of each overlap matrix's principal cosines, taken on the host from the matrices read."""
    pending = {"usable": usable} if usable is not None else {}
    pending.update((key, value) for key, value in stats.items() if isinstance(value, torch.Tensor))
    figures = {key: value for key, value in stats.items() if not isinstance(value, torch.Tensor)}
    parts = [*pending.values(), *overlaps]
    if parts:
        device = parts[0].device
        read = torch.cat([part.to(device=device, dtype=torch.float64).flatten() for part in parts]).cpu()  # the wait
        scalars, *matrices = read.split([len(pending), *(overlap.numel() for overlap in overlaps)])
        names = list(pending)
        if overlaps:  # ρ on the host: an SVD on a GPU would wait for its error check
            cosines = [cosine_mean(m.view(o.shape)) for m, o in zip(matrices, overlaps, strict=True)]
            scalars, names = torch.cat([scalars, torch.stack(cosines).mean().reshape(1)]), [*names, "rho"]
        figures.update(zip(names, scalars.tolist(), strict=True))
    if "usable" in figures:
        figures["usable"] = bool(figures["usable"])
    return figures


def _on_cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.cpu() if tensor is not None else None


def compute_dtype(grad: torch.Tensor) -> torch.dtype:
    """The dtype projections of `grad` are computed in: float64 for a float64 gradient, float32 otherwise."""
    return torch.float64 if grad.dtype == torch.float64 else torch.float32
