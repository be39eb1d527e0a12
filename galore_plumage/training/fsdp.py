"""FSDP2 for torchrun_main.py --fsdp: shard each decoder layer and the model with fully_shard, and save / load the
sharded optimizer state with torch.distributed.checkpoint (each rank writes and reads only its own rows).

The low-rank optimizers take the resulting DTensor parameters directly (optimizers/sharded.py): projections are
shard-local and a refresh all-reduces one n × n Gram matrix, so the full gradient is never gathered.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from ..optimizers.base import LowRankOptimizer
from ..optimizers.layerwise import inner_optimizer
from .checkpoint import TRAINER_FILE, CheckpointError, publish, read_trainer_state, write_summary


def shard_model(model: nn.Module) -> nn.Module:
    """fully_shard each decoder layer (its parameters are gathered only while it runs), then the root for the rest
    (embeddings, final norm, head). Parameters become DTensors sharded on dim 0 over all ranks."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"--fsdp expects a LlamaForCausalLM (model.model.layers); got {type(model).__name__}")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _template(model: nn.Module, optimizer, saved_world: int | None) -> dict:
    """DCP loads into a template (get_optimizer_state_dict of this optimizer): every key must exist, with its shape, as
    the `saved_world` processes that wrote the checkpoint laid it out (None: as this run's)."""
    if not isinstance(optimizer, LowRankOptimizer):  # torch's own: plain DTensor states, resharded by DCP
        return get_optimizer_state_dict(model, optimizer)
    optimizer.prepare_for_load()
    return optimizer.saved_layout(get_optimizer_state_dict(model, optimizer), saved_world or dist.get_world_size())


def _set(model: nn.Module, optimizer, loaded: dict, saved_world: int | None) -> None:
    if isinstance(optimizer, LowRankOptimizer):
        loaded = optimizer.reblocked(loaded, saved_world or dist.get_world_size())
    set_optimizer_state_dict(model, optimizer, loaded)


def save_optimizer(model: nn.Module, optimizer, path: str | Path) -> None:
    """Write the optimizer state as a DCP checkpoint: sharded moments by rows, bases and scalars once."""
    dcp.save({"optimizer": get_optimizer_state_dict(model, inner_optimizer(optimizer))}, checkpoint_id=str(path))


def load_optimizer(model: nn.Module, optimizer, path: str | Path, saved_world: int | None = None) -> None:
    """Read a checkpoint written by save_optimizer into `optimizer` (a fresh one is fine), written by `saved_world`
    processes (None: this run's number). DCP reads every DTensor by its global rows, so the row-sharded moments load
    into any number of processes; 8-bit states, whose block scales are per rank, are re-blocked (Sharding.reblocked)."""
    inner = inner_optimizer(optimizer)
    state = {"optimizer": _template(model, inner, saved_world)}
    dcp.load(state, checkpoint_id=str(path))
    _set(model, inner, state["optimizer"], saved_world)


def save_model(model: nn.Module, path: str | Path) -> None:
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(path))


def load_model(model: nn.Module, path: str | Path) -> None:
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])


# ----------------------------------------------------------------- torchrun_main.py --fsdp
DCP_FOLDER = "dcp"  # inside model_<step>/: model and optimizer, one file per rank


def ensure_process_group(context) -> None:
    """fully_shard needs a process group even for one process (plain `python`, or torchrun with one rank)."""
    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group(backend="nccl" if context.device.type == "cuda" else "gloo", rank=context.rank,
                            world_size=context.world_size)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def save_sharded_checkpoint(save_dir: str | Path, step: int, model: nn.Module, optimizer, trainer_state: dict,
                            summary: dict, is_main: bool) -> Path:
    """model_<step>/ with dcp/ (model and optimizer, each rank its shards), trainer.pt and config.json from rank 0;
    written to a temp folder every rank shares and renamed into place once complete, as checkpoint.py does."""
    save_dir = Path(save_dir)
    temp = save_dir / f".model_{step}.tmp-fsdp"
    if is_main:
        save_dir.mkdir(parents=True, exist_ok=True)
        if temp.exists():
            shutil.rmtree(temp)
    dist.barrier()
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, inner_optimizer(optimizer))}
    dcp.save(state, checkpoint_id=str(temp / DCP_FOLDER))
    final = save_dir / f"model_{step}"
    if is_main:
        torch.save(trainer_state, temp / TRAINER_FILE)
        model.config.to_json_file(temp / "config.json")
        write_summary(temp, summary)
        final = publish(save_dir, temp, step)
    dist.barrier()
    return final


def load_sharded_checkpoint(folder: Path, model: nn.Module, optimizer, saved_world: int | None = None) -> dict:
    """Load model and optimizer shards written by save_sharded_checkpoint, by `saved_world` processes (None: unknown,
    taken as this run's); returns the trainer state. Another number of processes is fine (see load_optimizer)."""
    if not (folder / DCP_FOLDER).is_dir():
        raise FileNotFoundError(f"--continue_from {str(folder)!r} holds no '{DCP_FOLDER}' folder: it was not written "
                                "with --fsdp; resume it without --fsdp")
    inner = inner_optimizer(optimizer)
    state = {"model": get_model_state_dict(model), "optimizer": _template(model, inner, saved_world)}
    try:
        dcp.load(state, checkpoint_id=str(folder / DCP_FOLDER))
    except Exception as error:  # noqa: BLE001 - DCP wraps each rank's failure in its own exception types
        raise CheckpointError(f"{folder / DCP_FOLDER}: unreadable ({type(error).__name__}: {error})") from None
    set_model_state_dict(model, state["model"])
    _set(model, inner, state["optimizer"], saved_world)
    return read_trainer_state(folder)
