"""Atomic checkpoints: a crash never leaves a half-written checkpoint where a resume would find it.

A checkpoint is a folder `<save_dir>/model_<step>/` holding the model and its tokenizer as `save_pretrained` writes
them (config.json + model.safetensors + tokenizer files: loadable with `LlamaForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained`, and fine-tuned by run_glue.py) and `trainer.pt`
(optimizer, scheduler, data position, RNG, counters: tensors and plain values, read with
`weights_only=True`). It is written into a hidden temp folder, `manifest.json` (every file's size and
SHA-256) last, and renamed into place; then `<save_dir>/latest` is replaced (temp file + rename) to name it.

On resume the manifest is checked again. A checkpoint named explicitly that fails the check is refused with
the file named; a save_dir resumes from its newest checkpoint that passes, with a warning for each one skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

TRAINER_FILE = "trainer.pt"
LATEST = "latest"
MANIFEST = "manifest.json"
SUMMARY_FILE = "training_state.json"  # the update, tokens and the run's flags, readable without torch
CHECKPOINT_NAME = re.compile(r"model_(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed; the message names the file and what is wrong with it."""


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


def save_checkpoint(save_dir: str | Path, step: int, model, trainer_state: dict, summary: dict, tokenizer=None) -> Path:
    """Write model_<step> atomically and point `latest` at it; returns the folder. With the run's `tokenizer` its files
    go in too, so the folder is a whole model for `from_pretrained` (run_glue.py --model_name_or_path fine-tunes it)."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    temp = save_dir / f".model_{step}.tmp-{os.getpid()}"
    if temp.exists():
        shutil.rmtree(temp)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-shard bar would break our own progress line
    model.save_pretrained(temp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(temp)
    torch.save(trainer_state, temp / TRAINER_FILE)
    write_summary(temp, summary)
    return publish(save_dir, temp, step)


def write_summary(folder: Path, summary: dict) -> None:
    (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")


def saved_config(folder: Path) -> dict | None:
    """The flags of the run that wrote the checkpoint (None for one written before they were recorded)."""
    path = folder / SUMMARY_FILE
    return json.loads(path.read_text()).get("config") if path.is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """manifest.json: the size and SHA-256 of every file of the finished folder, written last."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (folder / MANIFEST).write_text(json.dumps({"files": entries}, indent=1) + "\n")


def verify_checkpoint(folder: Path) -> None:
    """Raise CheckpointError naming the first file that is missing, truncated or changed since it was saved.
    A checkpoint written before manifests existed is only checked for its trainer state."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        if not (folder / TRAINER_FILE).is_file():
            raise CheckpointError(f"{folder / TRAINER_FILE}: missing, so {folder} is incomplete")
        return
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{manifest}: unreadable ({error})") from None
    for name in [TRAINER_FILE, *entries]:
        path = folder / name
        if name not in entries or not path.is_file():
            raise CheckpointError(f"{path}: missing, so {folder} is incomplete")
        size = path.stat().st_size
        if size != entries[name]["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes where {entries[name]['bytes']} were saved (truncated or "
                                  "overwritten)")
        if _sha256(path) != entries[name]["sha256"]:
            raise CheckpointError(f"{path}: its contents changed since it was saved (checksum mismatch)")


def publish(save_dir: Path, temp: Path, step: int) -> Path:
    """Write the manifest of the finished folder `temp`, sync it, rename it to model_<step> and point `latest` at
    it; returns the folder."""
    final = save_dir / f"model_{step}"
    write_manifest(temp)
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


def checkpoints_newest_first(save_dir: Path) -> list[Path]:
    """The model_<step> folders of a save_dir, highest step first."""
    found = [(int(m.group(1)), p) for p in save_dir.iterdir() if p.is_dir() and (m := CHECKPOINT_NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr)


def resolve_checkpoint(path: str | Path, warn: Callable[[str], None] = warn, flag: str = "--continue_from") -> Path:
    """The checkpoint to resume: `path` itself if it is a checkpoint folder (verified, refused if it fails), or
    the newest verified model_<step> of a save_dir, with a warning for each newer one skipped and for a
    `latest` that names another. `flag`: the option the path came from, for the messages."""
    path = Path(path)
    if (path / TRAINER_FILE).is_file() or (path / MANIFEST).is_file():
        verify_checkpoint(path)
        return path
    candidates = checkpoints_newest_first(path) if path.is_dir() else []
    if not path.is_dir() or not ((path / LATEST).is_file() or candidates):
        raise FileNotFoundError(f"{flag} {str(path)!r} is neither a checkpoint folder (with {TRAINER_FILE}) "
                                f"nor a folder of checkpoints with a '{LATEST}' file")
    latest = (path / LATEST).read_text().strip() if (path / LATEST).is_file() else None
    problems = []
    for folder in candidates:
        try:
            verify_checkpoint(folder)
        except CheckpointError as error:
            problems.append(str(error))
            warn(f"{error}; skipping {folder.name}")
            continue
        if folder.name != latest:
            warn(f"'{LATEST}' in {path} names {latest}, the newest complete checkpoint is {folder.name}: resuming it")
        return folder
    raise CheckpointError(f"{flag} {str(path)!r}: no complete checkpoint"
                          + (f" ('{LATEST}' names {latest}, which is missing)" if latest and not problems else "")
                          + "".join(f"; {problem}" for problem in problems))


def load_checkpoint(folder: Path, model) -> dict:
    """Load the weights into `model` (strictly) and return the trainer state."""
    from safetensors.torch import load_file

    if not (folder / "model.safetensors").is_file() and (folder / "dcp").is_dir():
        raise FileNotFoundError(f"--continue_from {str(folder)!r} is a sharded checkpoint (written with --fsdp): "
                                "resume it with --fsdp, at the same number of processes")
    weights = readable(folder / "model.safetensors", load_file, device=str(next(model.parameters()).device))
    if (getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in weights
            and "model.embed_tokens.weight" in weights):  # Llama's tied head, written once
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=True)
    return read_trainer_state(folder)


def read_trainer_state(folder: Path) -> dict:
    return readable(folder / TRAINER_FILE, torch.load, map_location="cpu", weights_only=True)


def readable(path: Path, reader, **options):
    """reader(path, **options), with a file that cannot be parsed reported as a CheckpointError naming it (a
    checkpoint without a manifest is not verified before it is read)."""
    try:
        return reader(path, **options)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing, so {path.parent} is incomplete") from None
    except Exception as error:  # noqa: BLE001 - unpickling, EOF and safetensors errors have no common base
        raise CheckpointError(f"{path}: unreadable ({type(error).__name__}: {error}); resume from an earlier "
                              f"checkpoint of {path.parent.parent}") from None
