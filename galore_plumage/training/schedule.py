"""Learning-rate schedules: linear warmup from 0, then cosine or linear decay to `min_lr_ratio`, or constant."""

from __future__ import annotations

import math
import warnings
from functools import partial

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr before update `step` (0-based)."""
    if step < warmup_steps:
        return step / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if kind == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if kind == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    raise ValueError(f"unknown scheduler {kind!r}; choose cosine, linear or constant")


def changed_from(step: int, factor: partial, from_step: int, times: float) -> float:
    """`factor`'s multiplier before update `step`, times `times` from update `from_step` (0-based) on."""
    return factor(step) * (times if step >= from_step else 1.0)


def build_scheduler(optimizer: Optimizer, kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float,
                    regular_change: tuple[int, float] | None = None) -> LambdaLR:
    """Stepped once per update. `regular_change` = (from_step, times): the regular group's lr (the first group, the
    only one without a rank) is `times` its scheduled value from update `from_step` on. (Partials, not lambdas, so the
    scheduler's state_dict stays plain.)"""
    factor = partial(lr_factor, kind=kind, warmup_steps=warmup_steps, total_steps=total_steps,
                     min_lr_ratio=min_lr_ratio)
    if regular_change is None:
        return LambdaLR(optimizer, factor)
    groups = optimizer.param_groups
    if "rank" in groups[0]:
        raise ValueError("a change of the regular group's lr needs a regular group (embeddings, norms, head) as the "
                         "optimizer's first parameter group; this optimizer's first group is projected")
    from_step, times = regular_change
    regular = partial(changed_from, factor=factor, from_step=from_step, times=times)
    return LambdaLR(optimizer, [regular] + [factor] * (len(groups) - 1))


def step_scheduler(scheduler: LambdaLR) -> None:
    """scheduler.step(), quiet about per-layer mode: its weights step in their hooks, never through
    inner.step(), whose call LambdaLR looks for before warning that the schedule runs ahead of the optimizer."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()
