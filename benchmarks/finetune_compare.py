"""Fine-tuning comparison on the offline task: AdamW, GaLore, FLORA, PLUMAGE and LoRA, rank 8, τ = 100, several seeds.

    python benchmarks/finetune_compare.py                       # all arms, seeds 0,1: prints the markdown table
    python benchmarks/finetune_compare.py --methods plumage,lora --seeds 0
    python benchmarks/finetune_compare.py --report-only         # the table from the runs already under --out

Each arm is one run_glue.py process: the bundled MiniLM on `shakespeare_plays` (which of two plays a
passage comes from), every attention and MLP weight targeted (--lora_all_modules), embeddings, pooler and
head trained fully by AdamW. The low-rank arms share one learning rate and scale 1.0; LoRA (r = 8,
alpha = 16) gets its own, higher, learning rate as LoRA usually needs. Reported per arm, mean ± sample
standard deviation over seeds: terminal train loss (mean over the last epoch), best validation accuracy
over epochs, optimizer-state bytes, wall time. Runs are single-threaded (OMP_NUM_THREADS=1): on a shared
2-core machine one thread per run is several times faster than two fighting other jobs.

A finished run is reused when its recorded command is unchanged, so an interrupted comparison resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from run_cache import run_or_reuse  # benchmarks/ is on sys.path when this file runs

ROOT = Path(__file__).resolve().parent.parent
METHODS = {  # label -> run_glue.py flags that make the arm
    "adamw": ["--optimizer", "adamw"],
    "galore": ["--optimizer", "galore_adamw"],
    "flora": ["--optimizer", "flora_adamw"],
    "plumage": ["--optimizer", "plumage_adamw"],
    "plumage max_inv_p=3": ["--optimizer", "plumage_adamw", "--max_inv_p", "3"],
    # the paper's exact estimator, named in full so the arm does not move with the defaults ("plumage" is the default)
    "plumage paper": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "none",
                      "--no-row_bias_correction", "--resample_every", "0"],
    # a lead for fine-tuning (session 6): every drawn row takes Adam's step, none amplified by 1/p, drawn anew each update
    "plumage cap1 resample": ["--optimizer", "plumage_adamw", "--sampled_step", "adaptive", "--max_inv_p", "1",
                              "--resample_every", "1"],
    "lora": ["--peft", "lora", "--lora_alpha", "16"],
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated arms")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--rank", type=int, default=8, help="projection rank (LoRA's r for the lora arm)")
    parser.add_argument("--update_proj_gap", type=int, default=100, help="refresh interval τ")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of the full-rank and low-rank arms")
    parser.add_argument("--lora_lr", type=float, default=1e-3, help="learning rate of the LoRA arm")
    parser.add_argument("--out", default="runs/finetune_compare", help="one folder per run under here")
    parser.add_argument("--report-only", action="store_true", help="only tabulate the finished runs")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        parser.error(f"unknown --methods {unknown}; choose from {', '.join(METHODS)}")
    return args


def command(args, method: str, seed: int, out: Path) -> list[str]:
    lr = args.lora_lr if method == "lora" else args.lr
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


def run_arm(args, method: str, seed: int) -> dict:
    out = Path(args.out) / f"{method.replace(' ', '_').replace('=', '-')}-s{seed}"
    summary = run_or_reuse(command(args, method, seed, out), out, final_record, f"{method} seed {seed}",
                           report_only=args.report_only, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if summary is None:
        raise SystemExit(f"{out} holds no finished run of the current command; run without --report-only")
    return summary


def mean_sd(values: list[float], fmt: str) -> str:
    if len(set(values)) == 1:  # one seed, or a quantity the seed does not change (state bytes)
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def table(results: dict[str, list[dict]]) -> str:
    lines = ["| method | seeds | terminal train loss | best val. accuracy | optimizer state (MiB) | trainable params | "
             "wall time (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for method, runs in results.items():
        lines.append(
            f"| {method} | {len(runs)} | {mean_sd([r['terminal_train_loss'] for r in runs], '.4f')} | "
            f"{mean_sd([100 * r['best_accuracy'] for r in runs], '.1f')} % | "
            f"{mean_sd([r['optimizer_state_bytes'] / 2**20 for r in runs], '.2f')} | "
            f"{runs[0]['trainable_parameters']:,} | {mean_sd([r['wall_time_s'] for r in runs], '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {method: [run_arm(args, method, seed) for seed in seeds] for method in args.methods.split(",")}
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
