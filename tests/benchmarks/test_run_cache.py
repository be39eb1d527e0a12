"""run_cache: a finished run is reused when its recorded command is this one, even if recorded by a copy of the
repository elsewhere (its output folder named under that copy's root); any other difference reruns it."""

from __future__ import annotations

import json
import sys
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
