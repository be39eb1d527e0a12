"""What torchrun_main.py pretrains a name with where no flag says otherwise, as the fair protocol measured it
(benchmarks/pretrain_protocol.py, docs/results.md §3): the lr and the regular group's lr ratio, the floor on Adam's
second moment and its warm-up, Fira's complement, the clip and β1, each by tokens an update and the run's length.
training/pretrain_settings.py applies them; the Python API (the classes, build_optimizer, run_glue.py) keeps the
classes' own settings."""

from __future__ import annotations

from typing import Any

from .registry import OptimizerSpec, family_defaults, recommended_lr

# The regular group's (embeddings, norms, head) peak lr as a multiple of `lr` when torchrun_main.py pretrains: the
# protocol's best for plumage_adamw on every shape larger than llama_tiny and level on llama_tiny (docs/results.md §3,
# sessions 32-33); plumage_adamw8bit's since session 36, with the floor's warm-up below (+0.012 and +0.026 alone,
# session 34); plumage_adafactor's at 2x in sessions 42-80, with scale 0.25 on its draws (+0.108 over GaLore's Adafactor
# recipe, five seeds, where at one lr and scale 1 it trailed it), and at 4x since session 81 on GaLore's top-r basis:
# Adafactor clips each weight's update on its own, so the draws' lead at their large lr was the regular group's
# (session 80: GaLore's basis with it at 6x level with the draws at 600 updates, three seeds), and over 5000 updates
# of Python source read once GaLore's basis at 4x leads GaLore's recipe on every seed (docs/results.md §3, session 81).
# One lr (1) for every other name, as galore-torch;
# the Python API (build_optimizer, the classes, the HF Trainer) keeps one lr too unless regular_lr is given: the ratio
# was measured in pretraining only.
PRETRAIN_REGULAR_LR_RATIO: dict[tuple[str, str], float] = {("plumage", "adamw"): 2.0, ("plumage", "adamw8bit"): 2.0,
                                                           ("plumage", "adafactor"): 4.0}


def recommended_regular_lr_ratio(spec: OptimizerSpec, preset: str | None = None) -> float:
    """The regular group's lr over `lr` that torchrun_main.py uses for a name (under `preset`) when neither
    --regular_lr nor --regular_lr_ratio is given; a preset keeps one lr, as every preset was measured."""
    if preset is not None:
        return 1.0
    return PRETRAIN_REGULAR_LR_RATIO.get((spec.family, spec.backend), 1.0)


# The global gradient norm torchrun_main.py clips at when pretraining a name and --grad_clipping is not given (0: off,
# galore-torch's script): plumage_sgdm's 1, the norm nearly every LLM recipe clips at. SGD does not normalize its step,
# and over the first ~100 updates the norm here reaches 12-39 (a median of 0.7-1.2 after), so at the lr the rest of the
# run wants the first steps are too long. On the protocol (llama_tiny, the plays, 8 x 64 tokens, 600 updates) GaLore's
# recipe is at its best at 0.07 unclipped; clipped at 1 both GaLore's basis and the draws are at their best at 0.8
# (bracketed), where the draws lead GaLore's recipe by 0.40 and GaLore clipped alike by 0.036 (three seeds each, every
# seed), and at the demo's flags (8 x 256 tokens, 300 updates), the draws at 0.8 again, GaLore's recipe by 0.32 (GaLore
# clipped at its best there, 1.12, level with them, three seeds); over 2000 updates both at 0.56, the draws GaLore's
# recipe by 0.24 and GaLore clipped alike by 0.019 (three seeds; docs/results.md §3, sessions 88-89). Per-layer names
# have no global norm (optimizers/layerwise.py), and a preset keeps what it was measured with: off.
PRETRAIN_GRAD_CLIPPING: dict[tuple[str, str], float] = {("plumage", "sgdm"): 1.0}


def recommended_grad_clipping(spec: OptimizerSpec, preset: str | None = None) -> float:
    """The global gradient norm torchrun_main.py clips a name's gradients at (under `preset`) when --grad_clipping is
    not given: PRETRAIN_GRAD_CLIPPING's, else 0 (off); off in per-layer mode and under a preset."""
    if preset is not None or spec.per_layer:
        return 0.0
    return PRETRAIN_GRAD_CLIPPING.get((spec.family, spec.backend), 0.0)


# Adafactor's β1 and SGD's momentum when torchrun_main.py pretrains a name and --beta1 is not given: 0.9 for
# plumage_adafactor and plumage_sgdm, the β1 every measurement of theirs ran with (GaLore's recipes alike: GaLore ran
# Adafactor with a first moment, docs/results.md §3, sessions 42 and 45), per-layer and under a preset too; 0 for every
# other name, as galore-torch's script (Adafactor without a first moment, SGD without momentum). Until session 89 every
# name took the script's 0, so `--optimizer plumage_sgdm` ran plain SGD, which no measurement here had run.
PRETRAIN_BETA1: dict[tuple[str, str], float] = {("plumage", "adafactor"): 0.9, ("plumage", "sgdm"): 0.9}


def recommended_beta1(spec: OptimizerSpec) -> float:
    """Adafactor's β1 / SGD's momentum torchrun_main.py gives a name when --beta1 is not given: PRETRAIN_BETA1's,
    else 0 (galore-torch's script)."""
    return PRETRAIN_BETA1.get((spec.family, spec.backend), 0.0)


# The peak lr torchrun_main.py pretrains a name with where --lr is not given, as (from this many tokens an update up,
# lr), while the floor in effect is m2 with its own ~1000-update warm-up (no v_floor_horizon given or derived); else
# the name's recommended_lr. The warm-up damps each sign-steady coordinate's step, and from 2,048 tokens an update
# m2's own wants twice the library's lr: at 2e-2 it leads the 200-update warm-up at 1e-2 (the default of sessions
# 36-55) by 0.035 on llama_35m's shape (three seeds, every seed) and is level on llama_tiny (+0.010, three seeds;
# docs/results.md §3, sessions 55-56); each at its own best lr the two are level on llama_tiny, m2's own ahead on
# llama_35m's shape. From 4,096 tokens an update there is no floor (PRETRAIN_NO_FLOOR_FROM_TOKENS): the library's lr.
# plumage_adamw8bit has no entry: its 200-update warm-up (PRETRAIN_V_FLOOR_HORIZON) at 1.4e-2 is level with the
# library's 1e-2 over the two models (+0.011 on llama_35m's shape, -0.007 on llama_tiny, three seeds each; sessions 60-61).
PRETRAIN_LR: dict[tuple[str, str], tuple[int, float]] = {("plumage", "adamw"): (2048, 2e-2)}


# The peak lr torchrun_main.py pretrains a name with where --lr is not given and the global gradient norm is clipped
# (--grad_clipping, given or PRETRAIN_GRAD_CLIPPING's), as (at this norm or below, ((from this many updates up, lr),
# ...)); not under a preset. A clipped step is bounded, and SGD momentum takes an lr ~10x the unclipped one:
# plumage_sgdm clipped at 1 (momentum 0.9) is at its best at 0.8, bracketed by 0.56 and 1.12, on llama_tiny at 8 x 64
# tokens (600 updates) and at 8 x 256 (300 updates), and at 0.56 at 1000 and 2000 updates of 8 x 64 (0.8 0.038 and
# 0.089 behind, seed 0; the same 0.7x from 1000 updates as plumage_adamw's PRETRAIN_LONG_RUN_LR), where unclipped 0.07
# is its best (its recommended_lr; docs/results.md §3, sessions 46, 88-89). A run of unknown length takes the first band.
PRETRAIN_CLIPPED_LR: dict[tuple[str, str], tuple[float, tuple[tuple[int, float], ...]]] = {
    ("plumage", "sgdm"): (1.0, ((0, 0.8), (1000, 0.56)))}


# The peak lr torchrun_main.py pretrains a name with where --lr is not given and no table above gives one, as
# ((from this many tokens an update up, lr), ...), with the name's own projector and not under a preset; the Python
# API keeps the class's (plumage_adafactor: none, Adafactor's relative step). Until session 89 plumage_adafactor
# pretrained at the library's 1e-3 there, 0.176 behind its 7e-3 and 0.087 behind GaLore's Adafactor recipe at its best
# (llama_tiny, the plays, 8 x 64 tokens, 600 updates, seed 0). Its bracketed best below 2,048 tokens an update is 7e-3
# at 600 updates and 3e-3 at 2000 and 5000 (the plays, the Python source, llama_35m's shape alike); 5e-3 is within
# 0.013 of it wherever it ran (docs/results.md §3, sessions 81-86). From 2,048 tokens an update 1e-2 is its best at 300 updates of
# 2,048 and 600 of 4,096 (5e-3 0.115 behind at 2,048, session 89; sessions 82-83); a long run there is unmeasured.
# The draws (--projector plumage) want about twice that (1.4e-2 and 2.8e-2, sessions 42-43): pass --lr.
PRETRAIN_BATCH_LR: dict[tuple[str, str], tuple[tuple[int, float], ...]] = {("plumage", "adafactor"): ((0, 5e-3),
                                                                                                      (2048, 1e-2))}


# A long run's share of that lr, as (from this many updates (--num_training_steps) up, factor): where the floor in
# effect is m2 with its own warm-up, the lr above times the factor, at any batch. The warm-up damps each sign-steady
# coordinate's step over its first ~1 / (1 − β2) = 1000 updates, and the lr that makes up for the damping costs in a
# run that spends most of its updates past it. At 512 tokens an update (docs/results.md §3, sessions 63-64), on
# llama_tiny on Python source read once, 1e-2 and 7e-3 are level at 600 updates (+0.013 for 1e-2, t = 0.9, three
# seeds) and 7e-3 leads from 1000 on: by 0.014 / 0.022 at 1000, 0.032 / 0.023 at 2000, 0.024 at 5000 (three seeds; 5e-3
# 0.017 behind it); at 1000 updates it is level on the plays (+0.009 / -0.001) and on llama_35m's shape (+0.007 /
# -0.010; 1.4e-2, its best at 600 updates, 0.017 behind on seed 0): never worse; at 2000 on the plays it leads by 0.011
# (seed 0). At 2,048 tokens an update, on the Python source, PRETRAIN_LR's 2e-2 times the factor, 1.4e-2, is level
# with 2e-2 at 1000 updates (-0.002, seed 0; session 64) and leads it at 2000 on both seeds (+0.010 / +0.020, by up to
# 0.043 mid-run; session 65), so the factor holds at any batch where the warm-up is in effect. There, from 1000
# updates, plumage_adamw now pretrains without it (PRETRAIN_LONG_RUN_LARGE_BATCH below) unless a floor is given or in
# per-layer mode; at 2000 updates 1e-2 (0.5 x) led 1.4e-2 by 0.021 on seed 0 (session 66), not yet enough to move it.
# The same factor holds there without the floor (session 67): where such a run pretrains as a large batch for its
# length (PRETRAIN_LONG_RUN_LARGE_BATCH, below the no-floor threshold), no floor with Fira's complement at 0.7 x the
# library's 1e-2, 7e-3, led 1e-2 at 2000 updates on every seed of three (+0.027 / +0.034 / +0.027, t = 12.1, ahead
# from update 750 on; 1.4e-2 0.006 behind 1e-2 on seed 0), and at 5000 updates on the same source read ~2.1 times the
# two are level (1e-2 − 7e-3 −0.023 / −0.026 / +0.039, t = 0.2; session 73). From 4,096 tokens an update (a large
# batch by its size) no factor: a long run there is unmeasured. plumage_adamw8bit takes the same factor since session
# 82, where its floor is m2's own warm-up too (below 2,048 tokens an update, or --v_floor_horizon none): at 5000 updates
# of 512 tokens on the Python source read once, 7e-3 was ahead of 1e-2 on every seed of three (+0.016 / +0.002 /
# +0.026, t = 2.1) and of GaLore's 8-bit recipe at its bracketed best, 3e-3 (2e-3 0.034 and 5e-3 0.047 behind it), by
# 0.020 over three seeds (-0.002 / +0.023 / +0.038, t = 1.7), where 1e-2 was level with it (+0.005: -0.018 / +0.021 /
# +0.012; docs/results.md §3, sessions 78-82); 5e-3 ended 0.009 behind 7e-3 there (seed 0). At 2000 updates 7e-3 led
# 1e-2 by 0.021 and 3e-3 by 0.013, level with 5e-3 (seed 0), and GaLore's 8-bit recipe at its bracketed best, 3e-3, by
# 0.059 (three seeds, every seed and evaluation, t = 24.8; sessions 83-84). At 1000 updates 7e-3 led 1e-2 by 0.015
# (t = 1.1, ahead on two of three; 5e-3 0.031 behind, seed 0) and GaLore's 8-bit recipe at its bracketed best, 5e-3, by
# 0.092 (t = 21.2; session 84).
PRETRAIN_LONG_RUN_LR: dict[tuple[str, str], tuple[int, float]] = {("plumage", "adamw"): (1000, 0.7),
                                                                  ("plumage", "adamw8bit"): (1000, 0.7)}


def _floor_in_effect(spec: OptimizerSpec, options: dict) -> str:
    """The v_floor a name runs with under the low-rank `options` given: theirs, else its family's."""
    return options.get("v_floor", family_defaults(spec)["v_floor"])


def _band(bands: tuple[tuple[int, float], ...], at: int, otherwise: float | None = None) -> float | None:
    """The value of the last band of ((from this up, value), ...) that `at` has reached; `otherwise` before the first."""
    return next((value for start, value in reversed(bands) if at >= start), otherwise)


def recommended_pretrain_lr(spec: OptimizerSpec, options: dict, tokens_per_update: int,
                            preset: str | None = None, num_updates: int | None = None,
                            grad_clipping: float = 0.0, projector: str | None = None) -> float:
    """The lr torchrun_main.py gives a name (under `preset`, with the low-rank `options` in effect, the derived
    v_floor included) at `tokens_per_update` for a run of `num_updates` when --lr is not given: PRETRAIN_CLIPPED_LR's
    band for `num_updates` where the run clips the global norm (`grad_clipping` > 0) at its norm or below; else
    PRETRAIN_LR's from its threshold up where the floor is m2 with its own warm-up, else PRETRAIN_BATCH_LR's band at
    `tokens_per_update` where `projector` (--projector) is the name's own, else recommended_lr (a preset keeps the lr it
    was measured with); times PRETRAIN_LONG_RUN_LR's factor from its number of updates up where m2's own warm-up is in
    effect, or no floor in a run that pretrains as a large batch for its length only (num_updates None: the run's
    length unknown, no factor)."""
    clipped_at, by_length = PRETRAIN_CLIPPED_LR.get((spec.family, spec.backend), (None, ()))
    if preset is None and clipped_at is not None and 0 < grad_clipping <= clipped_at:
        return _band(by_length, num_updates or 0)
    floor = None if preset is not None else _floor_in_effect(spec, options)
    m2_own_warm_up = floor == "m2" and options.get("v_floor_horizon") is None
    threshold, lr = PRETRAIN_LR.get((spec.family, spec.backend), (None, None))
    if not (m2_own_warm_up and threshold is not None and tokens_per_update >= threshold):
        lr = recommended_lr(spec, preset)
        if preset is None and projector in (None, spec.projector):
            lr = _band(PRETRAIN_BATCH_LR.get((spec.family, spec.backend), ()), tokens_per_update, lr)
    no_floor_for_its_length = floor == "none" and _large_batch_for_its_length_only(spec, tokens_per_update, num_updates)
    from_updates, factor = PRETRAIN_LONG_RUN_LR.get((spec.family, spec.backend), (None, 1.0))
    if ((m2_own_warm_up or no_floor_for_its_length) and from_updates is not None and num_updates is not None
            and num_updates >= from_updates):
        lr = float(f"{lr * factor:.6g}")  # 7e-3, not 0.006999999999999999 in the run's config
    return lr


# The floor's warm-up (v_floor_horizon, optimizers/moment_floor.py) when torchrun_main.py pretrains, as (from this many
# tokens an update up, horizon): plumage_adamw8bit's 200 updates from 2048 tokens instead of m2's ~1000, with the
# regular group at 2x the lr (above): +0.070 at 8 x 256 over m2 at one lr (three seeds; docs/results.md §3, session
# 36); below that m2's own (+0.007 for the 200 at 8 x 64 tokens, where m2's 2x alone gained 0.012). plumage_adamw had the
# same from session 36 to 55 (ahead of m2's own at 8 x 256 and 16 x 256 at the library's lr 1e-2, +0.05 and +0.03);
# each at its own best lr the two were level on llama_tiny and m2's own led on llama_35m's shape (session 55), so it
# now keeps m2's own at twice the lr (PRETRAIN_LR above; docs/results.md §3, session 56). 8-bit keeps the 200: on it
# m2's own at 2e-2 trailed the 200 at 1e-2 on llama_tiny at 8 x 256 (-0.012, every seed of three; session 56), and each
# at its bracketed best lr (the 200 at 1.4e-2, m2's own at 2.8e-2) the two are level there (-0.006, three seeds; session
# 58), and on llama_35m's shape too (the 200 at 1.4e-2, m2's own at 2e-2: +0.009 for m2's own, t = 0.8, three seeds;
# session 59), where float32's m2's own led by 0.035. The option's default stays None elsewhere (the classes,
# build_optimizer, run_glue.py).
PRETRAIN_V_FLOOR_HORIZON: dict[tuple[str, str], tuple[int, int]] = {("plumage", "adamw8bit"): (2048, 200)}


# Where torchrun_main.py pretrains without the floor: from this many tokens an update (total_batch_size x max_length)
# up, where neither --v_floor nor --v_floor_horizon is given. The floor's gain shrinks as the batch grows: H = 200
# against no floor, both with the 2x regular group (docs/results.md §3, sessions 35-37), +0.034 at 512 tokens an
# update, level at 2048 and 4096 (llama_tiny on the CPU), -0.047 at 16384 (llama_60m on an H200; three seeds each).
# plumage_adamw8bit likewise since session 41: with the complement below, no floor led its 200-update warm-up (without
# the complement) by 0.054 at 16 x 256 tokens, on every seed (three, Python source read once); without the complement
# none trailed that warm-up by 0.017 (the plays, seed 0, session 39). On llama_35m's shape, where m2's own warm-up led the
# 200 up to 2048 tokens (sessions 53-56), at 16 x 256 tokens m2's own at 2e-2 was level with none and Fira's complement
# at 1e-2 (+0.007 for the floor, seed 0; session 58): this threshold stays.
PRETRAIN_NO_FLOOR_FROM_TOKENS: dict[tuple[str, str], int] = {("plumage", "adamw"): 4096, ("plumage", "adamw8bit"): 4096}


# Where a long run pretrains as a large batch does (no floor, Fira's complement below; its lr: PRETRAIN_LONG_RUN_LR),
# as (from this many tokens an update up, from this many updates (--num_training_steps) up), not in per-layer mode
# (which holds no full gradient for the complement, so keeps the floor). The floor is a warm-up: its gain fades with
# the run's length, while the complement, which costs over 300 updates at this batch with the floor (session 39), pays
# over a long run as it does from 4,096. On llama_tiny at 8 x 256 tokens an update on Python source read once, 2000 updates
# (docs/results.md §3, sessions 66-67): no floor with Fira's complement at 1e-2 3.4599 / 3.4734 (seeds 0 / 1) against
# m2's own warm-up at 1.4e-2 (then the default) 3.5244 / 3.5144 and GaLore's recipe at its bracketed best, 7e-3, 3.5232
# / 3.5419: +0.066 over GaLore, ahead at every evaluation; at 1000 updates (seed 0) 3.8360 against 3.8735 and 3.9188.
# Its lr there is PRETRAIN_LONG_RUN_LR's 0.7 x 1e-2 since session 67: at 7e-3, +0.096 over GaLore (three seeds, t = 25.7).
PRETRAIN_LONG_RUN_LARGE_BATCH: dict[tuple[str, str], tuple[int, int]] = {("plumage", "adamw"): (2048, 1000)}


def pretrains_as_large_batch(spec: OptimizerSpec, tokens_per_update: int, num_updates: int | None,
                             threshold: int | None) -> bool:
    """Whether torchrun_main.py gives a name a large batch's setting whose own threshold is `threshold` tokens an
    update (None: the name has none): from that many tokens an update up, or where PRETRAIN_LONG_RUN_LARGE_BATCH says
    a run this long at this batch pretrains as a large batch does (num_updates None: the run's length unknown)."""
    if threshold is None:
        return False
    return tokens_per_update >= threshold or _long_enough_for_a_large_batch(spec, tokens_per_update, num_updates)


def _long_enough_for_a_large_batch(spec: OptimizerSpec, tokens_per_update: int, num_updates: int | None) -> bool:
    """Whether PRETRAIN_LONG_RUN_LARGE_BATCH says a run this long at this batch pretrains as a large batch does."""
    tokens, updates = PRETRAIN_LONG_RUN_LARGE_BATCH.get((spec.family, spec.backend), (None, None))
    return (tokens is not None and num_updates is not None and not spec.per_layer
            and tokens_per_update >= tokens and num_updates >= updates)


def _large_batch_for_its_length_only(spec: OptimizerSpec, tokens_per_update: int, num_updates: int | None) -> bool:
    """Whether a run pretrains as a large batch because it is long (PRETRAIN_LONG_RUN_LARGE_BATCH) at a batch below
    the name's no-floor threshold (PRETRAIN_NO_FLOOR_FROM_TOKENS), the band where its lr was measured."""
    threshold = PRETRAIN_NO_FLOOR_FROM_TOKENS.get((spec.family, spec.backend))
    return (threshold is not None and tokens_per_update < threshold
            and _long_enough_for_a_large_batch(spec, tokens_per_update, num_updates))


def recommended_v_floor(spec: OptimizerSpec, options: dict, tokens_per_update: int,
                        preset: str | None = None, num_updates: int | None = None) -> str | None:
    """The v_floor torchrun_main.py gives a name (under `preset`, with the low-rank `options` given) at
    `tokens_per_update` for a run of `num_updates`: 'none' where it pretrains as a large batch
    (PRETRAIN_NO_FLOOR_FROM_TOKENS, PRETRAIN_LONG_RUN_LARGE_BATCH) and neither v_floor nor v_floor_horizon is given,
    else None (the class's own floor; a preset keeps what it was measured with)."""
    threshold = PRETRAIN_NO_FLOOR_FROM_TOKENS.get((spec.family, spec.backend))
    if preset is not None or {"v_floor", "v_floor_horizon"} & options.keys():
        return None
    return "none" if pretrains_as_large_batch(spec, tokens_per_update, num_updates, threshold) else None


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
                         preset: str | None = None, num_updates: int | None = None) -> dict[str, Any]:
    """The complement options torchrun_main.py gives a name (under `preset`, with the low-rank `options` given) at
    `tokens_per_update` for a run of `num_updates`: PRETRAIN_COMPLEMENT's where it pretrains as a large batch (from
    its threshold up, or PRETRAIN_LONG_RUN_LARGE_BATCH), no residual option is given and the name is not per-layer;
    else {} (the class's own: none for plumage_adamw; a preset keeps what it was measured with). The complement names
    every residual option, so any one of them given stops the derivation."""
    threshold, complement = PRETRAIN_COMPLEMENT.get((spec.family, spec.backend), (None, {}))
    if preset is not None or spec.per_layer or complement.keys() & options.keys():
        return {}
    return dict(complement) if pretrains_as_large_batch(spec, tokens_per_update, num_updates, threshold) else {}


def recommended_v_floor_horizon(spec: OptimizerSpec, options: dict, tokens_per_update: int,
                                preset: str | None = None) -> int | None:
    """The v_floor_horizon torchrun_main.py gives a name (under `preset`, with the low-rank `options` given) at
    `tokens_per_update` when the flag is not given: PRETRAIN_V_FLOOR_HORIZON's from its threshold up where the floor
    in effect is 'm2', else None (m2's own warm-up below it; another floor has no warm-up to shape; a preset keeps
    m2's own, as every preset was measured)."""
    threshold, horizon = PRETRAIN_V_FLOOR_HORIZON.get((spec.family, spec.backend), (None, None))
    if preset is not None or threshold is None or tokens_per_update < threshold:
        return None
    return horizon if _floor_in_effect(spec, options) == "m2" else None


# Where torchrun_main.py pretrains PLUMAGE's draws over a long run's first updates only (sample_until: from then on each
# refresh keeps GaLore's top-r basis), as (from this many updates (--num_training_steps) up, the update the draws end
# at), where --sample_until is not given, the projector in effect samples and no preset is named. The draws' gain over
# GaLore's Adafactor recipe is a warm-up's: +0.108 at 600 updates of 512 tokens (five seeds), +0.023 at 2000 (three;
# sessions 42 and 51), and at 5000 they lead it to update 1000 and trail from 1250 on, ending 0.053 behind (three seeds;
# sessions 76-77). With the draws until update 1000 and the basis after, at the draws' lr (1e-2), 5000 updates end 0.036
# ahead of the draws throughout and still 0.017 behind GaLore's recipe at its best lr (3e-3), each on every seed of
# three (docs/results.md §3, session 77). Between 2000 and 5000 updates it is unmeasured. Those runs read the plays 1.9
# times; on Python source read once the draws until 1000 trailed the draws throughout by 0.014 (seed 0, session 80).
# Since session 81 plumage_adafactor's own projector does not sample: the rule holds for --projector plumage.
PRETRAIN_SAMPLE_UNTIL: dict[tuple[str, str], tuple[int, int]] = {("plumage", "adafactor"): (5000, 1000)}


def recommended_sample_until(spec: OptimizerSpec, options: dict, projector: str | None, preset: str | None = None,
                             num_updates: int | None = None) -> int | None:
    """The sample_until torchrun_main.py gives a name (under `preset`, with the low-rank `options` and the --projector
    given) for a run of `num_updates`: PRETRAIN_SAMPLE_UNTIL's from its number of updates up where the projector in
    effect is PLUMAGE's and --sample_until is not given, else None (sample throughout; a preset keeps what it was
    measured with; num_updates None: the run's length unknown)."""
    from_updates, until = PRETRAIN_SAMPLE_UNTIL.get((spec.family, spec.backend), (None, None))
    if preset is not None or from_updates is None or num_updates is None or "sample_until" in options:
        return None
    return until if (projector or spec.projector) == "plumage" and num_updates >= from_updates else None
