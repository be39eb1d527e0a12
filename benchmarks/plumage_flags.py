"""The command-line flags that pin a PLUMAGE arm of a benchmark, so the arm does not move when a default changes."""

from __future__ import annotations

from galore_plumage.optimizers import (
    PRETRAIN_BETA1,
    PRETRAIN_GRAD_CLIPPING,
    PRETRAIN_SAMPLE_UNTIL,
    optimizer_spec,
    recommended_regular_lr_ratio,
)
from galore_plumage.optimizers.options import BY_KEY

# the paper's estimator; an arm names each option in this order (run_cache compares recorded commands)
PAPER = {"sampled_step": "adaptive", "max_inv_p": "none", "row_bias_correction": False, "resample_every": 0,
         "residual": "none", "realign": "mv"}
# with a complement, how it moves is named too, right after --residual: Fira's limiter and step size unless given
COMPLEMENT = {"residual_limiter": "fira", "residual_scale": 1.0, "residual_cap": "none", "residual_horizon": "none"}


def plumage_flags(**options) -> list[str]:
    """torchrun_main.py flags for the paper's estimator with `options` changed (bools as --key / --no-key; None leaves
    the key out, for a backend that refuses it, or for an arm recorded before its backend took the key)."""
    complement = COMPLEMENT if options.get("residual", PAPER["residual"]) != "none" else {}
    chosen = {**PAPER, **complement, **options}  # a merge keeps each key where it first came: PAPER's order, then these
    flags = []
    for key, value in chosen.items():
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(f"--{key}" if value else f"--no-{key}")
        else:
            flags += [f"--{key}", str(value)]
    return flags


# What plumage_* used before session 17 made the Adam ones' default the top-r basis with the floor (projector svd,
# v_floor m2), before session 20 made their refresh the eigh of the Gram (solver gram), and before session 33 gave
# plumage_adamw's regular group 2x its lr in pretraining (regular_lr_ratio 2), and before session 36 shortened the
# floor's warm-up to 200 updates (v_floor_horizon 200): a benchmark names it on every plumage_* arm (with_family_pins),
# and a run recorded without these flags ran with these values (run_cache reads this table to reuse it).
# Since session 77 a long run of plumage_adafactor draws over its first 1000 updates only (PRETRAIN_SAMPLE_UNTIL):
# --sample_until none keeps an arm drawing throughout, as every run before it did. Since session 88 plumage_sgdm
# pretrains clipped at 1 (PRETRAIN_GRAD_CLIPPING), and since session 89 plumage_sgdm and plumage_adafactor at β1 0.9
# (PRETRAIN_BETA1): an arm that names neither ran unclipped at the script's 0.
FAMILY_PINS = {"--projector": "plumage", "--v_floor": "none", "--v_floor_horizon": "none", "--grad_clipping": "0",
               "--beta1": "0", "--solver": "svd", "--sample_until": "none", "--regular_lr_ratio": "1"}


def family_pins(optimizer: str, pretraining: bool = True) -> list[str]:
    """The flags that keep a plumage_* arm on PLUMAGE's projector without the floor (and m2's own warm-up where an arm
    names the floor), unclipped at β1 0, refreshed by SVD, drawing throughout, at one lr ([] for other names);
    --grad_clipping and --beta1 only for torchrun_main.py and where the name derives them; --v_floor and its horizon
    only where the options table lets the backend take them (the others refuse the flags), --sample_until and the
    ratio only for torchrun_main.py (`pretraining`; run_glue.py has one lr and derives neither) and where the name
    derives them (a sample_until rule; a ratio other than 1)."""
    spec = optimizer_spec(optimizer)
    if spec.family != "plumage":
        return []
    floors = BY_KEY["v_floor"].applies(spec.backend, None) is None
    one_lr = pretraining and recommended_regular_lr_ratio(spec) != 1
    draws_throughout = pretraining and (spec.family, spec.backend) in PRETRAIN_SAMPLE_UNTIL
    unclipped = pretraining and (spec.family, spec.backend) in PRETRAIN_GRAD_CLIPPING and not spec.per_layer
    script_beta1 = pretraining and (spec.family, spec.backend) in PRETRAIN_BETA1
    return (["--projector", FAMILY_PINS["--projector"]]
            + (["--v_floor", FAMILY_PINS["--v_floor"], "--v_floor_horizon", FAMILY_PINS["--v_floor_horizon"]]
               if floors else [])
            + (["--grad_clipping", FAMILY_PINS["--grad_clipping"]] if unclipped else [])
            + (["--beta1", FAMILY_PINS["--beta1"]] if script_beta1 else [])
            + ["--solver", FAMILY_PINS["--solver"]]
            + (["--sample_until", FAMILY_PINS["--sample_until"]] if draws_throughout else [])
            + (["--regular_lr_ratio", FAMILY_PINS["--regular_lr_ratio"]] if one_lr else []))


def with_family_pins(optimizer: str, flags: list[str], pretraining: bool = True) -> list[str]:
    """`flags` with family_pins appended for each pinned flag the arm does not name itself (an arm that gives
    --regular_lr sets its regular group's lr, and takes no ratio)."""
    pins = family_pins(optimizer, pretraining)
    named = set(flags) | ({"--regular_lr_ratio"} if "--regular_lr" in flags else set())
    if "--projector" in flags and flags[flags.index("--projector") + 1] != FAMILY_PINS["--projector"]:
        named.add("--sample_until")  # a projector that does not sample refuses the flag, and derives none
    extra = [item for flag, value in zip(pins[::2], pins[1::2], strict=True) if flag not in named for item in (flag, value)]
    return [*flags, *extra]
