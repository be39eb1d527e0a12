"""What each projector does to a gradient: bias and error of rank-r estimates, measured by Monte Carlo.

    python examples/projector_demo.py [--draws 400] [--shape 256 128] [--ranks 4 16 64]

A synthetic gradient with a power-law spectrum (σ_i ∝ i^-0.7, like a trained layer's) is projected and
mapped back, Ĝ = project_back(project(G)), by a fresh projector per draw (seeds 0..draws-1):

    bias  = ‖mean Ĝ − G‖ / ‖G‖        error = mean ‖Ĝ − G‖² / ‖G‖²

SVD (GaLore) is deterministic and biased; random (FLORA) and PLUMAGE are unbiased, so their bias shrinks
like 1/√draws, and PLUMAGE's error equals its closed form Σ(1/p − 1)σ² / ‖G‖², the least possible.
"""

from __future__ import annotations

import argparse
import time

import torch

from galore_plumage.projectors import build_projector, inclusion_probabilities


def synthetic_gradient(m: int, n: int, decay: float = 0.7, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, m, generator=generator, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64)).Q
    k = min(m, n)
    sigma = torch.arange(1, k + 1, dtype=torch.float64).pow(-decay)
    return (u[:, :k] * sigma) @ v[:, :k].T


def measure(name: str, grad: torch.Tensor, rank: int, draws: int) -> tuple[float, float]:
    total = torch.zeros_like(grad)
    squared_error = 0.0
    for seed in range(draws if name != "svd" else 1):
        projector = build_projector(name, rank=rank, seed=seed)
        projector.refresh(grad, step=0)
        estimate = projector.project_back(projector.project(grad))
        total += estimate
        squared_error += (estimate - grad).square().sum().item()
    used = draws if name != "svd" else 1
    norm2 = grad.square().sum().item()
    bias = ((total / used - grad).norm() / grad.norm()).item()
    return bias, squared_error / used / norm2


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
        r_star, p = inclusion_probabilities(sigma, rank)
        closed_form = ((1 / p[p > 0] - 1) * sigma[p > 0].square()).sum().item() / sigma.square().sum().item()
        for name in ("svd", "random", "plumage"):
            bias, error = measure(name, grad, rank, args.draws)
            note = f"{closed_form:.4f} (r*={r_star})" if name == "plumage" else ""
            print(f"| {rank} | {name} | {bias:.4f} | {error:.4f} | {note} |")
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
