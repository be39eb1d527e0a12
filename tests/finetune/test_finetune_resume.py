"""run_glue.py --checkpointing_steps / --resume_from_checkpoint: a resumed run continues the uninterrupted one update
for update (weights bit for bit, dropout included), in per-layer mode under accumulation too; a checkpoint written with
other flags, or a bad value, is refused by name."""

from __future__ import annotations

import pytest
import torch
from finetune_helpers import records, save_tiny_bert, write_plays

from galore_plumage.finetune import parse_config
from galore_plumage.finetune.loop import run


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    write_plays(root / "data")
    return {"model": str(save_tiny_bert(root / "bert")), "data": str(root / "data")}  # BERT's dropout 0.1: RNG state


def _argv(assets, out, *extra):
    return ["--model_name_or_path", assets["model"], "--data_dir", assets["data"], "--output_dir", str(out),
            "--max_train_samples", "64", "--max_eval_samples", "32", "--no-progress", *extra]


def _same_weights(model, reference):
    expected = dict(reference.named_parameters())
    for name, value in model.named_parameters():
        assert torch.equal(value, expected[name]), name


PLUMAGE = ("--optimizer", "plumage_adamw", "--lora_all_modules", "--lora_r", "4", "--update_proj_gap", "2",
           "--learning_rate", "1e-3", "--num_train_epochs", "2")


def test_resume_in_a_new_folder_continues_the_run_exactly(assets, tmp_path):
    """Four updates an epoch: model_3 stands inside epoch 1 (dropout's RNG state matters), model_6 inside epoch 2
    (so does the shuffling generator's: a fresh one would replay epoch 1's order)."""
    whole, summary = run(parse_config(_argv(assets, tmp_path / "whole", *PLUMAGE, "--checkpointing_steps", "3")))
    assert sorted(p.name for p in (tmp_path / "whole" / "checkpoints").glob("model_*")) == ["model_3", "model_6"]
    for step in (3, 6):
        out = tmp_path / f"resumed_{step}"
        resumed, resumed_summary = run(parse_config(_argv(assets, out, *PLUMAGE, "--resume_from_checkpoint",
                                                          str(tmp_path / "whole" / "checkpoints" / f"model_{step}"))))
        _same_weights(resumed, whole)
        assert [r["loss"] for r in records(out, "train")] == [
            r["loss"] for r in records(tmp_path / "whole", "train")][step:]  # the same losses from update step + 1
        assert resumed_summary["best_accuracy"] == summary["best_accuracy"]
        assert resumed_summary["terminal_train_loss"] == summary["terminal_train_loss"]
        (record,) = records(out, "resumed")
        assert record["step"] == step and record["checkpoint"].endswith(f"model_{step}")


def test_per_layer_epoch_checkpoints_wait_for_the_update_and_resume_in_place(assets, tmp_path):
    """Four batches an epoch, three an update: epochs 1 and 2 end with batches pending, so their checkpoints are
    written after the next update (2, 3); epoch 3 ends on one (4). Resumed from model_2 in its own folder (the folder
    of checkpoints), metrics.jsonl is cut back to update 2 and carries every update once."""
    flags = ("--optimizer", "plumage_adamw_per_layer", "--lora_all_modules", "--lora_r", "4", "--update_proj_gap", "2",
             "--learning_rate", "1e-3", "--num_train_epochs", "3", "--gradient_accumulation_steps", "3",
             "--checkpointing_steps", "epoch")
    whole, _ = run(parse_config(_argv(assets, tmp_path / "whole", *flags)))
    folder = tmp_path / "interrupted" / "checkpoints"
    run(parse_config(_argv(assets, tmp_path / "interrupted", *flags)))
    assert sorted(p.name for p in folder.glob("model_*")) == ["model_2", "model_3", "model_4"]
    resumed, _ = run(parse_config(_argv(assets, tmp_path / "interrupted", *flags, "--resume_from_checkpoint",
                                        str(folder / "model_2"))))
    _same_weights(resumed, whole)
    assert [r["step"] for r in records(tmp_path / "interrupted", "train")] == [1, 2, 3, 4]
    assert [r["epoch"] for r in records(tmp_path / "interrupted", "epoch")] == [1, 2, 3]
    assert len(records(tmp_path / "interrupted", "final")) == 1


def test_a_checkpoint_of_other_flags_or_a_bad_value_is_refused(assets, tmp_path):
    run(parse_config(_argv(assets, tmp_path / "first", *PLUMAGE, "--checkpointing_steps", "4", "--max_train_steps",
                           "4")))
    checkpoints = tmp_path / "first" / "checkpoints"
    other = [*PLUMAGE[:-4], "--learning_rate", "2e-3", "--num_train_epochs", "2", "--max_train_steps", "4"]
    with pytest.raises(ValueError, match=r"model_4 was written by a run with other flags: --learning_rate 0.002 "
                                         r"\(the checkpoint: 0.001\)"):
        run(parse_config(_argv(assets, tmp_path / "second", *other, "--resume_from_checkpoint", str(checkpoints))))
    same = [*PLUMAGE, "--checkpointing_steps", "4", "--max_train_steps", "4"]
    run(parse_config(_argv(assets, tmp_path / "another", *same)))
    with pytest.raises(FileExistsError, match=r"metrics.jsonl belongs to another run than .*model_4: resume into a new"):
        run(parse_config(_argv(assets, tmp_path / "another", *same, "--resume_from_checkpoint", str(checkpoints))))
    with pytest.raises(FileNotFoundError, match=r"--resume_from_checkpoint '.*nowhere' is neither a checkpoint"):
        run(parse_config(_argv(assets, tmp_path / "third", *PLUMAGE, "--resume_from_checkpoint",
                               str(tmp_path / "nowhere"))))
    for bad in ("0", "every"):
        with pytest.raises(ValueError, match=f"--checkpointing_steps '{bad}': give a number of updates >= 1, or 'epoch'"):
            parse_config(_argv(assets, tmp_path / "fourth", "--checkpointing_steps", bad))
