"""FSDP2 for torchrun_main.py --fsdp: shard each decoder layer and the model with fully_shard, and save / load the
sharded optimizer state with torch.distributed.checkpoint (each rank writes and reads only its own rows).

The low-rank optimizers take the resulting DTensor parameters directly (optimizers/sharded.py): projections are
shard-local and a refresh all-reduces one n × n Gram matrix, so the full gradient is never gathered.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard


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


def _inner(optimizer):
    return getattr(optimizer, "optimizer", optimizer)


def save_optimizer(model: nn.Module, optimizer, path: str | Path) -> None:
    """Write the optimizer state as a DCP checkpoint: sharded moments by rows, bases and scalars once."""
    dcp.save({"optimizer": get_optimizer_state_dict(model, _inner(optimizer))}, checkpoint_id=str(path))


def load_optimizer(model: nn.Module, optimizer, path: str | Path) -> None:
    """Read a checkpoint written by save_optimizer into `optimizer` (a fresh one is fine), at the same world size."""
    inner = _inner(optimizer)
    if getattr(inner, "_sharding", None) is not None:
        inner._sharding.prepare_for_load()  # DCP loads into a template: every key must exist with its shape
    state = {"optimizer": get_optimizer_state_dict(model, inner)}
    dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, inner, state["optimizer"])


def save_model(model: nn.Module, path: str | Path) -> None:
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(path))


def load_model(model: nn.Module, path: str | Path) -> None:
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
