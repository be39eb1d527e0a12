"""Step time and optimizer-state memory on the weights of one Llama layer: a by-hand benchmark, not a test.

What is measured. The seven nn.Linear weights of one Llama decoder layer (q, k, v, o: h×h; gate, up: i×h;
down: h×i, as (out, in)) at GaLore's 60M, 130M and 350M sizes, held by one optimizer as a single group (a
low-rank one, proj_type "std", for the low-rank optimizers) and given fixed fp32 gradients: seeded Gaussian ones
(--gradients gaussian, the default: a flat spectrum, the slowest for a refresh's eigensolver or SVD) or a Llama's
of that layer's shape on the bundled plays (--gradients model, benchmarks/model_gradients.py: a spectrum that falls
as a model's does):

    steady     one step that does not refresh the projection (update_proj_gap = 10**9; two warm-up steps
               first, which build the basis and the moments, and compile what compile_update compiles)
    refresh    one step that refreshes it (update_proj_gap = 1: every step refreshes and realigns; two
               warm-up steps first, so realignment has a previous basis to work from)
    amortized  (refresh + (τ − 1)·steady) / τ with τ = 200, GaLore's update_proj_gap
    state      bytes of every tensor in optimizer.state, nested dicts and lists included (our
               state[p]["projector"]), and galore-torch's projector objects' ortho_matrix, counted as the
               storages they keep alive (each once); where that is more than the tensors' own bytes
               (galore-torch's ortho_matrix is a slice of the full SVD factor) both are shown
    floor      the bare projection matmuls of the seven gradients at the rank, on the smaller side
               (Pᵀ·G or G·Qᵀ, then back): what no low-rank step can beat
    kernels    the aten operations one steady step dispatches (views left out; a torch._foreach call counted once,
               as on a GPU it launches one kernel for up to a few hundred tensors), counted with a
               TorchDispatchMode around a steady step of a copy built for it, 13 updates after its refresh
               (past the 10 after a refresh on which plumage_*'s complement moves): where small kernels are launch-bound
               (a GPU at these sizes) a step's time follows this count more than its arithmetic; "—" for
               compile_update (torch.compile does not trace under such a mode)

--layers N holds N copies of the layer's seven weights in the one group, as a model's N layers are held (llama_60m
has 8): what a step of foreach, whose batched calls serve every weight of a group, costs per layer at a model's size.

Optimizers: torch.optim.AdamW; bitsandbytes AdamW8bit; galore-torch GaLoreAdamW, GaLoreAdafactor and
GaLoreAdamW8bit; ours (optimizer_class(backend) with group keys) for projector svd / random / plumage ×
backend adamw / adamw8bit / adafactor, svd and plumage with each solver ("svd", "gram", "gram64"); "plumage" is the
paper's estimator (κ = 0) and "plumage draws" PLUMAGE's sampling as the plumage_* options set it (κ = 1: before every
step a draw from the pool of the top 2r vectors, the moments carried to it; PLUMAGE_SAMPLED for Adam, for Adafactor
PLUMAGE_ADAFACTOR_DRAWS, plumage_adafactor's default of sessions 42-80); "plumage_adamw default" is what
plumage_adamw(8bit) runs with no options since session 17 (PLUMAGE_ADAM_RECIPE: GaLore's top-r basis, v_floor m2, scale
0.25; refreshed through the Gram's eigh, solver "auto", since session 20),
"+ foreach" the same with its steady updates taken together (the moments of the seven weights advanced in
torch._foreach calls), "one by one" with them stepped weight by weight (foreach auto, the default since session 35,
is the first on a GPU and the second on a CPU), "+ compile_update" the same with each weight's moment update one
torch.compile'd kernel (compiled in the warm-up steps). One that cannot be built or stepped here is reported n/a with the reason.

How. Each optimizer gets its own copy of the weights; the gradients are shared (no optimizer writes to
them). Repetitions are interleaved (for each rep, every optimizer steps once) so drift hits all alike,
and each figure is the median over the reps. Times are time.perf_counter around one step, with
torch.cuda.synchronize before and after on CUDA. galore-torch's GaLoreAdamW8bit.step calls
torch.cuda.synchronize(), which raises on a machine without CUDA: on CPU it is replaced by a no-op.

    python benchmarks/step_time.py [--sizes 60m,130m,350m] [--reps 7] [--refresh-reps 3] [--layers 1]
                                   [--device cpu|cuda] [--threads N] [--out docs/step_time.md]
                                   [--only "plumage_adamw default (,..."] [--skip compile_update]
                                   [--gradients gaussian|model]

--only times just the rows whose names contain one of the comma-separated strings, with galore-torch's reference
rows and the floor always kept (more repetitions of a few rows in the time of a full run); --skip leaves out those
whose names contain one of its strings (the compiled rows, say, which compile for tens of seconds first).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import galore_plumage
from galore_plumage.optimizers import (
    PLUMAGE_ADAFACTOR_DRAWS,
    PLUMAGE_SAMPLED,
    PRETRAIN_COMPLEMENT,
    optimizer_class,
    optimizer_spec,
)
from galore_plumage.optimizers.base import PLUMAGE_ADAM_RECIPE
from galore_plumage.optimizers.memory import state_bytes
from galore_plumage.optimizers.options import option_defaults
from galore_plumage.optimizers.residual import PLUMAGE_RESIDUAL_HORIZON

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_gradients  # noqa: E402  (a sibling script, not a package)

# h, i, rank. "launch": a layer so small that a step costs what its kernels cost to launch, not to run: on one CPU
# thread, a proxy for a GPU at the model sizes, whose small kernels are launch-bound (session 43: the large-batch
# default one by one took 3.0-3.8x galore-torch's step here over three runs, 3.93x on an H200 at 350M;
# docs/step_time_launch.md)
SIZES = {"launch": (32, 86, 8), "60m": (512, 1376, 128), "130m": (768, 2048, 256), "350m": (1024, 2736, 256)}
TAU = 200
STEADY_GAP = 10**9
SEED = 0
REFERENCE = {  # the galore-torch row each family's ratios are taken against
    "adamw": "galore-torch GaLoreAdamW",
    "adamw8bit": "galore-torch GaLoreAdamW8bit",
    "adafactor": "galore-torch GaLoreAdafactor",
}
OPTIONS = {
    "adamw": {"lr": 1e-3, "weight_decay": 0.0},
    "adamw8bit": {"lr": 1e-3, "weight_decay": 0.0},
    "adafactor": {"lr": 1e-3, "relative_step": False, "scale_parameter": False},  # as GaLore's script
}
REALIGN = {"svd": "none", "random": "m", "plumage": "mv"}  # galore_*'s, flora_*'s and the paper's rule
SCALE = {"svd": 0.25, "random": 1.0, "plumage": 1.0}  # GaLore's recipe for svd; no effect on timing
FLOOR = "floor: projection matmuls"
GRADIENTS = {  # what --gradients gives every optimizer to step on
    "gaussian": "seeded Gaussian (a flat spectrum: the slowest case for a refresh's eigensolver or SVD)",
    "model": (f"the last layer's of a {model_gradients.LAYERS}-layer Llama of this layer's shape after "
              f"{model_gradients.WARM_STEPS} AdamW steps on the bundled plays, on {model_gradients.BATCH} × "
              f"{model_gradients.LENGTH} tokens (benchmarks/model_gradients.py: a spectrum that falls as a model's does)"),
}

Build = Callable[[list[torch.Tensor], int, int], torch.optim.Optimizer]  # (params, rank, update_proj_gap)


@dataclass(frozen=True)
class Candidate:
    name: str
    family: str  # adamw, adamw8bit or adafactor: picks the galore-torch reference row
    low_rank: bool
    build: Build
    compiled: bool = False  # steps through torch.compile, which does not trace under a TorchDispatchMode


@dataclass
class Result:
    name: str
    family: str
    steady_reps: list[float] | None = None  # seconds, one a repetition, in order
    refresh_reps: list[float] | None = None  # the same; None for full-rank optimizers (they never refresh)
    state_bytes: tuple[int, int] | None = None  # (storages kept alive, the tensors' own bytes)
    kernels: int | None = None  # aten operations of one steady step (CountKernels)
    failure: str | None = None

    @property
    def steady(self) -> float | None:
        return None if self.steady_reps is None else statistics.median(self.steady_reps)

    @property
    def refresh(self) -> float | None:
        return None if self.refresh_reps is None else statistics.median(self.refresh_reps)

    @property
    def amortized(self) -> float | None:
        if self.steady is None:
            return None
        refresh = self.steady if self.refresh is None else self.refresh
        return (refresh + (TAU - 1) * self.steady) / TAU


# ----------------------------------------------------------------------------------------- the setup
def layer_shapes(h: int, i: int) -> dict[str, tuple[int, int]]:
    """The (out, in) shapes of one Llama layer's nn.Linear weights."""
    return {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "gate": (i, h), "up": (i, h), "down": (h, i)}


def random_tensors(shapes, device: torch.device, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(scale * torch.randn(shape, generator=generator)).to(device) for shape in shapes]


def low_rank_group(params, rank: int, gap: int, scale: float, **extra) -> list[dict]:
    return [{"params": params, "rank": rank, "update_proj_gap": gap, "scale": scale, "proj_type": "std", **extra}]


def galore_torch_build(class_name: str, backend: str) -> Build:
    def build(params, rank, gap):
        import galore_torch

        with warnings.catch_warnings():  # its AdamW warns that it is deprecated in favour of torch's
            warnings.simplefilter("ignore", FutureWarning)
            return getattr(galore_torch, class_name)(low_rank_group(params, rank, gap, SCALE["svd"]), **OPTIONS[backend])

    return build


def ours_build(backend: str, projector: str, solver: str | None, default: bool = False, **options) -> Build:
    """Our optimizer with `projector`; default=True: with the plumage_* defaults (κ = 1: a draw from the pool of 2r
    vectors, moments realigned, before every step), otherwise the generic defaults (κ = 0: the paper's estimator);
    `options` on top (foreach=True, say)."""
    extra = {"projector": projector, "realign": REALIGN[projector]} | ({"solver": solver} if solver else {}) | options
    if default:  # PLUMAGE's draws as the plumage_* family sets them (for Adam: PLUMAGE_SAMPLED, its realignment)
        spec = optimizer_spec(f"plumage_{backend}")
        realign = (spec.realign if spec.projector == "plumage" else
                   PLUMAGE_ADAFACTOR_DRAWS["realign"] if backend == "adafactor" else PLUMAGE_SAMPLED["realign"])
        extra = option_defaults("plumage") | extra | {"realign": realign} | options

    def build(params, rank, gap):
        groups = low_rank_group(params, rank, gap, SCALE[projector], **extra)
        return optimizer_class(backend)(groups, **OPTIONS[backend])

    return build


def plumage_adam_default_build(backend: str, **options) -> Build:
    """plumage_adamw(8bit) as it runs with no options (the group keys of PLUMAGE_ADAM_RECIPE; its lr aside: OPTIONS'),
    with `options` on top (foreach=True, say)."""
    recipe = {key: value for key, value in PLUMAGE_ADAM_RECIPE.items() if key not in ("lr", "scale")} | options

    def build(params, rank, gap):
        groups = low_rank_group(params, rank, gap, PLUMAGE_ADAM_RECIPE["scale"], **recipe)
        return optimizer_class(backend)(groups, **OPTIONS[backend])

    return build


def bnb_adamw8bit(params, rank, gap):
    import bitsandbytes

    return bitsandbytes.optim.AdamW8bit(params, **OPTIONS["adamw8bit"])


def candidates() -> list[Candidate]:
    """Every optimizer timed, grouped by family; the SVD-based projectors with each solver."""
    solvers = ("svd", "gram", "gram64")
    ours = [(projector, solver) for projector in ("svd", "random", "plumage")
            for solver in (solvers if projector != "random" else (None,))]
    full_rank: dict[str, Build] = {
        "adamw": lambda params, rank, gap: torch.optim.AdamW(params, **OPTIONS["adamw"]),
        "adamw8bit": bnb_adamw8bit,
    }
    full_names = {"adamw": "torch AdamW", "adamw8bit": "bitsandbytes AdamW8bit"}
    galore_names = {"adamw": "GaLoreAdamW", "adamw8bit": "GaLoreAdamW8bit", "adafactor": "GaLoreAdafactor"}
    result = []
    for backend in ("adamw", "adamw8bit", "adafactor"):
        if backend in full_rank:
            result.append(Candidate(full_names[backend], backend, False, full_rank[backend]))
        result.append(Candidate(REFERENCE[backend], backend, True, galore_torch_build(galore_names[backend], backend)))
        for projector, solver in ours:
            label = f"ours {projector}" + (f" ({solver})" if solver else "") + f" / {backend}"
            result.append(Candidate(label, backend, True, ours_build(backend, projector, solver)))
        if backend in ("adamw", "adamw8bit"):
            auto = ", foreach auto" if backend == "adamw" else ""
            label = f"ours plumage_{backend} default (svd basis, solver auto = gram, v_floor m2{auto}) / {backend}"
            result.append(Candidate(label, backend, True, plumage_adam_default_build(backend)))
            if backend == "adamw":  # its steady updates taken together (_foreach calls) or not: auto is one of the two
                label = f"ours plumage_{backend} default + foreach / {backend}"
                result.append(Candidate(label, backend, True, plumage_adam_default_build(backend, foreach=True)))
                label = f"ours plumage_{backend} default, one by one (foreach off) / {backend}"
                result.append(Candidate(label, backend, True, plumage_adam_default_build(backend, foreach=False)))
                label = f"ours plumage_{backend} default + compile_update / {backend}"
                result.append(Candidate(label, backend, True, plumage_adam_default_build(backend, compile_update=True),
                                        compiled=True))
            # what torchrun_main.py pretrains with from 4096 tokens an update (optimizers.PRETRAIN_NO_FLOOR_FROM_TOKENS,
            # PRETRAIN_COMPLEMENT): no floor, Fira's complement G − P R at every update
            label = f"ours plumage_{backend} large-batch pretraining default (no floor, complement) / {backend}"
            result.append(Candidate(label, backend, True, plumage_adam_default_build(
                backend, v_floor="none", **PRETRAIN_COMPLEMENT[("plumage", backend)][1])))
            # ... its steady updates, complement included, taken together (foreach auto on a GPU) or one weight at a time
            # (auto on a CPU; on a GPU what it ran before session 43, when foreach left a complement's update out)
            for name, foreach in ((" + foreach", True), (", one by one (foreach off)", False)):
                label = f"ours plumage_{backend} large-batch pretraining default{name} / {backend}"
                result.append(Candidate(label, backend, True, plumage_adam_default_build(
                    backend, v_floor="none", foreach=foreach, **PRETRAIN_COMPLEMENT[("plumage", backend)][1])))
            # ... and together compiled: the complement's arithmetic fused, and AdamW's moments (8-bit's are bitsandbytes')
            label = f"ours plumage_{backend} large-batch pretraining default + foreach + compile_update / {backend}"
            result.append(Candidate(label, backend, True, plumage_adam_default_build(
                backend, v_floor="none", foreach=True, compile_update=True,
                **PRETRAIN_COMPLEMENT[("plumage", backend)][1]), compiled=True))
        for solver in ("svd", "gram"):
            label = f"ours plumage draws, κ = 1 ({solver}) / {backend}"
            result.append(Candidate(label, backend, True, ours_build(backend, "plumage", solver, default=True)))
        # ... taken together (foreach: auto on a GPU): PLUMAGE_ADAFACTOR_DRAWS's, PLUMAGE_SAMPLED's for the others
        label = f"ours plumage draws, κ = 1 (gram) + foreach / {backend}"
        result.append(Candidate(label, backend, True, ours_build(backend, "plumage", "gram", default=True, foreach=True)))
        if backend == "adafactor":  # ... compiled: Adafactor's factored step and the draws' complement fused (session 46)
            label = f"ours plumage draws, κ = 1 (gram) + foreach + compile_update / {backend}"
            result.append(Candidate(label, backend, True, ours_build(backend, "plumage", "gram", default=True,
                                                                     foreach=True, compile_update=True), compiled=True))
    return result


# ----------------------------------------------------------------------------------------- measuring
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def cuda_synchronize_disabled(device: torch.device):
    """On CPU, make torch.cuda.synchronize a no-op (galore-torch's GaLoreAdamW8bit calls it every step)."""
    if device.type == "cuda":
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = lambda device=None: None
    try:
        yield
    finally:
        torch.cuda.synchronize = original


def step_once(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad  # re-set each step: galore-torch's 8-bit optimizer replaces p.grad by the low-rank one
    optimizer.step()


def build_and_warm(candidate: Candidate, grads, rank: int, gap: int, device) -> tuple[Callable[[], None], tuple]:
    """The candidate's timed step (after two warm-up steps: the first makes the moments, the second is the first to
    update them, so what compile_update compiles one weight at a time is compiled by then; a compiled one takes three
    more: the first update taken together compiles its group's functions, the next compiles them again with floats
    not specialized) and its state bytes after the warm-up."""
    params = [torch.nn.Parameter(w) for w in random_tensors([g.shape for g in grads], device, SEED + 1, 0.02)]
    optimizer = candidate.build(params, rank, gap)
    for _ in range(5 if candidate.compiled else 2):
        step_once(optimizer, params, grads)
    synchronize(device)
    return (lambda: step_once(optimizer, params, grads)), state_bytes(dict(optimizer.state))


class CountKernels(TorchDispatchMode):
    """Counts the aten operations dispatched, leaving out views (no kernel runs for them); a torch._foreach call is
    one operation however many tensors it takes."""

    VIEWS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "alias", "detach", "slice", "select",
             "unbind", "split", "split_with_sizes", "squeeze", "unsqueeze", "as_strided", "reshape", "_reshape_alias"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in self.VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def kernels_of(candidate: Candidate, grads, rank: int, device) -> int | None:
    """The kernels of one steady step of a copy of the candidate built for counting alone, past the first
    PLUMAGE_RESIDUAL_HORIZON updates after its refresh (plumage_*'s complement moves only on those: the step the timed
    median mostly sees); None for a compiled one (torch.compile does not trace under a TorchDispatchMode, and after
    trying it compiles nothing more)."""
    if candidate.compiled:
        return None
    step, _ = build_and_warm(candidate, grads, rank, STEADY_GAP, device)
    for _ in range(PLUMAGE_RESIDUAL_HORIZON):
        step()
    with CountKernels() as counter:
        step()
    return counter.count


def floor_step(grads: list[torch.Tensor], bases: list[torch.Tensor]) -> Callable[[], None]:
    """Project each gradient on its smaller side at the rank and back, as GaLore's proj_type "std" does."""

    def run() -> None:
        for grad, basis in zip(grads, bases, strict=True):
            if grad.shape[0] >= grad.shape[1]:  # basis: n × r, right side
                (grad @ basis) @ basis.T
            else:  # basis: m × r, left side
                basis @ (basis.T @ grad)

    return run


def floor_bases(grads: list[torch.Tensor], rank: int, device) -> list[torch.Tensor]:
    shapes = [(min(g.shape), rank) for g in grads]
    return [torch.linalg.qr(b).Q for b in random_tensors(shapes, device, SEED + 2)]


def time_interleaved(steps: dict[str, Callable[[], None]], reps: int, device, what: str) -> dict[str, float]:
    """Median seconds per step of each entry, repetitions interleaved across entries."""
    return {name: statistics.median(values) for name, values in times_interleaved(steps, reps, device, what).items()}


def times_interleaved(steps: dict[str, Callable[[], None]], reps: int, device, what: str) -> dict[str, list[float]]:
    """Seconds of each entry's step in each repetition (a repetition steps every entry once, in turn)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(reps):
        started = time.perf_counter()
        for name, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
        print(f"  {what} rep {rep + 1}/{reps}: {time.perf_counter() - started:.1f} s", flush=True)
    return times


def build_all(cands: list[Candidate], grads, rank: int, gap: int, device, results: dict[str, Result]):
    """Warmed-up steps of the candidates that build and step; the others' failure goes into results."""
    steps = {}
    for candidate in cands:
        try:
            steps[candidate.name], size = build_and_warm(candidate, grads, rank, gap, device)
        except Exception as error:  # report it as n/a, keep benchmarking the rest
            results[candidate.name].failure = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            print(f"  n/a {candidate.name}: {results[candidate.name].failure}", flush=True)
            continue
        if gap == STEADY_GAP:
            results[candidate.name].state_bytes = size
            results[candidate.name].kernels = kernels_of(candidate, grads, rank, device)
    return steps


def measure_size(label: str, args, device: torch.device) -> list[Result]:
    h, i, rank = SIZES[label]
    if args.gradients == "model":
        print(f"{label}: a Llama's gradients (benchmarks/model_gradients.py)", flush=True)
        grads = model_gradients.layer_gradients(h, i, device, SEED)
    else:
        grads = random_tensors(layer_shapes(h, i).values(), device, SEED)
    # more layers: copies of the seven gradients (their values do not change what a step costs)
    grads = [grad.clone() for _ in range(args.layers) for grad in grads]
    cands = selected(candidates(), args.only, args.skip)
    results = {c.name: Result(c.name, c.family) for c in cands} | {FLOOR: Result(FLOOR, "adamw")}

    print(f"{label}: h={h} i={i} rank={rank}, {args.layers} layer(s), steady steps", flush=True)
    steps = build_all(cands, grads, rank, STEADY_GAP, device, results)
    steps[FLOOR] = floor_step(grads, floor_bases(grads, rank, device))
    with CountKernels() as counter:
        steps[FLOOR]()
    results[FLOOR].kernels = counter.count
    for name, seconds in times_interleaved(steps, args.reps, device, "steady").items():
        results[name].steady_reps = seconds
    del steps

    print(f"{label}: refresh steps", flush=True)
    low_rank = [c for c in cands if c.low_rank and results[c.name].failure is None]
    steps = build_all(low_rank, grads, rank, 1, device, results)
    for name, seconds in times_interleaved(steps, args.refresh_reps, device, "refresh").items():
        results[name].refresh_reps = seconds
    return list(results.values())


def selected(cands: list[Candidate], only: list[str] | None, skip: list[str] | None = None) -> list[Candidate]:
    """The candidates whose names contain one of `only` (all of them for None) and none of `skip`, galore-torch's
    references kept."""
    return [c for c in cands if c.name in REFERENCE.values()
            or ((only is None or any(part in c.name for part in only))
                and not any(part in c.name for part in skip or ()))]


# ----------------------------------------------------------------------------------------- reporting
def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1e3 * seconds:.2f}"


def mib(held: int, tensors: int) -> str:
    return f"{held / 2**20:.2f}" + (f" ({tensors / 2**20:.2f} in tensors)" if held > 1.01 * tensors else "")


def ratio(value: float | None, reference: float | None) -> str:
    return "—" if value is None or not reference else f"{value / reference:.2f}"


def paired_ratio(reps: list[float] | None, reference: list[float] | None) -> str:
    """The median over repetitions of this row's time over the reference's in the same repetition: both sides of each
    ratio ran back to back, so drift that moves both (another process, the clock) cancels, as it does not between
    two medians taken over the whole run."""
    if reps is None or reference is None:
        return "—"
    return f"{statistics.median(mine / theirs for mine, theirs in zip(reps, reference, strict=True)):.2f}"


def table(results: list[Result]) -> str:
    by_name = {r.name: r for r in results}
    lines = ["| optimizer | steady ms | refresh ms | amortized ms (τ=200) | state MiB | steady / galore | refresh / galore "
             "| amortized / galore | kernels (steady) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r.failure is not None:
            lines.append(f"| {r.name} | n/a: {r.failure.replace('|', '/')} | | | | | | | |")
            continue
        reference = by_name[REFERENCE[r.family]]
        state = "—" if r.state_bytes is None else mib(*r.state_bytes)
        lines.append(f"| {r.name} | {ms(r.steady)} | {ms(r.refresh)} | {ms(r.amortized)} | {state} "
                     f"| {paired_ratio(r.steady_reps, reference.steady_reps)} "
                     f"| {paired_ratio(r.refresh_reps, reference.refresh_reps)} | {ratio(r.amortized, reference.amortized)} "
                     f"| {'—' if r.kernels is None else r.kernels} |")
    return "\n".join(lines)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def command_line() -> str:
    """This run's command, the interpreter as a path relative to the working directory when it lies inside it."""
    interpreter = os.path.relpath(sys.executable)
    return shlex.join([sys.executable if interpreter.startswith("..") else interpreter, *sys.argv])


def machine(device: torch.device) -> str:
    gpu = f", GPU {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})" if device.type == "cuda" else ""
    return (f"{cpu_model()} ({torch.get_num_threads()} torch threads){gpu}; torch {torch.__version__}, "
            f"galore_plumage {getattr(galore_plumage, '__version__', '?')}, Python {platform.python_version()}; "
            f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")


def report(tables: dict[str, list[Result]], args, device: torch.device) -> str:
    parts = [
        "# Optimizer step time and state on one Llama layer" if args.layers == 1
        else f"# Optimizer step time and state on {args.layers} Llama layers",
        "",
        f"Command: `{command_line()}`  ",
        f"Machine: {machine(device)}  ",
        f"Reps: {args.reps} steady, {args.refresh_reps} refresh (medians, interleaved across optimizers).  ",
        f"Gradients: {GRADIENTS[args.gradients]}.",
        "",
        "What each column is: see the docstring of `benchmarks/step_time.py`. Steady: a step without refresh;",
        "refresh: a step that recomputes the projection (and realigns moments); amortized: (refresh + 199 · steady) / 200;",
        "state: bytes of the tensors in `optimizer.state` (projector bases included) after one step, counted as the",
        "storages they keep alive; in parentheses, where smaller, the tensors' own bytes (galore-torch's `ortho_matrix`",
        "is a slice of the full SVD factor and keeps all of it alive).",
        "Ratios are against galore-torch's GaLoreAdamW (adamw rows and the floor), GaLoreAdamW8bit (8-bit rows) and",
        "GaLoreAdafactor (adafactor rows). Full-rank optimizers never refresh: their amortized time is their steady time.",
        "Steady and refresh ratios are paired: the median over repetitions of the row's time over the reference's in",
        "the same repetition (so drift both saw cancels); the amortized ratio is that of the two amortized times.",
        "The floor is the bare projection matmuls (project and project back on the smaller side at the rank).",
        "Kernels: the aten operations of one steady step, views left out, a torch._foreach call counted once.",
        "galore-torch's GaLoreAdamW8bit passes bitsandbytes' arguments positionally: with bitsandbytes ≥ 0.45 its",
        "`percentile_clipping=100` becomes `max_unorm=100`, so its steps also compute an update norm.",
    ]
    if device.type == "cpu":
        parts.append("On CPU, `torch.cuda.synchronize` (called by galore-torch's GaLoreAdamW8bit) was made a no-op.")
    for label, results in tables.items():
        h, i, rank = SIZES[label]
        parts += ["", f"## {label.upper()}: h = {h}, i = {i}, rank {rank}", "", table(results)]
    return "\n".join(parts) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="60m,130m,350m", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--reps", type=int, default=7, help="steady-step repetitions")
    parser.add_argument("--refresh-reps", type=int, default=3, help="refresh-step repetitions")
    parser.add_argument("--layers", type=int, default=1,
                        help="copies of the layer's seven weights in the one group (a model's layers; llama_60m: 8)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report path (default docs/step_time.md, docs/step_time_cuda.md on CUDA)")
    parser.add_argument("--gradients", default="gaussian", choices=tuple(GRADIENTS),
                        help="what the optimizers step on: seeded Gaussian gradients, or a Llama's (model_gradients.py)")
    parser.add_argument("--only", type=lambda s: s.split(","), default=None,
                        help="comma-separated parts of row names: time only those rows (and galore-torch's)")
    parser.add_argument("--skip", type=lambda s: s.split(","), default=None,
                        help="comma-separated parts of row names: leave those rows out (after --only)")
    args = parser.parse_args(argv)
    args.sizes = args.sizes.split(",")
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown or args.reps < 1 or args.refresh_reps < 1 or args.layers < 1:
        parser.error(f"sizes must be among {', '.join(SIZES)} (got {unknown}); reps and layers must be >= 1")
    if args.out is None:
        name = "step_time_cuda.md" if args.device == "cuda" else "step_time.md"
        args.out = Path(__file__).resolve().parent.parent / "docs" / name
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine(device), flush=True)
    tables = {}
    with cuda_synchronize_disabled(device):
        for label in args.sizes:
            tables[label] = measure_size(label, args, device)
            print(table(tables[label]), flush=True)
    args.out.write_text(report(tables, args, device))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
