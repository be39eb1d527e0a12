"""pretrain_protocol's note on passes over the training text: each arm's most passes over its seeds, read from the
runs' summaries, and a caution past one pass (runs written as metrics.jsonl files here: no training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pretrain_protocol  # noqa: E402


def _finish(args, label: str, lr: float, seed: int, **summary) -> None:
    folder = pretrain_protocol.run_dir(args, label, lr, seed)
    folder.mkdir(parents=True)
    records = [{"type": "eval", "step": 10, "eval_loss": 4.0}, {"type": "summary", "step": 10, **summary}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _args(tmp_path: Path):
    return pretrain_protocol.parse_args(["--runs", str(tmp_path / "runs"), "--seeds", "0,1"])


def test_the_note_gives_each_arms_most_passes_and_cautions_past_one(tmp_path):
    args = _args(tmp_path)
    _finish(args, "galore_recipe", 1e-2, 0, passes=1.75)
    _finish(args, "galore_recipe", 1e-2, 1, passes=1.9)
    _finish(args, "adamw", 3e-3, 0, passes=0.5)
    _finish(args, "adamw", 3e-3, 1, passes=0.5)
    (line,) = [text for text in pretrain_protocol.passes_line(args, {"galore_recipe": 1e-2, "adamw": 3e-3},
                                                              ["galore_recipe", "adamw"]) if text]
    assert "galore_recipe 1.90, adamw 0.50." in line and "Past 1 the runs read text they had trained on" in line


def test_one_pass_or_less_gets_no_caution_and_unrecorded_runs_no_note(tmp_path):
    args = _args(tmp_path)
    for seed in (0, 1):
        _finish(args, "adamw", 3e-3, seed, passes=1.0)
        _finish(args, "galore_recipe", 1e-2, seed)  # before session 80: no passes recorded
    assert pretrain_protocol.passes_line(args, {"adamw": 3e-3}, ["adamw"]) == [
        "", "Passes over the training text (the most of any seed): adamw 1.00."]
    assert pretrain_protocol.passes_line(args, {"galore_recipe": 1e-2}, ["galore_recipe"]) == []
