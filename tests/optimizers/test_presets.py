"""Presets: `--preset paper` is the paper's exact estimator, the same run as the protocol's explicit flags for it;
flags given with a preset win; a preset that does not fit the optimizer is refused by name, before any file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from galore_plumage.finetune import parse_config as parse_finetune_config
from galore_plumage.optimizers import (
    OPTIONS,
    PLUMAGE_PAPER,
    PLUMAGE_SAMPLED,
    PlumageAdafactor,
    PlumageAdamW,
    PlumageAdamW8bit,
    PlumageSGDM,
    build_optimizer,
)
from galore_plumage.training.config import build_parser, parse_config
from galore_plumage.training.loop import make_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plumage_flags import plumage_flags  # noqa: E402 - the flags the pretraining protocol names the paper's arm with

PLUMAGE_CLASSES = (PlumageAdamW, PlumageAdamW8bit, PlumageAdafactor, PlumageSGDM)
RELATIVE_STEP_OFF = {PlumageAdafactor: {"relative_step": False, "scale_parameter": False}}  # an lr replaces it


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(20, 12)
        self.attn = nn.Linear(12, 12, bias=False)
        self.mlp = nn.Linear(12, 24, bias=False)
        self.head = nn.Linear(24, 20, bias=False)

    def forward(self, tokens):
        return self.head(torch.relu(self.mlp(self.attn(self.embed(tokens)))))


def _low_rank_group(optimizer) -> dict:
    group = next(g for g in optimizer.param_groups if "rank" in g)
    return {key: value for key, value in group.items() if key != "params"}


def _train(optimizer, model, updates=6) -> list[torch.Tensor]:
    data = torch.Generator().manual_seed(1)
    for _ in range(updates):
        tokens = torch.randint(0, 20, (4, 8), generator=data)
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("cls", PLUMAGE_CLASSES, ids=lambda c: c.__name__)
def test_paper_sets_every_option_back_to_the_tables_default(cls):
    """PLUMAGE_PAPER undoes every option plumage_* changes, on every backend: the options of the low-rank group are
    the table's defaults (the paper's values), under PLUMAGE's projector with both moments realigned and scale 1."""
    weight = nn.Parameter(torch.randn(12, 10))
    optimizer = cls([{"params": [weight], "rank": 3}], lr=1e-3, **PLUMAGE_PAPER, **RELATIVE_STEP_OFF.get(cls, {}))
    group = optimizer.param_groups[0]
    assert {o.key: group[o.key] for o in OPTIONS} == {o.key: o.default for o in OPTIONS}
    assert (group["projector"], group["realign"], group["scale"], group["lr"]) == ("plumage", "mv", 1.0, 1e-3)


def test_preset_paper_on_the_command_line_is_the_protocols_paper_arm():
    """`--preset paper` trains the weights of the pretraining protocol's paper arm, which names it flag by flag, bit
    for bit. (Their groups differ only in settings of what the paper leaves out: the complement's, the pool's.)"""
    explicit = ["--galore_scale", "1.0", "--lr", "1e-3", "--projector", "plumage", "--v_floor", "none", "--solver", "svd",
                "--regular_lr_ratio", "1", *plumage_flags()]
    common = ["--rank", "3", "--update_proj_gap", "2"]
    by_preset, by_flags = parse_config(["--preset", "paper", *common]), parse_config([*explicit, *common])
    assert by_preset.lr == by_flags.lr == 1e-3
    first, second = Tiny(), Tiny()
    trained = [_train(make_optimizer(by_preset, first), first), _train(make_optimizer(by_flags, second), second)]
    assert all(torch.equal(a, b) for a, b in zip(*trained, strict=True))
    assert not torch.equal(trained[0][1], Tiny().attn.weight)  # it did train


def test_flags_given_with_a_preset_win():
    config = parse_config(["--preset", "paper", "--max_inv_p", "3", "--lr", "3e-4", "--galore_scale", "0.5",
                           "--realign", "m", "--rank", "3"])
    group = _low_rank_group(make_optimizer(config, Tiny()))
    assert (group["max_inv_p"], group["lr"], group["scale"], group["realign"]) == (3.0, 3e-4, 0.5, "m")
    assert (group["projector"], group["resample_every"], group["v_floor"]) == ("plumage", 0, "none")


def test_an_option_that_needs_plumages_projector_is_accepted_under_the_paper_preset_only():
    """The paper preset's projector counts when options are checked: a cap applies under it, not under the default's
    svd projector."""
    assert parse_config(["--preset", "paper", "--max_inv_p", "3"]).low_rank == {"max_inv_p": 3.0}
    with pytest.raises(ValueError, match="max_inv_p"):
        parse_config(["--max_inv_p", "3"])


def test_sampled_is_plumage_sampled_over_the_adam_defaults():
    by_preset = build_optimizer("plumage_adamw", Tiny(), rank=3, preset="sampled")
    by_names = build_optimizer("plumage_adamw", Tiny(), rank=3, **PLUMAGE_SAMPLED)
    assert _low_rank_group(by_preset) == _low_rank_group(by_names)
    assert (_low_rank_group(by_preset)["lr"], _low_rank_group(by_preset)["scale"]) == (1e-2, 0.25)


@pytest.mark.parametrize("name", ["plumage_adafactor", "plumage_sgdm", "plumage_adamw8bit", "plumage_adamw_per_layer"])
def test_paper_trains_on_every_backend(name):
    model = Tiny()
    before = model.attn.weight.detach().clone()
    extra = {"min_8bit_size": 16} if name == "plumage_adamw8bit" else {}  # the low-rank moments in 8 bits
    optimizer = build_optimizer(name, model, rank=3, update_proj_gap=2, preset="paper", **extra)
    assert _low_rank_group(getattr(optimizer, "optimizer", optimizer))["projector"] == "plumage"
    _train(optimizer, model, updates=3)
    assert torch.isfinite(model.attn.weight).all() and not torch.equal(model.attn.weight, before)


@pytest.mark.parametrize("argv, message", [
    (["--optimizer", "galore_adamw", "--preset", "paper"], "not of 'galore_adamw': pick plumage_adamw"),
    (["--optimizer", "adamw", "--preset", "paper"], "not of 'adamw'"),
    (["--optimizer", "plumage_sgdm", "--preset", "sampled"], "made for the adamw and adamw8bit backends, not 'sgdm'"),
])
def test_a_preset_that_does_not_fit_is_refused_before_any_file(argv, message, tmp_path):
    save_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        parse_config([*argv, "--save_dir", str(save_dir)])
    assert not save_dir.exists()


def test_an_unknown_preset_is_refused_listing_the_choices(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--preset", "fira"])
    assert "choose from 'paper', 'sampled'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown preset 'fira'; choose one of paper, sampled"):
        build_optimizer("plumage_adamw", Tiny(), rank=3, preset="fira")


def test_help_names_the_presets():
    text = " ".join(build_parser().format_help().split())
    assert "--preset {paper,sampled}" in text
    assert "'paper': the paper's exact estimator" in text


def test_run_glue_takes_the_preset_with_its_own_lr_and_scale():
    config = parse_finetune_config(["--optimizer", "plumage_adamw", "--preset", "paper", "--max_inv_p", "3"])
    assert (config.preset, config.learning_rate, config.galore_scale) == ("paper", 5e-5, 1.0)
    with pytest.raises(ValueError, match="not of 'galore_adamw'"):
        parse_finetune_config(["--enable_galore", "--preset", "paper"])
