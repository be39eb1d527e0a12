"""A save_dir belongs to one run: a new run never writes into another's, a resumed run continues its own log, and
what dead writers left behind is cleared.

What a run owns in its save_dir: `metrics.jsonl`, `latest`, the `model_<step>/` checkpoints and the hidden temp
folders checkpoint.py writes them through (`.model_<step>.tmp-<pid>`, `.model_<step>.old-<pid>`,
`.latest.tmp-<pid>`, `.model_<step>.tmp-fsdp`, `.metrics.jsonl.tmp-<pid>`). Nothing else in the folder is ever touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from .checkpoint import CHECKPOINT_NAME, LATEST
from .metrics import METRICS_FILE

TEMP_NAME = re.compile(r"\.(model_\d+|latest|metrics\.jsonl)\.(tmp|old)-(\d+|fsdp)")


def run_files(save_dir: Path) -> list[str]:
    """The names in `save_dir` that belong to a run (empty for a new or unused folder)."""
    if not save_dir.is_dir():
        return []
    return sorted(p.name for p in save_dir.iterdir()
                  if p.name in (METRICS_FILE, LATEST) or CHECKPOINT_NAME.fullmatch(p.name) or TEMP_NAME.fullmatch(p.name))


def check_save_dir(save_dir: str, continue_from: str | None, overwrite: bool) -> None:
    """Refuse a new run into a save_dir that holds one, unless the run resumes from that save_dir or --overwrite
    asks for the old run to be deleted. Reads only; called before any file is written."""
    folder = Path(save_dir).resolve()
    resumes_here = continue_from is not None and folder in (Path(continue_from).resolve(),
                                                            Path(continue_from).resolve().parent)
    if overwrite and resumes_here:
        raise ValueError(f"--overwrite would delete the run that --continue_from {continue_from!r} resumes: drop "
                         "one of the two")
    found = run_files(folder)
    if found and not resumes_here and not overwrite:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise ValueError(f"--save_dir {save_dir!r} already holds a run ({shown}): resume it with --continue_from "
                         f"{save_dir}, pick a new --save_dir, or pass --overwrite to delete that run first")


def clear_run(save_dir: Path) -> list[str]:
    """--overwrite: delete what the old run owns (never other files); returns the names removed."""
    removed = run_files(save_dir)
    for name in removed:
        path = save_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(save_dir: Path) -> list[str]:
    """Clear the temp folders of writers that are gone (a kill during a save); returns their names.

    A `.model_<step>.old-<pid>` is a complete checkpoint moved aside while the same step was saved again: if the
    kill came before its replacement was renamed in, it is put back as model_<step> instead of deleted. The
    shared FSDP temp folder has no pid: it is stale whenever no save is running, which holds where this is called
    (at the start of a run and after each save)."""
    if not save_dir.is_dir():
        return []
    cleared = []
    for path in sorted(save_dir.iterdir()):
        match = TEMP_NAME.fullmatch(path.name)
        if not match or (match.group(3) != "fsdp" and _alive(int(match.group(3)))):
            continue
        target = save_dir / match.group(1)
        if match.group(2) == "old" and not target.exists():
            os.replace(path, target)
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        cleared.append(path.name)
    return cleared


def truncate_metrics(save_dir: Path, step: int) -> int:
    """On resume at `step`: drop the records logged after it (they are about to be logged again) and any summary,
    so no update is counted twice; rewritten through a temp file. Returns how many records were dropped."""
    return keep_records(save_dir / METRICS_FILE,
                        lambda record: record.get("type") != "summary" and record.get("step", 0) <= step)


def keep_records(path: Path, keep: Callable[[dict], bool]) -> int:
    """Rewrite the metrics file `path` (through a temp file) with the records `keep` accepts, asked in file order; a
    line cut short by a kill while it was being written is dropped too. Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a kill while it was being written
            continue
        if keep(record):
            kept.append(line)
    if len(kept) < len(lines):
        temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        temp.write_text("".join(line + "\n" for line in kept))
        os.replace(temp, path)
    return len(lines) - len(kept)
