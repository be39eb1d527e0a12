"""run_glue.py's GaLore-compatible data and batching flags: --gradient_accumulation_steps (every update sums the same
number of batches, in per-layer mode too), --pad_to_max_length, and --train_file / --validation_file."""

from __future__ import annotations

import json
import random

import pytest
import torch
from finetune_helpers import COMMON, WORDS, records, save_tiny_bert, write_plays

from galore_plumage.finetune import parse_config
from galore_plumage.finetune.loop import batches, run
from galore_plumage.finetune.model import load_classifier
from galore_plumage.finetune.tasks import load_files


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("accumulation")
    write_plays(root / "data")
    return {"model": str(save_tiny_bert(root / "bert", dropout=0.0)), "data": str(root / "data"), "root": root}


def _argv(assets, out, *extra):
    return ["--model_name_or_path", assets["model"], "--data_dir", assets["data"], "--output_dir", str(out),
            "--max_train_samples", "64", "--max_eval_samples", "32", "--no-progress", *extra]


def test_accumulating_two_batches_equals_one_batch_twice_as_large(assets, tmp_path):
    """SGD (linear in the gradient) on a model without dropout: batches of 8 summed in pairs make the updates of
    batches of 16 (the same shuffled order, each update's loss the mean of its two halves), to rounding."""
    runs = {}
    for name, batch, steps in (("accumulated", "8", "2"), ("whole", "16", "1")):
        out = tmp_path / name
        config = parse_config(_argv(assets, out, "--optimizer", "sgd", "--learning_rate", "0.5", "--num_train_epochs", "2",
                                    "--per_device_train_batch_size", batch, "--gradient_accumulation_steps", steps,
                                    "--pad_to_max_length", "--max_length", "24"))
        model, summary = run(config)
        runs[name] = (dict(model.named_parameters()), summary, records(out, "train"))
    (accumulated, summary, train), (whole, whole_summary, whole_train) = runs["accumulated"], runs["whole"]
    assert summary["steps"] == whole_summary["steps"] == 8  # 64 examples / 16 an update, 2 epochs
    assert [r["loss"] for r in train] == pytest.approx([r["loss"] for r in whole_train], rel=1e-5)
    for name, value in whole.items():
        torch.testing.assert_close(accumulated[name], value, rtol=1e-5, atol=1e-6, msg=name)
    start, _ = load_classifier(assets["model"], num_labels=2)
    changed = [n for n, p in start.named_parameters() if "classifier" not in n and not torch.equal(p, whole[n])]
    assert changed  # the encoder trained: the comparison is not between two untouched models


def test_per_layer_mode_accumulates_as_normal_mode_across_epoch_ends(assets, tmp_path):
    """Three batches an update, four batches an epoch: updates end inside epochs and carry a partial accumulation
    over their ends; per-layer mode (each weight steps in its gradient hook, summing projected gradients between
    refreshes) counts them the same way. SGD momentum, linear in the gradient, so the two modes' different order of
    summation stays at rounding (AdamW's normalization lifts it to ~1e-4 on a coordinate whose gradient cancels)."""
    models, updates = {}, {}
    for name in ("galore_sgdm", "galore_sgdm_per_layer"):
        out = tmp_path / name
        config = parse_config(_argv(assets, out, "--optimizer", name, "--lora_all_modules", "--lora_r", "4",
                                    "--update_proj_gap", "2", "--learning_rate", "0.5", "--num_train_epochs", "3",
                                    "--gradient_accumulation_steps", "3"))
        models[name], _ = run(config)
        updates[name] = [(r["step"], r["epoch"]) for r in records(out, "train")]
    assert updates["galore_sgdm"] == updates["galore_sgdm_per_layer"] == [(1, 1), (2, 2), (3, 3), (4, 3)]
    normal, layered = (dict(m.named_parameters()) for m in models.values())
    for key, value in normal.items():
        torch.testing.assert_close(layered[key], value, rtol=1e-5, atol=1e-6, msg=key)
    start = dict(load_classifier(assets["model"], num_labels=2)[0].named_parameters())
    projected = [key for key in normal if "encoder.layer" in key and normal[key].dim() == 2]
    assert len(projected) == 12
    for key in projected:  # the low-rank steps themselves agree, not only weights that barely moved
        moved = normal[key] - start[key]
        assert moved.abs().max() > 1e-7, key  # ~50 float32 steps of these weights (|w| ~ 0.02)
        torch.testing.assert_close(layered[key] - start[key], moved, rtol=0, atol=1e-3 * moved.abs().max().item(),
                                   msg=key)


def test_pad_to_max_length_pads_every_batch(assets):
    task = load_files(*_write_files(assets["root"] / "pad", rows=(12, 6)))
    _, tokenizer = load_classifier(assets["model"], num_labels=2)
    for pad, widths in ((True, {20}), (False, None)):
        loader = batches(task.train, tokenizer, max_length=20, batch_size=5, shuffle=False, seed=0, pad_to_max_length=pad)
        seen = {batch["input_ids"].shape[1] for batch in loader}
        assert seen == widths if pad else max(seen) < 20


def _write_files(folder, rows=(64, 32), seed=0):
    """A train CSV and a validation JSON Lines file: which of two vocabularies a sentence is drawn from, as 'north' /
    'south' (learnable, labels known)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = dict(zip(("north", "south"), WORDS.values(), strict=True))

    def sample(count):
        out = []
        for i in range(count):
            label = ("north", "south")[i % 2]
            out.append({"sentence": " ".join(rng.choice(names[label] + COMMON) for _ in range(8)), "label": label})
        return out

    train, validation = folder / "train.csv", folder / "validation.jsonl"
    train.write_text("sentence,label\n" + "".join(f"{r['sentence']},{r['label']}\n" for r in sample(rows[0])))
    validation.write_text("".join(json.dumps(r) + "\n" for r in sample(rows[1])))
    return train, validation


def test_own_files_train_a_classifier(assets, tmp_path):
    train, validation = _write_files(tmp_path / "data")
    argv = ["--model_name_or_path", assets["model"], "--train_file", str(train), "--validation_file", str(validation),
            "--optimizer", "plumage_adamw", "--lora_all_modules", "--lora_r", "4", "--learning_rate", "1e-3",
            "--num_train_epochs", "1", "--no-progress"]
    assert parse_config(argv).output_dir.endswith("glue-train-plumage_adamw")
    config = parse_config([*argv, "--output_dir", str(tmp_path / "run")])
    _, summary = run(config)
    assert summary["steps"] == 4  # 64 rows / 16
    (logged,) = records(tmp_path / "run", "config")
    assert (logged["train_examples"], logged["eval_examples"], logged["task_name"]) == (64, 32, None)
    task = load_files(train, validation)
    assert task.label_names == ("north", "south") and task.train.labels[:4] == [0, 1, 0, 1]
    assert task.train.texts[0] == (task.train.texts[0][0],)  # one text column


def test_text_columns_and_classes_follow_the_scripts_rules(tmp_path):
    pair = tmp_path / "pair.jsonl"
    pair.write_text("".join(json.dumps(r) + "\n" for r in (
        {"idx": 0, "sentence2": "b", "label": 10, "sentence1": "a"},
        {"idx": 1, "sentence2": "d", "label": "2", "sentence1": "c"},
        {"idx": 2, "sentence2": "f", "label": 2.0, "sentence1": "e"})))
    task = load_files(pair, pair)
    assert task.label_names == ("2", "10")  # whole numbers in numeric order; 2, "2" and 2.0 one class
    assert task.train.texts == [("a", "b"), ("c", "d"), ("e", "f")] and task.train.labels == [1, 0, 0]
    listed = tmp_path / "listed.json"  # a JSON list; no sentence1/sentence2: the first two other columns
    listed.write_text(json.dumps([{"question": "q1", "answer": "a1", "extra": "x", "label": "yes"},
                                  {"question": "q2", "answer": "a2", "extra": "y", "label": "no"}]))
    task = load_files(listed, listed)
    assert task.label_names == ("no", "yes") and task.train.texts == [("q1", "a1"), ("q2", "a2")]


@pytest.mark.parametrize("train_text, validation_text, message", [
    ("text,class\na,0\n", "text,class\na,0\n", r"no 'label' column \(columns: text, class\)"),
    ("text,label\na,0\nb,1\n", "text,label\na,2\n", r"row 1 has label '2', which no row of the training file has"),
    ("text,label\na,\n", "text,label\na,0\n", r"row 1 has no label"),
    ("label\n0\n", "label\n0\n", r"only a 'label' column"),
    # a regression file (labels all numbers, one fractional; test_finetune_regression.py) and a mixed one
    ("text,label\na,0.5\nb,1\n", "text,label\na,high\n", r"validation.csv: row 1 has label 'high', not a finite number"),
    ("text,label\na,0.5\nb,1\n", "text,label\na,nan\n", r"row 1 has label 'nan', not a finite number"),
    ("text,label\na,0.5\nb,yes\n", "text,label\na,yes\n", r"row 1 has label '0.5', not a whole number, among class"),
    # a nan among the training file's targets is that row's error, not a reason to read the file as classes
    ("text,label\na,0.5\nb,nan\n", "text,label\na,1\n", r"train.csv: row 2 has label 'nan', not a finite number"),
    ("text,label\na,inf\nb,1\n", "text,label\na,1\n", r"train.csv: row 1 has label 'inf', not a whole number"),
])
def test_bad_files_are_refused_by_value(tmp_path, train_text, validation_text, message):
    train, validation = tmp_path / "train.csv", tmp_path / "validation.csv"
    train.write_text(train_text)
    validation.write_text(validation_text)
    with pytest.raises(ValueError, match=message):
        load_files(train, validation)


def test_a_row_without_its_text_is_named(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"sentence": "a", "label": 0}) + "\n" + json.dumps({"label": 1}) + "\n")
    with pytest.raises(ValueError, match=r"row 2 has no sentence"):
        load_files(rows, rows)
