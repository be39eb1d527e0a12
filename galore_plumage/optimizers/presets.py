"""Named settings of the plumage_* optimizers, each one flag (`--preset NAME`) or one dict away.

A preset replaces the optimizer's own defaults (projector, realignment, scale, lr and the options of options.py);
whatever is given by name still wins, so `--preset paper --max_inv_p 3` is the paper's estimator with 1/p capped at 3.

    paper    the paper's exact PLUMAGE: its projector (r singular vectors drawn with min-variance inclusion
             probabilities, rescaled by 1/p, uncapped, drawn at refreshes only), both moments realigned (mv), no
             complement, no floor, scale 1 and lr 1e-3 as the paper documents them. Every option that plumage_*
             sets apart from the table's default is set back to it. On every backend.
             PlumageAdamW(params, lr=1e-3, **PLUMAGE_PAPER).
    sampled  PLUMAGE's draws as the default of sessions 14-16 set them: the best PLUMAGE-projector setting
             measured (docs/results.md §3), over plumage_adamw(8bit)'s lr and scale. Adam's moments only.
             PlumageAdamW(params, **PLUMAGE_SAMPLED).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .options import OPTIONS

# the paper's estimator: every option plumage_* changes, back at the table's default (the paper's values)
PLUMAGE_PAPER: dict[str, Any] = {
    "projector": "plumage", "realign": "mv", "scale": 1.0,
    **{o.key: o.default for o in OPTIONS if o.default != o.plumage_default() or o.default != o.plumage_adam_default()},
}
# The default of sessions 14-16: PLUMAGE's draws before every update (the plumage_* option defaults: κ = 1, 1/p capped
# at 1, the pool in bfloat16), the moments' mean and variance carried apart at every draw (LDAdam's mv_meansplit),
# Fira's complement on the first 10 updates after a refresh (the residual_* defaults), no floor of its own
# (mv_meansplit floors every row that stays).
PLUMAGE_SAMPLED: dict[str, Any] = {"projector": "plumage", "realign": "mv_meansplit", "residual": "norm_matched",
                                   "v_floor": "none"}


@dataclass(frozen=True)
class Preset:
    settings: dict[str, Any]  # group keys
    lr: float | None  # None: the optimizer's recommended lr
    backends: tuple[str, ...]  # the backends it was made for
    help: str


PRESETS: dict[str, Preset] = {
    "paper": Preset(PLUMAGE_PAPER, 1e-3, ("adamw", "adamw8bit", "adafactor", "sgdm"),
                    "the paper's exact estimator (uncapped 1/p, drawn at refreshes, realign mv, scale 1, lr 1e-3)"),
    "sampled": Preset(PLUMAGE_SAMPLED, None, ("adamw", "adamw8bit"),
                      "PLUMAGE's draws before every update, the plumage_adamw default of sessions 14-16"),
}
PRESET_FLAG_HELP = ("a named setting of a plumage_* optimizer, in place of its defaults (flags given with it still "
                    "win): " + "; ".join(f"'{name}': {preset.help}" for name, preset in PRESETS.items()))


def fitting_preset(name: str, family: str, backend: str, optimizer: str) -> Preset:
    """Preset `name`, for optimizer `optimizer` (of `family`, on `backend`); refuses one that does not fit it."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    if family != "plumage":
        raise ValueError(f"preset {name!r} is a setting of the plumage_* optimizers, not of {optimizer!r}: pick "
                         f"plumage_{backend} or drop the preset")
    if backend not in preset.backends:
        raise ValueError(f"preset {name!r} was made for the {' and '.join(preset.backends)} backends, not {backend!r}: "
                         f"pick plumage_{preset.backends[0]} or drop the preset")
    return preset
