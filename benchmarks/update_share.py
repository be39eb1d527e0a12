"""Where a PLUMAGE step goes: the share of the update's squared norm carried by directions sampled with p < 1.

    python benchmarks/update_share.py runs/pretrain_compare/plumage_adamw_realign-mv/seed0/model_200
    python benchmarks/update_share.py runs/pretrain_compare/plumage_sgdm_realign-m/seed0/model_200

Reads a torchrun_main.py checkpoint (trainer.pt) of a plumage AdamW or SGD-momentum run. For each low-rank weight
the update is P D⁻¹ Z, with Z = m̂ / (√v̂ + ε) (AdamW) or the momentum M (SGDM) in the low-rank space; P has
orthonormal columns, so direction i contributes (1/p_i)² ‖Z_i‖² to ‖update‖². The inclusion probabilities were
fitted to the gradient at the last refresh; the directions kept with p = 1 held nearly all of its energy.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch


def tail_shares(trainer_state: dict) -> list[float]:
    """Per plumage weight: Σ_{p_i<1} (1/p_i)² ‖Z_i‖² / Σ_i (1/p_i)² ‖Z_i‖² at the checkpoint's moments."""
    optimizer = trainer_state["optimizer"]
    shares = []
    for state in optimizer["state"].values():
        projector = state.get("projector")
        if not projector or projector.get("inv_p") is None:
            continue
        if "exp_avg_sq" in state:  # AdamW: the bias-corrected normalized step
            group = next(g for g in optimizer["param_groups"] if g.get("projector") == "plumage")
            (beta1, beta2), eps, step = group["betas"], group["eps"], state["step"]
            m, v = state["exp_avg"].double(), state["exp_avg_sq"].double()
            z = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + eps)
        elif "momentum_buffer" in state:  # SGD momentum: the buffer itself
            z = state["momentum_buffer"].double()
        else:
            continue
        (mode,) = (int(k) for k in projector["rank_per_mode"])
        per_direction = z.square().sum(dim=1 - mode) * projector["inv_p"].double().square()
        shares.append((per_direction[projector["inv_p"] > 1].sum() / per_direction.sum()).item())
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a model_<step> folder (or its trainer.pt) of a plumage_adamw/_sgdm run")
    args = parser.parse_args()
    path = Path(args.checkpoint)
    path = path / "trainer.pt" if path.is_dir() else path
    if not path.is_file():
        raise SystemExit(f"update_share.py: no trainer.pt at {str(path)!r}; pass a torchrun_main.py model_<step> folder")
    shares = tail_shares(torch.load(path, weights_only=True))
    if not shares:
        raise SystemExit(f"update_share.py: {str(path)!r} holds no plumage AdamW or SGD-momentum state")
    print(f"{len(shares)} weights; share of ‖update‖² from directions sampled with p < 1: median "
          f"{statistics.median(shares):.3f}, min {min(shares):.3f}, max {max(shares):.3f}")


if __name__ == "__main__":
    main()
