"""A damaged checkpoint is named, never loaded: the manifest written with each checkpoint, its check on resume, the
fall back to the newest complete one for a save_dir, and the refusal of one named explicitly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from galore_plumage.training.checkpoint import (
    LATEST,
    MANIFEST,
    TRAINER_FILE,
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from galore_plumage.training.model import build_model, load_model_config

MICRO = Path(__file__).resolve().parents[2] / "configs" / "llama_micro.json"


def _model(seed: int = 0):
    return build_model(load_model_config(MICRO, 96, 0), torch.float32, torch.device("cpu"), seed)


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00not a checkpoint file\xff" * 8)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _one_bit(path: Path) -> None:  # same size, so only the checksum can tell
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _deleted(path: Path) -> None:
    path.unlink()


DAMAGE = {"garbage": _garbage, "empty": _empty, "truncated": _truncated, "one-bit": _one_bit, "deleted": _deleted}
FILES = [TRAINER_FILE, "model.safetensors"]


@pytest.fixture
def three_checkpoints(tmp_path):
    model = _model()
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, model, {"update_step": step, "tag": torch.tensor([step])}, {"update_step": step})
    return tmp_path


def test_the_manifest_lists_every_file_with_its_size_and_checksum(three_checkpoints):
    folder = three_checkpoints / "model_6"
    entries = json.loads((folder / MANIFEST).read_text())["files"]
    assert set(entries) == {p.name for p in folder.iterdir()} - {MANIFEST}
    assert all(entries[name]["bytes"] == (folder / name).stat().st_size for name in entries)
    assert all(len(entry["sha256"]) == 64 for entry in entries.values())
    verify_checkpoint(folder)  # passes untouched


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(three_checkpoints, name, damage):
    """Resuming the save_dir skips model_6 with a warning naming the file and takes model_4, whose state loads;
    naming model_6 explicitly is refused with the same file named."""
    DAMAGE[damage](three_checkpoints / "model_6" / name)
    warnings = []
    folder = resolve_checkpoint(three_checkpoints, warn=warnings.append)
    assert folder == three_checkpoints / "model_4"
    assert len(warnings) == 2 and str(three_checkpoints / "model_6" / name) in warnings[0]
    assert "skipping model_6" in warnings[0] and "'latest' in" in warnings[1] and "model_4: resuming it" in warnings[1]
    assert torch.equal(load_checkpoint(folder, _model(seed=1))["tag"], torch.tensor([4]))
    with pytest.raises(CheckpointError, match=str(three_checkpoints / "model_6" / name)):
        resolve_checkpoint(three_checkpoints / "model_6")


def test_no_complete_checkpoint_names_every_problem(three_checkpoints):
    for step in (2, 4, 6):
        _truncated(three_checkpoints / f"model_{step}" / TRAINER_FILE)
    with pytest.raises(CheckpointError, match="no complete checkpoint") as error:
        resolve_checkpoint(three_checkpoints, warn=lambda _: None)
    assert all(f"model_{step}/{TRAINER_FILE}: " in str(error.value) for step in (2, 4, 6))


def test_a_damaged_manifest_is_named(three_checkpoints):
    _garbage(three_checkpoints / "model_6" / MANIFEST)
    with pytest.raises(CheckpointError, match=f"model_6/{MANIFEST}: unreadable"):
        verify_checkpoint(three_checkpoints / "model_6")


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated"])
@pytest.mark.parametrize("name", FILES)
def test_a_checkpoint_without_manifest_fails_to_load_with_the_file_named(three_checkpoints, name, damage):
    """Checkpoints written before manifests are loaded unverified; a file that cannot be parsed is named (it used
    to be a raw UnpicklingError / EOFError / SafetensorError, or a truncation message with no file)."""
    folder = three_checkpoints / "model_6"
    (folder / MANIFEST).unlink()
    DAMAGE[damage](folder / name)
    with pytest.raises(CheckpointError, match=f"{folder / name}: unreadable"):
        load_checkpoint(folder, _model(seed=1))


def test_latest_is_only_a_hint(three_checkpoints):
    """A kill between renaming model_6 into place and rewriting `latest` leaves latest on model_4: the newest
    complete checkpoint is still the one resumed, and the warning says so."""
    (three_checkpoints / LATEST).write_text("model_4\n")
    warnings = []
    assert resolve_checkpoint(three_checkpoints, warn=warnings.append) == three_checkpoints / "model_6"
    assert warnings == [f"'latest' in {three_checkpoints} names model_4, the newest complete checkpoint is model_6: "
                        "resuming it"]
