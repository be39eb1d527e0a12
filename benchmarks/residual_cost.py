"""What Fira's complement (residual="norm_matched") adds to a steady step: a by-hand A/B, not a test.

GaLoreAdamW and PlumageAdamW (PLUMAGE's draws, PLUMAGE_SAMPLED) step one Llama layer's seven weights with no refresh, each with
residual "none" and "norm_matched"; the four optimizers' steps alternate, so drift hits all alike; each figure is the
median over the reps, and every ratio is against GaLoreAdamW without the complement in the same run.

    python benchmarks/residual_cost.py [--sizes 60m,130m,350m] [--reps 11] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import SIZES, layer_shapes, random_tensors, step_once, time_interleaved  # noqa: E402 - on sys.path

from galore_plumage import GaLoreAdamW, PlumageAdamW  # noqa: E402
from galore_plumage.optimizers import PLUMAGE_SAMPLED  # noqa: E402

RESIDUALS = ("none", "norm_matched")


def build(cls, shapes, rank: int, residual: str):
    params = [torch.nn.Parameter(t) for t in random_tensors(shapes, torch.device("cpu"), seed=0, scale=0.02)]
    # PlumageAdamW with PLUMAGE's draws (plumage_adamw's default is GaLore's basis with v_floor since session 17)
    draws = PLUMAGE_SAMPLED if cls is PlumageAdamW else {}
    group = {"params": params, "rank": rank, "update_proj_gap": 10**9, **draws, "residual": residual}
    return params, cls([group], lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="60m,130m,350m")
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("| size | optimizer | residual | steady ms | / GaLoreAdamW without it |")
    print("|---|---|---|---:|---:|")
    for size in args.sizes.split(","):
        h, i, rank = SIZES[size]
        shapes = list(layer_shapes(h, i).values())
        grads = random_tensors(shapes, torch.device("cpu"), seed=1)
        steps = {(cls.__name__, residual): partial(step_once, optimizer, params, grads)
                 for cls in (GaLoreAdamW, PlumageAdamW) for residual in RESIDUALS
                 for params, optimizer in [build(cls, shapes, rank, residual)]}
        for step in steps.values():
            step()  # the first step builds the basis and the moments
        medians = {key: t * 1e3 for key, t in time_interleaved(steps, args.reps, torch.device("cpu"), size).items()}
        base = medians[("GaLoreAdamW", "none")]
        for (name, residual), ms in medians.items():
            print(f"| {size} | {name} | {residual} | {ms:.2f} | {ms / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
