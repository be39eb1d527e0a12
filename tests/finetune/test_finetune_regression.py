"""Regression tasks in run_glue.py (stsb, or a file of fractional labels): one output trained on the mean squared
error, judged by Pearson's r (and Spearman's ρ) as HF's run_glue.py judges stsb; the scores checked against scipy."""

from __future__ import annotations

import json
import random

import pytest
import torch
from finetune_helpers import COMMON, WORDS, records, save_tiny_bert
from scipy import stats

from galore_plumage.finetune import parse_config
from galore_plumage.finetune.loop import run, summary_table
from galore_plumage.finetune.scores import pearson, ranks
from galore_plumage.finetune.tasks import load_files, load_task


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_equal_scipys_with_ties(seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 6, (200,), generator=generator).float() / 5  # many ties, as stsb's scores have
    y = x + 0.3 * torch.randn(200, generator=generator)
    a, b = x.double().numpy(), y.double().numpy()
    assert pearson(x, y) == pytest.approx(stats.pearsonr(a, b).statistic, abs=1e-12)
    assert pearson(ranks(x), ranks(y)) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


def test_ranks_average_ties_and_a_constant_side_scores_zero():
    assert ranks(torch.tensor([10.0, 20.0, 20.0, 30.0, 20.0])).tolist() == [0, 2, 2, 4, 2]
    assert pearson(torch.ones(5), torch.arange(5.0)) == 0.0  # an untrained head may predict one value everywhere


def _similarity_rows(count: int, seed: int) -> list[dict]:
    """A score in [0, 5]: five times the share of one vocabulary's words in an 8-word sentence (learnable, known)."""
    rng = random.Random(seed)
    north, south = WORDS.values()
    rows = []
    for _ in range(count):
        share = rng.randint(0, 8)
        words = [rng.choice(north) for _ in range(share)] + [rng.choice(south + COMMON) for _ in range(8 - share)]
        rng.shuffle(words)
        rows.append({"sentence": " ".join(words), "label": 5 * share / 8})
    return rows


def _write(folder, rows=(96, 48)):
    folder.mkdir(parents=True, exist_ok=True)
    train, validation = folder / "train.csv", folder / "validation.jsonl"
    train.write_text("sentence,label\n" + "".join(f"{r['sentence']},{r['label']}\n" for r in _similarity_rows(rows[0], 0)))
    validation.write_text("".join(json.dumps(r) + "\n" for r in _similarity_rows(rows[1], 1)))
    return train, validation


def test_fractional_labels_make_a_regression_task(tmp_path):
    task = load_files(*_write(tmp_path, rows=(8, 4)))
    assert task.regression and task.num_labels == 1 and task.label_names == ()
    assert all(isinstance(label, float) for label in task.train.labels + task.validation.labels)
    whole = tmp_path / "whole.csv"  # whole numbers only: classes, as before
    whole.write_text("sentence,label\na,1\nb,2.0\n")
    assert not load_files(whole, whole).regression and load_files(whole, whole).label_names == ("1", "2")


def test_stsb_loads_as_a_regression_task(monkeypatch):
    """GLUE's stsb through datasets (stubbed: no hub here): sentence1/sentence2 and a float score."""
    import datasets

    def glue(path, name):
        assert (path, name) == ("nyu-mll/glue", "stsb")
        part = {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [4.2, 0.5]}
        return {"train": datasets.Dataset.from_dict(part), "validation": datasets.Dataset.from_dict(part)}

    monkeypatch.setattr(datasets, "load_dataset", glue)
    task = load_task("stsb")
    assert task.regression and task.num_labels == 1
    assert task.train.texts == [("a", "c"), ("b", "d")] and task.train.labels == pytest.approx([4.2, 0.5])


def test_a_regression_file_trains_and_is_scored_by_pearson(tmp_path):
    """A tiny BERT with one output learns the share of one vocabulary: the mean squared error falls, and the
    validation Pearson's r, logged per epoch with Spearman's ρ, rises from an untrained head's (−0.16 after epoch 1)."""
    train, validation = _write(tmp_path / "data")
    argv = ["--model_name_or_path", str(save_tiny_bert(tmp_path / "bert", dropout=0.0)), "--train_file", str(train),
            "--validation_file", str(validation), "--optimizer", "galore_adamw", "--lora_all_modules", "--lora_r", "4",
            "--learning_rate", "1e-2", "--num_train_epochs", "8", "--no-progress", "--output_dir", str(tmp_path / "run")]
    _, summary = run(parse_config(argv))
    epochs = records(tmp_path / "run", "epoch")
    assert len(epochs) == 8 and all({"eval_pearson", "eval_spearmanr"} <= set(r) for r in epochs)
    assert summary["metric"] == "pearson" and summary["best_pearson"] == max(r["eval_pearson"] for r in epochs)
    assert epochs[-1]["train_loss"] < 0.5 * epochs[0]["train_loss"]
    assert summary["best_pearson"] > 0.9 and summary["final_pearson"] > 0.8, epochs  # measured 0.98, 0.88


def test_a_summary_table_of_mixed_tasks_names_each_runs_metric():
    common = {"seed": 0, "terminal_train_loss": 0.5, "optimizer_state_bytes": 2**20, "wall_time_s": 3.0}
    accuracy = {**common, "method": "galore", "metric": "accuracy", "best_accuracy": 0.9}
    pearson_run = {**common, "method": "plumage", "metric": "pearson", "best_pearson": 0.8}
    assert "| best accuracy |" in summary_table([accuracy, accuracy]) and "| 0.9000 |" in summary_table([accuracy])
    mixed = summary_table([accuracy, pearson_run]).splitlines()
    assert "| best score |" in mixed[0]
    assert "| 0.9000 (accuracy) |" in mixed[2] and "| 0.8000 (pearson) |" in mixed[3]
