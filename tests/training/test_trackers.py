"""--report_to wandb (torchrun_main.py) and --with_tracking (run_glue.py): what metrics.jsonl gets, the tracker gets.

wandb is not installed here (nor needed): a stand-in module records the calls the two scripts make of wandb's API
(init, run.log, run.summary.update, run.finish) and refuses a step that goes back, as wandb does.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
from finetune_helpers import save_tiny_bert, write_plays
from train_helpers import DIST_VARS, read_metrics, tiny_run_flags, write_corpus

import run_glue
import torchrun_main


class FakeRun:
    def __init__(self, **init):
        self.init, self.logged, self.summary, self.finished, self._last = init, [], {}, 0, -1

    def log(self, values: dict, step: int | None = None) -> None:
        assert step is not None and step >= self._last, f"wandb drops a step that goes back: {step} after {self._last}"
        self._last = step
        self.logged.append((step, values))

    def finish(self) -> None:
        self.finished += 1

    def series(self, key: str) -> dict[int, float]:
        return {step: values[key] for step, values in self.logged if key in values}


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[FakeRun] = []

    def init(**options):
        runs.append(FakeRun(**options))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    return runs


def test_pretraining_reports_every_record_to_wandb(fake_wandb, tmp_path):
    flags = tiny_run_flags(tmp_path, write_corpus(tmp_path / "corpus.txt"), 4)
    save_dir = tmp_path / "run"
    assert torchrun_main.main([*flags, "--optimizer", "plumage_adamw", "--eval_every", "2", "--save_dir", str(save_dir),
                               "--report_to", "wandb", "--wandb_project", "lowrank", "--name", "tiny",
                               "--tags", "a,b"]) == 0
    (run,) = fake_wandb
    assert run.init["project"] == "lowrank" and run.init["name"] == "tiny" and run.init["tags"] == ["a", "b"]
    assert run.init["config"]["optimizer"] == "plumage_adamw" and run.init["config"]["rank"] == 8
    metrics = read_metrics(save_dir)
    assert run.series("train/loss") == {r["step"]: r["loss"] for r in metrics["train"]}
    assert run.series("eval/eval_loss") == {r["step"]: r["eval_loss"] for r in metrics["eval"]} and len(metrics["eval"]) == 2
    refreshes = run.series("projector/model.layers.0.self_attn.q_proj.weight/refreshes")
    assert refreshes == {2: 1, 4: 2}  # refreshed at updates 1 and 3 (τ = 2)
    assert run.summary["summary/eval_loss"] == metrics["summary"][0]["eval_loss"]
    assert run.finished == 1


def test_pretraining_without_wandb_installed_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets when it is not installed
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    flags = tiny_run_flags(tmp_path, write_corpus(tmp_path / "corpus.txt"), 2)
    with pytest.raises(ImportError, match=r"--report_to wandb needs the wandb package: pip install wandb"):
        torchrun_main.main([*flags, "--save_dir", str(tmp_path / "run"), "--report_to", "wandb"])


def test_fine_tuning_with_tracking_reports_to_wandb(fake_wandb, tmp_path):
    write_plays(tmp_path / "data")
    out = tmp_path / "glue"
    assert run_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "bert")), "--data_dir",
                          str(tmp_path / "data"), "--output_dir", str(out), "--max_train_samples", "32",
                          "--max_eval_samples", "16", "--num_train_epochs", "2", "--no-progress", "--with_tracking",
                          "--optimizer", "galore_adamw", "--lora_r", "4"]) == 0
    (run,) = fake_wandb
    assert run.init["name"] == "glue" and run.init["project"] == "galore_plumage"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["type"] == "epoch"]
    assert run.series("epoch/eval_accuracy") == {r["step"]: r["eval_accuracy"] for r in epochs} and len(epochs) == 2
    assert run.series("train/loss") == {r["step"]: r["loss"] for r in records if r["type"] == "train"}
    (final,) = [r for r in records if r["type"] == "final"]
    assert run.summary["final/best_accuracy"] == final["best_accuracy"] and run.finished == 1
