"""The options table (optimizers/options.py) drives every layer: each entry is checked here for its defaults, its bad
values (refused by the group, by build_optimizer and by both command lines), its flag and help in both scripts, and
its way to the optimizer. A new option needs an entry in the table, not a new test file."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn
from train_helpers import SHORT_RUN

from galore_plumage import GaLoreAdamW, PlumageAdamW, build_optimizer
from galore_plumage.finetune.config import build_parser as finetune_parser
from galore_plumage.finetune.config import parse_config as parse_finetune_config
from galore_plumage.optimizers.base import LOW_RANK_DEFAULTS, PLUMAGE_ADAM_RECIPE, PLUMAGE_DEFAULTS, projector_options
from galore_plumage.optimizers.options import OPTIONS, SAME
from galore_plumage.optimizers.registry import PLUMAGE_CLASSES
from galore_plumage.training.config import NOT_GIVEN, PLUMAGE_OPTION_DEFAULTS, build_parser, parse_config
from galore_plumage.training.loop import optimizer_options

BAD = [(option.key, bad) for option in OPTIONS for bad in option.bad_values]
GOOD = {  # a value other than the default for each option, as given on the command line and as it arrives
    "adaptive_interval": (["--adaptive_interval"], True),
    "tau_max": (["--tau_max", "800"], 800),
    "stagger": (["--stagger"], True),
    "refresh_batch": (["--refresh_batch", "8"], 8),
    "foreach": (["--foreach"], True),
    "compile_update": (["--compile_update"], True),
    "solver": (["--solver", "gram"], "gram"),
    "max_inv_p": (["--max_inv_p", "3"], 3.0),
    "sampled_step": (["--sampled_step", "norm_matched"], "norm_matched"),
    "row_bias_correction": (["--row_bias_correction"], True),
    "resample_every": (["--resample_every", "5"], 5),
    "sample_until": (["--sample_until", "1000"], 1000),
    "align_signs": (["--align_signs"], True),
    "pool_factor": (["--pool_factor", "3"], 3),
    "pool_bf16": (["--pool_bf16"], True),
    "residual": (["--residual", "norm_matched"], "norm_matched"),
    "residual_limiter": (["--residual_limiter", "steady"], "steady"),
    "residual_scale": (["--residual_scale", "0.25"], 0.25),
    "refresh_ema": (["--refresh_ema", "0.9"], 0.9),
    "residual_cap": (["--residual_cap", "1"], 1.0),
    "residual_horizon": (["--residual_horizon", "20"], 20),
    "v_floor": (["--v_floor", "m2_corrected"], "m2_corrected"),  # not m2: plumage_adamw's default
    "v_floor_horizon": (["--v_floor_horizon", "3000"], 3000),
}


def _weight():
    torch.manual_seed(0)
    return nn.Linear(10, 8, bias=False).weight


def test_every_option_has_a_command_line_example_here():
    assert set(GOOD) == {o.key for o in OPTIONS}


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_defaults_come_from_the_table_and_pass_their_own_check(option):
    assert LOW_RANK_DEFAULTS[option.key] == option.default
    option.check(option.default)
    if option.plumage is not SAME:
        assert PLUMAGE_DEFAULTS[option.key] == option.plumage
        option.check(option.plumage)
    assert PlumageAdamW.class_defaults[option.key] == PLUMAGE_ADAM_RECIPE[option.key] == option.plumage_adam_default()
    option.check(option.plumage_adam_default())
    assert option.key not in GaLoreAdamW.class_defaults


@pytest.mark.parametrize("key, bad", BAD)
def test_a_bad_value_in_a_group_is_refused_naming_it(key, bad):
    with pytest.raises(ValueError, match=key):
        PlumageAdamW([{"params": [_weight()], "rank": 2, key: bad}])


@pytest.mark.parametrize("key, bad", BAD)
def test_a_bad_value_through_build_optimizer_is_refused_naming_it(key, bad):
    model = nn.Sequential(nn.Linear(10, 8))
    with pytest.raises(ValueError, match=key):
        build_optimizer("plumage_adamw", model, rank=2, target_modules=("",), **{key: bad})


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_given_to_a_full_rank_optimizer_it_is_refused(option):
    model = nn.Sequential(nn.Linear(10, 8))
    with pytest.raises(ValueError, match=rf"{option.key}=.* optimizer 'adamw' is full-rank; pick plumage_adamw"):
        build_optimizer("adamw", model, **{option.key: GOOD[option.key][1]})
    argv, _ = GOOD[option.key]
    with pytest.raises(ValueError, match=rf"--{option.key} .*full-rank"):
        parse_config(["--optimizer", "adamw", *argv])


@pytest.mark.parametrize("parser", [build_parser, finetune_parser], ids=["torchrun_main", "run_glue"])
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_both_command_lines_have_the_flag_with_the_tables_help(parser, option):
    built = parser()
    actions = {a.dest: a for a in built._actions}
    assert option.key in actions
    assert actions[option.key].default == NOT_GIVEN  # left out of the options: the optimizer's own default
    printed = built._get_formatter()._expand_help(actions[option.key])  # the help as --help prints it, before wrapping
    assert printed == option.flag_help(PLUMAGE_OPTION_DEFAULTS)
    assert repr(option.default) in option.flag_help()
    defaults = printed.rsplit("(default ", 1)[1]  # "'svd', 'auto' for plumage_adamw, ...)"
    for name, cls in PLUMAGE_CLASSES.items():  # each name's own default, where it differs, is named with it
        value = cls.class_defaults[option.key]
        assert value == option.default or re.search(rf"{re.escape(repr(value))} for [^']*plumage_{name}\b", defaults)
        assert value != option.default or not re.search(rf"plumage_{name}\b", defaults)


@pytest.mark.parametrize("parser", [build_parser, finetune_parser], ids=["torchrun_main", "run_glue"])
def test_every_help_prints_as_written(parser):
    # argparse %-formats each help: a bare "%" in ours ("3-6 % slower") once printed the action's dict in --help.
    # What it prints is the help as written, then the formatter's "(default: ...)" where it adds one.
    built = parser()
    formatter = built._get_formatter()
    for action in built._actions[1:]:  # [0]: argparse's own -h
        assert formatter._expand_help(action).startswith(action.help.replace("%%", "%")), action.dest
    assert "'container':" not in built.format_help()


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.key)
def test_the_flag_reaches_the_optimizer_from_both_scripts(option):
    """On PLUMAGE's projector (--projector plumage), where every option of the table applies."""
    argv, value = GOOD[option.key]
    config = parse_config(["--optimizer", "plumage_adamw", "--projector", "plumage", *SHORT_RUN, *argv])
    # 600 updates at the default 2048 tokens an update: pretraining adds no option to plumage_adamw's (its lr instead:
    # PRETRAIN_LR; from 1000 updates the large batch's floor and complement, PRETRAIN_LONG_RUN_LARGE_BATCH)
    assert config.low_rank == {option.key: value}
    assert optimizer_options(config)[option.key] == value
    finetune = parse_finetune_config(["--optimizer", "plumage_adamw", "--projector", "plumage", *argv])
    assert finetune.low_rank == {option.key: value}
    optimizer = build_optimizer("plumage_adamw", nn.Sequential(nn.Linear(10, 8)), rank=2, target_modules=("",),
                                projector="plumage", **config.low_rank)
    (group,) = [g for g in optimizer.param_groups if "rank" in g]
    assert group[option.key] == value
    if option.to_projector:
        assert projector_options(group)[option.key] == value


def test_a_flag_given_as_none_is_kept_where_the_optimizers_default_is_not_none():
    """'none' is a value: `--residual_cap none` under the sampled preset (whose cap is 0.5) and `--v_floor_horizon none`
    for plumage_adamw8bit's pretraining (200) reach the optimizer as None; a flag left out is absent."""
    config = parse_config(["--optimizer", "plumage_adamw", "--preset", "sampled", "--residual_cap", "none"])
    assert config.low_rank == {"residual_cap": None}
    (group,) = [g for g in build_optimizer("plumage_adamw", nn.Sequential(nn.Linear(10, 8)), rank=2,
                                           target_modules=("",), preset="sampled", **config.low_rank).param_groups
                if "rank" in g]
    assert group["residual_cap"] is None
    assert parse_config(["--optimizer", "plumage_adamw8bit", "--v_floor_horizon", "none"]).low_rank == {
        "v_floor_horizon": None}
    assert parse_finetune_config(["--optimizer", "plumage_adamw"]).low_rank == {}


def test_no_cap_on_the_command_line_is_inf_and_the_projector_reads_it_as_none():
    config = parse_config(["--projector", "plumage", "--max_inv_p", "none", *SHORT_RUN])
    assert config.low_rank == {"max_inv_p": math.inf}
    optimizer = PlumageAdamW([{"params": [_weight()], "rank": 2, "projector": "plumage"}], **config.low_rank)
    (param,) = optimizer.param_groups[0]["params"]
    param.grad = torch.randn(param.shape)
    optimizer.step()
    assert optimizer.projector_for(param, optimizer.param_groups[0]).max_inv_p is None
