"""The optimizer names: backend × family × per-layer, their specs, and the lr, scale and options each name takes
when none is given.

Names, for each backend b in adamw, adamw8bit, adafactor, sgdm:
    b            full-rank (no projection)           galore_b   svd projector, no realignment
    plumage_b    the library's recommended setting, its class's: for adamw and adamw8bit since session 17 the svd
                 projector with v_floor "m2" (the protocol's best), for adafactor since session 81 the svd projector
                 at scale 0.25 (its regular group at 4x in pretraining; sessions 42-80 drew PLUMAGE's sample), for
                 sgdm the plumage projector with realign mv (its draws before every update at scale 0.25 since
                 session 46, which kept the paper's estimator until then)
    flora_b      random projector, realign m
and `<name>_per_layer` for each (weights step inside their gradient hooks). galore-torch's names keep
working: adam, adam8bit, adafactor, sgd, galore_adamw, galore_adamw8bit, galore_adafactor,
galore_adamw8bit_per_layer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .adafactor import AdafactorBackend, PlumageAdafactor
from .adamw import AdamWBackend, PlumageAdamW
from .adamw8bit import AdamW8bitBackend, PlumageAdamW8bit
from .base import Backend, LowRankOptimizer
from .options import option_defaults
from .presets import fitting_preset
from .sgdm import PlumageSGDM, SGDMomentumBackend

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
                     "plumage_adamw(8bit) and plumage_adafactor, m for flora_*, mv for plumage_sgdm; PLUMAGE's draws "
                     "(--projector plumage) on Adam train best with mv_meansplit, on Adafactor with mv)")


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
