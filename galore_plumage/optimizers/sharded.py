"""Low-rank steps for weights that FSDP2 (`fully_shard`) shards on dim 0: shard-local projections, one all-reduce
per refresh, and a checkpoint layout that torch.distributed.checkpoint saves shard by shard.

FSDP2 hands each rank the rows G_k (m_k × n) of the averaged gradient G = [G_1; …; G_W] of a weight W (m × n).

    right side   R = G P = [G_1 P; …; G_W P],   (G P D⁻¹ Pᵀ)_k = (G_k P) D⁻¹ Pᵀ
                 both shard-local: the moments on R are row-sharded like the weight, m_k·r per rank (m·r / W),
                 and the weight's own rows move with no communication at all.
    refresh      Gᵀ G = Σ_k G_kᵀ G_k (n × n): one all-reduce, then Projector.refresh_from_gram, whose eigh gives V
                 and σ² (negative rounding clamped, and λ below the Gram's rounding floor n·ε·λ₁ set, to σ = 0). Every
                 rank holds the same matrix, hence the same V and σ, and with the generator of DESIGN.md §7 (a pure
                 function of seed, weight index, refresh count) the same PLUMAGE sample: no broadcast. An
                 orthonormal V keeps PLUMAGE unbiased.
    left side    U comes from G Gᵀ (m × m), whose blocks G_i G_jᵀ pair every two shards: not shard-local. A weight
                 for which proj_type std/reverse_std picks the left side (m < n under std) is projected on the right
                 instead, with a warning. The gradient estimate is the same for the same sampled set,
                 U_I D⁻¹ U_Iᵀ G = G V_I D⁻¹ V_Iᵀ; only the coordinates of the moments change (m × r instead of r × n,
                 also the smaller state for such a weight). proj_type 'left' and 'full' are refused.

The step itself is LowRankOptimizer.step_param, the same code as for a whole weight: `Sharding` is the placement
(placement.py) that hands it this rank's rows, sums over ranks, and this refresh. Health checks at a refresh (finite,
non-zero) are made on the all-reduced sum, so all ranks take the same decision.

Backends declare what sharding needs of them (Backend.row_keys, per_rank_keys, reblocked, over_ranks, group_for_numel):
AdamW and SGD-momentum are elementwise; 8-bit AdamW quantizes each rank's rows in its own 256-blocks (the same blocks as
one process when m_k·r is a multiple of 256), re-blocked when another number of processes loads them; Adafactor's
three whole-tensor reductions (RMS, mean over rows, mean of the row factor) are summed over ranks.
"""

from __future__ import annotations

import json
import math
import warnings

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from ..projectors import projected_modes, projector_spec
from .placement import WHOLE
from .residual import add_placeholder as add_residual_placeholder


def is_sharded(param: torch.Tensor) -> bool:
    return isinstance(param, DTensor)


def process_group(param: DTensor) -> dist.ProcessGroup:
    return param.device_mesh.get_group()


def check_sharded_param(param: DTensor, where: str) -> None:
    """FSDP2's layout (a 1-D mesh, Shard(0)) is the one supported; HSDP or other placements fail here."""
    if param.device_mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        raise ValueError(f"{where}: a DTensor parameter must be sharded on dim 0 over a 1-D mesh (FSDP2's "
                         f"fully_shard), got placements {tuple(param.placements)} on a {param.device_mesh.ndim}-D mesh")


class Sharding:
    """The placement (placement.py) of a LowRankOptimizer's dim-0-sharded weights, their validation and their state
    layout in checkpoints. One per optimizer; every method that concerns one weight takes that weight."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        backend = optimizer.backend
        if backend.row_keys is None:
            raise ValueError(f"backend {backend.name!r} has no sharded (FSDP2) implementation: it declares no row_keys")
        self._backends: dict[dist.ProcessGroup, object] = {}
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

    # ----------------------------------------------------------------- the placement (placement.py)
    def local(self, tensor: DTensor) -> torch.Tensor:
        return tensor.to_local()

    def backend(self, backend, param: DTensor):
        group = process_group(param)
        if group not in self._backends:
            self._backends[group] = backend.over_ranks(group)
        return self._backends[group]

    def group_for(self, group: dict, backend, param: DTensor, local: torch.Tensor) -> dict:
        """The group for the whole tensor whose rows `local` holds (param.shape[0] rows of local's other dims)."""
        return backend.group_for_numel(group, param.shape[0] * math.prod(local.shape[1:]))

    def total_for(self, param: DTensor):
        return lambda value: _all_reduced(value, process_group(param))

    def projector_options(self, param: DTensor, group: dict) -> dict:
        """proj_type 'right', warning once per weight when the group's proj_type would have picked the left side."""
        if projected_modes(tuple(param.shape), group["proj_type"]) != (1,) and id(param) not in self._warned_left:
            self._warned_left.add(id(param))
            warnings.warn(f"proj_type={group['proj_type']!r} picks the left side of the sharded weight of shape "
                          f"{tuple(param.shape)}; it is projected on the right (shard-local) instead: the same gradient "
                          "estimate, moments kept as m x r", stacklevel=5)
        return {"proj_type": "right"}

    def refresh(self, projector, shard: torch.Tensor, param: DTensor, step: int) -> bool:
        return refresh_from_shards(projector, shard, tuple(param.shape), step, process_group(param))

    def all_finite(self, shard: torch.Tensor, param: DTensor) -> bool:
        flag = torch.tensor([float(bool(torch.isfinite(shard).all()))], device=shard.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=process_group(param))
        return bool(flag.item())

    def check_step(self, grad: torch.Tensor | None, low_grad: torch.Tensor | None) -> None:
        if low_grad is not None or grad is None:
            raise ValueError("a sharded weight steps from its full (sharded) gradient: per-layer mode, which "
                             "passes projected gradients, does not run under FSDP2")

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
        wrapped = {**state, **self._wrap_tensors(state, param)}
        if "projector" in state:
            wrapped["projector"] = {**state["projector"], "stats": json.dumps(state["projector"]["stats"])}
        return wrapped

    def _wrap_tensors(self, state: dict, param: DTensor) -> dict:
        """This rank's row and per-rank tensors of `state` as DTensors."""
        mesh, rows = param.device_mesh, param.shape[0]
        wrapped = {}
        backend = self.optimizer.backend
        for key in backend.row_keys:
            value = state.get(key)
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                shape = (rows, *value.shape[1:])
                wrapped[key] = DTensor.from_local(value.contiguous(), mesh, [Shard(0)], run_check=False, shape=shape,
                                                  stride=_contiguous_stride(shape))
        for key in backend.per_rank_keys:
            if key in state:
                length = backend.per_rank_length(state, math.ceil(rows / mesh.size()))  # torch.chunk's largest shard
                padded = torch.zeros(length, dtype=state[key].dtype, device=state[key].device)
                padded[: state[key].numel()] = state[key]
                wrapped[key] = DTensor.from_local(padded, mesh, [Shard(0)], run_check=False,
                                                  shape=(length * mesh.size(),), stride=(1,))
        return wrapped

    def _unwrap(self, state: dict, param: DTensor) -> dict:
        local = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}
        backend = self.optimizer.backend
        for key in backend.row_keys:
            if isinstance(state.get(key), torch.Tensor) and not isinstance(state[key], DTensor) and state[key].dim():
                raise ValueError(f"optimizer state {key!r} of a sharded weight is a plain tensor of shape "
                                 f"{tuple(state[key].shape)}; load sharded checkpoints with torch.distributed.checkpoint "
                                 "(galore_plumage.training.fsdp.load_optimizer)")
        for key in backend.per_rank_keys:
            if key in local:
                local[key] = local[key][: backend.per_rank_length(local, local[backend.row_keys[0]].shape[0])].clone()
        if isinstance(local.get("projector", {}).get("stats"), str):
            local["projector"] = {**local["projector"], "stats": json.loads(local["projector"]["stats"])}
        return local

    # ----------------------------------------------------------------- a checkpoint of another number of processes
    # Row keys reshard by themselves (DCP reads each rank's rows of their global shape); per-rank keys (8-bit's block
    # scales) were written in the saved ranks' blocks, which other row boundaries split otherwise.
    def saved_layout(self, state_dict: dict, saved_world: int) -> dict:
        """The load template (this optimizer's wrapped state dict) for a checkpoint written by `saved_world` processes:
        each per-rank key as a plain tensor of every saved rank's list, which each rank then reads whole (one float per
        256 values of the state)."""
        backend = self.optimizer.backend

        def as_saved(state: dict, param: DTensor) -> dict:
            if param.device_mesh.size() == saved_world:
                return state
            length = math.ceil(param.shape[0] / saved_world)
            return {**state, **{key: torch.zeros(backend.per_rank_length(state, length) * saved_world,
                                                 dtype=state[key].dtype, device=state[key].device)
                                for key in backend.per_rank_keys if key in state}}
        return self._map_states(state_dict, as_saved)

    def reblocked(self, state_dict: dict, saved_world: int) -> dict:
        """A state dict loaded into saved_layout's template, with its per-rank keys in this rank's blocks."""
        backend = self.optimizer.backend

        def to_this_world(state: dict, param: DTensor) -> dict:
            mesh = param.device_mesh
            if mesh.size() == saved_world or not any(key in state for key in backend.per_rank_keys):
                return state
            local = {key: value.to_local() if isinstance(value, DTensor) else value for key, value in state.items()}
            first_row = mesh.get_local_rank() * math.ceil(param.shape[0] / mesh.size())  # torch.chunk's split
            local.update(backend.reblocked(local, first_row, param.shape[0], saved_world))
            return {**state, **self._wrap_tensors(local, param)}
        return self._map_states(state_dict, to_this_world)

    @torch.no_grad()
    def prepare_for_load(self) -> None:
        """Give every weight without state a state of the right layout (values are placeholders), so that
        get_optimizer_state_dict of a fresh optimizer is a complete template for torch.distributed.checkpoint.load."""
        optimizer = self.optimizer
        for param, group in self._params():
            state = optimizer.state[param]
            if set(state) - {"step"}:
                continue
            where = self if is_sharded(param) else WHOLE
            weight, backend = where.local(param), where.backend(optimizer.backend, param)
            state["step"] = 1  # bias corrections divide by 1 − β^step
            if "rank" not in group:
                backend.update(state, torch.zeros_like(weight), where.group_for(group, backend, param, weight), weight)
                continue
            projector = optimizer.projector_for(param, group)
            if not projector.ready:
                projector.install_placeholder(tuple(param.shape), weight)
            state["projector"] = projector.state_dict()
            low = projector.project(torch.zeros_like(weight))
            backend.update(state, low, where.group_for(group, backend, param, low), weight)
            if optimizer.residual_for(group, projector) != "none":
                add_residual_placeholder(state, low)

    def _params(self):
        return [(p, group) for group in self.optimizer.param_groups for p in group["params"]]


def refresh_from_shards(projector, shard: torch.Tensor, shape: tuple[int, int], step: int,
                        group: dist.ProcessGroup) -> bool:
    """A new right-side basis from the row shards of G: True if installed, False if the basis was kept (G not finite
    anywhere, all zero, or the eigh failed).

    Spectral projectors all-reduce Σ_k G_kᵀ G_k (the compute dtype, as solver='gram' does on one process); the
    random projector only needs Σ‖G_k‖² (float64) for the same checks.
    """
    if projector.shape is not None and tuple(shape) != projector.shape:
        raise ValueError(f"{projector.name} projector was built for shape {projector.shape}, got {tuple(shape)}")
    x = shard.detach().to(torch.float64 if shard.dtype == torch.float64 else torch.float32)
    if projector.from_spectrum:
        gram = x.T @ x
        dist.all_reduce(gram, group=group)
        return projector.refresh_from_gram(gram, shape, step, x.dtype)
    energy = x.double().square().sum().reshape(1)
    dist.all_reduce(energy, group=group)
    if not (bool(torch.isfinite(energy).all()) and energy.item() > 0):
        projector.stats["skipped_refreshes"] += 1
        return False
    return projector.refresh_seeded(shape, step, x.dtype, x.device)


def _all_reduced(value: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum over ranks of a shard-local partial sum (e.g. a squared norm)."""
    value = value.clone()
    dist.all_reduce(value, group=group)
    return value


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= size
    return tuple(reversed(stride))
