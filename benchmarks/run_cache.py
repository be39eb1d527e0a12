"""One benchmark run as a subprocess, reused when the same command already finished (so tables resume)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from plumage_flags import FAMILY_PINS  # benchmarks/ is on sys.path when a benchmark runs

ROOT = Path(__file__).resolve().parent.parent


def run_or_reuse(command: list[str], out: Path, result: Callable[[Path], dict | None], label: str,
                 report_only: bool = False, env: dict | None = None, keep_stderr: bool = False) -> dict | None:
    """`result(out)` of the run `command` writes into `out`: the finished one if `out/command.json` records this
    command (the interpreter and the script's folder aside: a copy of the repository elsewhere reuses them), else a
    fresh run, or None with `report_only`. An unfinished or outdated `out` is removed before running, so a curve is
    never appended to an older run's. With `keep_stderr` the run's
    standard error goes to `out/stderr.txt` (kept when the run fails, so the caller can tell why)."""
    recorded = out / "command.json"
    done = result(out)
    if done is not None and recorded.exists() and _same_run(json.loads(recorded.read_text()), command[1:], out):
        return done
    if report_only:
        return None
    shutil.rmtree(out, ignore_errors=True)
    print(f"== {label}", flush=True)
    if keep_stderr:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "stderr.txt", "w") as stderr:
            subprocess.run(command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    else:
        subprocess.run(command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    recorded.write_text(json.dumps(command[1:]))
    print(f"== {label} done", flush=True)
    return result(out)


def _same_run(recorded: list[str], arguments: list[str], out: Path) -> bool:
    """The same script (by name) with the same arguments, `out` aside: the record lies in `out`, so its run wrote
    there, whatever path it was reached by then (another copy of the repository names it under its own root).
    A pin of plumage_*'s old defaults (plumage_flags.FAMILY_PINS) that the record lacks is what that run used."""
    arguments = _without_pins_recorded_implicitly(recorded, arguments)
    return (len(recorded) == len(arguments) and Path(recorded[0]).name == Path(arguments[0]).name
            and all(old == new or new == str(out) for old, new in zip(recorded[1:], arguments[1:], strict=True)))


def _without_pins_recorded_implicitly(recorded: list[str], arguments: list[str]) -> list[str]:
    if not any(name.startswith("plumage_") for name in arguments):
        return arguments
    kept, index = [], 0
    while index < len(arguments):
        flag = arguments[index]
        if (flag in FAMILY_PINS and flag not in recorded and index + 1 < len(arguments)
                and arguments[index + 1] == FAMILY_PINS[flag]):
            index += 2
            continue
        kept.append(flag)
        index += 1
    return kept
