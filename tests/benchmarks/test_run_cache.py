"""run_cache: a finished run is reused when its recorded command is this one, even if recorded by a copy of the
repository elsewhere (its output folder named under that copy's root); any other difference reruns it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from run_cache import run_or_reuse  # noqa: E402


def _finished(out: Path, command: list[str]) -> None:
    out.mkdir(parents=True)
    (out / "result.txt").write_text("4.9")
    (out / "command.json").write_text(json.dumps(command[1:]))


def _result(out: Path):
    path = out / "result.txt"
    return float(path.read_text()) if path.exists() else None


def test_a_run_recorded_by_another_copy_is_reused_and_a_changed_one_is_not(tmp_path):
    out = tmp_path / "runs" / "arm" / "seed0"
    _finished(out, ["python", "/elsewhere/copy/torchrun_main.py", "--lr", "0.01",
                    "--save_dir", "/elsewhere/copy/runs/arm/seed0"])
    here = ["python", str(tmp_path / "torchrun_main.py"), "--lr", "0.01", "--save_dir", str(out)]
    assert run_or_reuse(here, out, _result, "arm", report_only=True) == 4.9
    changed = [*here[:3], "0.02", *here[4:]]
    assert run_or_reuse(changed, out, _result, "arm", report_only=True) is None
    other_place = [*here[:5], str(tmp_path / "elsewhere")]  # a path that is not `out` must match as written
    assert run_or_reuse(other_place, out, _result, "arm", report_only=True) is None


def test_a_plumage_run_recorded_before_its_family_was_pinned_is_reused_only_at_the_old_defaults(tmp_path):
    """Since session 17 every plumage_* arm names `--projector plumage` (and, for Adam, `--v_floor none`), since
    session 20 `--solver svd`, since session 33 `--regular_lr_ratio 1` (plumage_adamw; 8-bit since 36), since session 36
    `--v_floor_horizon none` (Adam): a run recorded without them ran
    with exactly those values, so it is reused; a record that names them otherwise, or a pin with another value, is not
    the same run."""
    from plumage_flags import family_pins, with_family_pins

    out = tmp_path / "runs" / "arm" / "seed0"
    old = ["python", "torchrun_main.py", "--optimizer", "plumage_adamw", "--max_inv_p", "1", "--save_dir", str(out)]
    _finished(out, old)
    pinned = [*old[:6], *family_pins("plumage_adamw"), *old[6:]]
    assert pinned[6:16] == ["--projector", "plumage", "--v_floor", "none", "--v_floor_horizon", "none", "--solver", "svd",
                            "--regular_lr_ratio", "1"]
    assert run_or_reuse(pinned, out, _result, "arm", report_only=True) == 4.9
    floored = [*old[:6], "--projector", "plumage", "--v_floor", "m2", *old[6:]]
    assert run_or_reuse(floored, out, _result, "arm", report_only=True) is None
    top_r = [*old[:6], "--projector", "svd", *old[6:]]
    assert run_or_reuse(top_r, out, _result, "arm", report_only=True) is None
    gram = [*old[:6], "--projector", "plumage", "--solver", "gram", *old[6:]]
    assert run_or_reuse(gram, out, _result, "arm", report_only=True) is None
    # a GaLore run is never matched by dropping flags
    galore = ["python", "torchrun_main.py", "--optimizer", "galore_adamw", "--save_dir", str(out)]
    _finished(tmp_path / "g", galore)
    assert run_or_reuse([*galore[:4], "--v_floor", "none", *galore[4:]], tmp_path / "g", _result, "g",
                        report_only=True) is None
    # the pins: Adam backends get the floor and its horizon, the others neither (they refuse them); an arm's own
    # value stays
    assert family_pins("plumage_adafactor", pretraining=False) == ["--projector", "plumage", "--solver", "svd"]
    assert family_pins("plumage_adamw8bit_per_layer", pretraining=False)[-6:] == [
        "--v_floor", "none", "--v_floor_horizon", "none", "--solver", "svd"]
    assert family_pins("galore_adamw") == []
    assert with_family_pins("plumage_adamw", ["--v_floor", "m2"]) == [
        "--v_floor", "m2", "--projector", "plumage", "--v_floor_horizon", "none", "--solver", "svd",
        "--regular_lr_ratio", "1"]
    horizon = [*old[:6], "--projector", "plumage", "--v_floor", "none", "--v_floor_horizon", "200", *old[6:]]
    assert run_or_reuse(horizon, out, _result, "arm", report_only=True) is None
    # the ratio: only plumage_adamw(8bit)'s and plumage_adafactor's default is not one lr, only torchrun_main.py takes
    # it, and --regular_lr replaces it
    assert "--regular_lr_ratio" not in family_pins("plumage_adamw8bit", pretraining=False) + family_pins("plumage_sgdm")
    assert family_pins("plumage_adamw8bit")[-2:] == ["--regular_lr_ratio", "1"]  # 2x since session 36
    assert family_pins("plumage_adafactor")[-2:] == ["--regular_lr_ratio", "1"]  # 2x since session 42
    assert with_family_pins("plumage_adamw", ["--regular_lr", "2e-2"])[-2:] == ["--solver", "svd"]
    ratio_pinned = [*old[:6], "--projector", "plumage", "--regular_lr_ratio", "2", *old[6:]]
    assert run_or_reuse(ratio_pinned, out, _result, "arm", report_only=True) is None
    # drawing throughout: only plumage_adafactor derives sample_until (a long run's), only torchrun_main.py takes it, and
    # an arm on a projector that does not sample is not given it (the flag would be refused)
    assert family_pins("plumage_adafactor")[-4:-2] == ["--sample_until", "none"]
    assert "--sample_until" not in (family_pins("plumage_adafactor", pretraining=False) + family_pins("plumage_adamw")
                                    + family_pins("plumage_sgdm"))
    assert "--sample_until" not in with_family_pins("plumage_adafactor", ["--projector", "svd"])
    draws = ["python", "torchrun_main.py", "--optimizer", "plumage_adafactor", "--projector", "plumage", "--solver",
             "svd", "--regular_lr_ratio", "1", "--save_dir", str(out)]
    _finished(tmp_path / "d", draws)  # a run recorded before the pin drew throughout: reused under it
    assert run_or_reuse([*draws[:8], "--sample_until", "none", *draws[8:]], tmp_path / "d", _result, "d",
                        report_only=True) is not None
    # the clip (plumage_sgdm since session 88, not per-layer) and β1 (plumage_sgdm and plumage_adafactor since session
    # 89): only torchrun_main.py derives them; an SGD run recorded without either ran unclipped at momentum 0
    assert family_pins("plumage_sgdm")[2:6] == ["--grad_clipping", "0", "--beta1", "0"]
    assert family_pins("plumage_adafactor")[2:4] == ["--beta1", "0"]
    assert "--grad_clipping" not in family_pins("plumage_sgdm_per_layer") + family_pins("plumage_adafactor")
    assert not {"--grad_clipping", "--beta1"} & set(family_pins("plumage_sgdm", pretraining=False)
                                                    + family_pins("plumage_adamw"))
    plain = ["python", "torchrun_main.py", "--optimizer", "plumage_sgdm", "--lr", "0.07", "--save_dir", str(out)]
    _finished(tmp_path / "s", plain)
    assert run_or_reuse([*plain[:6], *family_pins("plumage_sgdm"), *plain[6:]], tmp_path / "s", _result, "s",
                        report_only=True) is not None
    assert run_or_reuse([*plain[:6], "--beta1", "0.9", *plain[6:]], tmp_path / "s", _result, "s",
                        report_only=True) is None


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_run_another_live_process_is_making_is_waited_for_then_reused(tmp_path, monkeypatch):
    """Two queues reaching one run (session 62: a pinned arm's seed 0 runs in every queue naming it) must not both
    remove its folder and write one metrics file: the second waits for the first's lock, then reuses its run."""
    import run_cache

    monkeypatch.setattr(run_cache, "POLL_S", 0.05)
    out = tmp_path / "runs" / "arm" / "seed0"
    command = [sys.executable, "-c", "raise SystemExit(3)"]  # the waiter running it itself would fail
    finish = (f"import json, pathlib, time; time.sleep(0.5); out = pathlib.Path({str(out)!r}); out.mkdir(parents=True); "
              f"(out / 'result.txt').write_text('4.9'); (out / 'command.json').write_text(json.dumps({command[1:]!r}))")
    holder = subprocess.Popen([sys.executable, "-c", finish])
    threading.Thread(target=holder.wait, daemon=True).start()  # reaped when it ends: a zombie's pid answers kill(0)
    out.parent.mkdir(parents=True)
    (out.parent / "seed0.running").write_text(str(holder.pid))
    assert run_or_reuse(command, out, _result, "arm") == 4.9
    assert holder.poll() is not None  # it returned only once the holder had finished
    assert not (out.parent / "seed0.running").exists()  # the dead holder's lock, taken over, then released


def test_a_lock_left_by_a_dead_process_is_taken_over_and_released(tmp_path, monkeypatch):
    import run_cache

    monkeypatch.setattr(run_cache, "POLL_S", 0.05)
    out = tmp_path / "runs" / "arm" / "seed0"
    out.parent.mkdir(parents=True)
    lock = out.parent / "seed0.running"
    lock.write_text(str(_dead_pid()))
    write = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(out / 'result.txt')!r}).write_text('5.1')"]
    assert run_or_reuse(write, out, _result, "arm", keep_stderr=True) == 5.1
    assert not lock.exists()
    assert json.loads((out / "command.json").read_text()) == write[1:]
