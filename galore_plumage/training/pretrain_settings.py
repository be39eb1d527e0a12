"""What a pretraining run takes where its flag is not given: each setting the optimizer was measured best with at
this run's tokens an update and length (the tables of optimizers/pretrain_defaults.py), filled into a TrainConfig
after its batch arithmetic. `fill_pretrain_settings` applies them in the one order their dependencies allow; a flag
the user gave is never overwritten.
"""

from __future__ import annotations

from ..optimizers.pretrain_defaults import (
    recommended_beta1,
    recommended_grad_clipping,
    recommended_pretrain_lr,
    recommended_regular_lr_ratio,
    recommended_residual,
    recommended_sample_until,
    recommended_v_floor,
    recommended_v_floor_horizon,
)
from ..optimizers.registry import OptimizerSpec, optimizer_spec


def fill_pretrain_settings(c) -> None:
    """Fill `c` (a training.config.TrainConfig, untyped here: config imports this module) in place: the clip and β1
    first (the lr table reads the clip), then the floor, its warm-up, the complement and the draws' end by the batch
    and the run's length, then the lr (which reads the floor in effect) and the regular group's lr."""
    spec = optimizer_spec(c.optimizer)
    _derive_grad_clipping(c, spec)
    _derive_beta1(c, spec)
    _derive_v_floor(c, spec)
    _derive_v_floor_horizon(c, spec)
    _derive_residual(c, spec)
    _derive_sample_until(c, spec)
    _derive_lr(c, spec)
    _derive_regular_lr(c, spec)


def _derive_lr(c, spec: OptimizerSpec) -> None:
    """The lr the optimizer pretrains with at this many tokens an update, the floor in effect, the run's length and
    the clip (optimizers.PRETRAIN_LR, else its recommended lr; PRETRAIN_LONG_RUN_LR; PRETRAIN_CLIPPED_LR;
    PRETRAIN_BATCH_LR), unless --lr was given."""
    if c.lr is None:
        c.lr = recommended_pretrain_lr(spec, c.low_rank, c.tokens_per_update, c.preset, num_updates=c.num_training_steps,
                                       grad_clipping=c.grad_clipping, projector=c.projector)


def _derive_grad_clipping(c, spec: OptimizerSpec) -> None:
    """The global gradient norm the optimizer pretrains with (optimizers.PRETRAIN_GRAD_CLIPPING), unless
    --grad_clipping was given."""
    if c.grad_clipping is None:
        c.grad_clipping = recommended_grad_clipping(spec, c.preset)


def _derive_beta1(c, spec: OptimizerSpec) -> None:
    """Adafactor's β1 / SGD's momentum the optimizer pretrains with (optimizers.PRETRAIN_BETA1), unless --beta1 was
    given."""
    if c.beta1 is None:
        c.beta1 = recommended_beta1(spec)


def _derive_regular_lr(c, spec: OptimizerSpec) -> None:
    """regular_lr from --regular_lr_ratio (or the optimizer's recommended ratio) x lr, unless given; one lr stays None:
    build_optimizer's single lr, as GaLore's script."""
    if c.regular_lr is not None:
        return
    ratio = c.regular_lr_ratio
    if ratio is None:
        ratio = recommended_regular_lr_ratio(spec, c.preset)
    if ratio != 1 and c.lr > 0:
        c.regular_lr = ratio * c.lr


def _derive_v_floor(c, spec: OptimizerSpec) -> None:
    """No floor where the optimizer pretrains without one at this many tokens an update and this run's length
    (optimizers.PRETRAIN_NO_FLOOR_FROM_TOKENS, PRETRAIN_LONG_RUN_LARGE_BATCH), into the options unless --v_floor or
    --v_floor_horizon was given."""
    floor = recommended_v_floor(spec, c.low_rank, c.tokens_per_update, c.preset, num_updates=c.num_training_steps)
    if floor is not None:
        c.low_rank = {**c.low_rank, "v_floor": floor}


def _derive_v_floor_horizon(c, spec: OptimizerSpec) -> None:
    """The floor's warm-up the optimizer pretrains with at this many tokens an update (optimizers.PRETRAIN_V_FLOOR_HORIZON,
    from its threshold up), into the options unless --v_floor_horizon was given (as 'none' too)."""
    if "v_floor_horizon" not in c.low_rank:
        horizon = recommended_v_floor_horizon(spec, c.low_rank, c.tokens_per_update, c.preset)
        if horizon is not None:
            c.low_rank = {**c.low_rank, "v_floor_horizon": horizon}


def _derive_residual(c, spec: OptimizerSpec) -> None:
    """The complement the optimizer pretrains with at this many tokens an update and this run's length
    (optimizers.PRETRAIN_COMPLEMENT, PRETRAIN_LONG_RUN_LARGE_BATCH), into the options unless a residual flag was
    given."""
    c.low_rank = {**c.low_rank, **recommended_residual(spec, c.low_rank, c.tokens_per_update, c.preset,
                                                       num_updates=c.num_training_steps)}


def _derive_sample_until(c, spec: OptimizerSpec) -> None:
    """PLUMAGE's draws over a long run's first updates only where the optimizer pretrains so at this run's length
    (optimizers.PRETRAIN_SAMPLE_UNTIL), into the options unless --sample_until was given."""
    until = recommended_sample_until(spec, c.low_rank, c.projector, c.preset, num_updates=c.num_training_steps)
    if until is not None:
        c.low_rank = {**c.low_rank, "sample_until": until}
