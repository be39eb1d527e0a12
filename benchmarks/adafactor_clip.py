"""How much Adafactor's update clipping shrinks the low-rank weights' steps, arm by arm.

Adafactor divides each weight's update G / √V̂ by max(1, RMS / clip_threshold) before the lr. Where every row of
V̂ is an average of its own squared gradients the RMS stays near 1 and the clip seldom acts; a row whose second
moment was just zeroed (a direction that entered the basis at a PLUMAGE draw: realign transports V with B∘B, and an
entering row has no old value) gets a V̂ of (1 − β2ₜ) times a settled row's, so it moves 1/√(1 − β2ₜ) times as far
(16× at update 1000), and the clip then divides the whole weight's update. This script measures that divisor: it
runs each protocol arm named (benchmarks/protocol_arms.py, Adafactor only) for a few hundred updates on the
protocol's setting and records the RMS of every low-rank weight's update before the clip.

    python benchmarks/adafactor_clip.py --arms plumage_adafactor_draws_recipe_ratio2=1e-2,galore_adafactor_recipe=3e-3

One run per arm, one after the other, in its own process (the measurement wraps the backend's two clipping paths,
update() and factored_directions_together, for that process only). Writes docs/adafactor_clip.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pretrain_protocol import command_for, parse_args  # noqa: E402 - benchmarks/ is on sys.path when this file runs
from protocol_arms import ARMS  # noqa: E402


def recording(records: list) -> tuple:
    """Stand-ins for AdafactorBackend._rms and factored_directions_together that compute what the originals do and
    append (shape, RMS before the clip) of each update to `records` (update() also measures the parameter on its first
    update: a weight's shape, which summary_rows leaves out)."""
    import galore_plumage.optimizers.adafactor as adafactor

    one_by_one, together = adafactor.AdafactorBackend._rms, adafactor.factored_directions_together

    def rms(tensor):
        value = one_by_one(tensor)
        records.append((list(tensor.shape), float(value)))
        return value

    def clipped_together(grads, row_factors, col_factors, beta2t, eps, clip_threshold):
        updates = together(grads, row_factors, col_factors, beta2t, eps, float("inf"))  # unclipped
        for update in updates:
            value = float(one_by_one(update))
            records.append((list(update.shape), value))
            update.div_(max(value / clip_threshold, 1.0))
        return updates

    return rms, clipped_together


def measure(argv: list[str], out: Path) -> None:
    """Run torchrun_main.py with `argv` in this process, recording (shape, RMS before the clip) of every factored
    Adafactor update, in order, into `out` (JSON)."""
    import galore_plumage.optimizers.adafactor as adafactor
    import torchrun_main

    records = []
    rms, clipped_together = recording(records)
    adafactor.AdafactorBackend._rms = staticmethod(rms)
    adafactor.factored_directions_together = clipped_together
    if torchrun_main.main(argv) != 0:
        raise SystemExit(f"the run failed: {argv}")
    out.write_text(json.dumps(records))


def arm_argv(arm: str, lr: float, args, save_dir: Path) -> list[str]:
    """torchrun_main.py's arguments for `arm` at `lr`, seed 0: the protocol's own command (pretrain_protocol.command_for,
    its defaults but the number of updates, the rank and the model) with no evaluation before the last update."""
    optimizer, extra, _ = ARMS[arm]
    if "adafactor" not in optimizer:
        raise SystemExit(f"arm {arm!r} runs {optimizer}, not Adafactor: name an Adafactor arm of protocol_arms.ARMS")
    protocol = parse_args(["--steps", str(args.updates), "--rank", str(args.rank), "--model_config", args.model_config,
                           "--eval_every", str(10 * args.updates), "--eval_tokens", "2000"])
    return command_for(optimizer, extra, 0, lr, protocol, save_dir)[2:]  # without the interpreter and the script


def summary_rows(arm: str, lr: float, records: list, rank: int, parts: int) -> list[str]:
    """One table row per part of the run: the low-rank weights' update RMS before the clip (the divisor is
    max(1, RMS) at clip_threshold 1)."""
    low_rank = [value for shape, value in records if len(shape) == 2 and rank in shape]
    rows = []
    for part in range(parts):
        chunk = low_rank[part * len(low_rank) // parts:(part + 1) * len(low_rank) // parts]
        rows.append(f"| {arm} | {lr:g} | {part + 1} of {parts} | {statistics.median(chunk):.2f} | "
                    f"{sum(value > 1 for value in chunk) / len(chunk):.2f} | "
                    f"{statistics.mean(max(value, 1.0) for value in chunk):.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", default="plumage_adafactor_draws_recipe_ratio2=1e-2,galore_adafactor_recipe=3e-3",
                        help="ARM=LR,...: protocol arms and each one's lr (their best at 5000 updates, session 77)")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--parts", type=int, default=3, help="the run's updates in this many parts, a row each")
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--model_config", default="configs/llama_tiny.json")
    parser.add_argument("--out", default=str(ROOT / "docs" / "adafactor_clip.md"))
    parser.add_argument("--measure", nargs=2, metavar=("OUT_JSON", "ARGV_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(json.loads(args.measure[1]), Path(args.measure[0]))
        return
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for item in args.arms.split(","):
            arm, _, lr = item.partition("=")
            if not lr:
                raise SystemExit(f"--arms item {item!r} names no lr: write ARM=LR, e.g. {arm}=1e-2")
            out = Path(scratch) / f"{arm}.json"
            argv = arm_argv(arm, float(lr), args, Path(scratch) / arm)
            subprocess.run([sys.executable, __file__, "--measure", str(out), json.dumps(argv)], check=True, cwd=ROOT)
            rows += summary_rows(arm, float(lr), json.loads(out.read_text()), args.rank, args.parts)
    command = " ".join(["python benchmarks/adafactor_clip.py", *sys.argv[1:]])
    text = "\n".join([
        "# Adafactor's update clipping on the low-rank weights", "",
        f"Command: `{command}` (llama_tiny's setting of the protocol: the bundled plays, 8 × 64 tokens an update, "
        f"rank {args.rank}, τ = 40, seed 0, {args.updates} updates with a warm-up over the first tenth).", "",
        "RMS of each low-rank weight's update G / √V̂ before Adafactor's clip (clip_threshold 1: the update is divided "
        "by max(1, RMS)), over every update of every low-rank weight in each part of the run.", "",
        "| arm | lr | part of the run | median RMS before the clip | share clipped | mean divisor |",
        "|---|---:|---|---:|---:|---:|", *rows, ""])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
