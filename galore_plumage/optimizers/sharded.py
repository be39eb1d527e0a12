"""Low-rank steps for weights that FSDP2 (`fully_shard`) shards on dim 0: shard-local projections, one all-reduce
per refresh, and a checkpoint layout that torch.distributed.checkpoint saves shard by shard.

FSDP2 hands each rank the rows G_k (m_k × n) of the averaged gradient G = [G_1; …; G_W] of a weight W (m × n).

    right side   R = G P = [G_1 P; …; G_W P],   (G P D⁻¹ Pᵀ)_k = (G_k P) D⁻¹ Pᵀ
                 both shard-local: the moments on R are row-sharded like the weight, m_k·r per rank (m·r / W),
                 and the weight's own rows move with no communication at all.
    refresh      Gᵀ G = Σ_k G_kᵀ G_k (n × n): one all-reduce, then the eigh of projectors.svd.eigh_gram gives V and
                 σ² (negative rounding clamped, and λ below the Gram's rounding floor n·ε·λ₁ set, to σ = 0). Every
                 rank holds the same matrix, hence the same V and σ, and with the generator of DESIGN.md §7 (a pure
                 function of seed, weight index, refresh count) the same PLUMAGE sample: no broadcast. An
                 orthonormal V keeps PLUMAGE unbiased.
    left side    U comes from G Gᵀ (m × m), whose blocks G_i G_jᵀ pair every two shards: not shard-local. A weight
                 for which proj_type std/reverse_std picks the left side (m < n under std) is projected on the right
                 instead, with a warning. The gradient estimate is the same for the same sampled set,
                 U_I D⁻¹ U_Iᵀ G = G V_I D⁻¹ V_Iᵀ; only the coordinates of the moments change (m × r instead of r × n,
                 also the smaller state for such a weight). proj_type 'left' and 'full' are refused.

Health checks at a refresh (finite, non-zero) are made on the all-reduced sum, so all ranks take the same decision.
Backends: AdamW and SGD-momentum are elementwise; 8-bit AdamW quantizes each rank's rows in its own 256-blocks (the
same blocks as one process when m_k·r is a multiple of 256); Adafactor's three whole-tensor reductions (RMS, mean over
rows, mean of the row factor) are summed over ranks.
"""

from __future__ import annotations

import json
import math
import warnings
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from ..projectors import build_projector, projected_modes, projector_spec, refresh_generator
from ..projectors.svd import Singular, eigh_gram
from .adafactor import AdafactorBackend
from .adamw8bit import BLOCKSIZE
from .base import Backend, apply_update, low_rank_update, projector_options, resample_if_due
from .sampled_step import restart_limiter

# state tensors whose dim 0 is the weight's (sharded) rows; absmax (8-bit) is one block list per rank
ROW_KEYS = {
    "adamw": ("exp_avg", "exp_avg_sq"),
    "adamw8bit": ("state1", "state2"),
    "adafactor": ("exp_avg", "exp_avg_sq_row", "exp_avg_sq"),
    "sgdm": ("momentum_buffer",),
}
PER_RANK_KEYS = ("absmax1", "absmax2")


def is_sharded(param: torch.Tensor) -> bool:
    return isinstance(param, DTensor)


def process_group(param: DTensor) -> dist.ProcessGroup:
    return param.device_mesh.get_group()


def check_sharded_param(param: DTensor, where: str) -> None:
    """FSDP2's layout (a 1-D mesh, Shard(0)) is the one supported; HSDP or other placements fail here."""
    if param.device_mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        raise ValueError(f"{where}: a DTensor parameter must be sharded on dim 0 over a 1-D mesh (FSDP2's "
                         f"fully_shard), got placements {tuple(param.placements)} on a {param.device_mesh.ndim}-D mesh")


class ShardedAdafactor(AdafactorBackend):
    """Adafactor on row-sharded tensors: its whole-tensor reductions are sums (and counts) all-reduced over ranks."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def _summed(self, sums: torch.Tensor, count: int) -> torch.Tensor:
        """(Σ over ranks of `sums`) / (Σ over ranks of `count`), computed in float64 so counts stay exact."""
        packed = torch.cat([sums.double().reshape(-1), sums.new_tensor([count], dtype=torch.float64)])
        dist.all_reduce(packed, group=self.group)
        return (packed[:-1] / packed[-1]).to(sums.dtype).reshape(sums.shape)

    def _rms(self, tensor):
        return self._summed(tensor.square().sum(), tensor.numel()).sqrt()

    def _mean_over_rows(self, tensor):
        return self._summed(tensor.sum(dim=-2), tensor.shape[-2])

    def _mean_of_row_factor(self, row):
        return self._summed(row.sum(dim=-1, keepdim=True), row.shape[-1])


class Sharding:
    """The DTensor half of a LowRankOptimizer: steps, validation and state layout for its dim-0-sharded weights."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        name = optimizer.backend.name
        if name not in ROW_KEYS:
            raise ValueError(f"backend {name!r} has no sharded (FSDP2) implementation; choose one of {sorted(ROW_KEYS)}")
        self._backends: dict[Any, Backend] = {}
        self._warned_left: set[int] = set()

    # ----------------------------------------------------------------- validation
    def validate_group(self, group: dict, index: int) -> None:
        for position, param in enumerate(group["params"]):
            if is_sharded(param):
                check_sharded_param(param, f"param {position} of group {index}")
        if "rank" not in group or not any(is_sharded(p) for p in group["params"]):
            return
        spec = projector_spec(group["projector"])
        if not (spec.cls.from_spectrum or not spec.cls.stores_factors):
            raise ValueError(f"projector {spec.name!r} cannot refresh from sharded gradients (it needs the full "
                             "gradient); use 'svd', 'plumage' or 'random' for FSDP2-sharded weights")
        if group["row_bias_correction"]:
            raise ValueError("row_bias_correction=True is not supported on FSDP2-sharded weights yet (its per-row "
                             "state is not laid out for sharded checkpoints); drop it or run without --fsdp")
        if group["proj_type"] in ("left", "full"):
            raise ValueError(f"proj_type={group['proj_type']!r} projects the left side, which needs the rows of every "
                             "shard (G Gᵀ); FSDP2-sharded weights are projected on the right: use 'right' or 'std'")

    def proj_type_for(self, param: DTensor, group: dict) -> str:
        """'right', warning once per weight when the group's proj_type would have picked the left side."""
        if projected_modes(tuple(param.shape), group["proj_type"]) != (1,) and id(param) not in self._warned_left:
            self._warned_left.add(id(param))
            warnings.warn(f"proj_type={group['proj_type']!r} picks the left side of the sharded weight of shape "
                          f"{tuple(param.shape)}; it is projected on the right (shard-local) instead: the same gradient "
                          "estimate, moments kept as m x r", stacklevel=4)
        return "right"

    def projector_for(self, param: DTensor, group: dict):
        optimizer = self.optimizer
        projector = optimizer._projectors.get(param)
        if projector is None:
            projector = build_projector(group["projector"], group["rank"], **projector_options(
                group, proj_type=self.proj_type_for(param, group), index=optimizer._indices[param]))
            if "projector" in optimizer.state[param]:
                projector.load_state_dict(optimizer.state[param]["projector"])
            optimizer._projectors[param] = projector
        return projector

    def backend_for(self, param: DTensor) -> Backend:
        backend = self.optimizer.backend
        if not isinstance(backend, AdafactorBackend):
            return backend  # elementwise (adamw, sgdm) or blockwise on each rank's own rows (adamw8bit)
        group = process_group(param)
        if group not in self._backends:
            self._backends[group] = ShardedAdafactor(group)
        return self._backends[group]

    # ----------------------------------------------------------------- stepping
    @torch.no_grad()
    def step(self, param: DTensor, group: dict, grad: DTensor | None, low_grad: torch.Tensor | None) -> None:
        if low_grad is not None or grad is None:
            raise ValueError("a sharded weight steps from its full (sharded) gradient: per-layer mode, which "
                             "passes projected gradients, does not run under FSDP2")
        optimizer, backend = self.optimizer, self.backend_for(param)
        state = optimizer.state[param]
        state.setdefault("step", 0)
        weight, shard = param.to_local(), grad.to_local()
        if "rank" not in group:
            state["step"] += 1
            backend.full_step(weight, shard, self._group_for(group, param.numel()), state)
            return
        projector = self.projector_for(param, group)
        if projector.due(state["step"]):
            first = not projector.ready
            outcome = refresh_from_shards(projector, shard, tuple(param.shape), state["step"], process_group(param))
            if outcome:
                if projector.transition is not None:
                    backend.realign(state, projector, group["realign"])
                restart_limiter(state)
                if first and group["stagger"]:
                    projector.next_refresh = state["step"] + optimizer._staggered_interval(param, projector.tau)
                state["projector"] = projector.state_dict()
            elif outcome is None or not projector.ready:  # non-finite somewhere, or no basis yet: skip, as base does
                return
        low = projector.project(shard)
        state["step"] += 1
        group = self._group_for(group, param.shape[0] * low.shape[1])
        update = low_rank_update(backend, state, low, group, weight, projector, total=partial(_all_reduced, param))
        apply_update(weight, update, projector, backend.decay_first)
        resample_if_due(backend, state, group, projector)

    def _group_for(self, group: dict, global_numel: int) -> dict:
        """8-bit's min_8bit_size is decided on the whole tensor, so every rank keeps the same state layout."""
        if "min_8bit_size" not in group:
            return group
        return {**group, "min_8bit_size": 0 if global_numel >= group["min_8bit_size"] else math.inf}

    # ----------------------------------------------------------------- state layout
    def wrap_state_dict(self, state_dict: dict) -> dict:
        """Per-rank tensors as DTensors, so torch.distributed.checkpoint saves each rank's part (it would keep one
        rank's copy of a plain tensor): row keys as Shard(0) of their global rows, absmax as one padded block list
        per rank; the projector's stats dict as one JSON string, whose keys vary over a run."""
        return self._map_states(state_dict, self._wrap)

    def unwrap_state_dict(self, state_dict: dict) -> dict:
        return self._map_states(state_dict, self._unwrap)

    def _map_states(self, state_dict: dict, function) -> dict:
        """Apply `function(state, param)` to the state of each sharded weight. The state is keyed by whatever the
        groups' "params" lists hold (indices from torch, parameter names from get_optimizer_state_dict)."""
        keys = [key for group in state_dict["param_groups"] for key in group["params"]]
        states = dict(state_dict["state"])
        for key, (param, _) in zip(keys, self._params(), strict=True):
            if is_sharded(param) and key in states:
                states[key] = function(states[key], param)
        return {**state_dict, "state": states}

    def _wrap(self, state: dict, param: DTensor) -> dict:
        mesh, rows = param.device_mesh, param.shape[0]
        wrapped = dict(state)
        for key in ROW_KEYS[self.optimizer.backend.name]:
            value = state.get(key)
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                shape = (rows, *value.shape[1:])
                wrapped[key] = DTensor.from_local(value.contiguous(), mesh, [Shard(0)], run_check=False, shape=shape,
                                                  stride=_contiguous_stride(shape))
        for key in PER_RANK_KEYS:
            if key in state:
                length = _blocks_per_rank(rows, mesh.size(), state["state1"])
                padded = torch.zeros(length, dtype=state[key].dtype, device=state[key].device)
                padded[: state[key].numel()] = state[key]
                wrapped[key] = DTensor.from_local(padded, mesh, [Shard(0)], run_check=False,
                                                  shape=(length * mesh.size(),), stride=(1,))
        if "projector" in state:
            wrapped["projector"] = {**state["projector"], "stats": json.dumps(state["projector"]["stats"])}
        return wrapped

    def _unwrap(self, state: dict, param: DTensor) -> dict:
        local = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}
        for key in ROW_KEYS[self.optimizer.backend.name]:
            if isinstance(state.get(key), torch.Tensor) and not isinstance(state[key], DTensor) and state[key].dim():
                raise ValueError(f"optimizer state {key!r} of a sharded weight is a plain tensor of shape "
                                 f"{tuple(state[key].shape)}; load sharded checkpoints with torch.distributed.checkpoint "
                                 "(galore_plumage.training.fsdp.load_optimizer)")
        for key in PER_RANK_KEYS:
            if key in local:
                local[key] = local[key][: math.ceil(local["state1"].numel() / BLOCKSIZE)].clone()
        if isinstance(local.get("projector", {}).get("stats"), str):
            local["projector"] = {**local["projector"], "stats": json.loads(local["projector"]["stats"])}
        return local

    @torch.no_grad()
    def prepare_for_load(self) -> None:
        """Give every weight without state a state of the right layout (values are placeholders), so that
        get_optimizer_state_dict of a fresh optimizer is a complete template for torch.distributed.checkpoint.load."""
        optimizer = self.optimizer
        for param, group in self._params():
            state = optimizer.state[param]
            if set(state) - {"step"}:
                continue
            weight = param.to_local() if is_sharded(param) else param
            backend = self.backend_for(param) if is_sharded(param) else optimizer.backend
            state["step"] = 1  # bias corrections divide by 1 − β^step
            if "rank" not in group:
                backend.update(state, torch.zeros_like(weight), self._group_for(group, param.numel()), weight)
                continue
            projector = self.projector_for(param, group) if is_sharded(param) else optimizer.projector_for(param, group)
            if not projector.ready:
                _install_placeholder_basis(projector, tuple(param.shape), weight)
            state["projector"] = projector.state_dict()
            low = projector.project(torch.zeros_like(weight))
            backend.update(state, low, self._group_for(group, param.shape[0] * low.shape[1]), weight)

    def _params(self):
        return [(p, group) for group in self.optimizer.param_groups for p in group["params"]]


def refresh_from_shards(projector, shard: torch.Tensor, shape: tuple[int, int], step: int,
                        group: dist.ProcessGroup) -> bool | None:
    """A new right-side basis from the row shards of G: True if installed, False if the basis was kept (all-zero
    gradient, eigh failure), None if G is not finite anywhere (the caller skips the step, as the base does).

    Spectral projectors all-reduce Σ_k G_kᵀ G_k (the compute dtype, as solver='gram' does on one process); the
    random projector only needs Σ‖G_k‖² (float64) for the same checks.
    """
    if projector.shape is not None and tuple(shape) != projector.shape:
        raise ValueError(f"{projector.name} projector was built for shape {projector.shape}, got {tuple(shape)}")
    x = shard.detach().to(torch.float64 if shard.dtype == torch.float64 else torch.float32)
    total = x.T @ x if projector.from_spectrum else x.double().square().sum().reshape(1)
    dist.all_reduce(total, group=group)
    if not bool(torch.isfinite(total).all()):
        projector.stats["skipped_refreshes"] += 1
        return None
    energy = total.diagonal().sum() if projector.from_spectrum else total[0]
    ranks = projector._rank_per_mode or projector._ranks(shape)
    decomposition = eigh_gram(total, x.dtype, noise_floor=True) if projector.from_spectrum and energy > 0 else None
    if energy <= 0 or (projector.from_spectrum and decomposition is None):
        projector.stats["skipped_refreshes"] += 1
        return False
    generator = refresh_generator(projector.seed, projector.index, projector.refresh_count)
    if projector.from_spectrum:
        vectors, sigma = decomposition
        basis = projector._basis_from_spectrum(Singular(sigma, lambda mode, columns: _columns(vectors, columns)),
                                               ranks, generator)
    else:  # a seed-only basis reads the gradient's shape, dtype and device: a zero-stride view of the full shape
        basis = projector._new_basis(x.new_zeros(()).expand(shape), ranks, generator)
    if basis is None:
        projector.stats["skipped_refreshes"] += 1
        return False
    projector.install(basis, tuple(shape), ranks, step)
    return True


def _all_reduced(param: DTensor, value: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of a shard-local partial sum (e.g. a squared norm)."""
    value = value.clone()
    dist.all_reduce(value, group=process_group(param))
    return value


def _install_placeholder_basis(projector, shape: tuple[int, int], like: torch.Tensor) -> None:
    """A basis with the real layout (factor n × r, PLUMAGE's 1/p) for a state template; load replaces it."""
    ranks = projector._ranks(shape)
    n = shape[1]
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    generator = refresh_generator(projector.seed, projector.index, 0)
    if projector.from_spectrum:
        vectors = torch.eye(n, dtype=dtype, device=like.device)
        sigma = torch.linspace(1.0, 0.5, n, dtype=dtype, device=like.device)
        basis = projector._basis_from_spectrum(Singular(sigma, lambda mode, columns: _columns(vectors, columns)),
                                               ranks, generator)
    else:
        basis = projector._new_basis(torch.zeros((), dtype=dtype, device=like.device).expand(shape), ranks, generator)
    projector.install(basis, shape, ranks, 0)


def _columns(vectors: torch.Tensor, columns) -> torch.Tensor:
    """Chosen eigenvectors as a row-major copy: the layout a checkpoint loads back into, so a resumed run multiplies
    with the very same memory layout (another layout rounds matmuls differently)."""
    return vectors[:, columns].clone(memory_format=torch.contiguous_format)


def _blocks_per_rank(rows: int, world: int, state1: torch.Tensor) -> int:
    """8-bit absmax length of the largest shard (torch.chunk's ceil(rows / world) rows): every rank pads to it."""
    per_row = math.prod(state1.shape[1:])
    return math.ceil(math.ceil(rows / world) * per_row / BLOCKSIZE)


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= size
    return tuple(reversed(stride))
