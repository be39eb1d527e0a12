"""The command-line flags that pin a PLUMAGE arm of a benchmark, so the arm does not move when a default changes."""

from __future__ import annotations

# the paper's estimator; an arm names each option in this order (run_cache compares recorded commands)
PAPER = {"sampled_step": "adaptive", "max_inv_p": "none", "row_bias_correction": False, "resample_every": 0,
         "residual": "none", "realign": "mv"}
# with a complement, how it moves is named too, right after --residual: Fira's limiter and step size unless given
COMPLEMENT = {"residual_limiter": "fira", "residual_scale": 1.0, "residual_cap": "none", "residual_horizon": "none"}


def plumage_flags(**options) -> list[str]:
    """torchrun_main.py flags for the paper's estimator with `options` changed (bools as --key / --no-key)."""
    complement = COMPLEMENT if options.get("residual", PAPER["residual"]) != "none" else {}
    chosen = {**PAPER, **complement, **options}  # a merge keeps each key where it first came: PAPER's order, then these
    flags = []
    for key, value in chosen.items():
        if isinstance(value, bool):
            flags.append(f"--{key}" if value else f"--no-{key}")
        else:
            flags += [f"--{key}", str(value)]
    return flags
