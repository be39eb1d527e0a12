"""Run adamw, galore_adamw and plumage_adamw on the same model, data and budget; write a table and a loss plot.

    python scripts/compare_optimizers.py                      # llama_tiny, 300 updates each (make compare)
    python scripts/compare_optimizers.py --steps 50 --model_config configs/llama_micro.json

Each optimizer runs its published recipe (AdamW and the paper's PLUMAGE: lr 1e-3, scale 1; GaLore: lr 1e-2, scale 0.25);
everything else is shared. Results: docs/compare.md and docs/compare_loss.png (runs under runs/compare/).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from plot_runs import load_run, plot_losses  # scripts/ is on sys.path when this file runs

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {
    "adamw": ["--lr", "1e-3"],
    "galore_adamw": ["--lr", "1e-2", "--galore_scale", "0.25"],
    # the paper's estimator by its flags (plumage_adamw's own default is GaLore's basis with v_floor since session 17)
    "plumage_adamw": ["--lr", "1e-3", "--galore_scale", "1.0", "--projector", "plumage", "--sampled_step", "adaptive",
                      "--max_inv_p", "none", "--resample_every", "0", "--residual", "none", "--realign", "mv",
                      "--v_floor", "none", "--regular_lr_ratio", "1"],
}


def run(optimizer: str, args, save_dir: Path) -> None:
    command = [
        sys.executable, str(ROOT / "torchrun_main.py"), "--optimizer", optimizer, *RECIPES[optimizer],
        "--model_config", args.model_config, "--batch_size", str(args.batch_size), "--max_length", str(args.max_length),
        "--num_training_steps", str(args.steps), "--warmup_steps", str(max(1, args.steps // 10)),
        "--eval_every", str(max(1, args.steps // 6)), "--save_every", str(args.steps), "--rank", str(args.rank),
        "--update_proj_gap", str(args.update_proj_gap), "--seed", str(args.seed), "--save_dir", str(save_dir),
        "--eval_tokens", str(args.eval_tokens), "--overwrite",  # a fresh run, not appended to an older one's
    ]
    print(f"== {optimizer}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def table(results: dict[str, list[dict]], args) -> str:
    lines = [
        f"Command: `python scripts/compare_optimizers.py --model_config {args.model_config} --steps {args.steps} "
        f"--batch_size {args.batch_size} --max_length {args.max_length} --rank {args.rank} "
        f"--update_proj_gap {args.update_proj_gap} --seed {args.seed}`", "",
        "| optimizer | recipe | final train loss (mean of last 10) | final eval loss | eval ppl |",
        "|---|---|---:|---:|---:|",
    ]
    for name, records in results.items():
        train = [r["loss"] for r in records if r["type"] == "train"]
        summary = next(r for r in records if r["type"] == "summary")
        tail = train[-10:]
        lines.append(f"| {name} | {' '.join(RECIPES[name])} | {sum(tail) / len(tail):.4f} | {summary['eval_loss']:.4f} | "
                     f"{summary['eval_ppl']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_config", default="configs/llama_tiny.json")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--update_proj_gap", type=int, default=50)
    parser.add_argument("--eval_tokens", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs", help="where compare.md and compare_loss.png go")
    parser.add_argument("--report-only", action="store_true", help="redraw from the runs already in runs/compare/")
    args = parser.parse_args()

    results = {}
    for name in RECIPES:
        save_dir = ROOT / "runs" / "compare" / name
        if not args.report_only:
            run(name, args, save_dir)
        results[name] = load_run(save_dir)[1]
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    text = table(results, args)
    (out / "compare.md").write_text("# Optimizer comparison on the bundled corpus\n\n" + text)
    import matplotlib

    matplotlib.use("Agg")
    plot_losses(list(results.items()), out / "compare_loss.png", log_scale=False, window=10)
    print(text)
    best = min(results, key=lambda n: next(r for r in results[n] if r["type"] == "summary")["eval_loss"])
    print(f"lowest eval loss: {best}; table in {out / 'compare.md'}, plot in {out / 'compare_loss.png'}")


if __name__ == "__main__":
    main()
