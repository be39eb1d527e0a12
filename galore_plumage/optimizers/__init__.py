"""Low-rank optimizers: backends × projectors, a name registry, and build_optimizer for a model.

Names, for each backend b in adamw, adamw8bit, adafactor, sgdm:
    b            full-rank (no projection)           galore_b   svd projector, no realignment
    plumage_b    the library's recommended setting, its class's: for adamw and adamw8bit since session 17 the svd
                 projector with v_floor "m2" (the protocol's best), for adafactor and sgdm the plumage projector
                 with realign mv (its draws before every update at scale 0.25: adafactor's since session 42, sgdm's
                 since session 46, which kept the paper's estimator until then)
    flora_b      random projector, realign m
and `<name>_per_layer` for each (weights step inside their gradient hooks). galore-torch's names keep
working: adam, adam8bit, adafactor, sgd, galore_adamw, galore_adamw8bit, galore_adafactor,
galore_adamw8bit_per_layer.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..projectors import projector_spec
from .adafactor import AdafactorBackend, GaLoreAdafactor, PlumageAdafactor
from .adamw import AdamWBackend, GaLoreAdamW, PlumageAdamW
from .adamw8bit import AdamW8bitBackend, GaLoreAdamW8bit, PlumageAdamW8bit
from .base import LOW_RANK_DEFAULTS, PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update
from .layerwise import LayerwiseOptimizer
from .options import BY_KEY, OPTIONS, check_options, option_defaults
from .presets import PLUMAGE_PAPER, PLUMAGE_SAMPLED, PRESET_FLAG_HELP, PRESETS, fitting_preset
from .realign import RULES
from .sampled_step import SAMPLED_STEPS
from .sgdm import GaLoreSGDM, PlumageSGDM, SGDMomentumBackend

BACKENDS: dict[str, type[Backend]] = {
    cls.name: cls for cls in (AdamWBackend, AdamW8bitBackend, AdafactorBackend, SGDMomentumBackend)
}
# The plumage_* classes carry the family's recommended settings (lr, scale, options) in class_defaults: the best of
# the fair pretraining protocol (benchmarks/pretrain_protocol.py, docs/protocol_compare.md). build_optimizer and the
# command lines read them from there, so a name and its class agree.
PLUMAGE_CLASSES: dict[str, type[LowRankOptimizer]] = {
    "adamw": PlumageAdamW, "adamw8bit": PlumageAdamW8bit, "adafactor": PlumageAdafactor, "sgdm": PlumageSGDM,
}
FAMILIES = {  # prefix -> (projector, realign, what it is); None: the backend's plumage_* class decides
    "": (None, "none", "full-rank"),
    "galore_": ("svd", "none", "GaLore: top-r SVD projection"),
    "plumage_": (None, None, "the library's recommended low-rank setting (PLUMAGE's projector unless its class says)"),
    "flora_": ("random", "m", "FLORA: Gaussian projection, momentum transferred"),
}
ALIASES = {"adam": "adamw", "adam8bit": "adamw8bit", "sgd": "sgdm"}
# the --realign flag of torchrun_main.py and run_glue.py, with what each name does when it is not given
REALIGN_FLAG_HELP = ("override the optimizer's moment realignment at refreshes and draws (its own: none for galore_* and "
                     "plumage_adamw(8bit), m for flora_*, mv for plumage_adafactor and plumage_sgdm; PLUMAGE's draws "
                     "on Adam train best with mv_meansplit)")


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    backend: str
    projector: str | None  # None: full-rank
    realign: str
    per_layer: bool
    description: str
    family: str = ""  # the name's prefix without "_" ("", "galore", "plumage", "flora"): whose defaults it takes


def _build_registry() -> dict[str, OptimizerSpec]:
    registry = {}
    for backend in BACKENDS:
        for prefix, (family_projector, family_realign, what) in FAMILIES.items():
            # plumage_*: the backend's class decides its projector and realignment
            projector = family_projector if prefix != "plumage_" else PLUMAGE_CLASSES[backend].class_defaults["projector"]
            realign = family_realign or PLUMAGE_CLASSES[backend].class_defaults["realign"]
            for per_layer in (False, True):
                name = f"{prefix}{backend}" + ("_per_layer" if per_layer else "")
                description = f"{what}, {backend} moments" + (", per-layer steps" if per_layer else "")
                registry[name] = OptimizerSpec(name, backend, projector, realign, per_layer, description,
                                               prefix.rstrip("_"))
    for alias, target in ALIASES.items():
        spec = registry[target]
        registry[alias] = OptimizerSpec(alias, spec.backend, None, "none", False, f"alias of {target}")
    return registry


_REGISTRY = _build_registry()


def list_optimizers() -> list[str]:
    return sorted(_REGISTRY)


def optimizer_spec(name: str) -> OptimizerSpec:
    if name not in _REGISTRY:
        raise ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(list_optimizers())}")
    return _REGISTRY[name]


@functools.cache
def optimizer_class(backend: str) -> type[LowRankOptimizer]:
    """The generic LowRankOptimizer subclass for a backend name."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    return type(f"LowRank_{backend}", (LowRankOptimizer,), {"backend": BACKENDS[backend]()})


DEFAULT_LR = 1e-3  # AdamW's published lr for GaLore's small Llamas; every optimizer without a measured one
RECOMMENDED_LR: dict[tuple[str, str], float] = {  # (family, backend) -> lr
    ("plumage", backend): cls.class_defaults["lr"] for backend, cls in PLUMAGE_CLASSES.items()
    if "lr" in cls.class_defaults
}


def recommended_lr(spec: OptimizerSpec, preset: str | None = None) -> float:
    """The lr a name (under `preset`, if given) uses when none is given."""
    if preset is not None and (chosen := fitting_preset(preset, spec.family, spec.backend, spec.name)).lr is not None:
        return chosen.lr
    return RECOMMENDED_LR.get((spec.family, spec.backend), DEFAULT_LR)


# The regular group's (embeddings, norms, head) peak lr as a multiple of `lr` when torchrun_main.py pretrains: the
# protocol's best for plumage_adamw on every shape larger than llama_tiny and level on llama_tiny (docs/results.md §3,
# sessions 32-33); plumage_adamw8bit's since session 36, with the floor's warm-up below (+0.012 and +0.026 alone,
# session 34); plumage_adafactor's since session 42, with scale 0.25 on its draws (+0.108 over GaLore's Adafactor
# recipe, five seeds, where at one lr and scale 1 it trailed it). One lr (1) for every other name, as galore-torch;
# the Python API (build_optimizer, the classes, the HF Trainer) keeps one lr too unless regular_lr is given: the ratio
# was measured in pretraining only.
PRETRAIN_REGULAR_LR_RATIO: dict[tuple[str, str], float] = {("plumage", "adamw"): 2.0, ("plumage", "adamw8bit"): 2.0,
                                                           ("plumage", "adafactor"): 2.0}


def recommended_regular_lr_ratio(spec: OptimizerSpec, preset: str | None = None) -> float:
    """The regular group's lr over `lr` that torchrun_main.py uses for a name (under `preset`) when neither
    --regular_lr nor --regular_lr_ratio is given; a preset keeps one lr, as every preset was measured."""
    if preset is not None:
        return 1.0
    return PRETRAIN_REGULAR_LR_RATIO.get((spec.family, spec.backend), 1.0)


# The floor's warm-up (v_floor_horizon, optimizers/moment_floor.py) when torchrun_main.py pretrains, as (from this many
# tokens an update up, horizon): 200 updates from 2048 tokens instead of m2's ~1000, with the regular group at
# 2x the lr (above). plumage_adamw: ahead of m2 at 8 x 256 and 16 x 256 tokens an update (+0.05, +0.03), where m2 fell
# behind GaLore's recipe as on a GPU at 64 x 256; plumage_adamw8bit: +0.070 at 8 x 256 over m2 at one lr (three seeds
# each; docs/results.md §3, sessions 35-36). Below that m2's own, for both: at 8 x 64 tokens 200 was level with it on
# llama_tiny (float32 -0.006; 8-bit +0.007 over m2 at one lr, whose 2x alone gained 0.012), and float32's behind it
# on every seed of three, each at its own best lr, on llama_35m's shape (0.042) and on Python source (0.014; session 53).
# The threshold is llama_tiny's: on llama_35m's shape m2's own still led at 8 x 256 (0.019, two seeds; session 54), so
# a larger model may want it higher (README, Limitations). The option's default stays None elsewhere (the classes,
# build_optimizer, run_glue.py).
PRETRAIN_V_FLOOR_HORIZON: dict[tuple[str, str], tuple[int, int]] = {("plumage", "adamw"): (2048, 200),
                                                                    ("plumage", "adamw8bit"): (2048, 200)}


# Where torchrun_main.py pretrains without the floor: from this many tokens an update (total_batch_size x max_length)
# up, where neither --v_floor nor --v_floor_horizon is given. The floor's gain shrinks as the batch grows: H = 200
# against no floor, both with the 2x regular group (docs/results.md §3, sessions 35-37), +0.034 at 512 tokens an
# update, level at 2048 and 4096 (llama_tiny on the CPU), -0.047 at 16384 (llama_60m on an H200; three seeds each).
# plumage_adamw8bit likewise since session 41: with the complement below, no floor led its 200-update warm-up (without
# the complement) by 0.054 at 16 x 256 tokens, on every seed (three, Python source read once); without the complement
# none trailed that warm-up by 0.017 (the plays, seed 0, session 39).
PRETRAIN_NO_FLOOR_FROM_TOKENS: dict[tuple[str, str], int] = {("plumage", "adamw"): 4096, ("plumage", "adamw8bit"): 4096}


def recommended_v_floor(spec: OptimizerSpec, options: dict, tokens_per_update: int,
                        preset: str | None = None) -> str | None:
    """The v_floor torchrun_main.py gives a name (under `preset`, with the low-rank `options` given) at
    `tokens_per_update`: 'none' from PRETRAIN_NO_FLOOR_FROM_TOKENS up where neither v_floor nor v_floor_horizon is
    given, else None (the class's own floor; a preset keeps what it was measured with)."""
    threshold = PRETRAIN_NO_FLOOR_FROM_TOKENS.get((spec.family, spec.backend))
    if preset is not None or threshold is None or {"v_floor", "v_floor_horizon"} & options.keys():
        return None
    return "none" if tokens_per_update >= threshold else None


# Where torchrun_main.py pretrains with a complement, Fira's as published (arXiv 2410.01623; optimizers/residual.py:
# the gradient outside the basis, G − P R, moves at the step Adam gives each column inside it, under Fira's norm-growth
# limiter, at every update): from this many tokens an update up, where no residual option is given and not in
# per-layer mode (whose point is not to hold full gradients, which the complement reads at every update). At 8 x 64
# tokens a raw G − P R is mostly noise and the complement cost at tau = 200 (session 13), at 8 x 256 it costs 0.069 on
# the floor's warm-up (three seeds, session 39); at 16 x 256 it gains 0.020 over the default without it on every seed
# (docs/results.md §3, session 38). plumage_adamw's own complement (a
# quarter step, the steady limiter, cap 0.5, the first 10 updates after a refresh) is not what was measured there.
# plumage_adamw8bit's too since session 41 (docs/results.md §3): session 39 measured it costing on 8-bit, but 8-bit's
# first update at a warm-up's lr 0 then gave Fira's limiter a zero reference (fixed in adamw8bit.py); fixed, it leads
# GaLore's 8-bit recipe by 0.126 at 16 x 256 tokens, as float32's leads its recipe (0.122), every seed of three
# (Python source read once; docs/results.md §3, session 41).
FIRA_COMPLEMENT: dict[str, Any] = {"residual": "norm_matched", "residual_limiter": "fira", "residual_scale": 1.0,
                                   "residual_cap": None, "residual_horizon": None}
PRETRAIN_COMPLEMENT: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {
    ("plumage", "adamw"): (4096, FIRA_COMPLEMENT), ("plumage", "adamw8bit"): (4096, FIRA_COMPLEMENT),
}


def recommended_residual(spec: OptimizerSpec, options: dict, tokens_per_update: int,
                         preset: str | None = None) -> dict[str, Any]:
    """The complement options torchrun_main.py gives a name (under `preset`, with the low-rank `options` given) at
    `tokens_per_update`: PRETRAIN_COMPLEMENT's from its threshold up, where no residual option is given and the name
    is not per-layer; else {} (the class's own: none for plumage_adamw; a preset keeps what it was measured with).
    The complement names every residual option, so any one of them given stops the derivation."""
    threshold, complement = PRETRAIN_COMPLEMENT.get((spec.family, spec.backend), (None, {}))
    if preset is not None or threshold is None or spec.per_layer or complement.keys() & options.keys():
        return {}
    return dict(complement) if tokens_per_update >= threshold else {}


def recommended_v_floor_horizon(spec: OptimizerSpec, options: dict, tokens_per_update: int,
                                preset: str | None = None) -> int | None:
    """The v_floor_horizon torchrun_main.py gives a name (under `preset`, with the low-rank `options` given) at
    `tokens_per_update` when the flag is not given: PRETRAIN_V_FLOOR_HORIZON's from its threshold up where the floor
    in effect is 'm2', else None (m2's own warm-up below it; another floor has no warm-up to shape; a preset keeps
    m2's own, as every preset was measured)."""
    threshold, horizon = PRETRAIN_V_FLOOR_HORIZON.get((spec.family, spec.backend), (None, None))
    if preset is not None or threshold is None or tokens_per_update < threshold:
        return None
    floor = options.get("v_floor", family_defaults(spec)["v_floor"])
    return horizon if floor == "m2" else None


def family_scale(spec: OptimizerSpec) -> float:
    """The projected-back scale of a name: GaLore's recipe 0.25 for galore_*, the class's for plumage_*."""
    if spec.family == "galore":
        return 0.25
    return PLUMAGE_CLASSES[spec.backend].class_defaults["scale"] if spec.family == "plumage" else 1.0


def family_defaults(spec: OptimizerSpec) -> dict:
    """The options of optimizers/options.py as the name's family sets them (plumage_*: its class's)."""
    if spec.family != "plumage":
        return option_defaults()
    return {key: PLUMAGE_CLASSES[spec.backend].class_defaults.get(key, value) for key, value in option_defaults().items()}


def _first_given(*values):
    """The first value that is not None (None if none is)."""
    return next((value for value in values if value is not None), None)


@dataclass(frozen=True)
class Route:
    name: str
    shape: tuple[int, ...]
    low_rank: bool
    reason: str


def route_parameters(model: nn.Module, target_modules, projector: str | None) -> list[Route]:
    """Decide, for every trainable parameter, low-rank or regular, and why."""
    tensors_ok = projector is not None and projector_spec(projector).tensors
    projectable = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d) if tensors_ok else (nn.Linear,)
    routes, seen = [], set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:  # a tied weight is routed once, by its first name
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{param_name}" if module_name else param_name
            if projector is None:
                routes.append(Route(full_name, tuple(param.shape), False, "full-rank optimizer"))
            elif param_name != "weight" or not isinstance(module, projectable):
                kind = "bias" if param_name == "bias" else f"{type(module).__name__}.{param_name}"
                routes.append(Route(full_name, tuple(param.shape), False, f"{kind}: not a projectable weight"))
            elif not any(target in module_name for target in target_modules):
                routes.append(Route(full_name, tuple(param.shape), False, f"module matches none of {list(target_modules)}"))
            else:
                routes.append(Route(full_name, tuple(param.shape), True, "low-rank"))
    return routes


def describe_routing(routes: list[Route], rank: int | None = None) -> str:
    low = [r for r in routes if r.low_rank]
    lines = [f"{len(low)} of {len(routes)} trainable tensors low-rank" + (f" (rank {rank})" if low else "")]
    lines += [f"  {'low-rank' if r.low_rank else 'regular ':8s} {r.name} {list(r.shape)}  {r.reason}" for r in routes]
    return "\n".join(lines)


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


def check_regular_lr_ratio(ratio: float | None, name: str) -> None:
    """Refuse --regular_lr_ratio (the regular group's lr over lr) where it is not a positive finite number, or where
    optimizer `name` is full-rank, as check_regular_lr refuses an absolute one."""
    if ratio is None:
        return
    _refuse_without_regular_group(name, f"--regular_lr_ratio {ratio:g}", "drop it")
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"--regular_lr_ratio must be a positive finite number (the regular group's lr over --lr; "
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
    "LOW_RANK_DEFAULTS",
    "PLUMAGE_DEFAULTS",
    "PLUMAGE_PAPER",
    "PLUMAGE_SAMPLED",
    "PRESETS",
    "PRESET_FLAG_HELP",
    "PRETRAIN_REGULAR_LR_RATIO",
    "PRETRAIN_COMPLEMENT",
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
    "recommended_lr",
    "recommended_regular_lr_ratio",
    "recommended_residual",
    "recommended_v_floor",
    "recommended_v_floor_horizon",
    "OPTIONS",
    "SAMPLED_STEPS",
    "describe_routing",
    "list_optimizers",
    "optimizer_class",
    "optimizer_spec",
    "route_parameters",
]
