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
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from plot_runs import load_run, plot_losses  # noqa: E402
from plumage_flags import with_family_pins  # noqa: E402 - benchmarks/ is on sys.path when this file runs
from protocol_arms import ARMS, REFERENCE, WARMUP_FRACTION  # noqa: E402
from protocol_statistics import max_rise, mean_sd, paired, spread_test  # noqa: E402
from run_cache import run_or_reuse  # noqa: E402 - benchmarks/ is on sys.path when this file runs

from galore_plumage.training import DIVERGED  # noqa: E402


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


def _finished(save_dir: Path) -> tuple[list[dict], dict] | None:
    """(records, summary) of a finished run; None when it has not finished."""
    if not (save_dir / "metrics.jsonl").exists():
        return None
    records = load_run(save_dir)[1]
    summary = next((r for r in records if r["type"] == "summary"), None)
    return None if summary is None else (records, summary)


def _evals(save_dir: Path) -> list[float] | None:
    """The eval losses of a finished run, in order; None when it has not finished."""
    finished = _finished(save_dir)
    return None if finished is None else [r["eval_loss"] for r in finished[0] if r["type"] == "eval"]


def _passes(save_dir: Path) -> float | None:
    """How many times a finished run read its training text (its summary's `passes`); None when not recorded (a
    stream, a run from before session 80, or one not finished)."""
    finished = _finished(save_dir)
    return None if finished is None else finished[1].get("passes")


def passes_line(args, best: dict[str, float], labels) -> list[str]:
    """The report's note on how often each arm's seeds read their training text, where recorded: past one pass an
    eval loss also measures how a fit to text seen again holds on held-out text (session 80: at 5000 updates of 512
    tokens the plays are read 1.9 times, and there an arm's lower training loss came with a higher eval loss)."""
    read = {}
    for label in labels:
        recorded = [p for s in args.seeds if (p := _passes(run_dir(args, label, best[label], s))) is not None]
        if recorded:
            read[label] = max(recorded)
    if not read:
        return []
    note = (" Past 1 the runs read text they had trained on again: an eval loss is then partly how a fit to it holds "
            "on held-out text, not only how fast the optimizer fits." if max(read.values()) > 1 else "")
    return ["", "Passes over the training text (the most of any seed): "
            + ", ".join(f"{label} {value:.2f}" for label, value in read.items()) + "." + note]


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
        mean = mean_sd(last, ".4f") if finite else "diverged"
        rise = max(max_rise(run) for run in runs) if finite else math.inf
        compare = args.reference in finals and label != args.reference
        reference = [r[-1] for r in finals[args.reference]] if compare else []
        versus, spread = (paired(reference, last), spread_test(reference, last)) if compare else ("", "")
        lines.append(f"| {label} | {best[label]:g} | " + " | ".join(fmt(v) for v in last) +
                     f" | {mean} | {fmt(rise)} | {versus} | {spread} |")
    lines += passes_line(args, best, finals)
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
