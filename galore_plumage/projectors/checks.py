"""The checks of the projector options that the optimizers' options table also declares (max_inv_p, resample_every,
sample_until, solver, pool_factor, the true/false ones): written once here, where the projector needs them, and
imported by optimizers/options.py as each option's check, so a message never differs between `build_projector(...)`
and `--flag`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# how SVD-based projectors get singular vectors: "svd" = torch.linalg.svd (galore-torch's call, bit-exact parity);
# "gram" = eigh of the projected side's Gram matrix when that side is the smaller one (several times faster);
# "gram64" = the same in float64: more accurate than either float32 route, at about twice gram's cost on a CPU
SOLVERS = ("svd", "gram", "gram64", "auto")


def check_max_inv_p(value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0):
        raise ValueError(f"max_inv_p must be a number >= 1 (or None / inf for no cap), got {value!r}")


def check_resample_every(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"resample_every must be an integer >= 0 (0: draw only at a refresh), got {value!r}")


def check_sample_until(value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"sample_until must be an integer >= 1 (the update from which refreshes keep the top rank "
                         f"singular vectors) or None (sample throughout), got {value!r}")


def check_pool_factor(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"pool_factor must be an integer >= 2 (the pool holds pool_factor x rank singular vectors), "
                         f"got {value!r}")


def check_solver(value) -> None:
    if value not in SOLVERS:
        raise ValueError(f"unknown solver {value!r}; choose one of {', '.join(SOLVERS)}")


def check_bool(key: str) -> Callable[[Any], None]:
    """The check of a true/false option named `key` (1, "yes" and None are refused: a flag is a bool)."""
    def check(value):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be True or False, got {value!r}")
    return check
