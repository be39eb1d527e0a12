"""Where a low-rank step goes, per weight and per update: kept vs sampled rows, entering directions, first blow-ups.

    OMP_NUM_THREADS=1 python benchmarks/step_anatomy.py                  # the arms below: docs/step_anatomy.md
    python benchmarks/step_anatomy.py --arms paper,norm_matched --steps 100

Each arm trains llama_tiny on the bundled corpus (torchrun_main.py's flags and data, no checkpoints) with an
observer on the optimizer (LowRankOptimizer.step_observers) that records, for every low-rank weight and update:

- the norm of the full-size step carried by the kept rows (p = 1) and by the sampled rows (p < 1): P has
  orthonormal columns, so row i contributes (step_size · scale / p_i)² ‖Z_i‖²;
- at a refresh, the mean |normalized update| (step_size / lr · |Z|, before 1/p) of the rows that entered the basis
  (less than half of the new vector lies in the old span: Σ_j B_ij² < 0.5) and of the rows that stayed;
- the first update at which each weight's step exceeds 5x its own median step (a blow-up), in order.

The per-update records go to runs/step_anatomy/<arm>.jsonl, the summary to docs/step_anatomy.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumage_flags import plumage_flags, with_family_pins  # noqa: E402 - benchmarks/ is on sys.path when this file runs

from galore_plumage.training.config import parse_config  # noqa: E402
from galore_plumage.training.data import Batches  # noqa: E402
from galore_plumage.training.distributed import init_distributed  # noqa: E402
from galore_plumage.training.loop import evaluate, make_optimizer, seed_everything  # noqa: E402
from galore_plumage.training.model import build_model, load_model_config  # noqa: E402
from galore_plumage.training.schedule import build_scheduler  # noqa: E402

# every PLUMAGE arm at the paper's scale and with each option named, so the arms do not move with the defaults
PAPER_SCALE = ["--galore_scale", "1.0"]


def plumage_arm(**options) -> list[str]:
    """plumage_adamw at the paper's scale with `options` changed, pinned to PLUMAGE's projector (with_family_pins)."""
    return ["--optimizer", "plumage_adamw", *with_family_pins("plumage_adamw", [*PAPER_SCALE, *plumage_flags(**options)])]


ARMS = {  # label -> torchrun_main.py optimizer flags
    "galore": ["--optimizer", "galore_adamw", "--galore_scale", "1.0"],
    "paper": plumage_arm(),
    "cap3": plumage_arm(max_inv_p=3),
    "norm_matched": plumage_arm(sampled_step="norm_matched"),
    "row_bias": plumage_arm(row_bias_correction=True),
}
BLOW_UP = 5.0  # a step this many times the weight's own median step


class Recorder:
    """The optimizer observer: one record per low-rank weight and update."""

    def __init__(self, optimizer, names: dict[torch.Tensor, str]):
        self.names, self.update, self.records = names, 0, []
        self.group = {p: group for group in optimizer.param_groups for p in group["params"]}

    def __call__(self, param, projector, update, state, refreshed):
        z = update.direction.double()
        (mode,) = projector.factors  # one-sided projections (std): the rows of the basis lie along `mode`
        size = abs(update.step_size) * projector.scale
        inv_p = projector.inv_p.double() if projector.inv_p is not None else torch.ones(z.shape[mode], dtype=z.dtype)
        per_row = z.square().sum(dim=1 - mode) * (size * inv_p).square()
        kept = inv_p == 1
        record = {"update": self.update, "weight": self.names[param], "refreshed": refreshed,
                  "kept": per_row[kept].sum().sqrt().item(), "sampled": per_row[~kept].sum().sqrt().item(),
                  "max_inv_p": inv_p.max().item()}
        if refreshed and projector.moved:
            carried = projector.transition[mode].double().square().sum(dim=1)  # Σ_j B_ij² per new row
            normalized = (z.abs() * abs(update.step_size) / self.group[param]["lr"]).mean(dim=1 - mode)
            entering = carried < 0.5
            if entering.any():
                record["entering"] = normalized[entering].mean().item()
            if (~entering).any():
                record["staying"] = normalized[~entering].mean().item()
        self.records.append(record)


def train_observed(flags: list[str], args, make_observer) -> tuple[object, float, list[float]]:
    """Train llama_tiny (torchrun_main.py's flags and data, no checkpoints) with make_observer(optimizer, names) on
    its step_observers, whose `update` attribute is set before each update: (the observer, eval loss, train losses)."""
    argv = [*flags, "--model_config", args.model_config, "--rank", str(args.rank), "--update_proj_gap",
            str(args.update_proj_gap), "--lr", str(args.lr), "--batch_size", str(args.batch_size), "--max_length",
            str(args.max_length), "--num_training_steps", str(args.steps), "--warmup_steps", str(args.steps // 10),
            "--eval_tokens", str(args.eval_tokens), "--seed", str(args.seed), "--save_dir", "runs/step_anatomy/unused"]
    config = parse_config(argv)
    context = init_distributed()
    seed_everything(config.seed)
    batches = Batches(config, context)
    model_config = load_model_config(config.model_config, len(batches.tokenizer), batches.tokenizer.eos_token_id)
    model = build_model(model_config, torch.float32, context.device, config.seed, False)
    optimizer = make_optimizer(config, model)
    scheduler = build_scheduler(optimizer, config.scheduler, config.warmup_steps, config.num_training_steps,
                                config.min_lr_ratio)
    observer = make_observer(optimizer, {p: n for n, p in model.named_parameters()})
    optimizer.step_observers.append(observer)
    losses = []
    for update in range(config.num_training_steps):
        observer.update = update
        batch = batches.next()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.item())
    eval_loss, _ = evaluate(model, batches.validation, context, contextlib.nullcontext)
    return observer, eval_loss, losses


def run_arm(label: str, flags: list[str], args) -> dict:
    recorder, eval_loss, losses = train_observed(flags, args, Recorder)
    out = ROOT / "runs" / "step_anatomy"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{label}.jsonl").write_text("\n".join(json.dumps(r) for r in recorder.records) + "\n")
    return summarize(recorder.records, eval_loss, statistics.fmean(losses[-20:]))


def summarize(records: list[dict], eval_loss: float, train_loss: float) -> dict:
    def share(r):
        total = r["kept"] ** 2 + r["sampled"] ** 2
        return r["sampled"] ** 2 / total if total else 0.0

    at_refresh = [share(r) for r in records if r["refreshed"]]
    within = [share(r) for r in records if not r["refreshed"]]
    steps = [(r["kept"] ** 2 + r["sampled"] ** 2) ** 0.5 for r in records]
    by_weight: dict[str, list[tuple[int, float]]] = {}
    for r, step in zip(records, steps, strict=True):
        by_weight.setdefault(r["weight"], []).append((r["update"], step))
    blow_ups = []
    for weight, series in by_weight.items():
        median = statistics.median(s for _, s in series)
        first = next((u for u, s in series if s > BLOW_UP * median), None)
        if first is not None:
            blow_ups.append((first, weight))
    entering = [r["entering"] for r in records if "entering" in r]
    staying = [r["staying"] for r in records if "staying" in r]
    return {
        "eval_loss": eval_loss, "train_loss": train_loss,
        "share_at_refresh": statistics.median(at_refresh) if at_refresh else 0.0,
        "share_within": statistics.median(within) if within else 0.0,
        "median_step": statistics.median(steps), "max_step": max(steps),
        "entering": statistics.fmean(entering) if entering else None,
        "staying": statistics.fmean(staying) if staying else None,
        "blow_ups": sorted(blow_ups)[:3], "blow_up_count": len(blow_ups), "weights": len(by_weight),
    }


def parse_observed_args(doc: str, arms: dict, steps: int, lr: float, out: str) -> argparse.Namespace:
    """The command line of a script built on train_observed: its arms, the training run's flags, the report's path."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(arms))
    parser.add_argument("--model_config", default="configs/llama_tiny.json")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--update_proj_gap", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--eval_tokens", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=out)
    args = parser.parse_args()
    unknown = [a for a in args.arms if a not in arms]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(arms)}")
    return args


def _two(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def main() -> None:
    args = parse_observed_args(__doc__, ARMS, steps=200, lr=1e-3, out="docs/step_anatomy.md")
    rows = []
    for label in args.arms:
        s = run_arm(label, ARMS[label], args)
        first = ", ".join(f"{w.removeprefix('model.').removesuffix('.weight')} @ {u}" for u, w in s["blow_ups"]) or "none"
        rows.append(f"| {label} | `{' '.join(ARMS[label])}` | {s['eval_loss']:.4f} | {s['train_loss']:.4f} | "
                    f"{100 * s['share_within']:.0f} % | {100 * s['share_at_refresh']:.0f} % | {s['median_step']:.2e} | "
                    f"{s['max_step']:.2e} | {_two(s['entering'])} | {_two(s['staying'])} | "
                    f"{s['blow_up_count']} of {s['weights']}: {first} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        f"# Step anatomy ({Path(args.model_config).stem}, {args.steps} updates, lr {args.lr:g}, rank {args.rank}, "
        f"τ {args.update_proj_gap}, seed {args.seed})", "",
        f"Command: `OMP_NUM_THREADS=1 python benchmarks/step_anatomy.py --arms {','.join(args.arms)} --steps {args.steps} "
        f"--lr {args.lr:g}`", "",
        "Per low-rank weight and update: the full-size step ‖ΔW‖ split into its kept rows (p = 1) and its "
        "sampled rows (p < 1). Sampled share: median over weights and updates of ‖ΔW_sampled‖² / ‖ΔW‖², within an "
        "interval and at the update of a refresh. Entering / staying: mean |normalized update| (step_size/lr·|Z|, "
        "before 1/p) of the rows that entered the basis at a refresh and of those that stayed. Blow-ups: weights "
        f"whose step exceeded {BLOW_UP:g}x their own median step, the first three by update.", "",
        "| arm | flags | eval loss | train loss (last 20) | sampled share within | at refresh | median ‖ΔW‖ | "
        "max ‖ΔW‖ | entering | staying | blow-ups (first) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", *rows, ""])
    (ROOT / args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
