"""The low-rank options beyond galore-torch's keys, each declared once: key, defaults, check, help, where it applies.

Everything that handles one of these options reads this table: the optimizers' group defaults (LOW_RANK_DEFAULTS,
PLUMAGE_DEFAULTS) and their validation, the projector's arguments (projector_options), build_optimizer's check that
an option given applies to the optimizer named, and the flags of torchrun_main.py and run_glue.py with their --help
(training/config.add_option_flags). Adding an option means one entry here and the code that uses it.

galore-torch's own keys (rank, update_proj_gap, scale, proj_type) are not here: they keep GaLore's flag names
(--rank/--lora_r, --galore_scale) and each script's GaLore defaults.

`default` is every family's value and the behaviour of a checkpoint written before the key existed;
`plumage` is what plumage_* uses instead, where the pretraining protocol chose another (benchmarks/pretrain_protocol.py).
Those choices fix what Adam-style normalization before D⁻¹ does to the paper's step (docs/results.md §3); SGD momentum,
which does not normalize, kept the paper's estimator until session 46, when it trailed the draws with 13-26x GaLore's
seed spread (optimizers/sgdm.py), so every plumage_* backend takes `plumage` now.
`plumage_adam` is what plumage_adamw and plumage_adamw8bit use where it differs again: since session 17 their default
is GaLore's top-r basis with v_floor (base.PLUMAGE_ADAM_RECIPE), and the PLUMAGE-only keys keep `plumage` for a run
that names projector="plumage".
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..projectors.checks import (
    SOLVERS,
    check_bool,
    check_max_inv_p,
    check_pool_factor,
    check_resample_every,
    check_sample_until,
    check_solver,
)
from .moment_floor import V_FLOORS, check_horizon
from .residual import (
    LIMITERS,
    PLUMAGE_LIMITER,
    PLUMAGE_RESIDUAL,
    PLUMAGE_RESIDUAL_CAP,
    PLUMAGE_RESIDUAL_HORIZON,
    PLUMAGE_RESIDUAL_SCALE,
    RESIDUALS,
    why_no_complement,
)
from .sampled_step import SAMPLED_STEPS

SAME = object()  # Option.plumage: plumage_* uses `default`


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(key: str, choices: tuple[str, ...]) -> Callable[[Any], None]:
    def check(value):
        if value not in choices:
            raise ValueError(f"unknown {key} {value!r}; choose one of {', '.join(choices)}")
    return check


def _check_tau_max(value) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        raise ValueError(f"tau_max must be an integer >= update_proj_gap (or None for 4 x update_proj_gap), got {value!r}")


def _check_residual_scale(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"residual_scale must be a finite number > 0 (1: Fira's step size for the complement), "
                         f"got {value!r}")


def _check_residual_cap(value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ValueError(f"residual_cap must be a number > 0 (or None / inf for Fira's uncapped complement), got {value!r}")


def _check_residual_horizon(value) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        raise ValueError(f"residual_horizon must be an integer >= 1 (or None to move the complement at every update), "
                         f"got {value!r}")


def _check_refresh_batch(value) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"refresh_batch must be an integer >= 1 (1: each weight's refresh decomposes its own gradient), "
                         f"got {value!r}")


def parse_optional_int(text: str) -> int | None:
    """A flag's whole number, or None for 'none'."""
    if str(text).strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'none', got {text!r}") from None


def parse_optional(text: str) -> float | None:
    """A flag's number, or None for 'none'/'inf'."""
    value = parse_cap(text)
    return None if value == math.inf else value


def _check_refresh_ema(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"refresh_ema must be a number in [0, 1) (0: refresh from the step's own gradient), got {value!r}")


def parse_cap(text: str) -> float:
    """The flag's text: a number >= 1, or 'none'/'inf' for no cap (the paper's estimator)."""
    if str(text).strip().lower() in ("none", "inf"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'none', got {text!r}") from None


# plumage_adamw(8bit)'s default projector is svd since session 17: a PLUMAGE option names the projector that takes it
_NAME_PLUMAGE = "; name projector 'plumage' (--projector plumage) for PLUMAGE's draws, or drop it"


def _needs_rescaling(backend: str, projector_cls) -> str | None:
    if not projector_cls.rescales:
        return f"it caps PLUMAGE's 1/p rescaling, but projector {projector_cls.name!r} does not rescale{_NAME_PLUMAGE}"
    return None


def _needs_sampling(backend: str, projector_cls) -> str | None:
    if not projector_cls.rescales:
        return f"it draws PLUMAGE's sample again, but projector {projector_cls.name!r} does not sample{_NAME_PLUMAGE}"
    return None


def _needs_singular_vectors(backend: str, projector_cls) -> str | None:
    if not projector_cls.signed:
        return f"it fixes the signs of singular vectors, but projector {projector_cls.name!r} does not use any"
    return None


def _needs_spectrum(backend: str, projector_cls) -> str | None:
    if not projector_cls.from_spectrum:
        return f"it batches decompositions of the gradient, but projector {projector_cls.name!r} decomposes none"
    return None


def _needs_orthonormal_basis(backend: str, projector_cls) -> str | None:
    return why_no_complement(projector_cls)


def _check_optional_bool(key: str) -> Callable[[Any], None]:
    """The check of an option that is True, False or None (None: chosen by the optimizer where it runs)."""
    def check(value):
        if value is not None:
            check_bool(key)(value)
    return check


def _needs_adamw_or_adafactor(backend: str, projector_cls) -> str | None:
    return None if backend in ("adamw", "adafactor") else f"it needs the adamw or adafactor backend, not {backend!r}"


def _needs_compilable(backend: str, projector_cls) -> str | None:
    return None if backend != "sgdm" else "SGD momentum's update is two _foreach calls: nothing to compile"


def _needs_adam_moments(backend: str, projector_cls) -> str | None:
    return None if backend in ("adamw", "adamw8bit") else f"it needs Adam's moments (adamw, adamw8bit), not {backend!r}"


@dataclass(frozen=True)
class Option:
    key: str
    default: Any
    help: str
    check: Callable[[Any], None]  # raises ValueError naming the value
    bad_values: tuple  # values `check` refuses: the table's test iterates them
    plumage: Any = SAME  # plumage_*'s default where it differs, for backends that normalize (Adam, Adafactor)
    plumage_adam: Any = SAME  # plumage_adamw(8bit)'s default where it differs from `plumage`
    to_projector: bool = False  # a build_projector argument
    parse: Callable[[str], Any] | None = None  # the flag's argparse type (bools get --key / --no-key)
    choices: tuple | None = None
    applies: Callable[[str, type], str | None] | None = None  # (backend, projector class) -> why it does not apply

    def plumage_default(self) -> Any:
        return self.default if self.plumage is SAME else self.plumage

    def plumage_adam_default(self) -> Any:
        return self.plumage_default() if self.plumage_adam is SAME else self.plumage_adam

    def flag_help(self, defaults_of: dict[str, dict[str, Any]] | None = None) -> str:
        """The help with the table's default and, from `defaults_of` (a name -> its defaults, e.g. each plumage_*
        class's), every other default with the names that take it."""
        names_of: dict[str, list[str]] = {}
        for name, defaults in (defaults_of or {}).items():
            if (value := defaults.get(self.key, self.default)) != self.default:
                names_of.setdefault(repr(value), []).append(name)
        others = "".join(f", {value} for {', '.join(names)}" for value, names in names_of.items())
        return f"{self.help} (default {self.default!r}{others})"

    def argparse_options(self) -> dict:
        if isinstance(self.default, bool) or self.parse is bool:  # a bool, or True/False/None (None: by device)
            return {"action": argparse.BooleanOptionalAction}
        options = {"type": self.parse or str}
        if self.choices:
            options["choices"] = self.choices
        return options


OPTIONS: tuple[Option, ...] = (
    Option("adaptive_interval", False, "adapt each weight's refresh interval to how fast its subspace moves (the "
           "paper's S/MP/A)", check_bool("adaptive_interval"), ("yes", 1), to_projector=True),
    Option("tau_max", None, "longest adaptive interval (None: 4 x update_proj_gap)", _check_tau_max, (0, 2.5, "800"),
           to_projector=True, parse=int),
    Option("stagger", False, "spread the first refreshes over the interval so the SVDs do not all land on one step",
           check_bool("stagger"), ("no", 0)),
    Option("solver", "svd", "how svd/plumage refreshes find singular vectors: 'svd' (torch.linalg.svd, galore-torch's "
           "call), 'gram' (eigh of the smaller Gram matrix: 0.4x its time on a CPU, the top 2r to 1e-4, but the "
           "smallest σ lost in float32), 'gram64' (the same in float64: the most accurate) or 'auto' (each projector's "
           "fastest accurate one on the gradient's device: 'gram' for svd's top r and for plumage's pool of the top 2r; "
           "for the paper's p over the whole spectrum 'gram64' on a CPU, 'svd' elsewhere)",
           check_solver, ("qr", None), plumage_adam="auto", to_projector=True, choices=SOLVERS),
    Option("refresh_batch", 1, "svd/plumage: decompose the gradients of up to this many weights of one shape whose "
           "refresh falls on the same step in one batched torch.linalg call (weights held whole, refresh_ema 0): fewer, "
           "larger calls, for a GPU; the call holds a copy of those gradients; 1 = each weight on its own",
           _check_refresh_batch, (0, -2, 2.5, True, "4", None), parse=int, applies=_needs_spectrum),
    Option("foreach", None, "take the steady updates of a group's low-rank weights together: their moments advanced "
           "(adamw, adafactor, sgdm; 8-bit each weight's own) and weights decayed in a few torch._foreach calls for all of "
           "them instead of a dozen kernels each, as torch.optim's multi-tensor Adam, and the complement's weights "
           "computed for all at once "
           "(the same numbers, to float32 rounding where the complement moves; not in per-layer mode, on FSDP2 shards, "
           "or for an update that refreshes, draws with sampled_step 'norm_matched' or first moves the complement, "
           "which step one by one). None: as torch.optim, "
           "on where the weights are on a GPU (0.69-0.73x galore-torch's steady step on an H200 against 1.04-1.10x "
           "one by one, docs/step_time_cuda.md), off on a CPU (3-6 % slower there, "
           "docs/step_time.md)", _check_optional_bool("foreach"), ("yes", 1), parse=bool),
    Option("compile_update", False, "adamw: fuse each weight's moment update (v_floor, M, V and Adam's direction) into "
           "one kernel with torch.compile instead of about ten; with foreach, the moments of the weights taken together "
           "and the complement's arithmetic on all their columns; adamw8bit and adafactor (with foreach=True): that "
           "arithmetic, and Adafactor's factored step (needs a C++ compiler on a CPU, Triton on a GPU; the first "
           "updates pay the compilation, seconds; the same numbers to float rounding; not with row_bias_correction)",
           check_bool("compile_update"), ("yes", 1, None), applies=_needs_compilable),
    Option("max_inv_p", None, "plumage: cap each 1/p rescale at this (>= 1): biased, but no sampled direction steps "
           "more than this many times a kept one; None/inf (flag: 'none') = no cap, the paper's estimator", check_max_inv_p,
           (0.5, -1.0, math.nan, True, "3"), plumage=1.0, to_projector=True, parse=parse_cap, applies=_needs_rescaling),
    Option("sampled_step", "adaptive", "plumage: how sampled (p < 1) rows move: 'adaptive' (the paper: the backend's "
           "normalized step, then 1/p) or 'norm_matched' (their own gradient at the kept rows' step size)",
           _check_choice("sampled_step", SAMPLED_STEPS), ("fira", None, 1), choices=SAMPLED_STEPS),
    Option("resample_every", 0, "plumage: draw the sampled rows again every this many updates from the refresh's "
           "top pool_factor·rank singular vectors, moving the moments along (the paper's κ); 0 = only at a refresh",
           check_resample_every, (-1, 1.5, True, "2", None), plumage=1, to_projector=True, parse=int,
           applies=_needs_sampling),
    Option("sample_until", None, "plumage: sample the basis at refreshes before this update only; from it on each "
           "refresh keeps the top rank singular vectors (GaLore's basis, 1/p = 1; biased) and no draw changes it. None "
           "= sample throughout (the paper); torchrun_main.py's plumage_adafactor with --projector plumage draws until "
           "update 1000 in a run of 5000 updates or more (optimizers.PRETRAIN_SAMPLE_UNTIL)", check_sample_until,
           (0, -5, 2.5, True, "1000"), to_projector=True, parse=parse_optional_int, applies=_needs_sampling),
    Option("pool_factor", 2, "plumage with resample_every > 0: the pool a refresh keeps for the draws holds the top "
           "pool_factor x rank singular vectors (dim x pool_factor*rank floats per weight)", check_pool_factor,
           (1, 2.5, True, "3", None), to_projector=True, parse=int, applies=_needs_sampling),
    Option("pool_bf16", False, "plumage with resample_every > 0: store the pool (and the basis, a view of it) in bfloat16, "
           "so it takes the memory of GaLore's float32 basis at pool_factor 2; projections still run in float32",
           check_bool("pool_bf16"), ("yes", 1, None), plumage=True, to_projector=True, applies=_needs_sampling),
    Option("align_signs", False, "svd/plumage/tucker: give each new singular vector the sign that agrees with the "
           "previous basis, so moments kept across a refresh (GaLore's) keep their direction and the run is the same "
           "on every device and LAPACK; off = galore-torch's bases exactly", check_bool("align_signs"),
           ("yes", 1, None), to_projector=True, applies=_needs_singular_vectors),
    Option("residual", "none", "how the gradient outside the basis moves the weight: 'none' (GaLore, the paper: "
           "dropped) or 'norm_matched' (Fira, arXiv 2410.01623: G − P R moves at the step size Adam gives each column "
           "inside the basis, with Fira's norm-growth limiter; `scale` does not multiply it; needs the full gradient "
           "at every step). torchrun_main.py pretrains plumage_adamw(8bit) with Fira's (norm_matched, limiter fira, "
           "scale 1, no cap, every update) from 4096 tokens an update where no residual flag is given "
           "(PRETRAIN_COMPLEMENT), and plumage_adamw from 2048 in a run of 1000 updates or more "
           "(PRETRAIN_LONG_RUN_LARGE_BATCH)",
           _check_choice("residual", RESIDUALS), ("fira", None, 1), plumage=PLUMAGE_RESIDUAL,
           plumage_adam="none", choices=RESIDUALS, applies=_needs_orthonormal_basis),
    Option("residual_limiter", "fira", "with residual='norm_matched': where the norm-growth limiter takes its reference: "
           "'fira' (every step) or 'steady' (not on a refresh step, whose basis was fitted to that gradient and leaves "
           "the complement near zero, which as the reference holds it near zero for hundreds of steps)",
           _check_choice("residual_limiter", LIMITERS), ("off", None, 1), plumage=PLUMAGE_LIMITER, choices=LIMITERS),
    Option("residual_scale", 1.0, "with residual='norm_matched': multiply the complement's step by this (1: Fira's, the "
           "step size Adam gives each column inside the basis; `scale` for the basis's own relative size)",
           _check_residual_scale, (0, -1.0, math.inf, math.nan, True, "1"), plumage=PLUMAGE_RESIDUAL_SCALE, parse=float),
    Option("residual_cap", None, "with residual='norm_matched': no column of the complement's step longer than this "
           "many times the same column of the backend's low-rank step Z (before scale and residual_scale): Fira's φ "
           "moves a column by ‖G⊥‖/‖R‖ times Z, which grows without bound as the basis goes stale; None/inf (flag: "
           "'none') = Fira's, no cap", _check_residual_cap, (0, -1.0, math.nan, True, "1"), plumage=PLUMAGE_RESIDUAL_CAP,
           parse=parse_optional),
    Option("residual_horizon", None, "with residual='norm_matched': move the complement only on the first this many "
           "updates after each refresh (the refresh's own update is the first): the gradient outside a basis fitted "
           "long ago is mostly what the basis missed, moved without momentum; None (flag: 'none') = at every update. "
           "The other updates need no full gradient (per-layer mode keeps only the projected one)",
           _check_residual_horizon, (0, -3, 2.5, True, "40"), plumage=PLUMAGE_RESIDUAL_HORIZON, parse=parse_optional_int),
    Option("refresh_ema", 0.0, "refresh the basis from an exponential average of the full gradients (this factor: "
           "E ← f E + (1 − f) G every step) instead of the refresh step's own gradient, so the basis follows the "
           "gradient's signal rather than one batch's noise; costs a full-size float32 buffer per weight and the full "
           "gradient at every step; 0 = galore-torch's refresh", _check_refresh_ema, (1, -0.1, 1.5, math.nan, True, "0.9"),
           parse=float),
    Option("row_bias_correction", False, "adamw, adafactor: bias-correct each basis row by its own age, so a direction "
           "entering at a refresh starts at Adam's step size (adafactor: its second-moment factor, so the update clip "
           "does not shrink the whole step after a draw)", check_bool("row_bias_correction"), ("yes", 1, None),
           applies=_needs_adamw_or_adafactor),
    Option("v_floor", "none", "adamw, adamw8bit: before each update of a low-rank weight raise the second moment to at least the "
           "square of the mean: 'm2' (V ← max(V, M²) on the raw moments: what PLUMAGE's mv_meansplit does to every row "
           "that stays at a draw; in effect a slow warm-up of the low-rank weights' step, by √(1 − β2^t)), "
           "'m2_corrected' (the same after bias correction: no normalized step above 1, no warm-up) or 'none' (Adam's). "
           "torchrun_main.py pretrains plumage_adamw(8bit) with 'none' from 4096 tokens an update where neither this "
           "flag nor --v_floor_horizon is given (PRETRAIN_NO_FLOOR_FROM_TOKENS), and plumage_adamw from 2048 in a run "
           "of 1000 updates or more (PRETRAIN_LONG_RUN_LARGE_BATCH)",
           _check_choice("v_floor", V_FLOORS), ("max", None, True), plumage_adam="m2", choices=V_FLOORS,
           applies=_needs_adam_moments),
    Option("v_floor_horizon", None, "with v_floor='m2': the warm-up it gives the low-rank step lasts about this many "
           "updates (the bound M² (1 − β2^k) / (1 − β_H^k), β_H = 1 − 1/H: the step on a coordinate whose gradient "
           "keeps its sign is lr · √(1 − β_H^t)); None (flag: 'none') = Adam's own 1 / (1 − β2), m2 as it is. "
           "torchrun_main.py pretrains plumage_adamw8bit at 200 from 2048 tokens an update where the flag is not given "
           "(PRETRAIN_V_FLOOR_HORIZON); plumage_adamw keeps m2's own there at twice the lr (PRETRAIN_LR)",
           lambda value: check_horizon(value, "m2"), (0, -5, 2.5, True, "1000"), parse=parse_optional_int,
           applies=_needs_adam_moments),
)
BY_KEY = {option.key: option for option in OPTIONS}


def option_defaults(family: str = "", adam: bool = False) -> dict[str, Any]:
    """Every option's default for one family ('' = every low-rank family but plumage_*); `adam`: plumage_* on Adam's
    moments (adamw, adamw8bit), whose recipe differs again."""
    if family != "plumage":
        return {o.key: o.default for o in OPTIONS}
    return {o.key: o.plumage_adam_default() if adam else o.plumage_default() for o in OPTIONS}


def projector_keys() -> tuple[str, ...]:
    return tuple(o.key for o in OPTIONS if o.to_projector)


def check_options(options: dict[str, Any], backend: str | None = None, projector_cls=None, where: str = "") -> None:
    """Refuse a bad value; with a backend and projector class, also an option given that they would not apply.

    Groups check values only: a family's default that does nothing for another projector (plumage_*'s sampled_step
    under projector='svd') is harmless. Options a user gives by name are checked for both (check_optimizer_options)."""
    for key, value in options.items():
        option = BY_KEY[key]
        try:
            option.check(value)
            reason = option.applies(backend, projector_cls) if option.applies and projector_cls else None
            if reason:
                raise ValueError(f"{key}={value!r} does not apply here: {reason}" + ("" if "drop it" in reason else "; drop it"))
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
