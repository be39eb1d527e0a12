"""Our optimizers under transformers.Trainer: target-module patterns, refusals, and checkpoints that resume exactly."""

from __future__ import annotations

import shutil

import pytest
import torch
from finetune_helpers import save_tiny_bert
from torch import nn

from galore_plumage.finetune import optimizer_for_trainer, resolve_target_modules
from galore_plumage.finetune.trainer import registry_name
from galore_plumage.optimizers import list_optimizers

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("trainer") / "bert")


def _model(bert_dir):
    from galore_plumage.finetune.model import load_classifier

    torch.manual_seed(0)
    model, _ = load_classifier(str(bert_dir), num_labels=2)
    return model


def _dataset(n: int = 48, length: int = 8, vocab: int = 30):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (n, length), generator=generator)
    labels = (ids[:, 0] % 2).tolist()  # learnable from the first word
    return [{"input_ids": ids[i], "attention_mask": torch.ones(length, dtype=torch.long), "labels": labels[i]}
            for i in range(n)]


def _args(out, **overrides):
    options = dict(output_dir=str(out), per_device_train_batch_size=8, learning_rate=1e-3, max_steps=4, save_steps=2,
                   save_strategy="steps", logging_strategy="no", report_to="none", use_cpu=True, seed=0,
                   data_seed=0, optim_target_modules=["attention", "intermediate", "output.dense"],
                   lr_scheduler_type="linear", warmup_steps=0, disable_tqdm=True, save_only_model=False)
    options.update(overrides)
    return transformers.TrainingArguments(**options)


def test_patterns_follow_trainer_rules():
    model = nn.Sequential()
    model.add_module("attn_q", nn.Linear(4, 4))
    model.add_module("mlp_up", nn.Linear(4, 8))
    model.add_module("head", nn.Linear(8, 2))
    model.add_module("norm", nn.LayerNorm(4))
    assert resolve_target_modules(model, ["attn", "mlp"]) == ["attn_q", "mlp_up"]  # substrings
    assert resolve_target_modules(model, [r"m.*_up"]) == ["mlp_up"]  # a list entry may be a full-match regex
    assert resolve_target_modules(model, r"attn_.|head") == ["attn_q", "head"]  # a string is one regex
    assert resolve_target_modules(model, "all-linear") == ["attn_q", "mlp_up", "head"]  # never the LayerNorm
    with pytest.raises(ValueError, match="select no nn.Linear"):
        resolve_target_modules(model, ["norm"])
    with pytest.raises(ValueError, match="optim_target_modules must be"):
        resolve_target_modules(model, 3)


def test_low_rank_group_holds_exactly_the_targets(bert_dir, tmp_path):
    model = _model(bert_dir)
    optimizer, scheduler = optimizer_for_trainer(model, _args(tmp_path), "galore_adamw", rank=4, update_proj_gap=3)
    assert scheduler is None  # Trainer builds its own
    regular, low = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in low["params"]) == sorted(
        f"bert.encoder.layer.{i}.{m}.weight" for i in range(2) for m in (
            "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
            "intermediate.dense", "output.dense"))
    assert low["rank"] == 4 and low["lr"] == 1e-3 and regular["betas"] == (0.9, 0.999)


def test_hf_optim_args_set_the_low_rank_group(bert_dir, tmp_path):
    """HF Trainer's GaLore keys in TrainingArguments.optim_args reach the low-rank group; a key also passed to
    optimizer_for_trainer must agree, and anything else in optim_args is refused by name."""
    model = _model(bert_dir)
    args = _args(tmp_path, optim_args="rank=4, update_proj_gap=3, scale=0.5, proj_type=right")
    optimizer, _ = optimizer_for_trainer(model, args, "galore_adamw")
    low = optimizer.param_groups[1]
    assert (low["rank"], low["update_proj_gap"], low["scale"], low["proj_type"]) == (4, 3, 0.5, "right")
    optimizer, _ = optimizer_for_trainer(model, args, "galore_adamw", rank=4)  # the same value twice: fine
    with pytest.raises(ValueError, match="rank=16 passed to optimizer_for_trainer, rank=4 in TrainingArguments"):
        optimizer_for_trainer(model, args, "galore_adamw", rank=16)
    with pytest.raises(ValueError, match="'alpha=2' is not one of rank=..., update_proj_gap=..."):
        optimizer_for_trainer(model, _args(tmp_path, optim_args="rank=4, alpha=2"), "galore_adamw")
    with pytest.raises(ValueError, match="rank must be int, got '4.5'"):
        optimizer_for_trainer(model, _args(tmp_path, optim_args="rank=4.5"), "galore_adamw")
    low = optimizer_for_trainer(model, _args(tmp_path), "galore_adamw")[0].param_groups[1]
    assert (low["rank"], low["update_proj_gap"], low["scale"]) == (8, 200, 0.25)  # neither given: our defaults


@pytest.mark.parametrize("hf, ours", [("galore_adamw_8bit", "galore_adamw8bit"),
                                      ("galore_adamw_layerwise", "galore_adamw_per_layer"),
                                      ("galore_adamw_8bit_layerwise", "galore_adamw8bit_per_layer"),
                                      ("galore_adafactor_layerwise", "galore_adafactor_per_layer"),
                                      ("plumage_adamw", "plumage_adamw")])
def test_hf_optimizer_names_are_ours(hf, ours):
    """The `optim` names of HF Trainer's GaLore (args.optim) are accepted as they are spelled there."""
    assert registry_name(hf) == ours and ours in list_optimizers()


def test_an_hf_name_builds_our_optimizer(bert_dir, tmp_path):
    optimizer, _ = optimizer_for_trainer(_model(bert_dir), _args(tmp_path), "galore_adamw_8bit", rank=4)
    assert optimizer.backend.name == "adamw8bit" and optimizer.param_groups[1]["projector"] == "svd"


def test_refusals_name_the_setting(bert_dir, tmp_path):
    model = _model(bert_dir)
    with pytest.raises(ValueError, match="optim_target_modules"):
        optimizer_for_trainer(model, _args(tmp_path, optim_target_modules=None), "plumage_adamw")
    with pytest.raises(ValueError, match="max_grad_norm=1.0"):
        optimizer_for_trainer(model, _args(tmp_path, max_grad_norm=1.0), "plumage_adamw_per_layer")
    with pytest.raises(ValueError, match="gradient_accumulation_steps=1"):
        optimizer_for_trainer(model, _args(tmp_path, max_grad_norm=0.0, gradient_accumulation_steps=2),
                              "plumage_adamw_per_layer")
    with pytest.raises(ValueError, match="unknown optimizer 'nope'"):
        optimizer_for_trainer(model, _args(tmp_path), "nope")


class StepCounter(transformers.TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def _train(bert_dir, args, name, resume=None):
    model = _model(bert_dir)
    # PLUMAGE's projector: its seeded draws and pool must come back from the checkpoint too
    optimizers = optimizer_for_trainer(model, args, name, rank=4, update_proj_gap=3, seed=0, projector="plumage")
    counter = StepCounter()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_dataset(), optimizers=optimizers,
                                   callbacks=[counter])
    trainer.train(resume_from_checkpoint=resume)
    return model, counter.steps


@pytest.mark.parametrize("name", ["plumage_adamw", "plumage_adamw_per_layer"])
def test_trainer_checkpoint_resumes_exactly(bert_dir, tmp_path, name):
    """4 steps straight == a fresh Trainer resuming from that run's step-2 checkpoint for the last 2 steps
    (projections refresh at steps 0 and 3: step 2 uses the restored basis and moments, step 3 realigns them)."""
    straight, steps = _train(bert_dir, _args(tmp_path / "straight", max_grad_norm=0.0), name)
    assert steps == 4
    checkpoint = tmp_path / "straight" / "checkpoint-2"
    assert torch.load(checkpoint / "optimizer.pt", weights_only=True)  # plain tensors and numbers only
    resumed, steps = _train(bert_dir, _args(tmp_path / "resumed", max_grad_norm=0.0), name, resume=str(checkpoint))
    assert steps == 2  # it did resume: only the remaining steps ran
    expected = dict(straight.named_parameters())
    for key, value in resumed.named_parameters():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7, msg=key)
    if name == "plumage_adamw":  # control: without the optimizer's state the same resume lands elsewhere
        shutil.copytree(checkpoint, tmp_path / "stateless")
        (tmp_path / "stateless" / "optimizer.pt").unlink()
        forgetful, _ = _train(bert_dir, _args(tmp_path / "forgetful", max_grad_norm=0.0), name,
                              resume=str(tmp_path / "stateless"))
        query = "bert.encoder.layer.0.attention.self.query.weight"
        assert not torch.allclose(dict(forgetful.named_parameters())[query], expected[query], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["adafactor", "plumage_adafactor"])
def test_adafactor_names_build_under_trainer(bert_dir, tmp_path, name):
    """TrainingArguments always carries an lr; the Adafactor names used to fail on it."""
    optimizer, _ = optimizer_for_trainer(_model(bert_dir), _args(tmp_path), name, rank=4, update_proj_gap=3)
    assert all(g["lr"] == 1e-3 and g["relative_step"] is False for g in optimizer.param_groups)
