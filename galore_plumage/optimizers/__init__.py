"""Low-rank optimizers: build_optimizer for a model by name, and the package's public names.

The names and what each takes when nothing is given are in registry.py; what torchrun_main.py pretrains them with
in pretrain_defaults.py; which weights go low-rank in routing.py; the backends in adamw.py, adamw8bit.py,
adafactor.py and sgdm.py over base.py's LowRankOptimizer.
"""

from __future__ import annotations

import math

from torch import nn

from ..projectors import projector_spec
from .adafactor import PLUMAGE_ADAFACTOR_DRAWS, GaLoreAdafactor, PlumageAdafactor
from .adamw import GaLoreAdamW, PlumageAdamW
from .adamw8bit import GaLoreAdamW8bit, PlumageAdamW8bit
from .base import LOW_RANK_DEFAULTS, PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update
from .layerwise import LayerwiseOptimizer
from .options import BY_KEY, OPTIONS, check_options
from .presets import PLUMAGE_PAPER, PLUMAGE_SAMPLED, PRESET_FLAG_HELP, PRESETS, fitting_preset
from .pretrain_defaults import (
    FIRA_COMPLEMENT,
    PRETRAIN_BATCH_LR,
    PRETRAIN_BETA1,
    PRETRAIN_CLIPPED_LR,
    PRETRAIN_COMPLEMENT,
    PRETRAIN_GRAD_CLIPPING,
    PRETRAIN_LONG_RUN_LARGE_BATCH,
    PRETRAIN_LONG_RUN_LR,
    PRETRAIN_LR,
    PRETRAIN_NO_FLOOR_FROM_TOKENS,
    PRETRAIN_REGULAR_LR_RATIO,
    PRETRAIN_SAMPLE_UNTIL,
    PRETRAIN_V_FLOOR_HORIZON,
    pretrains_as_large_batch,
    recommended_beta1,
    recommended_grad_clipping,
    recommended_pretrain_lr,
    recommended_regular_lr_ratio,
    recommended_residual,
    recommended_sample_until,
    recommended_v_floor,
    recommended_v_floor_horizon,
)
from .realign import RULES
from .registry import (
    BACKENDS,
    DEFAULT_LR,
    PLUMAGE_CLASSES,
    REALIGN_FLAG_HELP,
    RECOMMENDED_LR,
    OptimizerSpec,
    family_defaults,
    family_scale,
    list_optimizers,
    optimizer_class,
    optimizer_spec,
    recommended_lr,
)
from .routing import Route, describe_routing, route_parameters
from .sampled_step import SAMPLED_STEPS
from .sgdm import GaLoreSGDM, PlumageSGDM


def _first_given(*values):
    """The first value that is not None (None if none is)."""
    return next((value for value in values if value is not None), None)


def check_optimizer_options(name: str, projector: str | None, options: dict, where: str = "--{key} {value}: ",
                            preset: str | None = None) -> None:
    """Refuse a preset that does not fit optimizer `name`, and an option of the table (optimizers/options.py) that is
    malformed or that `name` (with `projector`, or else the preset's, overriding its own) would not apply: a
    full-rank name, a projector or backend it does not fit.

    Command lines call it while checking their flags, so the error comes before any file is written; `where`
    prefixes each message (formatted with the option's key and value)."""
    spec = optimizer_spec(name)
    if preset is not None:
        projector = projector or fitting_preset(preset, spec.family, spec.backend, name).settings.get("projector")
    for key, value in options.items():
        if key not in BY_KEY:
            continue
        prefix = where.format(key=key, value=value)
        if spec.projector is None:
            raise ValueError(f"{prefix}{key}={value!r} applies to low-rank optimizers, but optimizer {name!r} is "
                             f"full-rank; pick plumage_{spec.backend} or drop {key}")
        check_options({key: value}, spec.backend, projector_spec(projector or spec.projector).cls, prefix)


def _refuse_without_regular_group(name: str, what: str, fix: str) -> None:
    """A full-rank optimizer `name` has no regular group of its own: every weight is in it and takes its lr."""
    if optimizer_spec(name).projector is None:
        raise ValueError(f"{what} sets the lr of the weights a low-rank optimizer does not project, but optimizer "
                         f"{name!r} projects none; {fix}")


def check_regular_lr(regular_lr: float | None, name: str, where: str = "--regular_lr {value}: ") -> None:
    """Refuse a regular-group lr that is not a positive finite number, or one given to a full-rank optimizer `name`
    (whose every weight is in the regular group, so its lr already is that lr). Command lines call it while checking
    their flags; `where` prefixes each message (formatted with the value), as in check_optimizer_options."""
    if regular_lr is None:
        return
    prefix = where.format(value=regular_lr)
    _refuse_without_regular_group(name, f"{prefix}regular_lr={regular_lr!r}", "give its lr as lr instead")
    if not (isinstance(regular_lr, (int, float)) and math.isfinite(regular_lr) and regular_lr > 0):
        raise ValueError(f"{prefix}regular_lr={regular_lr!r}: expected a positive finite number (the peak lr of the "
                         "embeddings, norms and head), or leave it out to use lr")


def check_regular_lr_ratio(ratio: float | None, name: str, flag: str = "--regular_lr_ratio") -> None:
    """Refuse `flag` (a regular group's lr over lr) where it is not a positive finite number, or where optimizer
    `name` is full-rank, as check_regular_lr refuses an absolute one."""
    if ratio is None:
        return
    _refuse_without_regular_group(name, f"{flag} {ratio:g}", "drop it")
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"{flag} must be a positive finite number (the regular group's lr over --lr; "
                         f"1 = one lr on every group), got {ratio:g}")


def build_optimizer(
    name: str,
    model: nn.Module,
    lr: float | None = None,
    rank: int = 128,
    target_modules=("attn", "mlp"),
    update_proj_gap: int = 200,
    scale: float | None = None,
    proj_type: str = "std",
    projector: str | None = None,
    realign: str | None = None,
    preset: str | None = None,
    accumulation_steps: int = 1,
    grad_clipping: float = 0.0,
    regular_lr: float | None = None,
    verbose: bool = False,
    **options,
) -> LowRankOptimizer | LayerwiseOptimizer:
    """An optimizer `name` (see list_optimizers) over `model`'s trainable parameters.

    The weights of nn.Linear modules whose name contains one of `target_modules` form the low-rank group;
    everything else (embeddings, norms, biases, the head) a regular one. `projector=` / `realign=`
    override the name's. `lr` and `scale` default to the name's recommended values (recommended_lr,
    family_scale); the options of optimizers/options.py to the family's (plumage_* has its own). A `preset`
    (optimizers/presets.py: 'paper', 'sampled') replaces those defaults of a plumage_* name; arguments given
    still win. For the Adafactor names an lr (given or recommended) turns the relative step off
    (relative_step=False, scale_parameter=False unless passed), so `lr=` works as it does for every other name.
    `regular_lr` gives the regular group its own peak lr (the schedule scales both alike); default: `lr`.
    The routing is kept on the optimizer as `.routing` and printed when verbose.
    """
    spec = optimizer_spec(name)
    if spec.projector is None and projector is not None:
        raise ValueError(f"optimizer {name!r} is full-rank; pick a low-rank name (e.g. plumage_{spec.backend}) "
                         f"to use projector={projector!r}")
    chosen = fitting_preset(preset, spec.family, spec.backend, name) if preset is not None else None
    settings = chosen.settings if chosen else {}
    projector = _first_given(projector, settings.get("projector"), spec.projector)
    realign = _first_given(realign, settings.get("realign"), spec.realign)
    scale = _first_given(scale, settings.get("scale"), family_scale(spec))
    lr = _first_given(lr, chosen.lr if chosen else None, RECOMMENDED_LR.get((spec.family, spec.backend)))
    check_optimizer_options(name, projector, options, where="")
    check_regular_lr(regular_lr, name, where="")
    routes = route_parameters(model, target_modules, projector)
    params = dict(model.named_parameters())
    regular = [params[r.name] for r in routes if not r.low_rank]
    low_rank = [params[r.name] for r in routes if r.low_rank]
    groups = [{"params": regular, **({} if regular_lr is None else {"lr": regular_lr})}] if regular else []
    if low_rank:
        defaults = {**family_defaults(spec), **{key: value for key, value in settings.items() if key in BY_KEY}}
        family = {key: value for key, value in defaults.items() if key not in options}
        groups.append({
            **family, "params": low_rank, "rank": rank, "update_proj_gap": update_proj_gap, "proj_type": proj_type,
            "scale": scale, "projector": projector, "realign": realign,
        })
    if lr is not None:  # else the class's own (Adafactor's relative step takes none)
        options["lr"] = lr
        if spec.backend == "adafactor":  # a given lr replaces Adafactor's relative step, as transformers' docs advise
            options.setdefault("relative_step", False)
            options.setdefault("scale_parameter", False)
    optimizer = optimizer_class(spec.backend)(groups, **options)
    optimizer.routing = routes
    if verbose:
        print(describe_routing(routes, rank))
    if spec.per_layer:
        LayerwiseOptimizer.refuse_clipping(grad_clipping)
        wrapped = LayerwiseOptimizer(optimizer, accumulation_steps)
        wrapped.routing = routes
        return wrapped
    return optimizer


__all__ = [
    "BACKENDS",
    "DEFAULT_LR",
    "FIRA_COMPLEMENT",
    "LOW_RANK_DEFAULTS",
    "PLUMAGE_ADAFACTOR_DRAWS",
    "PLUMAGE_CLASSES",
    "PLUMAGE_DEFAULTS",
    "PLUMAGE_PAPER",
    "PLUMAGE_SAMPLED",
    "PRESETS",
    "PRESET_FLAG_HELP",
    "PRETRAIN_REGULAR_LR_RATIO",
    "PRETRAIN_SAMPLE_UNTIL",
    "PRETRAIN_BATCH_LR",
    "PRETRAIN_BETA1",
    "PRETRAIN_CLIPPED_LR",
    "PRETRAIN_COMPLEMENT",
    "PRETRAIN_GRAD_CLIPPING",
    "PRETRAIN_LONG_RUN_LARGE_BATCH",
    "PRETRAIN_LONG_RUN_LR",
    "PRETRAIN_LR",
    "PRETRAIN_NO_FLOOR_FROM_TOKENS",
    "PRETRAIN_V_FLOOR_HORIZON",
    "RECOMMENDED_LR",
    "REALIGN_FLAG_HELP",
    "RULES",
    "Backend",
    "GaLoreAdafactor",
    "GaLoreAdamW",
    "GaLoreAdamW8bit",
    "GaLoreSGDM",
    "LayerwiseOptimizer",
    "LowRankOptimizer",
    "OptimizerSpec",
    "PlumageAdafactor",
    "PlumageAdamW",
    "PlumageAdamW8bit",
    "PlumageSGDM",
    "Route",
    "Update",
    "build_optimizer",
    "check_optimizer_options",
    "check_regular_lr",
    "check_regular_lr_ratio",
    "recommended_beta1",
    "recommended_grad_clipping",
    "recommended_lr",
    "recommended_pretrain_lr",
    "recommended_regular_lr_ratio",
    "recommended_residual",
    "recommended_sample_until",
    "recommended_v_floor",
    "recommended_v_floor_horizon",
    "pretrains_as_large_batch",
    "OPTIONS",
    "SAMPLED_STEPS",
    "describe_routing",
    "list_optimizers",
    "optimizer_class",
    "optimizer_spec",
    "route_parameters",
]
