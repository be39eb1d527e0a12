"""One optimizer's step under two commits of the library, steps alternating: a by-hand A/B, not a test.

The library of `--against` (any git revision) is exported to a temporary folder and imported beside the working
tree's, each under its own module name, so both step in one process on the same gradients; each figure is the
median over the reps. For changes inside a step that no option switches off (how a draw rearranges the pool).
Each library runs at its own defaults, so a default that changed between the two is part of what is compared.
The step timed is a steady one, or with --refresh one that refreshes every weight's basis (update_proj_gap 1).

    python benchmarks/library_ab.py --against 157a6b3 [--optimizer PlumageAdamW] [--sizes 60m,350m] [--reps 15]
                                    [--refresh]
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tarfile
import tempfile
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from step_time import SIZES, layer_shapes, random_tensors, step_once, time_interleaved  # noqa: E402 - on sys.path


def import_library(folder: Path):
    """galore_plumage as found in `folder`, imported afresh (the previous import is set aside, not reused)."""
    for name in [m for m in sys.modules if m == "galore_plumage" or m.startswith("galore_plumage.")]:
        del sys.modules[name]
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("galore_plumage")
    finally:
        sys.path.remove(str(folder))


def export(revision: str, into: Path) -> Path:
    archive = into / "library.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), revision, "galore_plumage"], cwd=ROOT,
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the git revision to compare the working tree with")
    parser.add_argument("--optimizer", default="PlumageAdamW", help="a class of galore_plumage, at its defaults")
    parser.add_argument("--sizes", default="60m,350m")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--refresh", action="store_true", help="time steps that refresh every basis, not steady ones")
    args = parser.parse_args()
    kind, gap = ("refresh", 1) if args.refresh else ("steady", 10**9)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        libraries = {args.against: import_library(export(args.against, Path(folder))), "working tree": import_library(ROOT)}
        print(f"| size | {args.optimizer}: library | {kind} ms | / {args.against} |")
        print("|---|---|---:|---:|")
        for size in args.sizes.split(","):
            h, i, rank = SIZES[size]
            shapes = list(layer_shapes(h, i).values())
            grads = random_tensors(shapes, torch.device("cpu"), seed=1)
            steps = {}
            for label, library in libraries.items():
                params = [torch.nn.Parameter(t) for t in random_tensors(shapes, torch.device("cpu"), seed=0, scale=0.02)]
                optimizer = getattr(library, args.optimizer)([{"params": params, "rank": rank, "update_proj_gap": gap}])
                steps[label] = partial(step_once, optimizer, params, grads)
                steps[label]()  # the first step builds the basis and the moments
            medians = {label: t * 1e3 for label, t in time_interleaved(steps, args.reps, torch.device("cpu"), size).items()}
            for label, ms in medians.items():
                print(f"| {size} | {label} | {ms:.2f} | {ms / medians[args.against]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
