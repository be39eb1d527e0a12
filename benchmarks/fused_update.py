"""The fused low-rank update against the three passes it replaced: a by-hand A/B, not a test.

The same optimizer (PlumageAdamW with PLUMAGE's draws without the complement, solver "gram"; or GaLoreAdamW) steps one Llama
layer's seven weights with no refresh, once with Projector.add_back (W += α·P Z in one addmm) and once with add_back
replaced by the previous update (full = project_back(Z), scaled; then W.add_(full)). Steps of the two alternate, so
drift hits both alike; each figure is the median over the reps.

    python benchmarks/fused_update.py [--sizes 60m,130m,350m] [--reps 15] [--threads 2]
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
from galore_plumage.projectors import Projector  # noqa: E402


def unfused(projector: Projector, target: torch.Tensor, low: torch.Tensor, alpha: float, outside=None) -> None:
    if outside is not None:
        raise ValueError("the three-pass update has no form with the gradient outside the basis: run residual='none'")
    target.add_(projector.project_back(low), alpha=alpha)


def build(cls, shapes, rank: int, fused: bool, grads):
    """One step of a fresh optimizer on `grads`, fused or not, as a function of no arguments."""
    params = [torch.nn.Parameter(t) for t in random_tensors(shapes, torch.device("cpu"), seed=0, scale=0.02)]
    # residual "none": the complement (PlumageAdamW's default since session 11) has no three-pass form to compare
    # PLUMAGE's draws (PLUMAGE_SAMPLED) for PlumageAdamW: plumage_adamw's default is GaLore's basis since session 17
    draws = PLUMAGE_SAMPLED if cls is PlumageAdamW else {}
    group = {"params": params, "rank": rank, "update_proj_gap": 10**9, "solver": "gram", **draws, "residual": "none"}
    return partial(step, params, cls([group], lr=1e-3), fused, grads)


def step(params, optimizer, fused: bool, grads) -> None:
    """One step, with add_back as it is (fused) or replaced by the three passes."""
    original = Projector.add_back
    if not fused:
        Projector.add_back = unfused
    try:
        step_once(optimizer, params, grads)
    finally:
        Projector.add_back = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="60m,130m,350m")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("| size | optimizer | steady ms, three passes | steady ms, fused | fused / three passes |")
    print("|---|---|---:|---:|---:|")
    for size in args.sizes.split(","):
        h, i, rank = SIZES[size]
        shapes = list(layer_shapes(h, i).values())
        grads = random_tensors(shapes, torch.device("cpu"), seed=1)
        for cls in (GaLoreAdamW, PlumageAdamW):
            steps = {fused: build(cls, shapes, rank, fused, grads) for fused in (False, True)}
            for run in steps.values():
                run()  # the first step builds the basis and the moments
            old, new = (t * 1e3 for t in time_interleaved(steps, args.reps, torch.device("cpu"), size).values())
            print(f"| {size} | {cls.__name__} | {old:.2f} | {new:.2f} | {new / old:.2f} |", flush=True)


if __name__ == "__main__":
    main()
