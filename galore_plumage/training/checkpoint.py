"""Atomic checkpoints: a crash never leaves a half-written checkpoint where a resume would find it.

A checkpoint is a folder `<save_dir>/model_<step>/` holding the model as `save_pretrained` writes it
(config.json + model.safetensors: loadable with `LlamaForCausalLM.from_pretrained`) and `trainer.pt`
(optimizer, scheduler, data position, RNG, counters: tensors and plain values, read with
`weights_only=True`). It is written into a hidden temp folder and renamed into place; then
`<save_dir>/latest` is replaced (temp file + rename) to name it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

TRAINER_FILE = "trainer.pt"
LATEST = "latest"


def rng_state() -> dict:
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": list(internal), "python_version": version, "python_gauss": gauss}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_dir():  # a sharded (DCP) checkpoint keeps its shards in a subfolder
            _fsync_tree(path)
            continue
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def save_checkpoint(save_dir: str | Path, step: int, model, trainer_state: dict, summary: dict) -> Path:
    """Write model_<step> atomically and point `latest` at it; returns the folder."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    temp = save_dir / f".model_{step}.tmp-{os.getpid()}"
    if temp.exists():
        shutil.rmtree(temp)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-shard bar would break our own progress line
    model.save_pretrained(temp, safe_serialization=True)
    torch.save(trainer_state, temp / TRAINER_FILE)
    (temp / "training_state.json").write_text(json.dumps(summary, indent=2) + "\n")
    return publish(save_dir, temp, step)


def publish(save_dir: Path, temp: Path, step: int) -> Path:
    """Sync the finished folder `temp`, rename it to model_<step> and point `latest` at it; returns the folder."""
    final = save_dir / f"model_{step}"
    _fsync_tree(temp)
    if final.exists():  # same step saved again: move the old one aside first, drop it only after the swap
        old = save_dir / f".model_{step}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(temp, final)
        shutil.rmtree(old)
    else:
        os.replace(temp, final)
    pointer = save_dir / f".{LATEST}.tmp-{os.getpid()}"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, save_dir / LATEST)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a save_dir whose `latest` names one."""
    path = Path(path)
    if (path / TRAINER_FILE).is_file():
        return path
    if (path / LATEST).is_file():
        named = path / (path / LATEST).read_text().strip()
        if (named / TRAINER_FILE).is_file():
            return named
        raise FileNotFoundError(f"--continue_from {str(path)!r}: 'latest' names {named.name}, which is incomplete")
    raise FileNotFoundError(f"--continue_from {str(path)!r} is neither a checkpoint folder (with {TRAINER_FILE}) "
                            f"nor a save_dir with a '{LATEST}' file")


def load_checkpoint(folder: Path, model) -> dict:
    """Load the weights into `model` (strictly) and return the trainer state."""
    from safetensors.torch import load_file

    if not (folder / "model.safetensors").is_file() and (folder / "dcp").is_dir():
        raise FileNotFoundError(f"--continue_from {str(folder)!r} is a sharded checkpoint (written with --fsdp): "
                                "resume it with --fsdp, at the same number of processes")
    weights = load_file(folder / "model.safetensors", device=str(next(model.parameters()).device))
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=True)
    return torch.load(folder / TRAINER_FILE, map_location="cpu", weights_only=True)
