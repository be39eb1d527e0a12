"""Estimator lab: bias and error of the svd, random and plumage projectors on real llama_tiny gradients.

    python benchmarks/estimator_lab.py                      # trains llama_tiny 100 updates first (~1 min), then measures
    python benchmarks/estimator_lab.py --checkpoint runs/demo --draws 200 --ranks 8,16,32,64

1. Weights: a torchrun_main.py checkpoint (--checkpoint), or a short AdamW run made here (runs/estimator_lab/).
2. Gradients: one training batch through that model; every attention and MLP weight's gradient, the matrices a
   low-rank optimizer projects.
3. For each gradient and rank: Monte Carlo bias ‖E Ĝ − G‖/‖G‖ and error E‖Ĝ − G‖²/‖G‖² (galore_plumage.
   projectors.diagnostics) of svd, random and plumage, beside each one's closed form; PLUMAGE's r* and 1/p.
4. The two ways to find singular vectors (`solver` svd and gram): refresh time, agreement of σ and of the top-k
   subspace, and PLUMAGE's error with each, since gram may become PLUMAGE's default only if it changes nothing.
Writes docs/estimator_lab.md and docs/estimator_lab_{error,inv_p}.png.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from galore_plumage.projectors import build_projector, inclusion_probabilities, projected_modes
from galore_plumage.projectors.diagnostics import closed_form_error, monte_carlo, projected_side
from galore_plumage.projectors.spectrum import decompose

ROOT = Path(__file__).resolve().parent.parent
PROJECTORS = ("svd", "random", "plumage")
TRAIN_FLAGS = ["--model_config", "configs/llama_tiny.json", "--optimizer", "adamw", "--lr", "1e-3",
               "--batch_size", "8", "--max_length", "256", "--warmup_steps", "10", "--eval_tokens", "20000"]


def trained_model_folder(args) -> Path:
    """The checkpoint folder to load: the user's, or a short AdamW run made (once) under runs/estimator_lab/."""
    from galore_plumage.training.checkpoint import resolve_checkpoint

    if args.checkpoint:
        return resolve_checkpoint(args.checkpoint)
    save_dir = ROOT / "runs" / "estimator_lab" / f"adamw_{args.train_steps}"
    if not (save_dir / "latest").exists():
        steps = str(args.train_steps)
        subprocess.run([sys.executable, str(ROOT / "torchrun_main.py"), *TRAIN_FLAGS, "--num_training_steps", steps,
                        "--eval_every", steps, "--save_every", steps, "--save_dir", str(save_dir), "--no-progress"],
                       check=True, cwd=ROOT)
    return resolve_checkpoint(save_dir)


def capture_gradients(folder: Path, seed: int) -> dict[str, torch.Tensor]:
    """Gradients of every attention/MLP weight for one training batch of the bundled corpus (batch 8 × 256)."""
    from transformers import LlamaForCausalLM

    from galore_plumage.training.config import parse_config
    from galore_plumage.training.data import Batches
    from galore_plumage.training.distributed import Dist

    config = parse_config([*TRAIN_FLAGS, "--seed", str(seed), "--save_dir", str(ROOT / "runs" / "estimator_lab" / "tmp")])
    batch = Batches(config, Dist(0, 0, 1, torch.device("cpu"))).next()
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model(input_ids=batch, labels=batch).loss.backward()
    return {name.removeprefix("model.").removesuffix(".weight"): p.grad.detach().to(torch.float64)
            for name, p in model.named_parameters() if p.grad is not None and p.dim() == 2
            and (".self_attn." in name or ".mlp." in name)}


def estimator_rows(grads: dict[str, torch.Tensor], ranks: list[int], draws: int) -> list[dict]:
    rows = []
    for name, grad in grads.items():
        sigma, side = torch.linalg.svdvals(grad), projected_side(tuple(grad.shape))
        for rank in ranks:
            for projector in PROJECTORS:
                quality = monte_carlo(lambda s, p=projector, r=rank: build_projector(p, rank=r, seed=s), grad,
                                      1 if projector == "svd" else draws)
                rows.append({"weight": name, "shape": tuple(grad.shape), "rank": rank, "projector": projector,
                             "bias": quality.bias, "bias_floor": quality.bias_floor, "error": quality.error,
                             "error_sem": quality.error_sem, "closed": closed_form_error(projector, sigma, rank, side)})
        print(f"  {name} {tuple(grad.shape)} done", flush=True)
    return rows


def sampling_rows(grads: dict[str, torch.Tensor], rank: int) -> list[dict]:
    """PLUMAGE's r* and inclusion probabilities of each weight at the training rank."""
    rows = []
    for name, grad in grads.items():
        r_star, p = inclusion_probabilities(torch.linalg.svdvals(grad), rank)
        sampled = p[(p > 0) & (p < 1)]
        rows.append({"weight": name, "r_star": r_star, "inv_p": (1 / sampled).tolist(),
                     "candidates": int(sampled.numel())})
    return rows


def solver_rows(grads: dict[str, torch.Tensor], rank: int, draws: int, reps: int) -> list[dict]:
    """svd vs gram on each weight: refresh time, σ and subspace agreement, PLUMAGE error with each."""
    rows = []
    for name, grad in grads.items():
        grad32 = grad.float()  # optimizers refresh from float32 gradients
        (mode,) = projected_modes(tuple(grad.shape), "std")
        times = {}
        for solver in ("svd", "gram"):
            samples = []
            for _ in range(reps):
                projector = build_projector("plumage", rank=rank, solver=solver)
                start = time.perf_counter()
                projector.refresh(grad32, step=0)
                samples.append(time.perf_counter() - start)
            times[solver] = statistics.median(samples)
        exact, gram = decompose(grad32, (mode,), "svd"), decompose(grad32, (mode,), "gram")
        top = torch.arange(rank)
        u_svd, u_gram = exact.factor(mode, top).double(), gram.factor(mode, top).double()
        # ‖P Pᵀ − P̃ P̃ᵀ‖_F / √(2k): 0 when the top-k subspaces agree, 1 when orthogonal
        difference = u_svd @ u_svd.T - u_gram @ u_gram.T
        distance = (difference.norm() / (2 * rank) ** 0.5).item()
        # what the difference does to G itself: directions that differ but carry no energy do not matter
        action = ((difference @ grad if mode == 0 else grad @ difference).norm() / grad.norm()).item()
        sigma_gap = ((exact.sigma - gram.sigma).abs().max() / exact.sigma[0]).item()
        errors = {solver: monte_carlo(lambda s, v=solver: build_projector("plumage", rank=rank, seed=s, solver=v),
                                      grad32, draws) for solver in ("svd", "gram")}
        closed = closed_form_error("plumage", torch.linalg.svdvals(grad), rank, projected_side(tuple(grad.shape)))
        rows.append({"weight": name, "shape": tuple(grad.shape), "time_svd": times["svd"], "time_gram": times["gram"],
                     "sigma_gap": sigma_gap, "distance": distance, "action": action,
                     "error_svd": errors["svd"], "error_gram": errors["gram"],
                     "closed": closed})
    return rows


def _median(values) -> float:
    return statistics.median(list(values))


def write_report(args, est: list[dict], sampling: list[dict], solvers: list[dict], seconds: float) -> str:
    lines = [f"# Estimator lab: {len(sampling)} attention/MLP gradients of llama_tiny", "",
             f"Command: `python benchmarks/estimator_lab.py {' '.join(sys.argv[1:])}`".replace("  ", " "),
             f"(weights: {args.source}; one training batch of 8 × 256 tokens; {args.draws} Monte Carlo draws per "
             f"unbiased projector and rank; {seconds / 60:.1f} min on {args.machine}).", "",
             "## Bias and error by rank (median over the weights)", "",
             "error = E‖Ĝ − G‖²/‖G‖², closed form from galore_plumage.projectors.diagnostics; bias/floor ≈ 1 means the "
             "measured bias is Monte Carlo noise (unbiased), ≫ 1 a real bias. |MC − closed|/SEM: the worst weight's "
             "gap between measured and closed-form error, in standard errors.", "",
             "| rank | projector | bias ‖EĜ − G‖/‖G‖ | bias / floor | error (MC) | error (closed form) | "
             "worst \\|MC − closed\\|/SEM |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for rank in args.ranks:
        for projector in PROJECTORS:
            rows = [r for r in est if r["rank"] == rank and r["projector"] == projector]
            ratio = "—" if projector == "svd" else f"{_median(r['bias'] / r['bias_floor'] for r in rows):.2f}"
            worst = "exact" if projector == "svd" else \
                f"{max(abs(r['error'] - r['closed']) / r['error_sem'] for r in rows):.1f}"
            lines.append(f"| {rank} | {projector} | {_median(r['bias'] for r in rows):.2e} | {ratio} | "
                         f"{_median(r['error'] for r in rows):.3e} | {_median(r['closed'] for r in rows):.3e} | {worst} |")
    rank = max(args.ranks)
    lines += ["", f"## Per weight at rank {rank}: PLUMAGE's r* and 1/p, and each projector's error", "",
              "| weight | shape | r* | sampled from | max 1/p | svd error | plumage error (MC / closed) | random error |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for s in sampling:
        by = {r["projector"]: r for r in est if r["weight"] == s["weight"] and r["rank"] == rank}
        max_inv_p = f"{max(s['inv_p']):.1f}" if s["inv_p"] else "—"
        lines.append(f"| {s['weight']} | {by['svd']['shape'][0]}×{by['svd']['shape'][1]} | {s['r_star']} | "
                     f"{s['candidates']} | {max_inv_p} | {by['svd']['error']:.2e} | {by['plumage']['error']:.3e} / "
                     f"{by['plumage']['closed']:.3e} | {by['random']['error']:.3f} |")
    lines += ["", f"## Solvers: `svd` (torch.linalg.svd) vs `gram` (eigh of the projected side's Gram matrix), rank {rank}",
              "", "Refresh time is the median of one PLUMAGE refresh from a float32 gradient; "
              "σ gap = max |σ_svd − σ_gram| / σ_1; "
              "subspace distance = ‖PPᵀ − P̃P̃ᵀ‖_F/√(2k) of the top-k vectors (1 = orthogonal), and its action on the "
              "gradient ‖(PPᵀ − P̃P̃ᵀ)G‖/‖G‖ (vectors that differ but carry no energy do not matter); PLUMAGE error "
              "by Monte Carlo with each solver beside the closed form (from the exact σ).", "",
              "| shape | weights | refresh svd (ms) | refresh gram (ms) | gram / svd | max σ gap | max subspace distance | "
              "max action on G | plumage error svd | plumage error gram | closed form |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in dict.fromkeys(r["shape"] for r in solvers):
        rows = [r for r in solvers if r["shape"] == shape]
        t_svd, t_gram = _median(r["time_svd"] for r in rows) * 1e3, _median(r["time_gram"] for r in rows) * 1e3
        lines.append(f"| {shape[0]}×{shape[1]} | {len(rows)} | {t_svd:.2f} | {t_gram:.2f} | {t_gram / t_svd:.2f} | "
                     f"{max(r['sigma_gap'] for r in rows):.1e} | {max(r['distance'] for r in rows):.2f} | "
                     f"{max(r['action'] for r in rows):.1e} | {_median(r['error_svd'].error for r in rows):.3e} | "
                     f"{_median(r['error_gram'].error for r in rows):.3e} | {_median(r['closed'] for r in rows):.3e} |")
    return "\n".join(lines) + "\n"


def plot(args, est: list[dict], sampling: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for projector, color in zip(PROJECTORS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
        for weight in dict.fromkeys(r["weight"] for r in est):
            rows = [r for r in est if r["projector"] == projector and r["weight"] == weight]
            axis.plot([r["rank"] for r in rows], [r["error"] for r in rows], color=color, alpha=0.15, linewidth=0.8)
        medians = [_median(r["error"] for r in est if r["projector"] == projector and r["rank"] == k) for k in args.ranks]
        axis.plot(args.ranks, medians, "o-", color=color, linewidth=2, label=f"{projector} (median)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("rank k")
    axis.set_ylabel("E‖Ĝ − G‖² / ‖G‖²")
    axis.set_title("Error of rank-k gradient estimates, llama_tiny (faint: each weight)", fontsize=9)
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "estimator_lab_error.png", dpi=120)
    plt.close(figure)

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 0.6 + 0.22 * len(sampling)), sharey=True)
    positions = list(range(len(sampling)))  # numeric rows, so both panels share one y axis exactly
    left.barh(positions, [s["r_star"] for s in sampling], color="tab:green")
    left.set_xlabel(f"r* (always kept) of k = {max(args.ranks)}")
    right.boxplot([s["inv_p"] or [1.0] for s in sampling], positions=positions, vert=False, whis=(0, 100))
    right.set_xscale("log")
    right.set_xlabel("1/p of the directions sampled with p < 1")
    left.set_yticks(positions, [s["weight"] for s in sampling])
    left.invert_yaxis()
    for axis in (left, right):
        axis.tick_params(axis="y", labelsize=6)
        axis.grid(alpha=0.3, axis="x")
    figure.tight_layout()
    figure.savefig(out / "estimator_lab_inv_p.png", dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", help="a torchrun_main.py save_dir or model_<step> folder (default: train one)")
    parser.add_argument("--train_steps", type=int, default=100, help="AdamW updates before capture, without --checkpoint")
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64])
    parser.add_argument("--draws", type=int, default=64, help="Monte Carlo draws per unbiased projector and rank")
    parser.add_argument("--solver_reps", type=int, default=5, help="timed refreshes per solver and weight")
    parser.add_argument("--seed", type=int, default=0, help="which training batch the gradients come from")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args()
    if args.draws < 2 or min(args.ranks) < 1 or args.train_steps < 1:
        parser.error(f"need --draws >= 2, ranks >= 1 and --train_steps >= 1; got {args.draws}, {args.ranks}, "
                     f"{args.train_steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    folder = trained_model_folder(args)
    args.source = f"`{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}`"
    args.machine = f"CPU, {torch.get_num_threads()} torch thread(s)"
    grads = capture_gradients(folder, args.seed)
    print(f"captured {len(grads)} gradients from {folder}", flush=True)
    est = estimator_rows(grads, args.ranks, args.draws)
    sampling = sampling_rows(grads, max(args.ranks))
    solvers = solver_rows(grads, max(args.ranks), args.draws, args.solver_reps)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    text = write_report(args, est, sampling, solvers, time.perf_counter() - start)
    (out / "estimator_lab.md").write_text(text)
    plot(args, est, sampling, out)
    print(text)


if __name__ == "__main__":
    main()
