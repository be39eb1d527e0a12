"""How far Fira's complement moves the weight, per update since the last refresh: what its limiter does to it.

    OMP_NUM_THREADS=1 python benchmarks/complement_anatomy.py            # the arms below: docs/complement_anatomy.md

Each arm trains llama_tiny (benchmarks/step_anatomy.py's loop) with an observer that records, for every low-rank weight
and update: the share of the gradient inside the basis, ‖R‖² / ‖G‖² (R = Pᵀ G); Fira's φ = ‖Z‖ / ‖R‖ per column
before the limiter; and the limiter's factor (the φ the step used over that φ; one factor per weight). A refresh fits
the basis to that update's gradient, so its complement is near zero there; Fira's limiter takes that size as the
reference and lets the complement regrow by only 1 % an update (optimizers/residual.py, `residual_limiter`).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plumage_flags import plumage_flags, with_family_pins  # noqa: E402 - benchmarks/ is on sys.path when this file runs
from step_anatomy import parse_observed_args, train_observed  # noqa: E402

DEFAULT = ["--optimizer", "plumage_adamw", "--galore_scale", "0.25", "--pool_bf16",
           *with_family_pins("plumage_adamw", plumage_flags(max_inv_p=1, resample_every=1, residual="norm_matched"))]
ARMS = {  # label -> torchrun_main.py optimizer flags (every option named: the arms do not move with the defaults)
    "fira_limiter": [*DEFAULT, "--residual_limiter", "fira"],
    "steady_limiter": [*DEFAULT, "--residual_limiter", "steady"],
}
BUCKETS = ((1, 1), (2, 2), (3, 10), (11, 10**9))  # updates since the last refresh (1: the refresh's own update)


class ComplementRecorder:
    def __init__(self, optimizer, names):
        self.update, self.records = 0, []
        self.since = {}

    def __call__(self, param, projector, update, state, refreshed):
        if update.complement is None:
            return
        self.since[param] = 1 if refreshed else self.since.get(param, 0) + 1
        (mode,) = projector.factors
        grad = param.grad.double()
        low = projector.project(param.grad).double()
        r_norm = low.norm(dim=mode, keepdim=True)
        raw = update.direction.double().norm(dim=mode, keepdim=True) / r_norm
        used = update.complement.double()
        live = (r_norm > 0) & (raw > 0)
        self.records.append({"since": self.since[param], "captured": (r_norm.square().sum() / grad.square().sum()).item(),
                             "phi": raw[live].median().item(), "factor": (used[live] / raw[live]).median().item()})


def bucket_rows(records: list[dict]) -> list[str]:
    rows = []
    for low, high in BUCKETS:
        chosen = [r for r in records if low <= r["since"] <= high]
        if not chosen:
            continue
        label = str(low) if low == high else (f"{low}–{high}" if high < 10**9 else f"≥ {low}")
        rows.append(f"{label} | {statistics.median(r['captured'] for r in chosen):.3f} | "
                    f"{statistics.median(r['phi'] for r in chosen):.3g} | {statistics.median(r['factor'] for r in chosen):.3f}")
    return rows


def main() -> None:
    args = parse_observed_args(__doc__, ARMS, steps=120, lr=5e-3, out="docs/complement_anatomy.md")
    torch.set_num_threads(1)
    lines = [f"# Complement anatomy ({Path(args.model_config).stem}, {args.steps} updates, lr {args.lr:g}, rank {args.rank}, "
             f"τ {args.update_proj_gap}, seed {args.seed})", "",
             f"Command: `OMP_NUM_THREADS=1 python benchmarks/complement_anatomy.py --arms {','.join(args.arms)} "
             f"--steps {args.steps} --update_proj_gap {args.update_proj_gap}`", "",
             "Medians over the low-rank weights and the updates in each bucket of updates since the weight's last refresh "
             "(1: the refresh's own update, whose basis was fitted to that gradient). Captured: ‖R‖² / ‖G‖². φ: "
             "Fira's ‖Z‖ / ‖R‖ per column before the limiter. Factor: what the limiter kept of it (1: not limited).", ""]
    for label in args.arms:
        recorder, eval_loss, _ = train_observed(ARMS[label], args, ComplementRecorder)
        lines += [f"## {label}: `{' '.join(ARMS[label])}` (eval loss {eval_loss:.4f})", "",
                  "| updates since refresh | captured | φ | limiter factor |", "|---|---:|---:|---:|",
                  *(f"| {row} |" for row in bucket_rows(recorder.records)), ""]
        print("\n".join(lines[-8:]), flush=True)
    (ROOT / args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
