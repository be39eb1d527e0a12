"""pretrain_protocol --pin_lr and --lr_grid: a pinned arm runs its seeds at the pinned lr only (no sweep over its grid),
an arm given a grid sweeps that grid instead of its own, the others sweep their grid and keep their best; the report
names both (runs replaced by a recorder: no training here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pretrain_protocol  # noqa: E402


@pytest.fixture(autouse=True)
def no_curves(monkeypatch):
    """The report's plot reads runs that these recorders never wrote: draw nothing."""
    monkeypatch.setattr(pretrain_protocol, "plot_losses", lambda *a, **k: None)
    monkeypatch.setattr(pretrain_protocol, "load_run", lambda *a, **k: (None, []))


def test_a_pinned_arm_runs_only_its_pinned_lr(monkeypatch, tmp_path):
    ran = []

    def fake_run(args, label, lr, seed):
        ran.append((label, lr, seed))
        return [5.0, 4.0 + abs(lr - 5e-3)]  # eval losses: the grid's best is 5e-3

    monkeypatch.setattr(pretrain_protocol, "ensure", fake_run)
    monkeypatch.setattr(sys, "argv", ["pretrain_protocol.py", "--arms", "galore_recipe,galore_recipe_vfloor,adamw",
                                      "--pin_lr", "galore_recipe_vfloor=1.4e-2", "--lr_grid", "adamw=4e-3:6e-3",
                                      "--seeds", "0,1",
                                      "--out", str(tmp_path), "--name", "pinned"])
    pretrain_protocol.main()
    pinned = {(lr, seed) for label, lr, seed in ran if label == "galore_recipe_vfloor"}
    assert pinned == {(1.4e-2, 0), (1.4e-2, 1)}
    swept = {lr for label, lr, seed in ran if label == "galore_recipe" and seed == 0}
    assert swept == set(pretrain_protocol.ARMS["galore_recipe"][2])
    assert {(lr, seed) for label, lr, seed in ran if label == "galore_recipe" and seed == 1} == {(5e-3, 1)}
    assert {(lr, seed) for label, lr, seed in ran if label == "adamw"} == {(4e-3, 0), (6e-3, 0), (4e-3, 1)}
    report = (tmp_path / "pinned_compare.md").read_text()
    assert "--pin_lr galore_recipe_vfloor=0.014" in report and "galore_recipe_vfloor at 0.014: pinned" in report
    assert "--lr_grid adamw=0.004:0.006" in report and "| adamw | `adamw` | 0.004: 4.0010, 0.006: 4.0010 |" in report


def test_another_corpus_is_named_and_the_bundled_one_is_not(tmp_path):
    """--dataset reaches each run's command; the bundled corpus stays unnamed, so the runs recorded before the flag
    existed are reused (run_cache compares commands)."""
    def command(*argv):
        args = pretrain_protocol.parse_args(list(argv))
        return pretrain_protocol.command_for("galore_adamw", ["--galore_scale", "0.25"], 0, 1e-2, args, tmp_path)

    assert "--dataset" not in command()
    named = command("--dataset", "data/code.jsonl", "--model_config", "configs/llama_60m.json")
    assert named[named.index("--dataset") + 1] == "data/code.jsonl"
    assert named[named.index("--model_config") + 1] == "configs/llama_60m.json"


def test_every_arm_pinned_runs_all_seeds_in_one_batch_once_each(monkeypatch, tmp_path):
    """With nothing to choose, the seeds go to the pool with the sweep's seed (a GPU's deadline is not spent waiting
    on seed 0 alone); no run is started twice."""
    batches = []

    class RecordingPool:
        def __init__(self, jobs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, run, jobs):
            jobs = list(jobs)
            batches.append(jobs)
            return [run(job) for job in jobs]

    monkeypatch.setattr(pretrain_protocol, "ThreadPoolExecutor", RecordingPool)
    monkeypatch.setattr(pretrain_protocol, "ensure", lambda args, label, lr, seed: [5.0, 4.0 + seed * (0.01 + lr)])
    monkeypatch.setattr(sys, "argv", ["pretrain_protocol.py", "--arms", "galore_recipe,galore_recipe_vfloor",
                                      "--pin_lr", "galore_recipe=5e-3,galore_recipe_vfloor=1e-2", "--seeds", "0,1,2",
                                      "--out", str(tmp_path), "--name", "all_pinned"])
    pretrain_protocol.main()
    expected = {(label, lr, seed) for label, lr in (("galore_recipe", 5e-3), ("galore_recipe_vfloor", 1e-2))
                for seed in (0, 1, 2)}
    assert set(batches[0]) == expected and len(batches[0]) == len(expected)
    assert all(not batch for batch in batches[1:])
    assert "| galore_recipe_vfloor | 0.01 | 4.0000 | 4.0200 | 4.0400 |" in (tmp_path / "all_pinned_compare.md").read_text()


def test_one_seed_reports_its_loss_without_a_spread(monkeypatch, tmp_path):
    """A one-seed report shows the seed's loss as its mean, not '± nan' (stdev needs two seeds)."""
    monkeypatch.setattr(pretrain_protocol, "ensure", lambda args, label, lr, seed: [5.0, 4.0 + lr])
    monkeypatch.setattr(sys, "argv", ["pretrain_protocol.py", "--arms", "galore_recipe,adamw", "--pin_lr",
                                      "galore_recipe=5e-3,adamw=1e-3", "--seeds", "0",
                                      "--out", str(tmp_path), "--name", "one_seed"])
    pretrain_protocol.main()
    report = (tmp_path / "one_seed_compare.md").read_text()
    assert "nan" not in report
    assert "| galore_recipe | 0.005 | 4.0050 | 4.0050 | 0.0000 |" in report
