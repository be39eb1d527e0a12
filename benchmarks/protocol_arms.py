"""The pretraining protocol's arms: label -> (torchrun_main.py's optimizer, its extra flags, the lr grid), and the
reference arm every other is paired against. benchmarks/pretrain_protocol.py runs them; an arm names every flag that
defines it, so a change of default moves no recorded arm."""

from __future__ import annotations

from plumage_flags import plumage_flags  # benchmarks/ is on sys.path when the protocol runs

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
    """plumage_adafactor's draws as H10 sets them, with `overrides` (row_bias_correction left out unless overridden:
    Adafactor refused it until session 79, and the arms recorded before name no such flag)."""
    return plumage_flags(**{**H10, "row_bias_correction": None, **overrides})


ADAFACTOR_DRAWS = adafactor_draws()
# ... at GaLore's scale 0.25 with the regular group at 2x (plumage_adafactor's default of sessions 42-80)
ADAFACTOR_DRAWS_RECIPE_RATIO2 = ["--beta1", "0.9", "--galore_scale", "0.25", "--pool_bf16", "--regular_lr_ratio", "2"]


def sgdm_paper(**overrides) -> list[str]:
    """The paper's estimator as plumage_sgdm ran it until session 46 (momentum carried by rule m; no
    row_bias_correction, which SGD momentum refuses), with `overrides`."""
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
    # ... and the paper's estimator on the 8-bit states (scale 1, as the paper documents it; its float32 arm's grid;
    # no row_bias_correction, which the 8-bit backend refuses)
    "plumage8bit_paper": ("plumage_adamw8bit", ["--galore_scale", "1.0", *plumage_flags(row_bias_correction=None)],
                          (3e-4, 1e-4, 1e-3)),
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
    # ... PLUMAGE's draws at the recipe's scale 0.25 with the regular group at 2x: plumage_adafactor's in sessions 42-80
    "plumage_adafactor_draws_recipe_ratio2": ("plumage_adafactor", [*ADAFACTOR_DRAWS_RECIPE_RATIO2, *ADAFACTOR_DRAWS],
                                              (5e-3, 1e-2, 3e-3)),
    # ... drawn again every κ updates instead of before each (session 43: on a GPU a draw is launch-bound, and at
    # llama_60m the draws before every update ran at half the others' updates a second)
    **{f"plumage_adafactor_draws_recipe_ratio2_every{every}": ("plumage_adafactor", [
        *ADAFACTOR_DRAWS_RECIPE_RATIO2, *adafactor_draws(resample_every=every)], (1.4e-2, 1e-2)) for every in (5, 20)},
    # ... the draws until update 1000 and GaLore's top-r basis after (sample_until): at 5000 updates the draws led
    # GaLore's recipe to update 1000 and trailed it from 1250 (session 76); after the switch the basis is GaLore's at
    # the draws' lr, over three times GaLore's best at 5000 updates (3e-3), hence the lower lrs too
    "plumage_adafactor_draws_recipe_ratio2_until1000": ("plumage_adafactor", [
        *ADAFACTOR_DRAWS_RECIPE_RATIO2, *ADAFACTOR_DRAWS, "--sample_until", "1000"], (1e-2, 7e-3, 5e-3)),
    # ... each basis direction's second-moment factor bias-corrected by its own age (session 79): an entering one no
    # longer steps t^0.4 times a settled one's size, which made Adafactor's update clip shrink the whole step (session 78)
    "plumage_adafactor_draws_recipe_ratio2_rowbias": ("plumage_adafactor", [
        *ADAFACTOR_DRAWS_RECIPE_RATIO2, *adafactor_draws(row_bias_correction=True)], (5e-3, 3e-3, 1e-2)),
    # ... and GaLore's top-r basis from update 1000 (sample_until): without the clip, does the switch still cost? (less:
    # 0.013 at update 1250 against the corrected draws throughout, ahead of them from 3000; session 79)
    "plumage_adafactor_draws_recipe_ratio2_rowbias_until1000": ("plumage_adafactor", [
        *ADAFACTOR_DRAWS_RECIPE_RATIO2, *adafactor_draws(row_bias_correction=True), "--sample_until", "1000"], (5e-3,)),
    # ... the regular group's share of the draws' lead (session 80): Adafactor clips each weight's update on its own, so
    # at the draws' best lr (1.4e-2 at 600 updates) the directions settled in their basis step near GaLore's size
    # (divided by 3.5-8.5, session 78) while the regular group (embeddings, head, norms: no draws, hardly clipped) runs
    # at 2 x 1.4e-2. GaLore's basis with that regular group (ratio 6 at 5e-3 = 3e-2; 4 and 10 around), and the draws with
    # GaLore's regular group (ratio 0.7 at 1.4e-2 = 1e-2) and with a larger one (3). Ratio 4 is plumage_adafactor's
    # default since session 81 (tests/benchmarks/test_protocol_arms.py trains both alike)
    **{f"galore_adafactor_recipe_gram_ratio{ratio}": ("galore_adafactor", [
        "--beta1", "0.9", "--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio", str(ratio)],
        (5e-3, 3e-3, 7e-3)) for ratio in (4, 6, 10)},
    # ... the default's regular group back at GaLore's one lr once the text is read again (session 87): on the plays
    # read 1.9 times the default ends behind GaLore's recipe in eval loss with a lower training loss (session 80),
    # and the regular group at 2x throughout halves that gap (session 86). It widened it (-0.056, three seeds): the
    # lower lr gains at once, 0.04 at update 2750, then fits the seen text faster (lower training loss) and falls behind
    "galore_adafactor_recipe_gram_ratio4_repeat1": ("galore_adafactor", [
        "--beta1", "0.9", "--galore_scale", "0.25", "--solver", "gram", "--regular_lr_ratio", "4",
        "--regular_lr_ratio_on_repeat", "1"], (3e-3,)),
    **{f"plumage_adafactor_draws_recipe_ratio{ratio}": ("plumage_adafactor", [
        "--beta1", "0.9", "--galore_scale", "0.25", "--pool_bf16", "--regular_lr_ratio", str(ratio), *ADAFACTOR_DRAWS],
        (1.4e-2,)) for ratio in (0.7, 3)},
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
    # ... with a longer lr warm-up than the protocol's 10 % (session 88): the clip at 3 binds only over the first ~100
    # updates at 0.2 (the norm up to 12.6 there, a median of 1.23 after), so is what it gives a warm-up that a schedule can give
    # without a threshold that depends on the model's gradient norm?
    # And with it, do the draws or the regular group at 2x (both spiked at the warm-up's end in session 45) pay?
    **{f"{label}_warmup{round(100 * fraction)}": (optimizer, [*flags, WARMUP_FRACTION, str(fraction)], (0.1, 0.2, 0.4))
       for fraction in (0.3, 0.5)
       for label, optimizer, flags in (
           ("galore_sgdm_recipe", "galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25"]),
           ("galore_sgdm_recipe_ratio2", "galore_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25",
                                                         "--regular_lr_ratio", "2"]),
           ("plumage_sgdm_draws_recipe", "plumage_sgdm", ["--beta1", "0.9", "--galore_scale", "0.25", "--pool_bf16",
                                                          "--regular_lr_ratio", "1", *ADAFACTOR_DRAWS]),
           ("plumage_sgdm_draws_recipe_ratio2", "plumage_sgdm", [*ADAFACTOR_DRAWS_RECIPE_RATIO2, *ADAFACTOR_DRAWS]))},
    # how far rank can take GaLore's recipe here: rank 256 is every direction of llama_tiny's matrices (Adam in the
    # rotated basis), so the gap to it bounds what a better rank-64 estimator can gain. Not an equal-cost arm.
    "galore_recipe_rank256": ("galore_adamw", ["--galore_scale", "0.25", "--rank", "256"], (5e-3,)),
    # the default with twice GaLore's scale on the projected update (the other groups keep the lr)
    "plumage_cap1_scale05": ("plumage_adamw", ["--galore_scale", "0.5",
                                               *plumage_flags(max_inv_p=1, resample_every=1)], (3e-3,)),
}
REFERENCE = "galore_recipe"
