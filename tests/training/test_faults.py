"""Never lose a run: torchrun_main.py killed (SIGKILL) mid-save and at random updates, then resumed until done, ends
bit-identical to the run that was never interrupted, with one log record per update and no temp folder left; a
damaged newest checkpoint falls back to the previous one; a second run into a used save_dir, or a resume with
other flags, is refused and changes no byte of the first run.

The runs are subprocesses (a SIGKILL must not take pytest with it), single-threaded so that straight and resumed
runs compute alike, on the micro Llama and a synthetic corpus.
"""

from __future__ import annotations

import hashlib
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import DIST_VARS, REPO, hidden_entries, read_metrics, subprocess_env, tiny_run_flags, write_corpus

import torchrun_main
from galore_plumage.training import DIVERGED

UPDATES = 10
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def flags(tmp_path_factory):
    """Flags of a 10-update plumage_adamw run with accumulation 2, a refresh every 2 updates and a checkpoint
    every 2; the BPE cache is warmed by one in-process run first."""
    root = tmp_path_factory.mktemp("faults")
    run_flags = tiny_run_flags(root, write_corpus(root / "corpus.txt"), UPDATES) + [
        "--optimizer", "plumage_adamw", "--batch_size", "2", "--gradient_accumulation", "2", "--save_every", "2",
        "--eval_every", "5"]
    with pytest.MonkeyPatch.context() as patch:
        for var in DIST_VARS:
            patch.delenv(var, raising=False)
        assert torchrun_main.main(run_flags + ["--num_training_steps", "1", "--save_dir", str(root / "warm")]) == 0
    return run_flags


def _launch(flags: list[str], save_dir: Path, *extra: str, kill_in_save: int | None = None) -> subprocess.Popen:
    script = [str(REPO / "tests" / "kill_during_save.py"), str(kill_in_save)] if kill_in_save else ["torchrun_main.py"]
    return subprocess.Popen([sys.executable, *script, *flags, "--save_dir", str(save_dir), *extra], cwd=REPO,
                            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=RUN_TIMEOUT_S)
    return process.returncode, err


def _kill_after(process: subprocess.Popen, save_dir: Path, update: int) -> tuple[int, str]:
    """SIGKILL the run as soon as its log shows `update`; its return code (0 if it finished first) and stderr."""
    log = save_dir / "metrics.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if log.exists() and f'"type": "train", "step": {update},' in log.read_text():
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    return _finish(process)


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def straight(flags, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("straight") / "run"
    code, err = _finish(_launch(flags, save_dir))
    assert code == 0, err
    return save_dir


def _assert_same_run(straight: Path, resumed: Path) -> None:
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b["train"]] == list(range(1, UPDATES + 1))  # each update logged once
    assert [r["loss"] for r in b["train"]] == [r["loss"] for r in a["train"]]
    assert [(r["step"], r["eval_loss"]) for r in b["eval"]] == [(r["step"], r["eval_loss"]) for r in a["eval"]]
    assert len(b["summary"]) == 1 and b["summary"][0]["eval_loss"] == a["summary"][0]["eval_loss"]
    final_a = load_file(straight / f"model_{UPDATES}" / "model.safetensors")
    final_b = load_file(resumed / f"model_{UPDATES}" / "model.safetensors")
    assert final_a.keys() == final_b.keys() and all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_killed_mid_save_and_at_random_updates_then_resumed_equals_the_straight_run(flags, straight, tmp_path):
    save_dir = tmp_path / "run"
    # 1. killed inside its second save (update 4): the temp folder is written, model_4 never appears
    code, _ = _finish(_launch(flags, save_dir, kill_in_save=2))
    assert code == -signal.SIGKILL
    assert (save_dir / "latest").read_text().strip() == "model_2" and not (save_dir / "model_4").exists()
    assert any(name.startswith(".model_4.tmp-") for name in hidden_entries(save_dir))
    # 2. resumed, and killed again as soon as a random later update is logged, twice
    rng = random.Random(17)
    for _ in range(2):
        newest = (save_dir / "latest").read_text().strip()
        update = rng.randint(int(newest.removeprefix("model_")) + 1, UPDATES - 1)
        code, err = _kill_after(_launch(flags, save_dir, "--continue_from", str(save_dir)), save_dir, update)
        assert code == -signal.SIGKILL, err
    # 3. resumed until done
    code, err = _finish(_launch(flags, save_dir, "--continue_from", str(save_dir)))
    assert code == 0, err
    _assert_same_run(straight, save_dir)
    assert hidden_entries(save_dir) == []  # every dead writer's temp folder was cleared


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(flags, straight, tmp_path):
    save_dir = tmp_path / "run"
    code, err = _finish(_launch(flags, save_dir, "--stop_at", "6"))
    assert code == 0, err
    trainer = save_dir / "model_6" / "trainer.pt"
    trainer.write_bytes(trainer.read_bytes()[:100])  # truncated
    named = _finish(_launch(flags, save_dir, "--continue_from", str(save_dir / "model_6")))
    assert named[0] == 1 and f"{trainer}: 100 bytes where" in named[1]  # asked for explicitly: stop, say why
    code, err = _finish(_launch(flags, save_dir, "--continue_from", str(save_dir)))
    assert code == 0, err
    assert f"WARNING: {trainer}: 100 bytes where" in err and "skipping model_6" in err
    _assert_same_run(straight, save_dir)


@pytest.mark.parametrize("extra,named", [
    ((), "already holds a run"),
    (("--continue_from", "{run}", "--rank", "4"), "--rank 4 (the checkpoint: 8)"),
    (("--continue_from", "{run}", "--optimizer", "galore_adamw", "--lr", "1e-2"),
     "--lr 0.01 (the checkpoint: 0.003); --optimizer galore_adamw (the checkpoint: plumage_adamw)"),
    (("--continue_from", "{run}", "--residual_scale", "0.5"), "--residual_scale 0.5 (the checkpoint: not given)"),
    (("--continue_from", "{run}", "--batch_size", "1"), "--batch_size 1 (the checkpoint: 2); --total_batch_size 2 (the "
                                                        "checkpoint: 4)"),
])
def test_a_second_run_or_a_resume_with_other_flags_is_refused_and_changes_nothing(flags, straight, extra, named,
                                                                                 monkeypatch, capsys):
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    before = _digests(straight)
    code = torchrun_main.main(flags + ["--save_dir", str(straight), *(e.format(run=straight) for e in extra)])
    assert code != 0
    err = capsys.readouterr().err
    assert named in err, err
    assert _digests(straight) == before


def test_a_diverged_run_ends_with_one_line(flags, tmp_path, monkeypatch, capsys):
    """A non-finite loss (FloatingPointError) used to end in a traceback; now one line names the update, the exit
    status says the run diverged (what benchmarks/pretrain_protocol.py counts as +inf), and no half-written checkpoint
    is left."""
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    save_dir = tmp_path / "wild"
    code = torchrun_main.main(flags + ["--save_dir", str(save_dir), "--lr", "1e6"])
    err = capsys.readouterr().err
    assert code == DIVERGED == 3
    assert err.startswith("torchrun_main.py: error: non-finite training loss at update ") and err.count("\n") == 1, err
    assert hidden_entries(save_dir) == []


def test_a_resume_may_split_the_same_total_batch_otherwise(flags, straight, tmp_path):
    """model_6 (batch 2 x accumulation 2) resumed with batch 1 x accumulation 4: the same 4 sequences per update, the
    data position moved over in sequences, so updates 7-10 reach the straight run's losses and weights to the
    rounding of the other summation order (a wrong position or a lost moment moves them by far more)."""
    resumed = tmp_path / "relayout"
    layout = ["--batch_size", "1", "--gradient_accumulation", "4"]
    code, err = _finish(_launch(flags + layout, resumed, "--continue_from", str(straight / "model_6")))
    assert code == 0, err
    a = {r["step"]: r["loss"] for r in read_metrics(straight)["train"]}
    b = {r["step"]: r["loss"] for r in read_metrics(resumed)["train"]}
    assert sorted(b) == list(range(7, UPDATES + 1))
    assert b == pytest.approx({step: a[step] for step in b}, rel=1e-5)
    final_a = load_file(straight / f"model_{UPDATES}" / "model.safetensors")
    final_b = load_file(resumed / f"model_{UPDATES}" / "model.safetensors")
    # Adam's normalization lifts the summation order's rounding where V is tiny (3.4e-5 measured on k_proj); an update
    # moves a coordinate by up to lr x scale = 7.5e-4, and a wrong position moves update 7's loss by 0.07 (measured)
    for key in final_a:
        torch.testing.assert_close(final_b[key], final_a[key], rtol=0, atol=1e-4, msg=lambda m, key=key: f"{key}: {m}")
