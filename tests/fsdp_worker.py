"""Run under `torchrun --nproc_per_node W` by tests/optimizers/test_fsdp_optimizers.py: FSDP2 (gloo) against one process.

For each optimizer name, on a tiny float64 model with a weight whose rows do not divide by W:
  * W ranks, each with 1/W of the global batch, train STEPS updates (refreshes at 0, 3, 6) under fully_shard;
  * the same model without FSDP trains on the whole batch in this process (the single-process reference);
  * a DCP checkpoint (model + optimizer) taken at SAVE_AT is loaded into a fresh model and optimizer and continued.
Rank 0 writes what it measured to <out>/results.json; the test makes the assertions.

`fsdp_worker.py <out> resharded:<name>`, launched on another number of processes afterwards, loads <name>'s checkpoint
(8-bit AdamW: its block scales are per rank) and continues it; rank 0 writes <out>/resharded-<world>.json.
"""

from __future__ import annotations

import gc
import json
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS, PLUMAGE_SAMPLED, build_optimizer
from galore_plumage.optimizers.adamw8bit import dense_moments
from galore_plumage.training.fsdp import load_optimizer, save_optimizer

STEPS, SAVE_AT, GAP, RANK, BATCH = 7, 4, 3, 8, 64
# PLUMAGE-Adam at scale 1 (its default is GaLore's 0.25), so the weights move far past each tolerance in 7 updates
# The float32 runs compare a sharded Gram eigh with one process's SVD: bases equal to float32 rounding, which a pool
# stored in bfloat16 (PLUMAGE's default) would now and then turn into a bfloat16 rounding step (tests/device_helpers.py
# says more); they keep the pool in float32. The float64 plumage_adamw run keeps the default bfloat16 pool.
FP32_POOL = {"pool_bf16": False}
# PLUMAGE's projector with its draws (PLUMAGE_SAMPLED: the plumage_adamw default of sessions 14-16) on the Adam arms;
# plumage_adamw's own default (GaLore's basis with v_floor) runs as "plumage_adamw_default"
OPTIONS = {
    "galore_adamw": {"lr": 1e-2, "weight_decay": 0.01},
    "plumage_adamw": {"lr": 1e-2, "weight_decay": 0.01, "scale": 1.0, **PLUMAGE_SAMPLED},
    "plumage_adamw_default": {"lr": 1e-2, "weight_decay": 0.01, "scale": 1.0},
    # 300: the uneven 37 x 8 low-rank state stays fp32, the 64 x 8 one (32 x 8 = one 256-block per rank) is 8-bit
    "plumage_adamw8bit": {"lr": 1e-2, "weight_decay": 0.01, "min_8bit_size": 300, "scale": 1.0, **PLUMAGE_SAMPLED,
                          **FP32_POOL},
    "plumage_adamw8bit_fp32": {  # the same backend with every state kept fp32 (bitsandbytes' 32-bit kernel)
       "lr": 1e-2, "weight_decay": 0.01, "min_8bit_size": 10**9, "scale": 1.0, **PLUMAGE_SAMPLED, **FP32_POOL},
    # PLUMAGE's draws on Adafactor (its default of sessions 42-80): the factored moments realigned on row shards
    "plumage_adafactor": {"lr": 1e-2, "weight_decay": 0.01, "relative_step": False, "scale_parameter": True,
                          "beta1": 0.9, **PLUMAGE_ADAFACTOR_DRAWS, **FP32_POOL},
    "flora_adamw": {"lr": 1e-2, "weight_decay": 0.01},
    # Fira's complement on row shards (projected on the right): φ per row is local, the limiter's norm is summed
    "plumage_adamw_residual": {"lr": 1e-2, "weight_decay": 0.01, "scale": 1.0, **PLUMAGE_SAMPLED,
                               "residual": "norm_matched"},
}

# the runs whose checkpoint is also resumed on other numbers of processes (resharded:<name>)
RESHARDED = ("plumage_adamw8bit",)
SAVED_WORLD = 2  # what test_fsdp_optimizers.py launches the main run on

# the runs whose label is not the optimizer's name: label -> name
OPTIMIZER_OF = {"plumage_adamw_default": "plumage_adamw", "plumage_adamw8bit_fp32": "plumage_adamw8bit",
                "plumage_adamw_residual": "plumage_adamw"}


class Tiny(nn.Module):
    """mlp_up (37 x 24: uneven shards) and mlp_down (64 x 37) are low-rank; norm, the bias and head are regular.
    `wide` adds a 24 x 40 low-rank weight, for which proj_type std picks the left side."""

    def __init__(self, wide: bool = False):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(24))
        self.mlp_up = nn.Linear(24, 37)
        self.mlp_down = nn.Linear(37, 64, bias=False)
        self.mlp_wide = nn.Linear(40, 24, bias=False) if wide else None
        self.head = nn.Linear(64, 8, bias=False)

    def forward(self, x):
        if self.mlp_wide is not None:
            x = x + 0.1 * self.mlp_wide(torch.cat([x, x[:, :16]], dim=1))
        return self.head(torch.tanh(self.mlp_down(torch.tanh(self.mlp_up(x * self.norm)))))


# 8-bit and Adafactor keep float32 states, which float64 bases cannot multiply: they run in float32
DTYPES = {"plumage_adamw8bit": torch.float32, "plumage_adamw8bit_fp32": torch.float32, "plumage_adafactor": torch.float32}


def batch(step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`. In float64, 64 samples: full-rank gradients, so PLUMAGE samples among all 24/37
    directions. In float32, rounding of the gradient sum (FSDP's reduce-scatter vs one process) can swap or rotate
    nearly equal tail singular vectors and so change a sampled direction (tests/training/test_train_distributed.py saw the same
    with DDP); 8 samples give gradients of rank <= 8 = the projection rank, a subspace rounding cannot move."""
    size = BATCH if dtype == torch.float64 else RANK
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 24, generator=generator, dtype=torch.float64)
    y = torch.randn(size, 8, generator=generator, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def build(name: str, wide: bool, sharded: bool, proj_type: str):
    torch.manual_seed(0)
    model = Tiny(wide).to(DTYPES.get(name, torch.float64))
    dtype = model.norm.dtype
    if sharded:
        fully_shard(model)
    # float64: the reference takes the same eigh-of-Gram route; float32: torch.linalg.svd, whose rounding-level
    # singular values stay at ε·σ₁ (the sharded route zeroes them: spectrum.eigh_gram's noise floor)
    solver = "gram" if dtype == torch.float64 else "svd"
    optimizer = build_optimizer(OPTIMIZER_OF.get(name, name), model, rank=RANK, update_proj_gap=GAP,
                                proj_type=proj_type, **{**OPTIONS[name], "solver": solver})
    return model, optimizer


def train(model, optimizer, steps: range, shard: tuple[int, int] | None) -> None:
    dtype = next(model.parameters()).dtype
    for step in steps:
        x, y = batch(step, dtype)
        if shard is not None:  # this rank's equal share of the global batch; FSDP2 averages the gradients
            rank, world = shard
            size = len(x) // world
            x, y = x[rank * size:(rank + 1) * size], y[rank * size:(rank + 1) * size]
        loss = (model(x) - y).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def local_state_bytes(optimizer) -> dict[str, dict[str, int]]:
    """Per low-rank weight: bytes of its moment tensors on this rank, and of its projector tensors."""
    names = {id(p): n for n, p in optimizer.routing_params.items()}
    out = {}
    for group in optimizer.param_groups:
        if "rank" not in group:
            continue
        for param in group["params"]:
            state = optimizer.state[param]
            moments = sum(v.numel() * v.element_size() for k, v in state.items() if isinstance(v, torch.Tensor))
            projector = state["projector"]
            basis = sum(f.numel() * f.element_size() for f in projector.get("factors", {}).values())
            out[names[id(param)]] = {"moments": moments, "basis": basis}
    return out


def run_optimizer(name: str, out_dir: str, rank: int, world: int) -> dict:
    result: dict = {}
    model, optimizer = build(name, wide=False, sharded=True, proj_type="std")
    optimizer.routing_params = dict(model.named_parameters())
    train(model, optimizer, range(SAVE_AT), (rank, world))
    checkpoint = f"{out_dir}/{name}-step{SAVE_AT}"
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=f"{checkpoint}/model")
    save_optimizer(model, optimizer, f"{checkpoint}/optimizer")
    moments = dequantized_moments(model, optimizer)
    train(model, optimizer, range(SAVE_AT, STEPS), (rank, world))
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    if name in RESHARDED and rank == 0:  # what the resharded resumes compare with
        torch.save({"moments": moments, "final": full}, f"{checkpoint}/reference.pt")

    reference, ref_optimizer = build(name, wide=False, sharded=False, proj_type="std")
    ref_optimizer.routing_params = dict(reference.named_parameters())
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    train(reference, ref_optimizer, range(STEPS), None)
    result["max_abs_diff"] = max((full[n] - p.detach()).abs().max().item() for n, p in reference.named_parameters())
    result["min_moved"] = min((p.detach() - initial[n]).abs().max().item() for n, p in reference.named_parameters())

    stats = optimizer.projector_stats()
    result["refreshes"] = sorted({s["refreshes"] for s in stats.values()})
    result["state_bytes"] = gather_json(local_state_bytes(optimizer), world)
    result["reference_state_bytes"] = local_state_bytes(ref_optimizer)
    result["factors_agree"] = factors_agree(optimizer, world)

    resumed, resumed_optimizer = build(name, wide=False, sharded=True, proj_type="std")
    set_model_state_dict(resumed, _loaded_model(resumed, f"{checkpoint}/model"))
    load_optimizer(resumed, resumed_optimizer, f"{checkpoint}/optimizer")
    train(resumed, resumed_optimizer, range(SAVE_AT, STEPS), (rank, world))
    diffs = [(a.to_local() - b.to_local()).abs().max().item() if a.to_local().numel() else 0.0
             for a, b in zip(model.parameters(), resumed.parameters(), strict=True)]
    result["resume_max_abs_diff"] = max(gather_json(max(diffs), world))
    return result


def run_resharded(name: str, out_dir: str, rank: int, world: int) -> dict:
    """Resume run_optimizer's checkpoint of `name` (written by SAVED_WORLD processes) on `world` processes: the 8-bit
    moments as loaded against those saved (both dequantized, whole), and the weights after the remaining updates
    against the saved run's."""
    checkpoint = f"{out_dir}/{name}-step{SAVE_AT}"
    reference = torch.load(f"{checkpoint}/reference.pt", weights_only=True)
    model, optimizer = build(name, wide=False, sharded=True, proj_type="std")
    set_model_state_dict(model, _loaded_model(model, f"{checkpoint}/model"))
    load_optimizer(model, optimizer, f"{checkpoint}/optimizer", saved_world=SAVED_WORLD)
    loaded = dequantized_moments(model, optimizer)
    moment_diff = {n: [(a - b).abs().max().item() / b.abs().max().item() for a, b in zip(loaded[n], saved, strict=True)]
                   for n, saved in reference["moments"].items()}
    train(model, optimizer, range(SAVE_AT, STEPS), (rank, world))
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    return {"moment_diff": moment_diff, "weights_8bit": sorted(loaded),
            "max_abs_diff": max((full[n] - w).abs().max().item() for n, w in reference["final"].items())}


def dequantized_moments(model, optimizer) -> dict[str, list[torch.Tensor]]:
    """M and V of every weight with 8-bit moments, dequantized and gathered whole (in rows)."""
    out = {}
    for name, param in model.named_parameters():
        state = optimizer.state[param]
        if "absmax1" not in state:
            continue
        _, m, v = dense_moments(state)
        shape = (param.shape[0], *m.shape[1:])
        out[name] = [DTensor.from_local(t.contiguous(), param.device_mesh, [Shard(0)], run_check=False, shape=shape,
                                        stride=torch.empty(shape, device="meta").stride()).full_tensor().cpu()
                     for t in (m, v)]
    return out


def _loaded_model(model, path: str) -> dict:
    state = get_model_state_dict(model)
    dcp.load({"model": state}, checkpoint_id=path)
    return state


def factors_agree(optimizer, world: int) -> bool:
    """Every rank's bases (and PLUMAGE's 1/p) are bit-identical: computed apart, from the same all-reduced Gram."""
    local = [t for proj in optimizer._projectors.values() for t in [*proj.factors.values(), proj.inv_p] if t is not None]
    flat = torch.cat([t.reshape(-1) for t in local])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def gather_json(value, world: int) -> list:
    gathered = [None] * world
    dist.all_gather_object(gathered, value)
    return gathered


def run_wide(rank: int, world: int) -> dict:
    """flora_adamw (a seed-only basis) on a model with a wide weight: std would pick its left side; sharded, it is
    projected on the right with a warning, and equals one process run with proj_type='right'."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer = build("flora_adamw", wide=True, sharded=True, proj_type="std")
        train(model, optimizer, range(STEPS), (rank, world))
    reference, ref_optimizer = build("flora_adamw", wide=True, sharded=False, proj_type="right")
    train(reference, ref_optimizer, range(STEPS), None)
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    wide_state = optimizer.state[model.mlp_wide.weight]["exp_avg"]
    left = [str(w.message) for w in caught if "picks the left side" in str(w.message)]
    return {
        "max_abs_diff": max((full[n] - p.detach()).abs().max().item() for n, p in reference.named_parameters()),
        "left_warnings": left,
        "wide_state_shape": list(wide_state.shape),
        "explicit_left_error": _refusal(proj_type="left"),
        "tucker_error": _refusal(projector="tucker"),
    }


def _refusal(**options) -> str:
    """The ValueError message of building plumage_adamw with `options` over sharded weights ("" if none)."""
    torch.manual_seed(0)
    model = Tiny().double()
    fully_shard(model)
    try:
        build_optimizer("plumage_adamw", model, rank=RANK, **{"projector": "plumage", "v_floor": "none", **options})
    except ValueError as error:
        return str(error)
    return ""


def run_degenerate(rank: int, world: int) -> dict:
    """A rank-2 gradient (rank 8 asked) and then an all-NaN one: no NaN in the weights, ranks still agree."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 37, bias=False))
    model.double()
    fully_shard(model)
    optimizer = build_optimizer("plumage_adamw", model, rank=RANK, update_proj_gap=1, target_modules=("0",),
                                **PLUMAGE_SAMPLED)
    weight = model[0].weight
    low = torch.randn(37, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    grad = low @ torch.randn(2, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    outcomes = []
    for g in (grad, torch.full_like(grad, float("nan")), grad):
        weight.grad = torch.distributed.tensor.distribute_tensor(g, weight.device_mesh, weight.placements)
        optimizer.step()
        outcomes.append(bool(torch.isfinite(weight.full_tensor()).all()))
    stats = optimizer.projector_stats()[0]
    return {"finite": outcomes, "refreshes": stats["refreshes"], "skipped": stats["skipped_refreshes"],
            "r_star": stats["r_star"], "factors_agree": factors_agree(optimizer, world)}


def run_every_name(rank: int, world: int) -> dict:
    """Every optimizer name except per-layer ones, 4 updates (refreshes at 1 and 4) on the float32 model under
    fully_shard: "ok" when the weights are finite and moved, else the error."""
    from galore_plumage.optimizers import list_optimizers, optimizer_spec

    outcome = {}
    for name in list_optimizers():
        if optimizer_spec(name).per_layer:
            continue
        torch.manual_seed(0)
        model = Tiny()
        fully_shard(model)
        initial = [p.full_tensor().clone() for p in model.parameters()]
        options = {"lr": 1e-2} if optimizer_spec(name).backend != "adafactor" else {}
        try:
            optimizer = build_optimizer(name, model, rank=RANK, update_proj_gap=GAP, **options)
            train(model, optimizer, range(4), (rank, world))
            final = [p.full_tensor() for p in model.parameters()]
            finite = all(bool(torch.isfinite(w).all()) for w in final)
            moved = min((a - b).abs().max().item() for a, b in zip(final, initial, strict=True))
            outcome[name] = "ok" if finite and moved > 0 else f"finite={finite} moved={moved}"
        except Exception as error:  # noqa: BLE001 - reported to the test, which names it
            outcome[name] = f"{type(error).__name__}: {error}"
    return outcome


def main() -> None:
    out_dir, what = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if what.startswith("resharded:"):
        results, target = run_resharded(what.removeprefix("resharded:"), out_dir, rank, world), f"resharded-{world}"
    else:
        results = {name: run_optimizer(name, out_dir, rank, world) for name in what.split(",")}
        results["wide"] = run_wide(rank, world)
        results["degenerate"] = run_degenerate(rank, world)
        results["every_name"] = run_every_name(rank, world)
        results["world"], target = world, "results"
    if rank == 0:
        with open(f"{out_dir}/{target}.json", "w") as handle:
            json.dump(results, handle, indent=1)
    dist.barrier()
    gc.collect()  # drop lingering gloo work objects first: see training.distributed.shutdown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
