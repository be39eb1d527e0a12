"""Fine-tuning comparison on the offline task: AdamW, GaLore, FLORA, PLUMAGE and LoRA, rank 8, τ = 100, several seeds.

    python benchmarks/finetune_compare.py                       # all arms, seeds 0,1: prints the markdown table
    python benchmarks/finetune_compare.py --methods plumage,lora --seeds 0
    python benchmarks/finetune_compare.py --report-only         # the table from the runs already under --out
    python benchmarks/finetune_compare.py --lrs 1e-4,3e-4,1e-3  # each arm at its own best lr (the fair protocol)

Each arm is one run_glue.py process: the bundled MiniLM on `shakespeare_plays` (which of two plays a
passage comes from), every attention and MLP weight targeted (--lora_all_modules), embeddings, pooler and
head trained fully by AdamW. The low-rank arms take scale 1.0 and the lrs of `--lrs`; LoRA (r = 8, alpha = 16)
takes those of `--lora_lrs`, higher, as LoRA usually needs. With more than one lr an arm runs the first seed at
each, keeps the one with the lowest terminal train loss, and runs the other seeds there (the pretraining
protocol's rule: a comparison at one shared lr measures the lr, not the optimizer). Reported per arm, mean ± sample
standard deviation over seeds: terminal train loss (mean over the last epoch), best validation accuracy
over epochs, optimizer-state bytes, wall time. Runs are single-threaded (OMP_NUM_THREADS=1): on a shared
2-core machine one thread per run is several times faster than two fighting other jobs.

A finished run is reused when its recorded command is unchanged, so an interrupted comparison resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from plumage_flags import with_family_pins  # benchmarks/ is on sys.path when this file runs
from protocol_statistics import mean_sd
from run_cache import run_or_reuse

ROOT = Path(__file__).resolve().parent.parent
METHODS = {  # label -> run_glue.py flags that make the arm
    "adamw": ["--optimizer", "adamw"],
    "galore": ["--optimizer", "galore_adamw"],
    # GaLore with the floor V ← max(V, M²) before each low-rank update (session 16's option; the pretraining
    # protocol's best setting at 600 and 2000 updates)
    "galore vfloor": ["--optimizer", "galore_adamw", "--v_floor", "m2"],
    # ... refreshed through the Gram's eigh: plumage_adamw's default since session 20 (solver "auto" = gram for the
    # top-r basis)
    "galore vfloor gram": ["--optimizer", "galore_adamw", "--v_floor", "m2", "--solver", "gram"],
    "flora": ["--optimizer", "flora_adamw"],
    # every PLUMAGE arm names its options in full, so that no arm moves when a default changes (a finished run is
    # reused by its command: an arm with no flags would silently stand for whichever default it ran under)
    "plumage max_inv_p=3": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "3",
                            "--resample_every", "0", "--residual", "none"],
    "plumage paper": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "none",
                      "--no-row_bias_correction", "--resample_every", "0", "--residual", "none"],
    # the default of session 6: sampled rows moved by their own gradient at the kept rows' step size, drawn each update
    "plumage nm resample": ["--optimizer", "plumage_adamw", "--sampled_step", "norm_matched", "--max_inv_p", "none",
                            "--resample_every", "1", "--no-pool_bf16", "--residual", "none"],
    # the default since session 7: every drawn row takes Adam's step, none amplified by 1/p, drawn anew each update
    "plumage cap1 resample": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "1",
                              "--resample_every", "1", "--no-pool_bf16", "--residual", "none"],
    # ... with its pool in bfloat16 (the default of session 10)
    "plumage cap1 resample bf16": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "1",
                                   "--resample_every", "1", "--pool_bf16", "--residual", "none"],
    # ... with its pool in bfloat16 and Fira's complement (residual norm_matched): the candidate default of session 11
    "plumage cap1 resample residual": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "1",
                                       "--resample_every", "1", "--pool_bf16", "--residual", "norm_matched",
                                       "--residual_limiter", "fira", "--residual_scale", "1.0", "--residual_cap", "none",
                                       "--residual_horizon", "none"],
    # ... with the complement at a quarter of Fira's step, limited steadily (no reference taken on a refresh's update)
    "plumage cap1 resample steady quarter": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p",
                                             "1", "--resample_every", "1", "--pool_bf16", "--residual", "norm_matched",
                                             "--residual_limiter", "steady", "--residual_scale", "0.25",
                                             "--residual_cap", "none", "--residual_horizon", "none"],
    # ... with no column of the complement longer than half the basis's step on it: the default since session 13
    "plumage cap1 resample steady quarter cap05": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive",
                                                   "--max_inv_p", "1", "--resample_every", "1", "--pool_bf16",
                                                   "--residual", "norm_matched", "--residual_limiter", "steady",
                                                   "--residual_scale", "0.25", "--residual_cap", "0.5",
                                                   "--residual_horizon", "none"],
    # ... moved only on the first H updates after each refresh (residual_horizon), and with LDAdam's realignment (the
    # default of session 14: moments' mean and variance carried apart across a refresh)
    **{f"plumage cap1 resample steady quarter cap05 h{horizon}{name}": [
        "--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "1", "--resample_every", "1",
        "--pool_bf16", "--residual", "norm_matched", "--realign", realign, "--residual_limiter", "steady",
        "--residual_scale", "0.25", "--residual_cap", "0.5", "--residual_horizon", str(horizon)]
       for horizon in (10, 40) for name, realign in (("", "mv"), (" meansplit", "mv_meansplit"))},
    "lora": ["--peft", "lora", "--lora_alpha", "16"],
}
# Every PLUMAGE arm above the session-14 ones ran with the paper's realignment (mv), the default until session 14:
# pinned right after --residual's value
for _flags in METHODS.values():
    if "plumage_adamw" in _flags and "--realign" not in _flags:
        _at = _flags.index("--residual") + 2
        _flags[_at:_at] = ["--realign", "mv"]
# ... and, like every PLUMAGE arm, PLUMAGE's projector without the floor (plumage_flags.FAMILY_PINS)
METHODS = {label: with_family_pins("plumage_adamw", flags, pretraining=False) if "plumage_adamw" in flags else flags
           for label, flags in METHODS.items()}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated arms")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--rank", type=int, default=8, help="projection rank (LoRA's r for the lora arm)")
    parser.add_argument("--update_proj_gap", type=int, default=100, help="refresh interval τ")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lrs", default="1e-4", help="comma-separated lr grid of the full-rank and low-rank arms")
    parser.add_argument("--lora_lrs", default="1e-3", help="comma-separated lr grid of the LoRA arm")
    parser.add_argument("--out", default="runs/finetune_compare", help="one folder per run under here")
    parser.add_argument("--report-only", action="store_true", help="only tabulate the finished runs")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        parser.error(f"unknown --methods {unknown}; choose from {', '.join(METHODS)}")
    for flag in ("lrs", "lora_lrs"):
        try:
            setattr(args, flag, [float(lr) for lr in getattr(args, flag).split(",")])
        except ValueError:
            parser.error(f"--{flag} {getattr(args, flag)!r} is not a comma-separated list of numbers, e.g. 1e-4,3e-4")
    return args


def command(args, method: str, lr: float, seed: int, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "run_glue.py"), *METHODS[method], "--lora_all_modules", "--lora_r", str(args.rank),
            "--update_proj_gap", str(args.update_proj_gap), "--num_train_epochs", str(args.epochs),
            "--per_device_train_batch_size", str(args.batch_size), "--learning_rate", str(lr), "--seed", str(seed),
            "--output_dir", str(out), "--no-progress"]


def final_record(out: Path) -> dict | None:
    metrics = out / "metrics.jsonl"
    if not metrics.exists():
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return next((r for r in records if r["type"] == "final"), None)


def run_arm(args, method: str, lr: float, seed: int) -> dict:
    out = Path(args.out) / f"lr{lr:g}" / f"{method.replace(' ', '_').replace('=', '-')}-s{seed}"
    summary = run_or_reuse(command(args, method, lr, seed, out), out, final_record, f"{method} lr {lr:g} seed {seed}",
                           report_only=args.report_only, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if summary is None:
        raise SystemExit(f"{out} holds no finished run of the current command; run without --report-only")
    return summary


def sweep_arm(args, method: str, seeds: list[int]) -> tuple[dict[float, float], float, list[dict]]:
    """The arm's first-seed terminal train loss at each lr of its grid, the best lr, and every seed's run there."""
    lrs = args.lora_lrs if method == "lora" else args.lrs
    first = {lr: run_arm(args, method, lr, seeds[0]) for lr in lrs}
    sweep = {lr: run["terminal_train_loss"] for lr, run in first.items()}
    best = min(sweep, key=sweep.get)
    return sweep, best, [first[best]] + [run_arm(args, method, best, seed) for seed in seeds[1:]]


def table(results: dict[str, tuple[dict[float, float], float, list[dict]]]) -> str:
    lines = ["| method | lr sweep (seed of the sweep): terminal train loss | lr | seeds | terminal train loss | "
             "best val. accuracy | optimizer state (MiB) | trainable params | wall time (s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for method, (sweep, best, runs) in results.items():
        swept = ", ".join(f"{lr:g}: {loss:.4f}" for lr, loss in sorted(sweep.items())) if len(sweep) > 1 else "—"
        lines.append(
            f"| {method} | {swept} | {best:g} | {len(runs)} | {mean_sd([r['terminal_train_loss'] for r in runs], '.4f')} | "
            f"{mean_sd([100 * r['best_accuracy'] for r in runs], '.1f')} % | "
            f"{mean_sd([r['optimizer_state_bytes'] / 2**20 for r in runs], '.2f')} | "
            f"{runs[0]['trainable_parameters']:,} | {mean_sd([r['wall_time_s'] for r in runs], '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {method: sweep_arm(args, method, seeds) for method in args.methods.split(",")}
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
