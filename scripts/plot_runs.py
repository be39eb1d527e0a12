"""Plots from any set of torchrun_main.py runs: loss curves, and per-layer heatmaps of the projector statistics.

    python scripts/plot_runs.py runs/compare/adamw runs/compare/plumage_adamw --out docs/runs
    python scripts/plot_runs.py runs/demo --heatmaps r_star,rho,tau --out docs/demo

Each argument is a run's save_dir (or its metrics.jsonl). Writes <out>_loss.png: train loss (faint, and a
moving average) and eval loss (markers) per run, log-scaled with --log. With --heatmaps, for the first run
that logged each statistic, one <out>_<stat>.png per statistic: a layer × update heatmap (PLUMAGE's r*,
the subspace overlap ρ between consecutive bases, the interval τ, max 1/p, ...), as in the paper's appendix.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def load_run(path: str | Path) -> tuple[str, list[dict]]:
    """(label, records) of one run: a save_dir holding metrics.jsonl, or the file itself."""
    path = Path(path)
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        raise SystemExit(f"plot_runs.py: {str(path)!r} has no metrics.jsonl; pass a torchrun_main.py save_dir")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return (path if path.is_dir() else path.parent).name, records


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_losses(runs: list[tuple[str, list[dict]]], path: Path, log_scale: bool, window: int) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    for label, records in runs:
        train = [(r["step"], r["loss"]) for r in records if r["type"] == "train"]
        evals = [(r["step"], r["eval_loss"]) for r in records if r["type"] == "eval"]
        if not train:
            continue
        steps, losses = zip(*train, strict=True)
        (line,) = axis.plot(steps, moving_average(list(losses), window), linewidth=1.5, label=f"{label} (train)")
        axis.plot(steps, losses, color=line.get_color(), alpha=0.2, linewidth=0.8)
        if evals:
            axis.plot(*zip(*evals, strict=True), "o", color=line.get_color(), label=f"{label} (eval)")
    axis.set_xlabel("update")
    axis.set_ylabel("loss (nats/token)")
    if log_scale:
        axis.set_yscale("log")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def stat_grid(records: list[dict], stat: str) -> tuple[list[str], list[int], list[list[float]]]:
    """Layers (in first-seen order) × logged updates of one projector statistic; NaN where it is missing."""
    rows = [r for r in records if r["type"] == "projector"]
    params = list(dict.fromkeys(r["param"] for r in rows))
    steps = sorted({r["step"] for r in rows})
    grid = [[math.nan] * len(steps) for _ in params]
    for r in rows:
        value = r.get(stat)
        if isinstance(value, (int, float)):
            grid[params.index(r["param"])][steps.index(r["step"])] = float(value)
    return params, steps, grid


def plot_heatmap(label: str, records: list[dict], stat: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    params, steps, grid = stat_grid(records, stat)
    figure, axis = plt.subplots(figsize=(1.2 + 0.5 * len(steps), 1.2 + 0.22 * len(params)))
    image = axis.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    axis.set_xticks(range(len(steps)), [str(s) for s in steps], fontsize=7)
    axis.set_yticks(range(len(params)), [p.removeprefix("model.").removesuffix(".weight") for p in params], fontsize=6)
    axis.set_xlabel("update")
    axis.set_title(f"{label}: {stat} per low-rank weight", fontsize=9)
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="save_dirs (or metrics.jsonl files) of torchrun_main.py runs")
    parser.add_argument("--out", default="docs/runs", help="output prefix: <out>_loss.png, <out>_<stat>.png")
    parser.add_argument("--log", action="store_true", help="log-scale loss axis (the paper's SGD-momentum study)")
    parser.add_argument("--window", type=int, default=10, help="moving-average window of the train loss")
    parser.add_argument("--heatmaps", default="", help="comma-separated projector stats, e.g. r_star,rho,tau,max_inv_p")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")

    import matplotlib

    matplotlib.use("Agg")
    runs = [load_run(path) for path in args.runs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = [out.with_name(out.name + "_loss.png")]
    plot_losses(runs, written[0], args.log, args.window)
    for stat in (s for s in args.heatmaps.split(",") if s):
        having = [(label, records) for label, records in runs
                  if any(r["type"] == "projector" and isinstance(r.get(stat), (int, float)) for r in records)]
        if not having:
            raise SystemExit(f"plot_runs.py: no run logged {stat!r} in projector records (full-rank optimizers log "
                             "none; r_star and max_inv_p come from plumage, rho from the second refresh on)")
        written.append(out.with_name(f"{out.name}_{stat}.png"))
        plot_heatmap(*having[0], stat, written[-1])
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
