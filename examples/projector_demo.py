"""What each projector does to a gradient: bias and error of rank-r estimates, measured by Monte Carlo.

    python examples/projector_demo.py [--draws 400] [--shape 256 128] [--ranks 4 16 64]

A synthetic gradient with a power-law spectrum (σ_i ∝ i^-0.7, like a trained layer's) is projected and
mapped back, Ĝ = project_back(project(G)), by a fresh projector per draw (seeds 0..draws-1):

    bias  = ‖mean Ĝ − G‖ / ‖G‖        error = mean ‖Ĝ − G‖² / ‖G‖²

SVD (GaLore) is deterministic and biased; random (FLORA) and PLUMAGE are unbiased, so their bias shrinks
like 1/√draws. Each error meets its closed form (galore_plumage.projectors.diagnostics): the tail energy for
svd, (d + 1)/k for random, and Σ(1/p − 1)σ² / ‖G‖² for PLUMAGE, the least of any unbiased k-sparse estimator.
"""

from __future__ import annotations

import argparse
import time

import torch

from galore_plumage.projectors import build_projector
from galore_plumage.projectors.diagnostics import closed_form_error, monte_carlo


def synthetic_gradient(m: int, n: int, decay: float = 0.7, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, m, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64)).Q
    k = min(m, n)
    sigma = torch.arange(1, k + 1, dtype=torch.float64).pow(-decay)
    return (u[:, :k] * sigma) @ v[:, :k].T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=400, help="Monte Carlo draws per unbiased projector")
    parser.add_argument("--shape", type=int, nargs=2, default=(256, 128), metavar=("M", "N"))
    parser.add_argument("--ranks", type=int, nargs="+", default=(4, 16, 64))
    args = parser.parse_args()

    grad = synthetic_gradient(*args.shape)
    sigma = torch.linalg.svdvals(grad)
    start = time.perf_counter()
    print(f"gradient {args.shape[0]}x{args.shape[1]}, σ_i ∝ i^-0.7, {args.draws} draws per unbiased projector\n")
    print("| rank | projector | bias ‖E Ĝ − G‖/‖G‖ | error E‖Ĝ − G‖²/‖G‖² | closed form |")
    print("|---:|---|---:|---:|---:|")
    for rank in args.ranks:
        for name in ("svd", "random", "plumage"):
            draws = 1 if name == "svd" else args.draws  # svd is deterministic
            quality = monte_carlo(lambda seed, n=name, r=rank: build_projector(n, rank=r, seed=seed), grad, draws)
            closed_form = closed_form_error(name, sigma, rank, min(args.shape))
            print(f"| {rank} | {name} | {quality.bias:.4f} | {quality.error:.4f} | {closed_form:.4f} |")
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
