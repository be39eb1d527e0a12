"""One benchmark run as a subprocess, reused when the same command already finished (so tables resume)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from plumage_flags import FAMILY_PINS  # benchmarks/ is on sys.path when a benchmark runs

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 30.0  # how often a queue waiting on another's run looks again (a run takes minutes)


def run_or_reuse(command: list[str], out: Path, result: Callable[[Path], dict | None], label: str,
                 report_only: bool = False, env: dict | None = None, keep_stderr: bool = False) -> dict | None:
    """`result(out)` of the run `command` writes into `out`: the finished one if `out/command.json` records this
    command (the interpreter and the script's folder aside: a copy of the repository elsewhere reuses them), else a
    fresh run, or None with `report_only`. An unfinished or outdated `out` is removed before running, so a curve is
    never appended to an older run's. A run that another live process (another queue over the same runs) is making
    is waited for, then reused, not removed under it. With `keep_stderr` the run's
    standard error goes to `out/stderr.txt` (kept when the run fails, so the caller can tell why)."""
    if report_only:
        return _finished(command, out, result)
    with _held(out):
        if (done := _finished(command, out, result)) is not None:
            return done
        return _run(command, out, result, label, env, keep_stderr)


def _finished(command: list[str], out: Path, result: Callable[[Path], dict | None]) -> dict | None:
    recorded = out / "command.json"
    done = result(out)
    if done is not None and recorded.exists() and _same_run(json.loads(recorded.read_text()), command[1:], out):
        return done
    return None


def _run(command: list[str], out: Path, result: Callable[[Path], dict | None], label: str, env: dict | None,
         keep_stderr: bool) -> dict | None:
    recorded = out / "command.json"
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


@contextlib.contextmanager
def _held(out: Path) -> Iterator[None]:
    """Hold `out` for this process: a lock file beside it (`out` itself is removed before a run) names the holder's
    pid. Two queues that reach one run (a pinned arm's seed 0 runs in every queue that names the arm) would otherwise
    both remove the folder and write one metrics file; the second waits for the first instead. A lock whose process
    is gone (a killed queue) is taken over."""
    lock = out.parent / f"{out.name}.running"
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = _holder(lock)
            if holder is None:  # its process is gone: the lock is stale
                lock.unlink(missing_ok=True)
            else:
                print(f"== waiting for process {holder}, which is running {out}", flush=True)
                time.sleep(POLL_S)
            continue
        with os.fdopen(handle, "w") as file:
            file.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _holder(lock: Path) -> int | None:
    """The pid in `lock` if that process is alive, else None (an unreadable lock is one being written: alive)."""
    try:
        pid = int(lock.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return -1
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    return pid


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
