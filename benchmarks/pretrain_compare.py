"""Small-scale replication of the paper's pretraining comparisons: every optimizer on one lr schedule, several seeds.

    python benchmarks/pretrain_compare.py                    # both tables, seeds 0,1: docs/pretrain_compare.md + figures
    python benchmarks/pretrain_compare.py --table sgdm       # only the SGD-momentum study
    python benchmarks/pretrain_compare.py --report-only      # redraw from the runs already under runs/pretrain_compare/
    OMP_NUM_THREADS=1 python benchmarks/pretrain_compare.py --jobs 2   # two single-threaded runs at a time

Each arm is one torchrun_main.py run of llama_tiny on the bundled corpus. All arms of a table share the model,
data order (per seed), peak lr, warmup and cosine schedule, rank, refresh interval and the projected-back scale
(1.0), so only the optimizer differs. The default lr 1e-3 is AdamW's published lr for GaLore's small Llamas and our
demo's; at 2.5e-3 (GaLore's lr 1e-2 × scale 0.25) GaLore beat AdamW here, which leaves the gap closure undefined.
The main table reports the final eval loss (mean and half-range over seeds) and the gap closure
(L_galore - L) / (L_galore - L_adamw): the share of GaLore's loss gap to full-rank AdamW that an arm closes (the
paper reports 33 % on average for PLUMAGE). The SGD-momentum table is the paper's debiasing study: without a
second moment the bias of a top-r projection shows most plainly.

A finished run is reused when its recorded command is unchanged, so an interrupted table resumes where it stopped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from plot_runs import load_run, plot_losses  # noqa: E402
from plumage_flags import plumage_flags, with_family_pins  # noqa: E402 - benchmarks/ is on sys.path when this file runs
from run_cache import run_or_reuse  # noqa: E402 - benchmarks/ is on sys.path when this file runs

from galore_plumage.training.metrics import perplexity  # noqa: E402

# label -> (optimizer name, extra flags). Adafactor gets beta1 0.9 so it has a first moment to realign like the others.
# The PLUMAGE arms are the paper's estimator (the default when this table was made), named in full by plumage_flags
# so that an arm does not move when a default changes.
PAPER = plumage_flags()
MAIN = {
    "adamw": ("adamw", []),
    "galore_adamw": ("galore_adamw", []),
    "plumage_adamw realign=none": ("plumage_adamw", ["--realign", "none", *PAPER]),
    "plumage_adamw realign=m": ("plumage_adamw", ["--realign", "m", *PAPER]),
    "plumage_adamw realign=mv": ("plumage_adamw", PAPER),
    "plumage_adamw realign=mv adaptive": ("plumage_adamw", ["--adaptive_interval", *PAPER]),
    # PLUMAGE with each 1/p capped (biased, bounded steps); 1 = the sampled basis without rescaling
    "plumage_adamw max_inv_p=1": ("plumage_adamw", plumage_flags(max_inv_p=1)),
    "plumage_adamw max_inv_p=3": ("plumage_adamw", plumage_flags(max_inv_p=3)),
    "plumage_adamw max_inv_p=10": ("plumage_adamw", plumage_flags(max_inv_p=10)),
    "flora_adamw": ("flora_adamw", []),
    "galore_adamw8bit": ("galore_adamw8bit", []),
    "plumage_adamw8bit": ("plumage_adamw8bit", PAPER),
    "galore_adafactor": ("galore_adafactor", ["--beta1", "0.9"]),
    "plumage_adafactor": ("plumage_adafactor", ["--beta1", "0.9", *PAPER]),
    "plumage_adafactor max_inv_p=3": ("plumage_adafactor", ["--beta1", "0.9", *plumage_flags(max_inv_p=3)]),
}
SGDM = {  # --beta1 is SGD's momentum in GaLore's script
    "sgdm": ("sgdm", ["--beta1", "0.9"]),
    "galore_sgdm": ("galore_sgdm", ["--beta1", "0.9"]),
    "plumage_sgdm realign=m": ("plumage_sgdm", ["--beta1", "0.9", *PAPER]),
    "plumage_sgdm realign=m max_inv_p=1": ("plumage_sgdm", ["--beta1", "0.9", *plumage_flags(max_inv_p=1)]),
    "plumage_sgdm realign=m max_inv_p=3": ("plumage_sgdm", ["--beta1", "0.9", *plumage_flags(max_inv_p=3)]),
    "plumage_sgdm realign=m max_inv_p=10": ("plumage_sgdm", ["--beta1", "0.9", *plumage_flags(max_inv_p=10)]),
}
TABLES = {"main": MAIN, "sgdm": SGDM}
# closure of which arm is measured against which GaLore arm (same backend) and the full-rank AdamW reference
GALORE_OF = {"adamw": "galore_adamw", "adamw8bit": "galore_adamw8bit", "adafactor": "galore_adafactor",
             "sgdm": "galore_sgdm"}
FULL_RANK_OF = {"adamw": "adamw", "adamw8bit": "adamw", "adafactor": "adamw", "sgdm": "sgdm"}


def command_for(optimizer: str, extra: list[str], seed: int, lr: float, args, save_dir: Path) -> list[str]:
    return [
        sys.executable, str(ROOT / "torchrun_main.py"), "--optimizer", optimizer, *with_family_pins(optimizer, extra),
        "--model_config", args.model_config, "--lr", str(lr), "--galore_scale", "1.0",
        "--batch_size", str(args.batch_size), "--max_length", str(args.max_length),
        "--num_training_steps", str(args.steps), "--warmup_steps", str(max(1, args.steps // 10)),
        "--eval_every", str(max(1, args.steps // 4)), "--save_every", str(args.steps), "--rank", str(args.rank),
        "--update_proj_gap", str(args.update_proj_gap), "--seed", str(seed), "--eval_tokens", str(args.eval_tokens),
        "--save_dir", str(save_dir), "--no-progress",
    ]


def run_dir(label: str, seed: int, runs: str = "runs/pretrain_compare") -> Path:
    return ROOT / runs / label.replace(" ", "_").replace("=", "-") / f"seed{seed}"


def ensure_run(label: str, optimizer: str, extra: list[str], seed: int, lr: float, args) -> dict | None:
    """Run one arm for one seed (unless the same command already finished) and return its summary record.

    With --report-only nothing runs: a missing run gives None and its arm is left out of the table.
    """
    save_dir = run_dir(label, seed, args.runs)
    command = command_for(optimizer, extra, seed, lr, args, save_dir)
    summary = run_or_reuse(command, save_dir, _summary, f"{label} seed {seed}", report_only=args.report_only)
    if summary is None:
        print(f"(no finished run of {label!r} seed {seed} with this command in {save_dir}: left out)")
    return summary


def _summary(save_dir: Path) -> dict | None:
    if not (save_dir / "metrics.jsonl").exists():
        return None
    return next((r for r in load_run(save_dir)[1] if r["type"] == "summary"), None)


def gap_closure(galore: float, arm: float, full_rank: float) -> float | None:
    """(L_galore - L_arm) / (L_galore - L_full): 0 = no better than GaLore, 1 = as good as full rank.

    None when full rank is not better than GaLore: then there is no gap to close and the ratio means nothing.
    """
    return (galore - arm) / (galore - full_rank) if galore > full_rank else None


def percent(value: float | None) -> str:
    return "undefined" if value is None else f"{100 * value:+.0f} %"


def mean_spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4f} ± {(max(values) - min(values)) / 2:.4f}"


def report(name: str, arms: dict, losses: dict[str, list[float]], lr: float, args) -> str:
    """One markdown table: per-seed eval losses, their mean ± half-range, the gain over GaLore and the gap closure."""
    seeds, mean = args.seeds, statistics.fmean
    lines = [f"### {'Main comparison' if name == 'main' else 'SGD-momentum study'} (lr {lr})", "",
             f"| arm | flags | {' | '.join(f'seed {s}' for s in seeds)} | eval loss mean ± half-range | ppl of mean | "
             "L_galore − L (mean; per seed) | gap closure (of means; per seed) |",
             "|---|---|" + "---:|" * (len(seeds) + 4)]
    for label, (optimizer, extra) in ((k, v) for k, v in arms.items() if k in losses):
        backend = optimizer.split("_", 1)[-1] if "_" in optimizer else optimizer
        galore, full = GALORE_OF.get(backend), FULL_RANK_OF.get(backend)
        gain = closure = ""
        if label != galore and galore in losses:
            pairs = list(zip(losses[galore], losses[label], strict=True))
            gain = f"{mean(losses[galore]) - mean(losses[label]):+.4f}; " + ", ".join(f"{g - a:+.4f}" for g, a in pairs)
        if label not in (galore, full) and galore in losses and full in losses:
            of_means = gap_closure(mean(losses[galore]), mean(losses[label]), mean(losses[full]))
            # per seed only where the means define a gap: a seed's own gap can be far smaller than the noise
            closure = "undefined: full rank not better than GaLore" if of_means is None else percent(of_means) + \
                "; " + ", ".join(percent(gap_closure(g, a, f)) for (g, a), f in zip(pairs, losses[full], strict=True))
        cells = " | ".join(f"{v:.4f}" for v in losses[label])
        ppl = perplexity(mean(losses[label]))
        lines.append(f"| {label} | `{' '.join([optimizer, *extra])}` | {cells} | {mean_spread(losses[label])} | "
                     f"{ppl:.1f} | {gain} | {closure} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", choices=["main", "sgdm", "all"], default="all")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    parser.add_argument("--model_config", default="configs/llama_tiny.json")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--update_proj_gap", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-3, help="peak lr of every arm of the main table")
    parser.add_argument("--sgdm_lr", type=float, default=0.1, help="peak lr of every arm of the SGD-momentum table")
    parser.add_argument("--eval_tokens", type=int, default=50_000)
    parser.add_argument("--out", default="docs", help="where pretrain_compare.md and the figures go")
    parser.add_argument("--runs", default="runs/pretrain_compare", help="one folder per arm and seed under here")
    parser.add_argument("--arms", type=lambda s: s.split(","), default=None,
                        help="comma-separated arm labels to run (default: every arm of the table)")
    parser.add_argument("--name", default="pretrain", help="<name>_compare.md and <name>_<table>_loss.png are written")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (set OMP_NUM_THREADS so they share the CPU)")
    parser.add_argument("--report-only", action="store_true", help="only redraw from finished runs")
    args = parser.parse_args()
    if len(args.seeds) < 1 or args.steps < 1 or args.jobs < 1:
        parser.error(f"need at least one seed, step and job; got seeds {args.seeds}, steps {args.steps}, jobs {args.jobs}")

    import matplotlib

    matplotlib.use("Agg")
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for name in (["main", "sgdm"] if args.table == "all" else [args.table]):
        arms, lr = TABLES[name], (args.lr if name == "main" else args.sgdm_lr)
        if args.arms is not None:
            arms = {label: arm for label, arm in arms.items() if label in args.arms}
            if not arms:
                continue
        jobs = [(label, opt, extra, seed) for label, (opt, extra) in arms.items() for seed in args.seeds]
        with ThreadPoolExecutor(args.jobs) as pool:  # each run is its own process; threads only wait on them
            summaries = list(pool.map(lambda job, lr=lr: ensure_run(*job, lr, args), jobs))
        losses = {label: [] for label in arms}
        for (label, *_), summary in zip(jobs, summaries, strict=True):
            losses[label].append(summary["eval_loss"] if summary else None)
        losses = {label: values for label, values in losses.items() if None not in values}
        sections.append(report(name, arms, losses, lr, args))
        curves = [(label, load_run(run_dir(label, args.seeds[0], args.runs))[1]) for label in losses
                  if name == "sgdm" or label in ("adamw", "galore_adamw", "plumage_adamw realign=mv", "flora_adamw",
                                                 "plumage_adamw max_inv_p=3")]
        plot_losses(curves, out / f"{args.name}_{name}_loss.png", log_scale=name == "sgdm", window=10)
    flags = " ".join(f"--{k} {v}" for k, v in [("steps", args.steps), ("batch_size", args.batch_size),
                                                ("max_length", args.max_length), ("rank", args.rank),
                                                ("update_proj_gap", args.update_proj_gap), ("lr", args.lr),
                                                ("sgdm_lr", args.sgdm_lr), ("eval_tokens", args.eval_tokens),
                                                ("seeds", ",".join(map(str, args.seeds)))])
    for key, default in (("runs", "runs/pretrain_compare"), ("name", "pretrain")):
        if getattr(args, key) != default:
            flags += f" --{key} {getattr(args, key)}"
    if args.arms is not None:
        flags += f" --arms '{','.join(args.arms)}'"
    text = (f"# Pretraining comparison ({Path(args.model_config).stem}, bundled corpus)\n\n"
            f"Command: `python benchmarks/pretrain_compare.py --table {args.table} {flags}`\n\n" + "\n".join(sections))
    (out / f"{args.name}_compare{'' if args.table == 'all' else '_' + args.table}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
