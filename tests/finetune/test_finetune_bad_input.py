"""run_glue.py refuses bad input early, naming the value and what to do."""

from __future__ import annotations

import pytest
from finetune_helpers import write_plays
from train_helpers import REPO  # noqa: F401  (puts the repository root on sys.path for run_glue)

import run_glue
from galore_plumage.finetune import parse_config
from galore_plumage.finetune.model import load_classifier, model_family
from galore_plumage.finetune.tasks import dialogue_lines, load_task


def _error(capsys, argv, code):
    assert run_glue.main(argv) == code
    return capsys.readouterr().err


def test_unknown_task_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_glue.main(["--task_name", "mrcp"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'mrcp'" in err and "shakespeare_plays" in err and "mrpc" in err
    with pytest.raises(ValueError, match=r"unknown --task_name 'mrcp'.*shakespeare_plays"):
        load_task("mrcp")


def test_missing_model_folder_is_named(capsys, tmp_path):
    missing = str(tmp_path / "no" / "such" / "model")
    err = _error(capsys, ["--model_name_or_path", missing], 2)
    assert missing in err and "no such folder" in err


def test_folder_without_a_model_is_named(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"could not load a model from '{empty}'"):
        load_classifier(str(empty), num_labels=2)


@pytest.mark.parametrize("argv, message", [
    (["--peft", "lora", "--enable_galore"], "--peft lora trains small adapters"),
    (["--peft", "lora", "--optimizer", "plumage_adamw"], "not 'plumage_adamw'"),
    (["--enable_galore", "--optimizer", "adamw"], "--optimizer adamw is full-rank"),
    (["--projector", "plumage"], "need a low-rank optimizer"),
    (["--lora_r", "0"], "--lora_r must be >= 1, got 0"),
    (["--max_train_samples", "0"], "--max_train_samples must be >= 1"),
    (["--learning_rate", "-1"], "--learning_rate must be >= 0"),
    (["--lora_dropout", "1.0"], "--lora_dropout must be in"),
    (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps must be >= 1, got 0"),
    (["--task_name", "mrpc", "--train_file", "t.csv", "--validation_file", "v.csv"], "pass a task, or your files"),
    (["--train_file", "t.csv"], "--train_file needs --validation_file too"),
    (["--validation_file", "v.csv"], "--validation_file needs --train_file too"),
    (["--train_file", "t.txt", "--validation_file", "v.csv"], "--train_file t.txt: expected a .csv, .json or .jsonl file"),
    (["--train_file", "missing.csv", "--validation_file", "v.csv"], "--train_file missing.csv: no such file"),
])
def test_conflicting_or_out_of_range_flags(capsys, argv, message):
    assert message in _error(capsys, argv, 2)


def test_more_accumulation_than_batches_is_refused(capsys, tmp_path):
    write_plays(tmp_path / "data")
    err = _error(capsys, ["--data_dir", str(tmp_path / "data"), "--max_train_samples", "32", "--num_train_epochs", "1",
                          "--gradient_accumulation_steps", "3", "--output_dir", str(tmp_path / "run"), "--no-progress"], 1)
    assert "--gradient_accumulation_steps 3 is more than the 2 batches x 1 epochs" in err


def test_a_cap_for_lora_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match=r"--max_inv_p 3.0: .*'adamw' is full-rank"):
        parse_config(["--peft", "lora", "--max_inv_p", "3"])


def test_galore_flags_imply_the_optimizer():
    assert parse_config([]).optimizer == "adamw"
    assert parse_config(["--enable_galore"]).optimizer == "galore_adamw"
    assert parse_config(["--optimizer", "PLUMAGE_ADAMW"]).optimizer == "plumage_adamw"  # a low-rank name suffices
    config = parse_config(["--peft", "lora"])
    assert (config.optimizer, config.method, config.output_dir) == ("adamw", "lora", "runs/glue-shakespeare_plays-lora")


def test_offline_glue_explains_itself(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match=r"could not load GLUE task 'mrpc'.*--task_name shakespeare_plays"):
        load_task("mrpc")


def test_existing_run_is_not_overwritten(capsys, tmp_path):
    write_plays(tmp_path / "data", lines_per_play=2000)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    err = _error(capsys, ["--data_dir", str(tmp_path / "data"), "--output_dir", str(out)], 1)
    assert "metrics.jsonl exists" in err


def test_unknown_architecture_is_refused():
    import torch

    with pytest.raises(ValueError, match="cannot tell the attention and MLP modules of Sequential"):
        model_family(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_dialogue_lines_drop_everything_but_speech():
    play = "\n".join([
        "HAMLET", "", "Persons Represented", "HAMLET, Prince of Denmark.", "SCENE: Elsinore and its castle walls.",
        "", "ACT I.", "", "SCENE I. Elsinore. A platform before the Castle.", "", "[Enter Francisco.]", "",
        "BERNARDO.", "Who's there? [Aside] Stand and unfold yourself.", "", "FRANCISCO.", "Nay, answer me.",
        "Long live the king, my lord!", "", "[Exit.]", "Exeunt all but Horatio and the ghost.",
    ])
    assert dialogue_lines(play) == ["Who's there? Stand and unfold yourself.", "Long live the king, my lord!"]
