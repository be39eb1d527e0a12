"""The fair pretraining protocol: every arm at its own best lr, then several seeds at that lr, paired against GaLore.

    OMP_NUM_THREADS=1 python benchmarks/pretrain_protocol.py --jobs 2          # sweep, seeds, docs/protocol_compare.md
    python benchmarks/pretrain_protocol.py --report-only                     # redraw from finished runs
    python benchmarks/pretrain_protocol.py --arms adamw,galore_recipe         # a subset of arms

1. Sweep: each arm runs seed `--sweep_seed` at every lr of its grid (the same lr on every param group of that
   arm; each arm's projected-back scale as its method documents it: GaLore's published 0.25, PLUMAGE's 1.0).
   The arm's lr is the one with the lowest final eval loss; a run that stops on a non-finite loss counts as +inf.
2. Seeds: the arm runs every seed of `--seeds` at that lr.
3. Report: per arm the per-seed final eval losses, mean ± sample standard deviation, the largest rise between
   two consecutive evaluations (a divergence shows as a jump), and the paired difference to the reference arm
   (GaLore's published recipe) with its paired t statistic.

Every run is one torchrun_main.py process of llama_tiny on the bundled corpus; all arms share model, data order
(per seed), warmup, cosine schedule, rank and refresh interval. Finished runs are reused (run_cache).
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from plot_runs import load_run, plot_losses  # noqa: E402
from plumage_flags import plumage_flags, with_family_pins  # noqa: E402 - benchmarks/ is on sys.path when this file runs
from run_cache import run_or_reuse  # noqa: E402 - benchmarks/ is on sys.path when this file runs

from galore_plumage.training import DIVERGED  # noqa: E402

LRS = (1e-3, 3e-3, 1e-2)
PAPER = plumage_flags()
NORM_MATCHED = plumage_flags(sampled_step="norm_matched")
WARMUP_FRACTION = "--warmup_fraction"  # the protocol's own arm flag (not torchrun_main.py's): warmup = steps x it
GAPS = (("", []), ("_gap200", ["--update_proj_gap", "200"]))  # (label suffix, flags): the protocol's τ, and τ = 200
# the default of session 14 but for its realignment: κ = 1, cap 1, the complement at a quarter of Fira's step with the
# steady limiter, each column capped at half the basis's step, on the first 10 updates after a refresh
H10 = dict(max_inv_p=1, resample_every=1, residual="norm_matched", residual_limiter="steady", residual_scale=0.25,
           residual_cap=0.5, residual_horizon=10)


def adafactor_draws(**overrides) -> list[str]:
    """plumage_adafactor's draws as H10 sets them, with `overrides` (Adafactor refuses row_bias_correction, an AdamW
    option: left out)."""
    return plumage_flags(**{**H10, **overrides}, row_bias_correction=None)


ADAFACTOR_DRAWS = adafactor_draws()
# ... at GaLore's scale 0.25 with the regular group at 2x (plumage_adafactor's default since session 42)
ADAFACTOR_DRAWS_RECIPE_RATIO2 = ["--beta1", "0.9", "--galore_scale", "0.25", "--pool_bf16", "--regular_lr_ratio", "2"]


def sgdm_paper(**overrides) -> list[str]:
    """The paper's estimator as plumage_sgdm ran it until session 46 (momentum carried by rule m; no
    row_bias_correction, an AdamW option), with `overrides`."""
    return plumage_flags(row_bias_correction=None, realign="m", **overrides)


# label -> (optimizer, extra flags, lr grid, run in this order: the likeliest best first). Every arm names its scale
# and its PLUMAGE options, so an arm does not move when a default changes. Grids were widened where the best lr fell
# on an edge of the first one, and refined between 3e-3 and 1e-2 for GaLore and the default (5e-3 and 7e-3): at 5e-3
# GaLore's seed 0 gained 0.06 over 3e-3.
ARMS: dict[str, tuple[str, list[str], tuple[float, ...]]] = {
    "adamw": ("adamw", [], (3e-4, 1e-3, 3e-3, 1e-2)),
    # GaLore's published recipe: scale 0.25 on the projected update, the one lr on every group
    "galore_recipe": ("galore_adamw", ["--galore_scale", "0.25"], (1e-3, 3e-3, 5e-3, 7e-3, 1e-2, 3e-2)),
    # ... with each new singular vector's sign agreeing with the previous basis (its kept moments keep their direction)
    "galore_recipe_aligned": ("galore_adamw", ["--galore_scale", "0.25", "--align_signs"], (3e-3,)),
    "plumage_paper": ("plumage_adamw", ["--galore_scale", "1.0", *PAPER], (1e-4, 3e-4, 1e-3)),
    # ... its refresh through solver="gram64" (float64 eigh of the smaller Gram: p as accurate as float32 SVD's or more,
    # 0.59-0.68x its time on a CPU): issue 15's check before solver="auto" takes it for PLUMAGE's spectrum on a CPU
    "plumage_paper_gram64": ("plumage_adamw", ["--galore_scale", "1.0", *PAPER, "--solver", "gram64"], (3e-4,)),
    # the remedies, one at a time on the paper's estimator (scale 1, as the paper documents it)
    "plumage_cap3": ("plumage_adamw", ["--galore_scale", "1.0", *plumage_flags(max_inv_p=3)], LRS),
    "plumage_norm_matched": ("plumage_adamw", ["--galore_scale", "1.0", *NORM_MATCHED], LRS),
    "plumage_row_age": ("plumage_adamw", ["--galore_scale", "1.0", *plumage_flags(row_bias_correction=True)],
                        (1e-3,)),
    # GaLore's recipe with the norm-matched sampled step
    "plumage_norm_matched_recipe": ("plumage_adamw", ["--galore_scale", "0.25", *NORM_MATCHED], (*LRS, 3e-2)),
    # ... and the paper's κ = 1: the sampled rows drawn again before every update from the refresh's top 2r vectors
    "plumage_nm_resample": ("plumage_adamw", ["--galore_scale", "0.25",
                                              *plumage_flags(sampled_step="norm_matched", resample_every=1)], (1e-3, 3e-3, 1e-2)),
    # κ = 1 with Adam's step on every drawn row: uncapped (the paper's estimator on the 2r pool), and capped at 1
    # (no row amplified: GaLore's step on a randomly completed basis), the default since session 7
    "plumage_adaptive_resample": ("plumage_adamw", ["--galore_scale", "0.25", *plumage_flags(resample_every=1)],
                                  (3e-3, 1e-2, 1e-3)),
    "plumage_cap1_resample": ("plumage_adamw", ["--galore_scale", "0.25",
                                                *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3, 1e-2, 1e-3, 5e-3, 7e-3)),
    # the default with a longer κ: a drawn row keeps its moments for κ updates before the next draw (probed at the
    # default's lr first; a grid is widened only for an arm that comes close)
    "plumage_cap1_kappa4": ("plumage_adamw", ["--galore_scale", "0.25",
                                              *plumage_flags(max_inv_p=1, resample_every=4)], (3e-3,)),
    "plumage_cap1_kappa10": ("plumage_adamw", ["--galore_scale", "0.25",
                                               *plumage_flags(max_inv_p=1, resample_every=10)], (3e-3,)),
    # the default drawing from a wider pool (3r, 4r singular vectors kept per weight): more directions visited
    "plumage_cap1_pool3": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_factor", "3",
                                             *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
    "plumage_cap1_pool4": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_factor", "4",
                                             *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
    # the default with each row bias-corrected by its own age: a row drawn anew (transported M = V = 0) starts at
    # ±1 instead of Adam's (1 − β1)/√(1 − β2) ≈ 3.2 with the global correction. Tests whether that 3.2 helps.
    "plumage_cap1_row_age": ("plumage_adamw", ["--galore_scale", "0.25", *plumage_flags(
        max_inv_p=1, resample_every=1, row_bias_correction=True)], (3e-3,)),
    # between the default (cap 1) and the paper's κ = 1 (uncapped): a drawn tail row amplified up to 2×
    "plumage_cap2_resample": ("plumage_adamw", ["--galore_scale", "0.25",
                                                *plumage_flags(max_inv_p=2, resample_every=1)], (3e-3,)),
    # the default with no pool (κ = 0: draw once per refresh): GaLore's memory
    "plumage_cap1_kappa0": ("plumage_adamw", ["--galore_scale", "0.25",
                                              *plumage_flags(max_inv_p=1, resample_every=0)], (3e-3, 1e-2)),
    # the default at GaLore's optimizer memory: its pool (2r vectors) and moments at rank 52 hold as many floats as
    # GaLore's basis (r) and moments at rank 64 over a llama_tiny layer (9760 · 52 ≈ 7968 · 64)
    "plumage_cap1_equal_memory": ("plumage_adamw", ["--galore_scale", "0.25", "--rank", "52",
                                                    *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
    # the default with its pool stored in bfloat16 (--pool_bf16): GaLore's optimizer memory at the same rank
    "plumage_cap1_pool_bf16": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16",
                                                 *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
    # ... the same flags run again at session 10's arithmetic (the update in one addmm, the draw's moments moved by a
    # gather): a new label, so the cache does not hand back the runs of the older library under plumage_cap1_pool_bf16
    "plumage_cap1_pool_bf16_fused": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16",
                                                       *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
    # ... and its refresh through solver="gram" (float32 eigh of the smaller Gram matrix, 3-4x faster than the SVD on
    # a CPU, exact over the pool: tests/projectors/test_solver_accuracy.py): the same quality is what issue 15 asks
    "plumage_cap1_pool_bf16_gram": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", "--solver", "gram",
                                                      *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
    # Fira's residual (arXiv 2410.01623): the gradient outside the basis moves at the step size Adam gives the basis,
    # on GaLore's recipe (Fira's own setting: scale 0.25 on the projected update) and on the default
    "galore_recipe_residual": ("galore_adamw", ["--galore_scale", "0.25", "--residual", "norm_matched"],
                               (3e-3, 5e-3, 7e-3)),
    # the default since session 11
    "plumage_cap1_residual": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
        max_inv_p=1, resample_every=1, residual="norm_matched")], (3e-3, 5e-3, 7e-3)),
    # ... with the complement's step scaled as the basis's is (residual_scale = scale = 0.25): Fira's unscaled complement
    # moves each column 4x as far as the basis moves it
    "plumage_cap1_residual_scaled": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
        max_inv_p=1, resample_every=1, residual="norm_matched", residual_scale=0.25)],
                                     (5e-3, 1e-2, 7e-3)),
    # the default with the limiter's reference not taken on a refresh step (residual_limiter "steady"): Fira's limiter
    # takes it there, where the complement of a basis fitted to that gradient is near zero, and then holds the
    # complement at 3-5 % of its size for the rest of the interval (docs/complement_anatomy.md); at full size, and at a
    # quarter
    **{f"plumage_cap1_steady{name}{gap_name}": ("plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
        max_inv_p=1, resample_every=1, residual="norm_matched", residual_limiter="steady", residual_scale=scale), *gap],
        (5e-3, 3e-3, 7e-3) if name == "_quarter" and gap_name != "_gap20" else (5e-3,))
       for name, scale in (("", 1.0), ("_quarter", 0.25), ("_tenth", 0.1))
       for gap_name, gap in (("", []), ("_gap20", ["--update_proj_gap", "20"]), ("_gap200", ["--update_proj_gap", "200"]))},
    # the refresh interval τ, for GaLore's recipe and the default alike (the protocol's τ = 40 is neither's tuned value)
    **{f"{label}_gap{gap}": (optimizer, [*flags, "--update_proj_gap", str(gap)], lrs[gap])
       for label, optimizer, flags, lrs in (
           ("galore_recipe", "galore_adamw", ["--galore_scale", "0.25"],
            {20: (3e-3, 5e-3), 100: (3e-3,), 200: (5e-3, 3e-3, 7e-3)}),
           ("plumage_cap1", "plumage_adamw", ["--galore_scale", "0.25", *plumage_flags(max_inv_p=1, resample_every=1)],
            dict.fromkeys((20, 100, 200), (3e-3,))),
           ("plumage_cap1_residual", "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
               max_inv_p=1, resample_every=1, residual="norm_matched")], dict.fromkeys((20, 100, 200), (5e-3,))))
       for gap in (20, 100, 200)},
    # the basis refreshed from a running average of the full gradient (refresh_ema f) instead of one batch's gradient,
    # whose top-r subspace is partly that batch's noise: on the default of session 12 and on GaLore's recipe
    **{f"{label}_ema{round(factor * 100)}{gap_name}": (optimizer, [*flags, "--refresh_ema", str(factor), *gap], (5e-3,))
       for label, optimizer, flags in (
           ("plumage_cap1_steady_quarter", "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
               max_inv_p=1, resample_every=1, residual="norm_matched", residual_limiter="steady",
               residual_scale=0.25)]),
           ("galore_recipe", "galore_adamw", ["--galore_scale", "0.25"]))
       for factor in (0.9, 0.97)
       for gap_name, gap in GAPS},
    # ... with each column of its complement held to `cap` x the basis's step on that column (residual_cap): Fira's φ
    # moves it by ‖G⊥‖/‖R‖ x that step, which grows as the basis goes stale (at τ = 200 the complement costs 0.06)
    **{f"plumage_cap1_steady_quarter_cap{str(cap).replace('.', '')}{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
            max_inv_p=1, resample_every=1, residual="norm_matched", residual_limiter="steady", residual_scale=0.25,
            residual_cap=cap), *gap], (5e-3, 3e-3, 7e-3) if cap == 0.5 else (5e-3,))
       for cap in (1.0, 0.5, 0.25) for gap_name, gap in GAPS},
    # ... and moved only on the first H updates after each refresh (residual_horizon): at τ = 200 the capped complement
    # fell 0.03 behind the arm without one in the first interval, whose basis was fitted to update 1's gradient
    **{f"plumage_cap1_steady_quarter_cap05_h{horizon}{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
            max_inv_p=1, resample_every=1, residual="norm_matched", residual_limiter="steady", residual_scale=0.25,
            residual_cap=0.5, residual_horizon=horizon), *gap], (5e-3, 3e-3, 7e-3))
       for horizon in (5, 10, 20, 40) for gap_name, gap in GAPS},
    # ... with the moments carried otherwise across a refresh and a draw (the default's realign is mv), or each basis
    # row bias-corrected by its own age: the complement's gain lies in the first updates after a refresh, where the
    # entering directions' moments are young
    **{f"plumage_cap1_steady_quarter_cap05_h10_{variant}{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(**H10, **options), *gap], lrs)
       for variant, options in (("realign_none", {"realign": "none"}), ("realign_m", {"realign": "m"}),
                                ("meansplit", {"realign": "mv_meansplit"}), ("rowbias", {"row_bias_correction": True}))
       for gap_name, gap, lrs in (("", [], (5e-3,) if variant != "meansplit" else (3e-3, 5e-3, 7e-3, 1e-2)),
                                  ("_gap200", ["--update_proj_gap", "200"],
                                   (5e-3,) if variant != "meansplit" else (3e-3, 5e-3, 7e-3, 1e-2, 1.4e-2)))},
    # LDAdam's realignment (mean and variance carried apart) on GaLore's recipe, and on the default without its complement
    **{f"galore_recipe_meansplit{gap_name}": ("galore_adamw", ["--galore_scale", "0.25", "--realign", "mv_meansplit", *gap],
                                              (5e-3,))
       for gap_name, gap in GAPS},
    **{f"plumage_cap1_pool_bf16_no_complement_meansplit{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
            max_inv_p=1, resample_every=1, realign="mv_meansplit"), *gap], (5e-3, 7e-3, 1e-2, 1.4e-2))
       for gap_name, gap in GAPS},
    # ... with another scale on the projected update than GaLore's 0.25 (the lr, on every group, stays)
    **{f"plumage_cap1_steady_quarter_cap05_h10_scale{str(scale).replace('.', '')}{gap_name}": (
        "plumage_adamw", ["--galore_scale", str(scale), "--pool_bf16", *plumage_flags(**H10), *gap], (5e-3,))
       for scale in (0.18, 0.35) for gap_name, gap in GAPS},
    # ... a short horizon with a larger complement: half Fira's step, or each column up to the basis's step
    **{f"plumage_cap1_steady_{scale_name}_cap{str(cap).replace('.', '')}_h10{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(
            max_inv_p=1, resample_every=1, residual="norm_matched", residual_limiter="steady", residual_scale=scale,
            residual_cap=cap, residual_horizon=10), *gap], (5e-3,))
       for scale_name, scale, cap in (("half", 0.5, 0.5), ("quarter", 0.25, 1.0), ("half", 0.5, 1.0))
       for gap_name, gap in GAPS},
    # the default of session 12 without its complement (residual "none"), at the protocol's τ and at τ = 200
    **{f"plumage_cap1_pool_bf16_no_complement{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(max_inv_p=1, resample_every=1), *gap],
        (5e-3, 3e-3, 7e-3, 1e-2)) for gap_name, gap in GAPS},
    # the default's own randomness: run at --seeds 0 (model and data fixed), its draws seeded apart (--projection_seed):
    # the spread of these runs is the part of the seed spread the estimator adds
    **{f"plumage_cap1_steady_quarter_cap05_h10_meansplit_draws{draws}{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", *plumage_flags(**H10, realign="mv_meansplit"),
                          "--projection_seed", str(draws), *gap], (7e-3,) if not gap else (1e-2,))
       for draws in (101, 102, 103, 104) for gap_name, gap in GAPS},
    # ... refreshed through solver="gram" (float32 eigh of the smaller Gram, 0.37-0.46x galore-torch's SVD on a CPU,
    # exact over the pool): issue 15's quality check on the default of session 14
    **{f"plumage_cap1_steady_quarter_cap05_h10_meansplit_gram{gap_name}": (
        "plumage_adamw", ["--galore_scale", "0.25", "--pool_bf16", "--solver", "gram",
                          *plumage_flags(**H10, realign="mv_meansplit"), *gap], (7e-3,) if not gap else (1e-2,))
       for gap_name, gap in GAPS},
    # GaLore's recipe with v_floor (V ← max(V, M²) before each low-rank update: what the default's mv_meansplit does to
    # every staying row at its draws, and all of the default's lead over GaLore's recipe in session 15), and with the
    # bound taken after bias correction instead (no warm-up of the low-rank step): which of the floor's two effects pays
    **{f"galore_recipe_vfloor{name}{gap_name}": ("galore_adamw", ["--galore_scale", "0.25", "--v_floor", floor, *gap], lrs)
       for name, floor, lrs in (("", "m2", (1e-2, 1.4e-2, 7e-3, 2e-2, 5e-3)), ("_corrected", "m2_corrected", (5e-3, 7e-3, 1e-2)))
       for gap_name, gap in GAPS},
    # ... with the floor's warm-up stretched over H updates (v_floor_horizon; m2 alone is H = 1 / (1 − β2) = 1000): its
    # gain over GaLore fades as the warm-up ends (+0.07 at 600 updates, +0.01 at 5000), so does a longer one keep it?
    **{f"galore_recipe_vfloor_h{horizon}{gap_name}": ("galore_adamw", ["--galore_scale", "0.25", "--v_floor", "m2",
                                                                       "--v_floor_horizon", str(horizon), *gap],
                                                      (7e-3, 1e-2, 1.4e-2))
       for horizon in (200, 2000, 3000, 5000, 10000) for gap_name, gap in GAPS},
    # ... refreshed through solver="gram" (float32 eigh of the smaller Gram: 0.36-0.41x galore-torch's SVD on a CPU,
    # 0.24-0.85x on an H100): issue 15's quality check before plumage_adamw's default solver became "gram"
    **{f"galore_recipe_vfloor_gram{gap_name}": ("galore_adamw", ["--galore_scale", "0.25", "--v_floor", "m2", "--solver",
                                                                 "gram", *gap], (1.4e-2, 1e-2))
       for gap_name, gap in GAPS},
    # ... with the regular group (embeddings, norms, head) at 2x the arm's lr: plumage_adamw's default in pretraining since
    # session 33 (--regular_lr_ratio 2; the regular group's own lr paid on every shape larger than llama_tiny, session 32)
    **{f"galore_recipe_vfloor_gram_ratio2{gap_name}": ("galore_adamw", [
        "--galore_scale", "0.25", "--v_floor", "m2", "--solver", "gram", "--regular_lr_ratio", "2", *gap], (1e-2, 7e-3, 1.4e-2))
       for gap_name, gap in GAPS},
    # ... the same without the floor: on an H200 at llama_60m (64 x 256 tokens an update, session 35) the default fell
    # behind GaLore's recipe after update 400; the floor's warm-up binds wherever the batch makes gradients sign-steady
    **{f"galore_recipe_gram_ratio2{gap_name}": ("galore_adamw", [
        "--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio", "2", *gap], (1e-2, 7e-3, 1.4e-2))
       for gap_name, gap in GAPS},
    # ... at 3x (the best of 1x-3x on the CPU's two deepest shapes, session 32): plumage_adamw's default from 4096 tokens
    # an update with a larger regular group, the next lever where it is level with GaLore's recipe (session 37)
    "galore_recipe_gram_ratio3": ("galore_adamw", ["--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio",
                                                   "3"], (1e-2,)),
    # ... with Fira's complement (the gradient outside the basis at Adam's per-column step, arXiv 2410.01623): at 8 x 64
    # tokens it cost at tau = 200 (session 13), a noisy raw gradient; a large batch makes that gradient less noisy, so
    # does it pay where everything else is level (session 38)? As Fira runs it (residual_scale 1, its limiter, whose
    # reference taken at a refresh holds the complement at a few % of its size: docs/complement_anatomy.md), and as
    # session 13 found best at 8 x 64 tokens (a quarter, the steady limiter, each column capped at half the basis's)
    **{f"galore_recipe_gram_ratio2_{name}": ("galore_adamw", [
        "--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio", "2", "--residual", "norm_matched", *flags],
        (1e-2, 5e-3, 7e-3))
       for name, flags in (("fira", ["--residual_scale", "1"]),
                           ("steady_quarter_cap05", ["--residual_limiter", "steady", "--residual_scale", "0.25",
                                                     "--residual_cap", "0.5"]))},
    # ... and on the pretraining default below 4096 tokens an update (the floor's 200-update warm-up, 2x): does the
    # complement that pays at 16 x 256 tokens (session 38) pay at the demo's 8 x 256 too, where the floor is kept?
    "galore_recipe_vfloor_h200_gram_ratio2_fira": ("galore_adamw", [
        "--galore_scale", "0.25", "--v_floor", "m2", "--v_floor_horizon", "200", "--solver", "gram", "--regular_lr_ratio",
        "2", "--residual", "norm_matched", "--residual_scale", "1"], (1e-2, 7e-3, 1.4e-2)),
    # ... with the floor's warm-up over H updates instead of m2's ~1000 (v_floor_horizon): the lead the floor gives early
    # without the damping it keeps through the middle of a large-batch run
    **{f"galore_recipe_vfloor_h{horizon}_gram_ratio2{gap_name}": ("galore_adamw", [
        "--galore_scale", "0.25", "--v_floor", "m2", "--v_floor_horizon", str(horizon), "--solver", "gram",
        "--regular_lr_ratio", "2", *gap], (1e-2,))
       for horizon in (50, 100, 200, 300) for gap_name, gap in GAPS},
    # ... and with the default's complement (Fira's, a quarter step, steady limiter, cap 0.5, first 10 updates after a
    # refresh): with the floor on both sides, the default differs from this arm only by PLUMAGE's draws
    **{f"galore_recipe_vfloor_h10{gap_name}": ("galore_adamw", [
        "--galore_scale", "0.25", "--v_floor", "m2", "--residual", "norm_matched", "--residual_limiter", "steady",
        "--residual_scale", "0.25", "--residual_cap", "0.5", "--residual_horizon", "10", *gap], (1e-2, 7e-3, 1.4e-2))
       for gap_name, gap in GAPS},
    # does PLUMAGE's sampling add anything to the floor (the default since session 17 is GaLore's top-r basis + v_floor)?
    # Its draws made once per refresh (κ = 0, moments kept as GaLore keeps them), or before every update from the top 2r
    # vectors (κ = 1, pool in bfloat16, moments carried by B with entering rows from zero); 1/p capped at 1 in both
    **{f"plumage_cap1_{name}_vfloor{gap_name}": ("plumage_adamw", [
        "--galore_scale", "0.25", *pool, *plumage_flags(max_inv_p=1, resample_every=kappa, realign=realign),
        "--v_floor", "m2", *gap], (1e-2, 1.4e-2, 7e-3))
       for name, kappa, realign, pool in (("kappa0", 0, "none", []), ("resample", 1, "mv", ["--pool_bf16"]))
       for gap_name, gap in GAPS},
    # GaLore's recipe, and with the floor, each with a longer lr warm-up than the protocol's 10 % of the updates (every
    # group): the floor is a warm-up of the low-rank weights (session 16), so does a longer plain warm-up give GaLore
    # the same gain?
    **{f"{label}_warmup{round(100 * fraction)}": (optimizer, [*flags, WARMUP_FRACTION, str(fraction)], lrs)
       for fraction in (0.25, 0.5)
       for label, optimizer, flags, lrs in (
           ("galore_recipe", "galore_adamw", ["--galore_scale", "0.25"], (5e-3, 7e-3, 1e-2, 1.4e-2)),
           ("galore_recipe_vfloor", "galore_adamw", ["--galore_scale", "0.25", "--v_floor", "m2"], (1e-2, 1.4e-2, 2e-2)))},
    # ... each with the regular group (embeddings, norms, head: 57 % of llama_tiny's weights, full AdamW) at its own lr
    # (--regular_lr) and the low-rank group at the arm's: the floor's best lr, 1e-2 at 5000 updates, is 3.3x GaLore's,
    # and every group took it; through the middle of a long run the floor trails GaLore (sessions 26-27). Is that the
    # regular group's lr?
    # (At regular 3e-3 and a low-rank 1e-2 both fell behind GaLore's recipe at 3e-3 and the floor at 1e-2, by 0.10-0.12
    # at update 1000 and 0.17-0.18 at 1750, session 28: the regular group wants the high lr. So the other way round:
    # the regular group at 1e-2, the low-rank group lower.)
    # (On llama_35m, whose regular group is 37 % of the weights, GaLore's best regular lr was 5e-2 or above on seed 0,
    # the floor's 3e-2: the 3e-2 to 1e-1 grids, session 30.)
    **{f"{label}_regular{regular_lr}": (optimizer, [*flags, "--regular_lr", regular_lr], lrs[regular_lr])
       for label, optimizer, flags, lrs in (
           ("galore_recipe", "galore_adamw", ["--galore_scale", "0.25"],
            {"3e-3": (1e-2, 5e-3, 7e-3), "1e-2": (3e-3, 5e-3, 2e-3, 7e-3), "2e-2": (5e-3, 3e-3, 7e-3, 2e-3),
             "3e-2": (5e-3, 7e-3, 3e-3), "5e-2": (3e-3, 5e-3, 7e-3), "1e-1": (5e-3,)}),
           ("galore_recipe_vfloor", "galore_adamw", ["--galore_scale", "0.25", "--v_floor", "m2"],
            {"3e-3": (1e-2, 1.4e-2), "1e-2": (5e-3, 7e-3, 3e-3, 1e-2, 1.4e-2, 2e-2), "2e-2": (1e-2, 1.4e-2, 7e-3),
             "3e-2": (1e-2, 7e-3), "5e-2": (1e-2,)}))
       for regular_lr in ("3e-3", "1e-2", "2e-2", "3e-2", "5e-2", "1e-1") if regular_lr in lrs},
    # 8-bit AdamW (bitsandbytes' blockwise states): GaLore's recipe, and with the floor (plumage_adamw8bit's default,
    # which dequantizes both moments and requantizes V before each low-rank update)
    "galore8bit_recipe": ("galore_adamw8bit", ["--galore_scale", "0.25"], (5e-3, 1e-2, 3e-3)),
    "galore8bit_recipe_vfloor": ("galore_adamw8bit", ["--galore_scale", "0.25", "--v_floor", "m2"], (1e-2, 1.4e-2, 7e-3)),
    # ... refreshed through the Gram's eigh: plumage_adamw8bit's default since session 20
    "galore8bit_recipe_vfloor_gram": ("galore_adamw8bit", ["--galore_scale", "0.25", "--v_floor", "m2", "--solver", "gram"],
                                      (1e-2,)),
    # ... with the regular group at 2x (plumage_adamw's pretraining default since session 33): does the 8-bit default want it?
    "galore8bit_recipe_vfloor_gram_ratio2": ("galore_adamw8bit", ["--galore_scale", "0.25", "--v_floor", "m2", "--solver",
                                                                  "gram", "--regular_lr_ratio", "2"], (1e-2,)),
    # ... with the floor's warm-up over 200 updates (the float32 candidate of session 35), at one lr and at 2x
    **{f"galore8bit_recipe_vfloor_h200_gram{ratio_name}": ("galore_adamw8bit", [
        "--galore_scale", "0.25", "--v_floor", "m2", "--v_floor_horizon", "200", "--solver", "gram", *ratio], (1e-2,))
       for ratio_name, ratio in (("", []), ("_ratio2", ["--regular_lr_ratio", "2"]))},
    # ... and without the floor, at 2x: plumage_adamw's pretraining default from 4096 tokens an update (session 37)
    "galore8bit_recipe_gram_ratio2": ("galore_adamw8bit", ["--galore_scale", "0.25", "--solver", "gram",
                                                           "--regular_lr_ratio", "2"], (1e-2,)),
    # ... and with Fira's complement: plumage_adamw's pretraining default from 4096 tokens an update (session 38), and
    # plumage_adamw8bit's since session 41 (its lr-0 first update had misled the limiter: costly in session 39)
    "galore8bit_recipe_gram_ratio2_fira": ("galore_adamw8bit", [
        "--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio", "2", "--residual", "norm_matched",
        "--residual_scale", "1"], (1e-2, 7e-3, 1.4e-2)),
    # Adafactor with a first moment (β1 = 0.9, as GaLore ran it; an lr turns the relative step and the parameter
    # scaling off, as transformers advises): GaLore's recipe; plumage_adafactor's default until session 42 (PLUMAGE's
    # draws, κ = 1, cap 1, the complement on 10 updates after a refresh, scale 1, at one lr: H10 with mv realignment)
    # and the paper's estimator; and the AdamW default's large-batch recipe (top-r basis through the Gram, scale 0.25,
    # the regular group at 2x), without and with Fira's complement
    "galore_adafactor_recipe": ("galore_adafactor", ["--beta1", "0.9", "--galore_scale", "0.25"],
                                (5e-3, 1e-2, 3e-3, 2e-2)),
    "plumage_adafactor_default": ("plumage_adafactor", ["--beta1", "0.9", "--galore_scale", "1.0", "--pool_bf16",
                                                        *ADAFACTOR_DRAWS],
                                  (5e-3, 1e-2, 3e-3, 2e-3)),
    "plumage_adafactor_paper": ("plumage_adafactor", ["--beta1", "0.9", "--galore_scale", "1.0",
                                                      *plumage_flags(row_bias_correction=None)],
                                (1e-3, 3e-4, 3e-3)),
    # ... PLUMAGE's draws at the recipe's scale 0.25 with the regular group at 2x: plumage_adafactor's since session 42
    "plumage_adafactor_draws_recipe_ratio2": ("plumage_adafactor", [*ADAFACTOR_DRAWS_RECIPE_RATIO2, *ADAFACTOR_DRAWS],
                                              (5e-3, 1e-2, 3e-3)),
    # ... drawn again every κ updates instead of before each (session 43: on a GPU a draw is launch-bound, and at
    # llama_60m the draws before every update ran at half the others' updates a second)
    **{f"plumage_adafactor_draws_recipe_ratio2_every{every}": ("plumage_adafactor", [
        *ADAFACTOR_DRAWS_RECIPE_RATIO2, *adafactor_draws(resample_every=every)], (1.4e-2, 1e-2)) for every in (5, 20)},
    **{f"galore_adafactor_recipe_gram_ratio2{name}": ("galore_adafactor", [
        "--beta1", "0.9", "--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio", "2", *complement],
        (5e-3, 1e-2, 3e-3)) for name, complement in (("", []), ("_fira", ["--residual", "norm_matched",
                                                                          "--residual_scale", "1"]))},
    # SGD with momentum 0.9 (the paper's debiasing study; session 3 ran it at one lr, 0.1, where the paper's estimator
    # trailed GaLore by 0.22). GaLore's recipe (scale 0.25, one lr) and GaLore at scale 1 (SGD does not normalize, so
    # the scale is the low-rank group's lr against the regular group's); the paper's estimator (plumage_sgdm's default
    # until session 46: SGD has no per-coordinate normalization for 1/p to be amplified by, but over five seeds it
    # trained erratically) and with 1/p capped at 3 (session 3's best); plumage_adafactor's draws (κ = 1, cap 1, the
    # complement on 10 updates after a refresh; plumage_sgdm's default since session 46) and GaLore's top-r basis, each
    # at scale 0.25 with the regular group at 2x (the Adam defaults' pretraining recipe)
    "galore_sgdm_recipe": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25"], (0.1, 0.2, 0.05, 0.4)),
    "galore_sgdm_scale1": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "1.0"], (0.1, 0.05, 0.2)),
    "plumage_sgdm_paper": ("plumage_sgdm", ["--beta1", "0.9", "--galore_scale", "1.0", *sgdm_paper()], (0.05, 0.1, 0.02)),
    "plumage_sgdm_cap3": ("plumage_sgdm", ["--beta1", "0.9", "--galore_scale", "1.0", *sgdm_paper(max_inv_p=3)],
                          (0.1, 0.05)),
    "plumage_sgdm_draws_recipe_ratio2": ("plumage_sgdm", [*ADAFACTOR_DRAWS_RECIPE_RATIO2, *ADAFACTOR_DRAWS],
                                         (0.1, 0.2, 0.05)),
    "galore_sgdm_recipe_ratio2": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--regular_lr_ratio", "2"],
                                  (0.1, 0.2, 0.05)),
    # ... the draws at one lr (session 45's sweep: at 2x the regular group's SGD spikes at the lr where the low-rank
    # group would want it, 0.05 x 2), at GaLore's scale and at twice it
    **{f"plumage_sgdm_draws{name}": ("plumage_sgdm", ["--beta1", "0.9", "--galore_scale", scale, "--pool_bf16",
                                                       "--regular_lr_ratio", "1", *ADAFACTOR_DRAWS], (0.05, 0.025, 0.1))
       for name, scale in (("_recipe", "0.25"), ("_scale05", "0.5"))},
    # ... with the gradient outside the basis moved too, at every update (session 47): GaLore's recipe with Fira's
    # complement at Fira's scale and at GaLore's, and the draws with theirs at every update instead of the 10 after a
    # refresh (SGD does not normalize, so Fira's φ = ‖Z‖/‖R‖ is the momentum's gain on each column)
    **{f"galore_sgdm_recipe_fira{name}": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--residual",
                                                          "norm_matched", "--residual_scale", scale], (0.05, 0.07))
       for name, scale in (("", "1"), ("025", "0.25"))},
    "plumage_sgdm_draws_recipe_every": ("plumage_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--pool_bf16",
                                                         "--regular_lr_ratio", "1",
                                                         *adafactor_draws(residual_horizon="none")], (0.05, 0.07)),
    # ... both with the global gradient norm clipped (torchrun_main.py's --grad_clipping; session 50): at 0.1 the draws
    # led GaLore's best on seed 0 (5.734) but seeds 1-2 spiked at the warm-up's end (session 45). Here the norm is ~2
    # after the first 50 updates and 4-8 before and in spikes: 1 binds at every update (a lower lr), 3 at those
    **{f"galore_sgdm_recipe_clip{clip}": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--grad_clipping",
                                                          clip], (0.07, 0.1, 0.05)) for clip in ("1", "3")},
    **{f"plumage_sgdm_draws_recipe_clip{clip}": ("plumage_sgdm", [
        "--beta1", "0.9", "--galore_scale", "0.25", "--pool_bf16", "--regular_lr_ratio", "1", "--grad_clipping", clip,
        *ADAFACTOR_DRAWS], (0.1, 0.07, 0.14)) for clip in ("1", "3")},
    # ... GaLore's recipe with its momentum carried through each refresh (session 52): GaLore keeps the r-row buffer as it
    # is when the basis changes, so a singular vector whose sign flipped (an SVD's sign is arbitrary) reverses its row
    # of momentum, and a rotated one mixes rows. SGD does not normalize, so that stale momentum is stepped as is:
    # transported (realign "m", M <- P_new^T P_old M) or only its signs kept (align_signs, GaLore's basis otherwise)
    "galore_sgdm_recipe_realign_m": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--realign", "m"],
                                     (0.07, 0.05, 0.1)),
    "galore_sgdm_recipe_aligned": ("galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--align_signs"],
                                   (0.07, 0.05)),
    # how far rank can take GaLore's recipe here: rank 256 is every direction of llama_tiny's matrices (Adam in the
    # rotated basis), so the gap to it bounds what a better rank-64 estimator can gain. Not an equal-cost arm.
    "galore_recipe_rank256": ("galore_adamw", ["--galore_scale", "0.25", "--rank", "256"], (5e-3,)),
    # the default with twice GaLore's scale on the projected update (the other groups keep the lr)
    "plumage_cap1_scale05": ("plumage_adamw", ["--galore_scale", "0.5",
                                               *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
}
REFERENCE = "galore_recipe"


def command_for(optimizer: str, extra: list[str], seed: int, lr: float, args, save_dir: Path) -> list[str]:
    # an arm that names its own rank, refresh interval or warmup fraction keeps it; the others take the protocol's
    rank = [] if "--rank" in extra else ["--rank", str(args.rank)]
    gap = [] if "--update_proj_gap" in extra else ["--update_proj_gap", str(args.update_proj_gap)]
    fraction = 0.1
    if WARMUP_FRACTION in extra:
        at = extra.index(WARMUP_FRACTION)
        fraction, extra = float(extra[at + 1]), extra[:at] + extra[at + 2:]
    return [
        sys.executable, str(ROOT / "torchrun_main.py"), "--optimizer", optimizer, *with_family_pins(optimizer, extra),
        "--model_config", args.model_config, "--lr", str(lr),
        "--batch_size", str(args.batch_size), "--max_length", str(args.max_length),
        "--num_training_steps", str(args.steps), "--warmup_steps", str(max(1, round(args.steps * fraction))),
        "--eval_every", str(args.eval_every), "--save_every", str(args.steps), *rank,
        *gap, "--seed", str(seed), "--eval_tokens", str(args.eval_tokens),
        "--save_dir", str(save_dir), "--no-progress",
        # another corpus than the bundled one (named only then, so the runs recorded without the flag are reused)
        *(["--dataset", args.dataset] if args.dataset != "shakespeare" else []),
    ]


def run_dir(args, label: str, lr: float, seed: int) -> Path:
    return ROOT / args.runs / label / f"lr{lr:g}" / f"seed{seed}"


def _evals(save_dir: Path) -> list[float] | None:
    """The eval losses of a finished run, in order; None when it has not finished."""
    if not (save_dir / "metrics.jsonl").exists():
        return None
    records = load_run(save_dir)[1]
    if not any(r["type"] == "summary" for r in records):
        return None
    return [r["eval_loss"] for r in records if r["type"] == "eval"]


def ensure(args, label: str, lr: float, seed: int) -> list[float] | None:
    """The eval curve of one run (running it unless finished); [inf] for a run that stopped on a non-finite loss."""
    optimizer, extra, _ = ARMS[label]
    save_dir = run_dir(args, label, lr, seed)
    if (save_dir / "diverged").exists():
        return [math.inf]
    command = command_for(optimizer, extra, seed, lr, args, save_dir)
    try:
        return run_or_reuse(command, save_dir, _evals, f"{label} lr {lr:g} seed {seed}", report_only=args.report_only,
                            keep_stderr=True)
    except subprocess.CalledProcessError as error:
        stderr = (save_dir / "stderr.txt").read_text() if (save_dir / "stderr.txt").exists() else ""
        if error.returncode != DIVERGED:  # a crash is no result: stop and show it
            raise
        (save_dir / "diverged").write_text(" ".join(command[1:]) + "\n" + stderr.strip().splitlines()[-1])
        return [math.inf]


def max_rise(curve: list[float]) -> float:
    """The largest increase of the eval loss between two consecutive evaluations (0 for a monotone curve)."""
    return max([0.0] + [b - a for a, b in zip(curve, curve[1:], strict=False)])


def paired(reference: list[float], arm: list[float]) -> str:
    """mean of (L_ref − L_arm) over seeds and its paired t; positive = the arm is better."""
    diffs = [r - a for r, a in zip(reference, arm, strict=True)]
    mean = statistics.fmean(diffs)
    if len(diffs) < 2 or not all(math.isfinite(d) for d in diffs):
        return f"{mean:+.4f}"
    sd = statistics.stdev(diffs)
    t = mean / (sd / math.sqrt(len(diffs))) if sd > 0 else math.inf
    return f"{mean:+.4f} (t = {t:.1f}; " + ", ".join(f"{d:+.3f}" for d in diffs) + ")"


def pitman_morgan(reference: list[float], arm: list[float]) -> tuple[float, float]:
    """(sd ratio arm / reference, two-sided p of the Pitman–Morgan test that the two variances are equal).

    The seeds are shared, so the two spreads are not independent samples (an F test would be wrong): for paired X, Y,
    var X = var Y exactly when X + Y and Y − X are uncorrelated, and t = r √(n − 2) / √(1 − r²) has n − 2 degrees
    of freedom under that hypothesis, for normal pairs (Pitman 1939, Morgan 1939)."""
    from scipy import stats

    if len(arm) < 3 or len(reference) != len(arm):
        raise ValueError(f"the test needs the same >= 3 seeds for both arms, got {len(reference)} and {len(arm)}")
    ratio = statistics.stdev(arm) / statistics.stdev(reference)
    pairs = list(zip(reference, arm, strict=True))
    r = statistics.correlation([a + b for a, b in pairs], [b - a for a, b in pairs])
    t = r * math.sqrt(len(arm) - 2) / math.sqrt(max(1.0 - r * r, 1e-300))
    return ratio, 2.0 * float(stats.t.sf(abs(t), len(arm) - 2))


def spread_test(reference: list[float], arm: list[float]) -> str:
    """The table's spread cell: sd ratio and the Pitman–Morgan p ("" below three seeds or for a diverged run)."""
    if len(arm) < 3 or not all(math.isfinite(v) for v in [*reference, *arm]):
        return ""
    ratio, p = pitman_morgan(reference, arm)
    return f"{ratio:.2f} (p = {p:.2f})"


def fmt(value: float) -> str:
    return "diverged" if not math.isfinite(value) else f"{value:.4f}"


def per_arm(value):
    """An argparse type for 'LABEL=VALUE,LABEL=VALUE': {label: value(VALUE)}."""
    return lambda text: {label: value(item) for label, item in (pair.split("=") for pair in text.split(","))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS), help="comma-separated arm labels")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--sweep_seed", type=int, default=0)
    parser.add_argument("--model_config", default="configs/llama_tiny.json")
    parser.add_argument("--dataset", default="shakespeare", help="torchrun_main.py's --dataset: the bundled corpus, or "
                        "a local .jsonl such as scripts/code_corpus.py writes (docs/gpu_runbook.md)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--update_proj_gap", type=int, default=40)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--eval_tokens", type=int, default=20_000)
    parser.add_argument("--runs", default="runs/protocol")
    parser.add_argument("--out", default="docs")
    parser.add_argument("--name", default="protocol")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (set OMP_NUM_THREADS so they share the CPU)")
    parser.add_argument("--sweep-only", action="store_true", help="stop after the lr sweep")
    parser.add_argument("--report-only", action="store_true", help="only redraw from finished runs")
    parser.add_argument("--pin_lr", type=per_arm(float), default={},
                        help="LABEL=LR,...: run these arms at this lr only, no sweep (e.g. an optimizer's default lr, or "
                             "another horizon at the lr the protocol chose)")
    parser.add_argument("--lr_grid", type=per_arm(lambda lrs: tuple(float(lr) for lr in lrs.split(":"))), default={},
                        help="LABEL=LR:LR:...,...: sweep these arms over these lrs instead of their grid (another horizon "
                             "or model, where the grid's best may have moved)")
    parser.add_argument("--reference", default=REFERENCE, help="the arm every other is paired against (GaLore's recipe "
                        "at the same refresh interval)")
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    for flag, named in (("--pin_lr", args.pin_lr), ("--lr_grid", args.lr_grid)):
        if set(named) - set(args.arms):
            parser.error(f"{flag} names arms not in --arms: {sorted(set(named) - set(args.arms))}")
    return args


def main() -> None:
    args = parse_args()
    with ThreadPoolExecutor(args.jobs) as pool:  # each run is its own process; threads only wait on them
        # a pinned arm runs only its pinned lr: its sweep would choose nothing
        grids = {label: (args.pin_lr[label],) if label in args.pin_lr else args.lr_grid.get(label, ARMS[label][2])
                 for label in args.arms}
        sweep_jobs = [(label, lr, args.sweep_seed) for label in args.arms for lr in grids[label]]
        # every arm at one lr leaves nothing to choose: its seeds run beside the sweep's, not after it (a GPU's runs
        # all at once; session 37 lost two runs to a deadline waiting on seed 0)
        one_lr = not args.sweep_only and all(len(grids[label]) == 1 for label in args.arms)
        first = list(dict.fromkeys(sweep_jobs + ([(label, grids[label][0], s) for label in args.arms
                                                  for s in args.seeds] if one_lr else [])))
        done = dict(zip(first, pool.map(lambda job: ensure(args, *job), first), strict=True))
        sweep = {job: done[job] for job in sweep_jobs}
        best = {}
        for label in args.arms:
            finished = {lr: sweep[(label, lr, args.sweep_seed)] for lr in grids[label]
                        if sweep[(label, lr, args.sweep_seed)] is not None}
            if finished:
                best[label] = min(finished, key=lambda lr, f=finished: f[lr][-1])
        seed_jobs = [] if args.sweep_only else [(label, best[label], s) for label in best for s in args.seeds]
        rest = [job for job in seed_jobs if job not in done]
        done.update(zip(rest, pool.map(lambda job: ensure(args, *job), rest), strict=True))
        curves = {job: done[job] for job in seed_jobs}

    defaults = vars(parse_args([]))
    changed = "".join(f" --{key} {args_value}" for key in ("model_config", "dataset", "batch_size", "max_length",
                                                             "eval_every", "eval_tokens", "runs")
                      if (args_value := getattr(args, key)) != defaults[key])
    corpus = "bundled corpus" if args.dataset == defaults["dataset"] else Path(args.dataset).name
    lines = [f"# Fair pretraining protocol ({Path(args.model_config).stem}, {corpus}, {args.steps} updates)", "",
             f"Command: `OMP_NUM_THREADS=1 python benchmarks/pretrain_protocol.py --jobs {args.jobs} "
             f"--arms {','.join(args.arms)} --seeds {','.join(map(str, args.seeds))} --steps {args.steps} --rank {args.rank} "
             f"--update_proj_gap {args.update_proj_gap}"
             + (" --sweep-only" if args.sweep_only else "") + changed
             + (f" --reference {args.reference}" if args.reference != REFERENCE else "")
             + (" --pin_lr " + ",".join(f"{k}={v:g}" for k, v in args.pin_lr.items()) if args.pin_lr else "")
             + (" --lr_grid " + ",".join(f"{k}=" + ":".join(f"{v:g}" for v in lrs) for k, lrs in args.lr_grid.items())
                if args.lr_grid else "") + "`", "",
             f"## 1. lr sweep (seed {args.sweep_seed}; final eval loss)", "", "| arm | flags | lr: eval loss |", "|---|---|---|"]
    for label in args.arms:
        optimizer, extra, lrs = ARMS[label]
        cells = ", ".join(f"{lr:g}: " + ("—" if sweep.get((label, lr, args.sweep_seed)) is None
                                         else fmt(sweep[(label, lr, args.sweep_seed)][-1])) for lr in sorted(grids[label]))
        lines.append(f"| {label} | `{' '.join([optimizer, *extra])}` | {cells} |")
    finals = {label: [curves.get((label, best[label], s)) for s in args.seeds] for label in best}
    finals = {label: runs for label, runs in finals.items() if None not in runs}
    pinned = f" ({', '.join(f'{k} at {v:g}' for k, v in args.pin_lr.items())}: pinned by --pin_lr)" if args.pin_lr else ""
    lines += ["", f"## 2. Seeds {','.join(map(str, args.seeds))} at each arm's best lr{pinned}", "",
              f"Paired difference: L_{args.reference} − L_arm per seed (positive = better than {args.reference}), with its "
              "paired t statistic. Largest rise: the largest increase between consecutive evaluations of any seed. "
              f"Spread: the arm's sd over {args.reference}'s on the same seeds, with the two-sided p of the "
              "Pitman–Morgan test of equal variances for paired samples (small p: the spreads differ).", "",
              "| arm | lr | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean ± sd | largest rise | "
              f"vs {args.reference} | spread vs {args.reference} |", "|---|---:|" + "---:|" * (len(args.seeds) + 4)]
    for label, runs in finals.items():
        last = [run[-1] for run in runs]
        finite = all(math.isfinite(v) for v in last)
        sd = statistics.stdev(last) if finite and len(last) > 1 else math.nan
        mean = f"{statistics.fmean(last):.4f} ± {sd:.4f}" if finite else "diverged"
        rise = max(max_rise(run) for run in runs) if finite else math.inf
        compare = args.reference in finals and label != args.reference
        reference = [r[-1] for r in finals[args.reference]] if compare else []
        versus, spread = (paired(reference, last), spread_test(reference, last)) if compare else ("", "")
        lines.append(f"| {label} | {best[label]:g} | " + " | ".join(fmt(v) for v in last) +
                     f" | {mean} | {fmt(rise)} | {versus} | {spread} |")
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    if finals:
        import matplotlib

        matplotlib.use("Agg")
        plot_losses([(f"{label} lr {best[label]:g}", load_run(run_dir(args, label, best[label], args.seeds[0]))[1])
                     for label, runs in finals.items() if math.isfinite(runs[0][-1])],
                    out / f"{args.name}_loss.png", log_scale=False, window=10)
        lines += ["", f"![eval and train loss, seed {args.seeds[0]}]({args.name}_loss.png)"]
    text = "\n".join(lines) + "\n"
    (out / f"{args.name}_compare.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
