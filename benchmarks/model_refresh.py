"""Whole-model refresh time: every projected weight of a Llama refreshing its basis, ours against galore-torch's.

A by-hand benchmark (issue 15), not a test. For each size (configs/llama_<size>.json) the projected weights are the
seven nn.Linear weights of each decoder layer (q, k, v, o, gate, up, down), as GaLore's script projects them; each gets
one refresh from a fixed, seeded random float32 gradient of its shape (one gradient per distinct shape, shared by the
layers: a decomposition's time depends on the shape, not on which layer it is).

    together   every weight refreshes at the same step, as at update 1 and, without `stagger`, at every τ-th update:
               the wall time of refreshing them all one after the other (each figure once per rep, median over reps)
    staggered  with `stagger=True` the k-th of N weights refreshes τ − ⌊kτ/N⌋ updates after the first, then every τ
               (LowRankOptimizer._staggered_interval): the slowest update of one interval, from the per-shape times
               measured for `together` (the sum over the weights due at that update), against galore-torch's
               `together`: the update a user waits longest for, with and without the stagger

Rows: galore-torch's GaLoreProjector.project at a refresh iteration (torch.linalg.svd of the gradient, then the
projection), our `svd` projector (plumage_adamw's default basis since session 17) and PLUMAGE's draws (pool of the top
2r vectors, κ = 1, bfloat16 pool: PLUMAGE_SAMPLED's projector) with each solver ("svd": torch.linalg.svd as
galore-torch; "gram": float32 eigh of the smaller Gram; "gram64": the same in float64). Ours refresh through
Projector.refresh and then project, as an optimizer step does. "batched B" rows (refresh_batch = B): the weights of one
shape decomposed B at a time in one call (spectrum.decompose_batch on a stack of their gradients), each projector then
refreshing from its own decomposition (Projector.prepare): optimizers/batched_refresh.prepare_together, the optimizer's
own path; `together` only.

    python benchmarks/model_refresh.py [--sizes 60m,130m] [--reps 3] [--tau 200] [--device cpu|cuda] [--threads N]
                                       [--only "ours svd (gram),..."] [--batches 8,32|none] [--out docs/model_refresh.md]

On a CPU, 350m takes minutes a row and 1b/7b hours: run those on a GPU. --only times just the rows whose names contain
one of the comma-separated strings; galore-torch's row only when named too (at 7b it is 224 SVDs of up to 4096 × 11008
a rep), and without it the ratio columns read "—". --batches: the batch sizes of the "batched B" rows ("none": no
such rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import command_line, layer_shapes, machine, random_tensors, synchronize  # noqa: E402 - on sys.path

from galore_plumage.optimizers.batched_refresh import prepare_together  # noqa: E402
from galore_plumage.projectors import build_projector  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RANKS = {"60m": 128, "130m": 256, "350m": 256, "1b": 512, "7b": 1024}  # GaLore's published ranks
SEED = 0
GALORE_TORCH = "galore-torch GaLoreProjector"


def projected_shapes(size: str) -> list[tuple[int, int]]:
    """The (out, in) shape of every projected weight of configs/llama_<size>.json in the model's order (per layer: q, k,
    v, o, gate, up, down), the order `stagger` spreads them in."""
    config = json.loads((ROOT / "configs" / f"llama_{size}.json").read_text())
    return list(layer_shapes(config["hidden_size"], config["intermediate_size"]).values()) * config["num_hidden_layers"]


def staggered_offsets(count: int, tau: int) -> list[int]:
    """Update (after the first, at which all refresh) of each weight's first staggered refresh, then every τ: the
    schedule of LowRankOptimizer._staggered_interval (tests/benchmarks/test_model_refresh.py holds them equal)."""
    return [tau - (k * tau) // count for k in range(count)]


def slowest_staggered_update(seconds: list[float], tau: int) -> float:
    """The largest total refresh time over the τ updates of one staggered interval (weight k due at its offset)."""
    per_update = [0.0] * (tau + 1)
    for k, offset in enumerate(staggered_offsets(len(seconds), tau)):
        per_update[offset] += seconds[k]  # offsets lie in 1 … τ
    return max(per_update)


def galore_torch_refresh(rank: int) -> Callable[[torch.Tensor], None]:
    from galore_torch.galore_projector import GaLoreProjector

    def refresh(grad):
        GaLoreProjector(rank, update_proj_gap=200, scale=0.25, proj_type="std").project(grad, 0)

    return refresh


def our_refresh(projector: str, rank: int, **options) -> Callable[[torch.Tensor], None]:
    def refresh(grad):
        built = build_projector(projector, rank, proj_type="std", update_proj_gap=200, **options)
        if not built.refresh(grad, 0):
            raise RuntimeError(f"{projector} {options} kept no basis for a gradient of shape {tuple(grad.shape)}")
        built.project(grad)

    return refresh


def our_batched_refresh(projector: str, rank: int, batch: int, **options) -> Callable[[list[torch.Tensor]], None]:
    """Refreshes of same-shaped weights from one decompose_batch call per `batch` of them (the optimizer's path)."""
    def refresh(grads):
        built = [build_projector(projector, rank, proj_type="std", update_proj_gap=200, **options) for _ in grads]
        prepare_together([(one, grad, 0) for one, grad in zip(built, grads, strict=True)], batch)
        for one, grad in zip(built, grads, strict=True):
            if not one.refresh(grad, 0):
                raise RuntimeError(f"{projector} {options} kept no basis for a gradient of shape {tuple(grad.shape)}")
            one.project(grad)

    return refresh


SAMPLED = dict(max_inv_p=1.0, resample_every=1, pool_bf16=True)  # PLUMAGE_SAMPLED's projector options
BATCHES = (8, 32)


def rows(rank: int) -> dict[str, Callable[[torch.Tensor], None]]:
    table = {GALORE_TORCH: galore_torch_refresh(rank)}
    for solver in ("svd", "gram", "gram64"):
        table[f"ours svd ({solver})"] = our_refresh("svd", rank, solver=solver)
    for solver in ("svd", "gram", "gram64"):
        table[f"ours plumage draws ({solver})"] = our_refresh("plumage", rank, solver=solver, **SAMPLED)
    return table


def batched_rows(rank: int, batches: tuple[int, ...] = BATCHES) -> dict[str, Callable[[list[torch.Tensor]], None]]:
    return {f"ours svd ({solver}), batched {batch}": our_batched_refresh("svd", rank, batch, solver=solver)
            for solver in ("svd", "gram") for batch in batches}


def timed(refresh: Callable, grad: torch.Tensor | list[torch.Tensor]) -> float:
    device = grad[0].device if isinstance(grad, list) else grad.device
    synchronize(device)
    start = time.perf_counter()
    refresh(grad)
    synchronize(device)
    return time.perf_counter() - start


def selected(table: dict[str, Callable], only: list[str] | None) -> dict[str, Callable]:
    """The rows whose names contain one of `only` (all of them for None)."""
    return table if only is None else {name: row for name, row in table.items() if any(part in name for part in only)}


def measure(size: str, reps: int, tau: int, device: torch.device, only: list[str] | None = None,
            batches: tuple[int, ...] = BATCHES) -> list[str]:
    shapes = projected_shapes(size)
    rank = RANKS[size]
    distinct = list(dict.fromkeys(shapes))
    grads = dict(zip(distinct, random_tensors(distinct, device, SEED), strict=True))
    table, batched = selected(rows(rank), only), selected(batched_rows(rank, batches), only)
    for refresh in table.values():  # warm-up: library loading, workspace allocation
        refresh(grads[shapes[0]])
    for refresh in batched.values():
        refresh([grads[shapes[0]]] * 2)
    per_shape = {name: {shape: [] for shape in grads} for name in table}
    totals = {name: [] for name in [*table, *batched]}
    for _ in range(reps):  # interleaved: each rep refreshes the whole model once per row
        for name, refresh in table.items():
            seconds = {shape: [] for shape in grads}
            for shape in shapes:
                seconds[shape].append(timed(refresh, grads[shape]))
            totals[name].append(sum(sum(s) for s in seconds.values()))
            for shape, values in seconds.items():
                per_shape[name][shape].extend(values)
        for name, refresh in batched.items():  # each shape's weights in calls of the row's batch
            totals[name].append(sum(timed(refresh, [grads[shape]] * shapes.count(shape)) for shape in grads))
    reference = statistics.median(totals[GALORE_TORCH]) if GALORE_TORCH in totals else None
    lines = [f"## {size}: {len(shapes)} projected weights, rank {rank}", "",
             f"| refresh | together s | / galore-torch | staggered: slowest update s (τ = {tau}) | / galore-torch together |",
             "|---|---:|---:|---:|---:|"]
    for name in totals:
        together = statistics.median(totals[name])
        staggered = "— | —"  # galore-torch has no stagger: all its weights refresh at every τ-th update (batched rows:
        if name in per_shape and name != GALORE_TORCH:  # staggered weights rarely share a step)
            median_shape = {shape: statistics.median(values) for shape, values in per_shape[name].items()}
            slowest = slowest_staggered_update([median_shape[shape] for shape in shapes], tau)
            staggered = f"{slowest:.3f} | {share(slowest, reference, 3)}"
        lines.append(f"| {name} | {together:.2f} | {share(together, reference, 2)} | {staggered} |")
    return lines


def share(seconds: float, reference: float | None, digits: int) -> str:
    """seconds / galore-torch's together, or "—" where its row was not timed (--only)."""
    return "—" if reference is None else f"{seconds / reference:.{digits}f}"


def batch_sizes(text: str) -> tuple[int, ...]:
    """--batches: "none" or comma-separated integers >= 2 (a batch of 1 is the unbatched row)."""
    if text == "none":
        return ()
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"--batches {text!r}: give integers >= 2 separated by commas, or 'none'")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=lambda s: s.split(","), default=["60m", "130m"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tau", type=int, default=200)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads on a CPU (default: torch's)")
    parser.add_argument("--only", type=lambda s: s.split(","), default=None,
                        help="comma-separated parts of row names: time only those rows (galore-torch's too only if named)")
    parser.add_argument("--batches", type=batch_sizes, default=BATCHES,
                        help="batch sizes of the 'batched B' rows, comma-separated, or 'none' (default: 8,32)")
    parser.add_argument("--out", default=None, help="write the tables here too (markdown)")
    args = parser.parse_args()
    unknown = [s for s in args.sizes if s not in RANKS]
    if unknown:
        parser.error(f"unknown sizes {unknown}; choose from {', '.join(RANKS)}")
    if args.reps < 1 or args.tau < 1:
        parser.error(f"--reps and --tau must be >= 1, got {args.reps} and {args.tau}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    lines = ["# Whole-model refresh time", "", f"Command: `{command_line()}`  ", f"Machine: {machine(device)}  ",
             f"Reps: {args.reps} (medians). What each column is: the docstring of benchmarks/model_refresh.py.", ""]
    print("\n".join(lines), flush=True)
    for size in args.sizes:
        section = measure(size, args.reps, args.tau, device, args.only, args.batches) + [""]
        print("\n".join(section), flush=True)
        lines += section
    if args.out:
        Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
