"""The command-line flags that pin a PLUMAGE arm of a benchmark, so the arm does not move when a default changes."""

from __future__ import annotations

# the paper's exact estimator; an arm names each option in this order (run_cache compares recorded commands)
PAPER = {"sampled_step": "adaptive", "max_inv_p": "none", "row_bias_correction": False, "resample_every": 0,
         "residual": "none"}


def plumage_flags(**options) -> list[str]:
    """torchrun_main.py flags for the paper's estimator with `options` changed (bools as --key / --no-key)."""
    flags = []
    for key, value in {**PAPER, **options}.items():
        if isinstance(value, bool):
            flags.append(f"--{key}" if value else f"--no-{key}")
        else:
            flags += [f"--{key}", str(value)]
    return flags
