"""A save_dir belongs to one run (training/run_folder.py): refusing a second run, --overwrite, clearing what killed
saves left, and cutting the replayed updates out of metrics.jsonl on resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from galore_plumage.training.run_folder import (
    check_save_dir,
    clear_run,
    remove_stale_temps,
    run_files,
    truncate_metrics,
)


def _dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    return int(child.stdout)


def _used(folder):
    (folder / "model_2").mkdir(parents=True)
    (folder / "model_2" / "trainer.pt").write_bytes(b"state")
    (folder / "latest").write_text("model_2\n")
    (folder / "metrics.jsonl").write_text('{"type": "train", "step": 1}\n')
    (folder / "notes.txt").write_text("the user's own file\n")
    return folder


def test_a_used_save_dir_is_refused_unless_resumed_or_overwritten(tmp_path):
    assert run_files(tmp_path / "new") == []
    check_save_dir(str(tmp_path / "new"), None, False)  # a new folder
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    check_save_dir(str(tmp_path / "mine"), None, False)  # a folder of other files is not a run
    used = _used(tmp_path / "used")
    assert run_files(used) == ["latest", "metrics.jsonl", "model_2"]
    with pytest.raises(ValueError, match=r"already holds a run \(latest, metrics.jsonl, model_2\): resume it with "
                                         r"--continue_from .*, pick a new --save_dir, or pass --overwrite"):
        check_save_dir(str(used), None, False)
    check_save_dir(str(used), str(used), False)  # resumed: the save_dir itself ...
    check_save_dir(str(used), str(used / "model_2"), False)  # ... or one of its checkpoints
    check_save_dir(str(used), None, True)
    with pytest.raises(ValueError, match="already holds a run"):
        check_save_dir(str(used), str(tmp_path / "other" / "model_2"), False)  # resumes another run into this one
    with pytest.raises(ValueError, match="--overwrite would delete the run that --continue_from"):
        check_save_dir(str(used), str(used), True)


def test_overwrite_deletes_the_run_and_nothing_else(tmp_path):
    used = _used(tmp_path)
    temp = f".model_4.tmp-{_dead_pid()}"
    (used / temp).mkdir()
    assert clear_run(used) == [temp, "latest", "metrics.jsonl", "model_2"]
    assert sorted(p.name for p in used.iterdir()) == ["notes.txt"]


def test_stale_temps_of_dead_writers_are_cleared_and_a_moved_aside_checkpoint_comes_back(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    for name in (f".model_6.tmp-{dead}", f".model_8.tmp-{alive}", ".model_10.tmp-fsdp", f".model_4.old-{dead}",
                 f".model_2.old-{dead}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer.pt").write_bytes(name.encode())
    (tmp_path / f".latest.tmp-{dead}").write_text("model_6\n")
    (tmp_path / "model_2").mkdir()  # model_2 exists: its moved-aside copy is only a leftover
    cleared = remove_stale_temps(tmp_path)
    assert sorted(cleared) == sorted([f".model_6.tmp-{dead}", ".model_10.tmp-fsdp", f".model_4.old-{dead}",
                                      f".model_2.old-{dead}", f".latest.tmp-{dead}"])
    # a live writer's temp stays; the old model_4, whose replacement never arrived, is put back in place
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".model_8.tmp-{alive}", "model_2", "model_4"]
    assert (tmp_path / "model_4" / "trainer.pt").read_bytes() == f".model_4.old-{dead}".encode()


def test_truncate_metrics_drops_the_replayed_updates_and_the_summary(tmp_path):
    records = [{"type": "config", "step": 0}, *({"type": "train", "step": s} for s in range(1, 7)),
               {"type": "eval", "step": 4}, {"type": "projector", "step": 4}, {"type": "eval", "step": 6},
               {"type": "summary", "step": 6}]
    lines = [json.dumps(r) for r in records] + ['{"type": "train", "st']  # the last line cut by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert truncate_metrics(tmp_path, 4) == 5
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [r for r in records if r["type"] != "summary" and r["step"] <= 4]
    assert truncate_metrics(tmp_path, 4) == 0 and truncate_metrics(tmp_path / "nowhere", 4) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
