"""Checkpoints of a fine-tuning run: run_glue.py's --checkpointing_steps and --resume_from_checkpoint (GaLore's flags).

A checkpoint is written only between updates (no gradient is pending), atomically, by training/checkpoint.py: under
<output_dir>/checkpoints/model_<update>/, every weight of the model (the fresh classification head and LoRA's adapters
included, which a peft model's own save_pretrained leaves out) and `trainer.pt`: the optimizer (projector state
and all), the schedule, the RNG (dropout) and where the run stands in its data: the epoch, the batches of it already
taken, the shuffling generator as that epoch began, and the losses and validation scores logged so far. A resumed run
reshuffles that epoch from the same generator state and skips the batches taken, so it continues the uninterrupted
run update for update (tests/finetune/test_finetune_resume.py: the same weights, bit for bit).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..training.checkpoint import (
    load_checkpoint,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    saved_config,
    set_rng_state,
)
from ..training.config import resume_conflicts
from ..training.metrics import METRICS_FILE
from ..training.run_folder import keep_records

CHECKPOINTS = "checkpoints"  # under --output_dir
# flags a resumed run may change: where it writes, how often it saves, what it shows, how it validates
RESUME_MAY_CHANGE = frozenset({"output_dir", "resume_from_checkpoint", "checkpointing_steps", "progress", "data_dir",
                               "per_device_eval_batch_size", "with_tracking", "report_to", "wandb_project"})
RUN_END = ("final", "projector")  # metrics.jsonl records written once a run ends


@dataclass
class Position:
    """Where a run stands between two updates."""
    step: int = 0  # updates done
    epoch: int = 1  # the epoch in progress (the next one, between epochs)
    batches_done: int = 0  # batches of that epoch already taken
    shuffle_state: torch.Tensor | None = None  # the shuffling generator's state as that epoch began
    losses: list[float] = field(default_factory=list)  # that epoch's batch losses so far
    epoch_losses: list[float] = field(default_factory=list)  # the mean batch loss of each finished epoch
    scores: list[float] = field(default_factory=list)  # the validation score (scores.primary_score) of each finished epoch


class AllWeights:
    """What save_checkpoint saves: every weight of `model` in model.safetensors (copies, so tied tensors save too)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def save_pretrained(self, folder, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file({name: value.detach().clone() for name, value in self.model.state_dict().items()},
                  str(Path(folder) / "model.safetensors"))


def save(config, position: Position, model, optimizer, scheduler) -> Path:
    """Write the run's checkpoint at `position` (between updates) and return its folder."""
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
             "position": dataclasses.asdict(position)}
    summary = {"update_step": position.step, "optimizer": config.optimizer, "config": dataclasses.asdict(config)}
    return save_checkpoint(Path(config.output_dir) / CHECKPOINTS, position.step, AllWeights(model), state, summary)


def restore(config, model, optimizer, scheduler) -> tuple[Path, Position]:
    """Load the checkpoint --resume_from_checkpoint names (a model_<update> folder, or a checkpoints folder: its newest
    complete one) into the model, optimizer and schedule; the RNG too. One written with other flags is refused,
    naming each; metrics.jsonl of the same --output_dir is cut back to the checkpoint's update."""
    flag = "--resume_from_checkpoint"
    folder = resolve_checkpoint(config.resume_from_checkpoint, flag=flag)
    saved = saved_config(folder)
    if conflicts := resume_conflicts(saved, config, RESUME_MAY_CHANGE) if saved else []:
        raise ValueError(f"{flag} {config.resume_from_checkpoint!r}: {folder.name} was written by a run with other "
                         f"flags: {'; '.join(conflicts)}. Give the checkpoint's values, or start a new run")
    state = load_checkpoint(folder, model)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    position = Position(**state["position"])
    metrics = Path(config.output_dir) / METRICS_FILE
    if folder.parent.resolve() == (Path(config.output_dir) / CHECKPOINTS).resolve():
        cut_metrics(metrics, position)
    elif metrics.exists():
        raise FileExistsError(f"{metrics} belongs to another run than {folder}: resume into a new --output_dir, or into "
                              f"the checkpoint's own ({folder.parent.parent})")
    return folder, position


def cut_metrics(path: Path, position: Position) -> None:
    """Drop the records a resume at `position` is about to write again: updates after it, epochs it had not finished
    (an epoch can end after the checkpoint's update without another update, so its record's step says nothing), and
    the run's end."""
    epochs = 0

    def keep(record: dict) -> bool:
        nonlocal epochs
        if record.get("type") == "epoch":
            epochs += 1
            return epochs <= len(position.epoch_losses)
        return record.get("type") not in RUN_END and record.get("step", 0) <= position.step

    keep_records(path, keep)


def checkpoint_every(value: str | None) -> int | str | None:
    """--checkpointing_steps: None, 'epoch', or a number of updates >= 1 (its message says what was given)."""
    if value is None or value == "epoch":
        return value
    try:
        every = int(value)
    except ValueError:
        every = 0
    if every < 1:
        raise ValueError(f"--checkpointing_steps {value!r}: give a number of updates >= 1, or 'epoch'")
    return every
