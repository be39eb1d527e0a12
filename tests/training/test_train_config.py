"""torchrun_main.py's flags: GaLore's names parse, choices follow the registries, and bad values fail up front.

Every check goes through `parse_config(argv, world_size=..., cuda_bf16=...)`, the function the script calls,
so a renamed flag, a lost choice or a changed default is caught before a run spends time on it.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from train_helpers import SHORT_RUN, SMALL_BATCH

import galore_plumage
from galore_plumage.optimizers import RULES
from galore_plumage.projectors import list_projectors
from galore_plumage.projectors.modes import PROJ_TYPES
from galore_plumage.training.config import TrainConfig, build_parser, parse_config, parse_token_count, resume_conflicts
from galore_plumage.training.loop import optimizer_options

# flag -> (argv, field, expected value): one run of each GaLore flag and each of ours with a non-default value
GALORE_FLAGS = {
    "model_config": (["--model_config", "configs/llama_micro.json"], "configs/llama_micro.json"),
    "use_hf_model": (["--use_hf_model"], True),
    "continue_from": (["--continue_from", "runs/x/model_10"], "runs/x/model_10"),
    "batch_size": (["--batch_size", "4"], 4),
    "max_length": (["--max_length", "64"], 64),
    "optimizer": (["--optimizer", "galore_adamw"], "galore_adamw"),
    "lr": (["--lr", "0.01"], 0.01),
    "scheduler": (["--scheduler", "linear"], "linear"),
    "min_lr_ratio": (["--min_lr_ratio", "0.05"], 0.05),
    "activation_checkpointing": (["--activation_checkpointing"], True),
    "weight_decay": (["--weight_decay", "0.1"], 0.1),
    "warmup_steps": (["--warmup_steps", "7"], 7),
    "eval_every": (["--eval_every", "11"], 11),
    "num_training_steps": (["--num_training_steps", "1234"], 1234),
    "save_every": (["--save_every", "13"], 13),
    "save_dir": (["--save_dir", "somewhere/else"], "somewhere/else"),
    "tags": (["--tags", "a,b"], "a,b"),
    "dtype": (["--dtype", "bfloat16"], "bfloat16"),
    "workers": (["--workers", "3"], 3),
    "seed": (["--seed", "42"], 42),
    "name": (["--name", "my-run"], "my-run"),
    "grad_clipping": (["--grad_clipping", "1.0"], 1.0),
    "beta1": (["--beta1", "0.9"], 0.9),
    "rank": (["--rank", "16"], 16),
    "update_proj_gap": (["--update_proj_gap", "50"], 50),
    "galore_scale": (["--galore_scale", "0.5"], 0.5),
    "proj_type": (["--proj_type", "left"], "left"),
    "single_gpu": (["--single_gpu"], True),
}
OUR_FLAGS = {
    "projector": (["--projector", "svd"], "svd"),
    "realign": (["--realign", "mv"], "mv"),
    "preset": (["--preset", "paper"], "paper"),
    "dataset": (["--dataset", "allenai/c4"], "allenai/c4"),
    "tokenizer": (["--tokenizer", "t5-base"], "t5-base"),
    "stop_at": (["--stop_at", "5"], 5),
    "projection_seed": (["--projection_seed", "3"], 3),
    "regular_lr": (["--regular_lr", "3e-3"], 3e-3),
    "regular_lr_ratio": (["--regular_lr_ratio", "3"], 3.0),
}


@pytest.mark.parametrize("flag", sorted({**GALORE_FLAGS, **OUR_FLAGS}))
def test_each_flag_parses_under_its_name(flag):
    """Each flag (GaLore's spelling, or ours) sets the field of the same name to the value given."""
    argv, expected = {**GALORE_FLAGS, **OUR_FLAGS}[flag]
    config = parse_config(argv)
    assert getattr(config, flag) == expected
    assert type(getattr(config, flag)) is type(expected)


def test_projection_seed_seeds_the_projections_alone():
    """--projection_seed reaches the optimizer's seed (its draws) and nothing else; without it the run's --seed does."""
    assert optimizer_options(parse_config(["--seed", "4"]))["seed"] == 4
    config = parse_config(["--seed", "4", "--projection_seed", "9"])
    assert (config.seed, optimizer_options(config)["seed"]) == (4, 9)


def test_the_remaining_galore_flags_parse():
    """--gradient_accumulation, --total_batch_size, --max_train_tokens and --proj_quant exist (checked by value below)."""
    config = parse_config(["--batch_size", "2", "--gradient_accumulation", "3", "--total_batch_size", "6",
                           "--max_train_tokens", "20000", "--max_length", "100", "--warmup_steps", "1"])
    assert (config.gradient_accumulation, config.total_batch_size, config.max_train_tokens) == (3, 6, 20000)
    assert build_parser().parse_args(["--proj_quant"]).proj_quant is True  # accepted by the parser, refused by resolve


def test_every_registered_optimizer_is_a_choice_case_insensitively():
    """Every name of list_optimizers() is accepted, in any case (GaLore's scripts pass e.g. 'Adam')."""
    names = galore_plumage.list_optimizers()
    assert len(names) > 10
    for name in names:
        assert parse_config(["--optimizer", name]).optimizer == name
        assert parse_config(["--optimizer", name.upper()]).optimizer == name
    assert parse_config(["--optimizer", "Adam"]).optimizer == "adam"


def test_unknown_optimizer_exits_listing_the_choices(capsys):
    """An unknown optimizer is an argparse error (SystemExit) whose message lists the registered names."""
    with pytest.raises(SystemExit) as error:
        parse_config(["--optimizer", "adamw9bit"])
    assert error.value.code != 0
    message = capsys.readouterr().err
    assert "adamw9bit" in message
    for name in ("plumage_adamw", "galore_adafactor", "flora_sgdm_per_layer", "adamw8bit"):
        assert name in message


@pytest.mark.parametrize(("flag", "choices"), [
    ("--projector", list_projectors()), ("--realign", list(RULES)), ("--proj_type", list(PROJ_TYPES)),
    ("--scheduler", ["cosine", "linear", "constant"]), ("--dtype", ["float32", "bfloat16"]),
])
def test_choice_flags_follow_their_registries(flag, choices, capsys):
    """Every registered value is accepted and an unregistered one exits naming the valid ones."""
    field = flag.lstrip("-")
    for value in choices:
        assert getattr(parse_config([flag, value]), field) == value
    with pytest.raises(SystemExit):
        parse_config([flag, "no_such_value"])
    message = capsys.readouterr().err
    assert all(value in message for value in choices)


# ----------------------------------------------------------------- batch arithmetic
@pytest.mark.parametrize(("argv", "world", "accumulation", "total"), [
    ([], 1, 1, 8),                                                      # defaults: batch 8, one process
    (["--batch_size", "4"], 2, 1, 8),                                   # total defaults to batch x world
    (["--batch_size", "4", "--total_batch_size", "32"], 2, 4, 32),      # accumulation derived
    (["--batch_size", "2", "--gradient_accumulation", "3"], 2, 3, 12),  # total derived
    (["--batch_size", "2", "--gradient_accumulation", "3", "--total_batch_size", "6"], 1, 3, 6),
])
def test_batch_arithmetic(argv, world, accumulation, total):
    """total_batch_size = batch_size x gradient_accumulation x world_size, whichever two are given."""
    config = parse_config(argv, world_size=world)
    assert (config.gradient_accumulation, config.total_batch_size, config.world_size) == (accumulation, total, world)
    assert config.total_batch_size == config.batch_size * config.gradient_accumulation * world


def test_total_batch_not_a_multiple_names_the_values():
    """--total_batch_size 30 with batch 4 on 2 processes cannot be split: the message names 30, 4 and 2."""
    with pytest.raises(ValueError, match=re.escape("--total_batch_size 30 is not a multiple of batch_size x world_size "
                                                   "= 4 x 2")):
        parse_config(["--batch_size", "4", "--total_batch_size", "30"], world_size=2)


def test_inconsistent_accumulation_names_the_values():
    """Accumulation 3 x batch 4 x world 2 = 24, not the 16 asked for: every factor appears in the message."""
    with pytest.raises(ValueError, match=re.escape("3 x 4 x 2 != --total_batch_size 16")):
        parse_config(["--batch_size", "4", "--gradient_accumulation", "3", "--total_batch_size", "16"], world_size=2)


def test_zero_accumulation_is_refused():
    with pytest.raises(ValueError, match="--gradient_accumulation must be >= 1, got 0"):
        parse_config(["--gradient_accumulation", "0"])


# ----------------------------------------------------------------- tokens -> steps
@pytest.mark.parametrize(("text", "tokens"), [
    ("100M", 100_000_000), ("1.5B", 1_500_000_000), ("20000", 20_000), ("2k", 2_000), ("13.1B", 13_100_000_000),
    ("1.001K", 1_001), ("0.7B", 700_000_000), ("4.35M", 4_350_000),
])
def test_token_counts_parse_exactly(text, tokens):
    """K/M/B suffixes scale exactly (a decimal like 1.001K must not lose a token to float rounding)."""
    assert parse_token_count(text) == tokens
    assert parse_config(["--max_train_tokens", text, "--warmup_steps", "0"]).max_train_tokens == tokens


@pytest.mark.parametrize("text", ["lots", "1.5X", "-3M", ""])
def test_bad_token_count_exits(text, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--max_train_tokens", text])
    assert "--max_train_tokens" in capsys.readouterr().err


@pytest.mark.parametrize(("tokens", "batch", "accumulation", "world", "length"), [
    ("20000", 2, 3, 1, 100), ("100M", 8, 4, 2, 256), ("1.5B", 16, 1, 1, 1024), ("12000", 4, 1, 3, 1000),
])
def test_max_train_tokens_sets_the_number_of_updates(tokens, batch, accumulation, world, length):
    """Updates = ceil(tokens / (total_batch_size x max_length)), overriding --num_training_steps."""
    config = parse_config(["--max_train_tokens", tokens, "--batch_size", str(batch), "--gradient_accumulation",
                           str(accumulation), "--max_length", str(length), "--num_training_steps", "7",
                           "--warmup_steps", "0"], world_size=world)
    expected = math.ceil(parse_token_count(tokens) / (batch * accumulation * world * length))
    assert config.num_training_steps == expected
    assert config.num_training_steps != 7


def test_max_train_tokens_rounds_up():
    """20001 tokens at 2 x 100 tokens an update is 101 updates, not 100: the last partial update is run."""
    config = parse_config(["--max_train_tokens", "20001", "--batch_size", "2", "--max_length", "100",
                           "--warmup_steps", "0"])
    assert config.num_training_steps == 101


# ----------------------------------------------------------------- refused combinations
def test_warmup_not_shorter_than_the_run_is_refused():
    """Warmup that fills the whole run leaves no decay: an error naming both numbers; fine for constant."""
    with pytest.raises(ValueError, match="--warmup_steps 100 leaves no room for the cosine decay in 100 updates"):
        parse_config(["--num_training_steps", "100", "--warmup_steps", "100"])
    with pytest.raises(ValueError, match="--warmup_steps 200 .* linear decay in 100 updates"):
        parse_config(["--num_training_steps", "100", "--warmup_steps", "200", "--scheduler", "linear"])
    assert parse_config(["--num_training_steps", "100", "--warmup_steps", "100", "--scheduler", "constant"])
    assert parse_config(["--num_training_steps", "100", "--warmup_steps", "99"]).warmup_steps == 99


def test_warmup_checked_against_the_steps_from_tokens():
    """The warmup check uses the step count that --max_train_tokens implies (here 10 updates)."""
    argv = ["--max_train_tokens", "2000", "--batch_size", "2", "--max_length", "100", "--num_training_steps", "1000"]
    with pytest.raises(ValueError, match="in 10 updates"):
        parse_config([*argv, "--warmup_steps", "10"])
    assert parse_config([*argv, "--warmup_steps", "9"]).num_training_steps == 10


def test_single_gpu_with_two_processes_is_refused():
    with pytest.raises(ValueError, match="--single_gpu runs one process, but WORLD_SIZE is 2"):
        parse_config(["--single_gpu"], world_size=2)
    assert parse_config(["--single_gpu"], world_size=1).single_gpu


@pytest.mark.parametrize("name", [n for n in galore_plumage.list_optimizers() if n.endswith("_per_layer")])
def test_per_layer_optimizers_refuse_two_processes(name):
    """Per-layer optimizers step inside the gradient hook, before DDP's all-reduce: one process only."""
    with pytest.raises(ValueError, match=f"--optimizer {name} steps each weight inside its gradient hook"):
        parse_config(["--optimizer", name, "--batch_size", "2"], world_size=2)
    assert parse_config(["--optimizer", name], world_size=1).optimizer == name


def test_proj_quant_is_refused():
    with pytest.raises(ValueError, match="--proj_quant .* is not implemented; drop the flag"):
        parse_config(["--proj_quant"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    (["--lr", "-1"], "--lr must be >= 0, got -1"),
    (["--min_lr_ratio", "1.5"], r"--min_lr_ratio must be in \[0, 1\], got 1.5"),
    (["--beta1", "1.0"], r"--beta1 must be in \[0, 1\), got 1.0"),
    (["--stop_at", "0"], r"--stop_at must be in \[1, num_training_steps=10000\], got 0"),
    (["--stop_at", "10001"], r"--stop_at must be in \[1, num_training_steps=10000\], got 10001"),
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--lr", "inf"], "--lr must be a finite number, got inf"),
    (["--weight_decay", "nan"], "--weight_decay must be a finite number, got nan"),
    (["--galore_scale", "nan"], "--galore_scale must be a finite number, got nan"),
    (["--optimizer", "adamw", "--max_inv_p", "3"], r"--max_inv_p 3.0: .*'adamw' is full-rank"),
    (["--optimizer", "galore_adamw", "--max_inv_p", "3"], r"--max_inv_p 3.0: .*projector 'svd' does not rescale"),
    (["--optimizer", "plumage_adamw", "--projector", "random", "--max_inv_p", "3"], r"projector 'random' does not"),
    (["--optimizer", "plumage_adamw", "--max_inv_p", "0.5"], r"--max_inv_p 0.5: max_inv_p must be a number >= 1"),
    (["--regular_lr", "inf"], "--regular_lr must be a finite number, got inf"),
    (["--regular_lr", "0"], r"--regular_lr 0.0: regular_lr=0.0: expected a positive finite number"),
    (["--regular_lr=-1e-3"], r"--regular_lr -0.001: regular_lr=-0.001: expected a positive finite number"),
    (["--optimizer", "adamw", "--regular_lr", "1e-3"], r"--regular_lr 0.001: .* optimizer 'adamw' projects none; give "
                                                        r"its lr as lr"),
    (["--regular_lr_ratio", "nan"], "--regular_lr_ratio must be a finite number, got nan"),
    (["--regular_lr_ratio", "0"], r"--regular_lr_ratio must be a positive finite number .*got 0"),
    (["--regular_lr_ratio=-2"], r"--regular_lr_ratio must be a positive finite number .*got -2"),
    (["--regular_lr_ratio", "2", "--regular_lr", "1e-2"], "--regular_lr 0.01 and --regular_lr_ratio 2 both set the "
                                                           "regular group's lr: give one"),
    (["--optimizer", "adamw", "--regular_lr_ratio", "2"], r"--regular_lr_ratio 2 sets .* optimizer 'adamw' projects "
                                                          "none; drop it"),
    (["--regular_lr_ratio_on_repeat", "nan"], "--regular_lr_ratio_on_repeat must be a finite number, got nan"),
    (["--regular_lr_ratio_on_repeat", "0"], r"--regular_lr_ratio_on_repeat must be a positive finite number .*got 0"),
    (["--optimizer", "adamw", "--regular_lr_ratio_on_repeat", "1"], r"--regular_lr_ratio_on_repeat 1 sets .* "
                                                                     "optimizer 'adamw' projects none; drop it"),
    (["--dataset", "allenai/c4", "--regular_lr_ratio_on_repeat", "1"], r"--regular_lr_ratio_on_repeat 1 needs the "
                                                                        r"training text's length, which a stream does "
                                                                        r"not know \(--dataset 'allenai/c4'\)"),
])
def test_out_of_range_values_name_the_flag(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_config(argv)


@pytest.mark.parametrize(("argv", "lr", "regular_lr"), [
    ([], 2e-2, 4e-2),  # plumage_adamw pretrains with its regular group at 2x its lr (sessions 32-33)
    (["--lr", "5e-3"], 5e-3, 1e-2),  # the ratio follows a given lr
    (["--optimizer", "plumage_adamw_per_layer"], 2e-2, 4e-2),
    (["--regular_lr_ratio", "3"], 2e-2, 6e-2),
    (["--regular_lr_ratio", "1"], 2e-2, None),  # one lr: no group of its own, as GaLore's script
    (["--regular_lr", "4e-3"], 2e-2, 4e-3),  # an absolute lr wins
    (["--preset", "paper"], 1e-3, None),  # a preset keeps the one lr it was measured with
    (["--preset", "sampled"], 1e-2, None),
    (["--optimizer", "galore_adamw"], 1e-3, None),  # GaLore's recipe: one lr
    (["--optimizer", "plumage_adamw8bit"], 1e-2, 2e-2),  # since session 36, with the floor's 200-update warm-up
    (["--optimizer", "galore_adamw", "--regular_lr_ratio", "2", "--lr", "3e-3"], 3e-3, 6e-3),
    (["--optimizer", "galore_adamw8bit_per_layer", "--regular_lr_ratio", "2"], 1e-3, 2e-3),  # any low-rank name takes it
    (["--optimizer", "adamw"], 1e-3, None),
])
def test_regular_lr_defaults_to_the_optimizers_ratio_of_lr(argv, lr, regular_lr):
    """--regular_lr resolves to --regular_lr_ratio x --lr, the ratio defaulting per optimizer (recommended_regular_lr_ratio;
    runs of 600 updates, at their batch's lr)."""
    config = parse_config([*SHORT_RUN, *argv])
    assert config.lr == pytest.approx(lr)
    assert config.regular_lr == (None if regular_lr is None else pytest.approx(regular_lr))


@pytest.mark.parametrize("argv, norm", [
    (["--optimizer", "plumage_sgdm", "--lr", "0.8"], 1.0),  # SGD's first steps are too long at the lr it wants after
    (["--optimizer", "plumage_sgdm", "--lr", "0.8", "--grad_clipping", "0"], 0.0),  # a given norm wins, 0 too
    (["--optimizer", "plumage_sgdm", "--lr", "0.8", "--grad_clipping", "3"], 3.0),
    (["--optimizer", "plumage_sgdm_per_layer", "--lr", "0.8"], 0.0),  # no global norm in per-layer mode
    (["--optimizer", "plumage_sgdm", "--lr", "0.05", "--preset", "paper"], 0.0),  # as the preset was measured
    (["--optimizer", "galore_sgdm", "--lr", "0.07"], 0.0),  # galore-torch's script: off
    (["--optimizer", "plumage_adamw"], 0.0),  # Adam normalizes its step; unclipped, as galore-torch's script
])
def test_grad_clipping_defaults_to_the_optimizers_pretraining_norm(argv, norm):
    """optimizers.PRETRAIN_GRAD_CLIPPING: plumage_sgdm pretrains with the global gradient norm clipped at 1 unless
    --grad_clipping is given; every other name, per-layer mode and a preset unclipped (session 88)."""
    assert parse_config([*SHORT_RUN, *argv]).grad_clipping == norm


def test_a_resume_that_would_change_the_clip_names_the_norm_it_ran_with():
    """A plumage_sgdm checkpoint written unclipped (before session 88) resumes only as it ran: the conflict names the
    flag that restores it."""
    saved = dataclasses.asdict(parse_config([*SHORT_RUN, "--optimizer", "plumage_sgdm", "--lr", "0.07",
                                             "--grad_clipping", "0"]))
    conflicts = resume_conflicts(saved, parse_config([*SHORT_RUN, "--optimizer", "plumage_sgdm", "--lr", "0.07"]))
    assert conflicts == ["--grad_clipping 1.0 (the checkpoint: 0.0; as it ran: --grad_clipping 0)"]


@pytest.mark.parametrize("argv, beta1", [
    (["--optimizer", "plumage_sgdm"], 0.9),  # the momentum every SGD measurement here ran with
    (["--optimizer", "plumage_adafactor"], 0.9),  # Adafactor's first moment, as GaLore's and ours were measured
    (["--optimizer", "plumage_sgdm_per_layer"], 0.9),
    (["--optimizer", "plumage_sgdm", "--preset", "paper"], 0.9),  # the paper's estimator was measured at 0.9 too
    (["--optimizer", "plumage_sgdm", "--beta1", "0"], 0.0),  # a given value wins, 0 too
    (["--optimizer", "galore_sgdm"], 0.0),  # galore-torch's script: SGD without momentum ...
    (["--optimizer", "galore_adafactor"], 0.0),  # ... and Adafactor without a first moment
    (["--optimizer", "sgd"], 0.0),
    (["--optimizer", "plumage_adamw"], 0.0),  # Adam's betas are its own; the flag is unused there
])
def test_beta1_defaults_to_the_optimizers_pretraining_momentum(argv, beta1):
    """optimizers.PRETRAIN_BETA1: plumage_sgdm and plumage_adafactor pretrain with β1 0.9 unless --beta1 is given;
    every other name with galore-torch's script's 0 (session 89: until then plumage_sgdm ran plain SGD)."""
    assert parse_config([*SHORT_RUN, *argv]).beta1 == beta1


@pytest.mark.parametrize("name, key", [("plumage_sgdm", "momentum"), ("plumage_adafactor", "beta1")])
def test_the_default_beta1_reaches_the_optimizer(name, key):
    assert optimizer_options(parse_config([*SHORT_RUN, "--optimizer", name]))[key] == 0.9


@pytest.mark.parametrize("argv, lr", [
    (["--optimizer", "plumage_sgdm"], 0.8),  # clipped at 1 by default: the clipped lr (sessions 88-89)
    (["--optimizer", "plumage_sgdm", "--num_training_steps", "1000"], 0.56),  # a long run's (session 89)
    (["--optimizer", "plumage_sgdm", "--num_training_steps", "999"], 0.8),
    (["--optimizer", "plumage_sgdm", "--grad_clipping", "0.5"], 0.8),  # a tighter clip bounds the step more
    (["--optimizer", "plumage_sgdm", "--grad_clipping", "0"], 0.07),  # unclipped: the class's lr (sessions 45-46)
    (["--optimizer", "plumage_sgdm", "--grad_clipping", "3"], 0.07),  # a looser clip binds on the first steps only
    (["--optimizer", "plumage_sgdm_per_layer"], 0.07),  # no global norm, no clip
    (["--optimizer", "plumage_sgdm", "--lr", "0.4"], 0.4),  # a given lr wins
    (["--optimizer", "plumage_sgdm", "--preset", "paper", "--grad_clipping", "1"], 1e-3),  # the preset's own lr
    (["--optimizer", "galore_sgdm", "--grad_clipping", "1"], 1e-3),  # no clipped lr for GaLore's name
])
def test_a_clipped_sgd_run_defaults_to_the_clipped_lr(argv, lr):
    """optimizers.PRETRAIN_CLIPPED_LR: where plumage_sgdm clips the global norm at 1 or below and --lr is not given,
    it pretrains at 0.8 (its bracketed best clipped); unclipped at its recommended lr."""
    assert parse_config([*SHORT_RUN, *argv]).lr == pytest.approx(lr)


@pytest.mark.parametrize("argv, lr", [
    (["--optimizer", "plumage_adafactor", "--max_length", "64"], 5e-3),  # 512 tokens: within 0.013 of 600-5000 updates' best
    (["--optimizer", "plumage_adafactor_per_layer", "--max_length", "64"], 5e-3),
    (["--optimizer", "plumage_adafactor"], 1e-2),  # 8 x 256 = 2,048 tokens an update (sessions 82, 89)
    (["--optimizer", "plumage_adafactor", "--batch_size", "16"], 1e-2),  # 4,096 (session 83)
    (["--optimizer", "plumage_adafactor", "--projector", "svd", "--max_length", "64"], 5e-3),  # its own, named
    (["--optimizer", "plumage_adafactor", "--projector", "plumage"], 1e-3),  # the draws want ~2x: not guessed
    (["--optimizer", "plumage_adafactor", "--lr", "3e-3"], 3e-3),  # a given lr wins
    (["--optimizer", "galore_adafactor"], 1e-3),  # galore-torch's script's
])
def test_adafactor_pretrains_at_its_lr_for_the_batch(argv, lr):
    """optimizers.PRETRAIN_BATCH_LR: plumage_adafactor with its own projector pretrains at 5e-3 below 2,048 tokens an
    update and 1e-2 from there where --lr is not given (the library's 1e-3 until session 89, 0.176 behind)."""
    assert parse_config([*SHORT_RUN, *argv]).lr == pytest.approx(lr)


def test_a_resume_of_a_plain_sgd_run_names_the_momentum_it_ran_with():
    """A plumage_sgdm checkpoint written with the script's β1 0 (before session 89) resumes only as it ran: the conflict
    names the flag that restores it, and the lr it ran at."""
    saved = dataclasses.asdict(parse_config([*SHORT_RUN, "--optimizer", "plumage_sgdm", "--beta1", "0", "--lr", "1e-3"]))
    conflicts = resume_conflicts(saved, parse_config([*SHORT_RUN, "--optimizer", "plumage_sgdm"]))
    assert conflicts == ["--beta1 0.9 (the checkpoint: 0.0; as it ran: --beta1 0)", "--lr 0.8 (the checkpoint: 0.001)"]


@pytest.mark.parametrize("argv, lr", [
    ([], 2e-2),  # 8 x 256 = 2048 tokens an update, m2's own warm-up: twice the library's lr (session 56)
    (["--optimizer", "plumage_adamw_per_layer"], 2e-2),
    (["--v_floor_horizon", "none"], 2e-2),  # m2's own warm-up, given as a value
    (["--v_floor", "m2"], 2e-2),
    (["--v_floor_horizon", "200"], 1e-2),  # another warm-up: the library's lr, as it was measured (sessions 36-55)
    (["--v_floor", "none"], 1e-2),  # no floor: no warm-up to make up for
    (["--v_floor", "m2_corrected"], 1e-2),
    (["--max_length", "64"], 1e-2),  # 512 tokens an update: the library's lr
    (["--max_length", "128", "--batch_size", "15"], 1e-2),  # 1920: just below the threshold
    (["--max_length", "64", "--batch_size", "8", "--total_batch_size", "32"], 2e-2),  # accumulated: tokens an update
    (["--batch_size", "16"], 1e-2),  # 4096: no floor (PRETRAIN_NO_FLOOR_FROM_TOKENS)
    (["--batch_size", "16", "--v_floor", "m2"], 2e-2),  # a floor given there keeps its own warm-up
    (["--lr", "5e-3"], 5e-3),  # a given lr wins
    (["--optimizer", "plumage_adamw8bit"], 1e-2),  # 8-bit keeps its 200-update warm-up, at the library's lr
    (["--preset", "paper"], 1e-3),  # a preset keeps the lr it was measured with
    (["--optimizer", "galore_adamw"], 1e-3),
])
def test_the_lr_defaults_to_the_pretraining_lr_of_m2s_own_warm_up(argv, lr):
    """optimizers.PRETRAIN_LR: from 2048 tokens an update, where the floor in effect is m2 with its own warm-up,
    plumage_adamw pretrains at 2e-2; everywhere else at the optimizer's recommended lr (runs of 600 updates)."""
    assert parse_config([*SHORT_RUN, *argv]).lr == pytest.approx(lr)


@pytest.mark.parametrize("argv, lr", [
    (SMALL_BATCH, 7e-3),  # GaLore's 10,000 updates at 512 tokens an update: 0.7 x 1e-2
    ([*SMALL_BATCH, "--num_training_steps", "1000", "--warmup_steps", "100"], 7e-3),  # the threshold
    ([*SMALL_BATCH, "--num_training_steps", "999", "--warmup_steps", "100"], 1e-2),  # just below it
    ([*SMALL_BATCH, "--max_train_tokens", "512000", "--warmup_steps", "100"], 7e-3),  # 1000 updates of 512 tokens
    ([*SMALL_BATCH, "--max_train_tokens", "511488", "--warmup_steps", "100"], 1e-2),  # 999
    (["--max_length", "128", "--batch_size", "15"], 7e-3),  # 1920 tokens: just below PRETRAIN_LR's band
    (["--v_floor", "m2"], 1.4e-2),  # 2048 tokens an update, the floor given: 0.7 x PRETRAIN_LR's 2e-2 (session 65)
    (["--optimizer", "plumage_adamw_per_layer"], 1.4e-2),  # per-layer keeps the floor there (no complement to take)
    ([], 7e-3),  # 2048 tokens, 10,000 updates: a large batch's setting (PRETRAIN_LONG_RUN_LARGE_BATCH), 0.7 x 1e-2
    (["--v_floor", "none"], 7e-3),  # the same floor, given
    (["--num_training_steps", "1000", "--warmup_steps", "100"], 7e-3),
    (["--num_training_steps", "999", "--warmup_steps", "100"], 2e-2),  # just below the threshold there: the floor
    (["--batch_size", "16"], 1e-2),  # 4096: a large batch by its size (PRETRAIN_NO_FLOOR_FROM_TOKENS): no factor
    (["--batch_size", "16", "--v_floor", "m2"], 1.4e-2),  # a floor given there keeps its own warm-up
    ([*SMALL_BATCH, "--optimizer", "plumage_adamw_per_layer"], 7e-3),
    ([*SMALL_BATCH, "--v_floor", "m2"], 7e-3),
    ([*SMALL_BATCH, "--v_floor_horizon", "200"], 1e-2),  # another warm-up: no factor, as it was measured
    ([*SMALL_BATCH, "--v_floor", "none"], 1e-2),  # no floor: no warm-up to outlast
    ([*SMALL_BATCH, "--optimizer", "plumage_adamw8bit"], 7e-3),  # 8-bit's m2 warm-up too (session 82)
    ([*SMALL_BATCH, "--optimizer", "plumage_adamw8bit", "--num_training_steps", "999", "--warmup_steps", "100"], 1e-2),
    ([*SMALL_BATCH, "--optimizer", "plumage_adamw8bit_per_layer"], 7e-3),
    (["--optimizer", "plumage_adamw8bit"], 1e-2),  # 2048 tokens: 8-bit's 200-update warm-up, no factor
    (["--optimizer", "plumage_adamw8bit", "--v_floor_horizon", "none"], 7e-3),  # m2's own there, given
    (["--optimizer", "plumage_adamw8bit", "--batch_size", "16"], 1e-2),  # 4096: no floor, a large batch by its size
    ([*SMALL_BATCH, "--preset", "sampled"], 1e-2),  # a preset keeps the lr it was measured with
    ([*SMALL_BATCH, "--optimizer", "galore_adamw"], 1e-3),
    ([*SMALL_BATCH, "--lr", "1e-2"], 1e-2),  # a given lr wins
])
def test_a_long_run_scales_the_pretraining_lr_of_m2s_own_warm_up(argv, lr):
    """optimizers.PRETRAIN_LONG_RUN_LR: from 1000 updates (--num_training_steps, or --max_train_tokens over the
    tokens an update), where the floor in effect is m2 with its own warm-up, plumage_adamw pretrains at 0.7 x its
    batch's lr (the library's 1e-2 below 2048 tokens an update, PRETRAIN_LR's 2e-2 from there), and at 0.7 x 1e-2
    where such a run pretrains as a large batch for its length (from 2048 to 4095 tokens an update, no floor);
    plumage_adamw8bit at 0.7 x 1e-2 where its floor is m2's own warm-up (below 2048 tokens an update, or given)."""
    assert parse_config(argv).lr == pytest.approx(lr)


@pytest.mark.parametrize("argv, horizon", [
    ([], "absent"),  # plumage_adamw pretrains with m2's own warm-up at twice the lr (session 56; 200 in 36-55)
    (["--optimizer", "plumage_adamw_per_layer"], "absent"),
    (["--v_floor_horizon", "500"], 500),
    (["--v_floor_horizon", "none"], None),  # m2's own warm-up, given as a value
    (["--v_floor", "m2"], "absent"),
    (["--optimizer", "plumage_adamw8bit_per_layer"], 200),
    (["--v_floor", "none"], "absent"),  # no floor: no warm-up to shape
    (["--v_floor", "m2_corrected"], "absent"),
    (["--preset", "paper"], "absent"),  # a preset keeps what it was measured with
    (["--preset", "sampled"], "absent"),
    (["--optimizer", "plumage_adamw8bit"], 200),
    (["--optimizer", "galore_adamw"], "absent"),  # GaLore's recipe, and its floor as given
    (["--optimizer", "galore_adamw", "--v_floor", "m2"], "absent"),
])
def test_the_floors_warm_up_defaults_to_the_optimizers_pretraining_horizon(argv, horizon):
    """optimizers.PRETRAIN_V_FLOOR_HORIZON: filled into the options when the flag is not given and the floor is m2
    (at the default 8 x 256 = 2048 tokens an update): plumage_adamw8bit's 200 updates; plumage_adamw has none."""
    options = parse_config(argv).low_rank
    assert options.get("v_floor_horizon", "absent") == horizon


@pytest.mark.parametrize("argv, horizon", [
    (["--max_length", "64"], "absent"),  # 8 x 64 = 512 tokens an update: m2's own warm-up (session 53)
    (["--max_length", "128", "--batch_size", "15"], "absent"),  # 1920: just below the threshold
    (["--max_length", "64", "--batch_size", "32", "--optimizer", "plumage_adamw8bit"], 200),  # 2048 tokens: 8-bit's 200
    (["--max_length", "64", "--batch_size", "8", "--total_batch_size", "32", "--optimizer", "plumage_adamw8bit"],
     200),  # accumulated: tokens an update
    (["--max_length", "64", "--optimizer", "plumage_adamw8bit"], "absent"),
    (["--max_length", "64", "--batch_size", "32"], "absent"),  # plumage_adamw: m2's own at every batch
    (["--max_length", "64", "--v_floor_horizon", "200"], 200),  # a warm-up given is kept
    (["--max_length", "64", "--v_floor", "m2"], "absent"),
])
def test_below_2048_tokens_an_update_the_floor_keeps_m2s_own_warm_up(argv, horizon):
    """optimizers.PRETRAIN_V_FLOOR_HORIZON's threshold: no v_floor_horizon filled in below it, so m2's ~1000 updates."""
    options = parse_config(argv).low_rank
    assert options.get("v_floor_horizon", "absent") == horizon


@pytest.mark.parametrize("argv, floor, horizon", [
    (["--batch_size", "16"], "none", "absent"),  # 16 x 256 = 4096 tokens an update: no floor (session 37)
    (["--batch_size", "8", "--total_batch_size", "64"], "none", "absent"),  # accumulated: tokens an update count
    ([*SHORT_RUN, "--batch_size", "16", "--max_length", "128"], "absent", "absent"),  # 2048 tokens: m2's own warm-up
    (["--batch_size", "16", "--v_floor", "m2"], "m2", "absent"),  # a floor given is kept
    (["--batch_size", "16", "--v_floor_horizon", "300"], "absent", 300),  # a warm-up given keeps the floor
    (["--batch_size", "16", "--v_floor_horizon", "none"], "absent", None),
    (["--batch_size", "16", "--optimizer", "plumage_adamw8bit"], "none", "absent"),  # 8-bit too (session 41)
    (["--batch_size", "16", "--max_length", "128", "--optimizer", "plumage_adamw8bit"], "absent", 200),
    (["--batch_size", "16", "--preset", "paper"], "absent", "absent"),
    (["--batch_size", "16", "--optimizer", "galore_adamw"], "absent", "absent"),
])
def test_plumage_adamw_pretrains_without_the_floor_from_4096_tokens_an_update(argv, floor, horizon):
    """optimizers.PRETRAIN_NO_FLOOR_FROM_TOKENS: v_floor 'none' filled in where neither floor flag is given."""
    options = parse_config(argv).low_rank
    assert (options.get("v_floor", "absent"), options.get("v_floor_horizon", "absent")) == (floor, horizon)


FIRA = {"residual": "norm_matched", "residual_limiter": "fira", "residual_scale": 1.0, "residual_cap": None,
        "residual_horizon": None}


@pytest.mark.parametrize("argv, complement", [
    (["--batch_size", "16"], FIRA),  # 16 x 256 = 4096 tokens an update: Fira's complement (session 38)
    (["--batch_size", "8", "--total_batch_size", "64"], FIRA),  # accumulated: tokens an update count
    ([*SHORT_RUN, "--batch_size", "16", "--max_length", "128"], {}),  # 2048 tokens, 600 updates: no complement
    (["--batch_size", "16", "--residual", "none"], {"residual": "none"}),  # a residual flag given stops it
    (["--batch_size", "16", "--residual_scale", "0.5"], {"residual_scale": 0.5}),
    (["--batch_size", "16", "--optimizer", "plumage_adamw_per_layer"], {}),  # per-layer mode holds no full gradients
    (["--batch_size", "16", "--optimizer", "plumage_adamw8bit"], FIRA),  # 8-bit too (session 41)
    (["--batch_size", "16", "--max_length", "128", "--optimizer", "plumage_adamw8bit"], {}),
    (["--batch_size", "16", "--optimizer", "plumage_adamw8bit_per_layer"], {}),
    (["--batch_size", "16", "--optimizer", "plumage_adafactor"], {}),  # its own complement, at every batch
    (["--batch_size", "16", "--preset", "paper"], {}),
    (["--batch_size", "16", "--optimizer", "galore_adamw"], {}),
])
def test_plumage_adamw_pretrains_with_the_complement_from_4096_tokens_an_update(argv, complement):
    """optimizers.PRETRAIN_COMPLEMENT: its options filled in where no residual flag is given."""
    options = parse_config(argv).low_rank
    assert {key: value for key, value in options.items() if key.startswith("residual")} == complement


@pytest.mark.parametrize("argv, large_batch", [
    ([], True),  # GaLore's 10,000 updates at the demo's 8 x 256 = 2048 tokens an update (session 66)
    (["--num_training_steps", "1000", "--warmup_steps", "100"], True),  # the threshold
    (["--num_training_steps", "999", "--warmup_steps", "100"], False),  # just below it: m2's own warm-up
    (["--max_train_tokens", "2048000", "--warmup_steps", "100"], True),  # 1000 updates of 2048 tokens
    (["--max_train_tokens", "2045952", "--warmup_steps", "100"], False),  # 999
    (["--batch_size", "8", "--max_length", "128", "--total_batch_size", "16"], True),  # accumulated: tokens an update
    (["--max_length", "128", "--batch_size", "15"], False),  # 1920 tokens: the floor at any length
    ([*SMALL_BATCH], False),
    (["--optimizer", "plumage_adamw_per_layer"], False),  # no full gradient for the complement: keeps the floor
    (["--optimizer", "plumage_adamw8bit"], False),  # not measured on 8-bit: its 200-update warm-up
    (["--preset", "sampled"], False),
    (["--optimizer", "galore_adamw"], False),
])
def test_a_long_run_from_2048_tokens_an_update_pretrains_as_a_large_batch(argv, large_batch):
    """optimizers.PRETRAIN_LONG_RUN_LARGE_BATCH: from 2048 tokens an update and 1000 updates (--num_training_steps, or
    --max_train_tokens over the tokens an update) plumage_adamw pretrains as it does from 4096 tokens: no floor, Fira's
    complement, at 0.7 x the library's lr (PRETRAIN_LONG_RUN_LR; the regular group at 2x); elsewhere neither is
    filled in."""
    config = parse_config(argv)
    complement = {key: value for key, value in config.low_rank.items() if key.startswith("residual")}
    if large_batch:
        assert (config.low_rank.get("v_floor"), complement) == ("none", FIRA)
        assert (config.lr, config.regular_lr) == (pytest.approx(7e-3), pytest.approx(1.4e-2))
    else:
        assert (config.low_rank.get("v_floor", "absent"), complement) == ("absent", {})


@pytest.mark.parametrize("argv, options", [
    (["--v_floor", "m2"], {"v_floor": "m2", **FIRA}),  # one flag given stops its own derivation only, as at 4096
    (["--v_floor_horizon", "none"], {"v_floor_horizon": None, **FIRA}),
    (["--residual", "none"], {"v_floor": "none", "residual": "none"}),
])
def test_a_flag_given_stops_its_own_large_batch_derivation(argv, options):
    """The floor and the complement are derived one by one (recommended_v_floor, recommended_residual), for a long
    run at 2048 tokens an update as from 4096."""
    assert parse_config(argv).low_rank == options


def test_the_complement_names_every_residual_option():
    """Any residual flag given stops the derivation because the complement names them all (recommended_residual)."""
    from galore_plumage.optimizers import OPTIONS, PRETRAIN_COMPLEMENT

    residual_options = {option.key for option in OPTIONS if option.key.startswith("residual")}
    assert set(PRETRAIN_COMPLEMENT[("plumage", "adamw")][1]) == residual_options == set(FIRA)


def test_a_large_batch_checkpoint_from_before_session_38_resumes_without_the_complement():
    """A plumage_adamw run at 4096 tokens an update saved in session 37 had no complement: the conflicts name the flag
    that resumes it as it ran, and that flag clears them (an option left out counts as the optimizer's default)."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    saved = asdict(parse_config(["--batch_size", "16", "--residual", "none"]))
    del saved["low_rank"]["residual"]
    now = parse_config(["--batch_size", "16"])
    # an option left out is plumage_adamw's own (residual_limiter steady, scale 0.25, cap 0.5, horizon 10)
    assert resume_conflicts(saved, now) == [
        "--residual norm_matched (the checkpoint: not given; as it ran: --residual none)",
        "--residual_cap None (the checkpoint: not given)",
        "--residual_horizon None (the checkpoint: not given)",
        "--residual_limiter fira (the checkpoint: not given)",
        "--residual_scale 1.0 (the checkpoint: not given)"]
    assert resume_conflicts(saved, parse_config(["--batch_size", "16", "--residual", "none"])) == []


def test_a_large_batch_checkpoint_from_before_session_37_resumes_with_its_floor():
    """A plumage_adamw run at 4096 tokens an update saved in session 36 had the floor with H = 200; both conflicts
    name the one flag that resumes it as it ran, and that flag clears them."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    saved = asdict(parse_config(["--batch_size", "16", "--v_floor_horizon", "200"]))
    now = parse_config(["--batch_size", "16"])
    assert resume_conflicts(saved, now) == [
        "--v_floor none (the checkpoint: not given; the floor it ran with: --v_floor_horizon 200)",
        "--v_floor_horizon not given (the checkpoint: 200)"]
    assert resume_conflicts(saved, parse_config(["--batch_size", "16", "--v_floor_horizon", "200"])) == []


def test_a_large_batch_8bit_checkpoint_from_before_session_41_resumes_with_its_floor_and_no_complement():
    """A plumage_adamw8bit run at 4096 tokens an update saved in session 40 had the floor's 200-update warm-up and no
    complement: the conflicts name the flags that resume it as it ran, and those flags clear them."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    eight_bit = ["--batch_size", "16", "--optimizer", "plumage_adamw8bit"]
    saved = asdict(parse_config([*eight_bit, "--v_floor_horizon", "200", "--residual", "none"]))
    del saved["low_rank"]["residual"]
    assert resume_conflicts(saved, parse_config(eight_bit)) == [
        "--residual norm_matched (the checkpoint: not given; as it ran: --residual none)",
        "--residual_cap None (the checkpoint: not given)",
        "--residual_horizon None (the checkpoint: not given)",
        "--residual_limiter fira (the checkpoint: not given)",
        "--residual_scale 1.0 (the checkpoint: not given)",
        "--v_floor none (the checkpoint: not given; the floor it ran with: --v_floor_horizon 200)",
        "--v_floor_horizon not given (the checkpoint: 200)"]
    as_it_ran = parse_config([*eight_bit, "--v_floor_horizon", "200", "--residual", "none"])
    assert resume_conflicts(saved, as_it_ran) == []


def test_an_adafactor_checkpoint_from_before_session_42_resumes_at_one_lr():
    """plumage_adafactor pretrained at one lr until session 42: the conflict names the flag that resumes such a run as
    it ran, and that flag clears it (its low-rank settings come back with the optimizer's state)."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    adafactor = ["--optimizer", "plumage_adafactor", "--lr", "1e-2"]
    saved = asdict(parse_config([*adafactor, "--regular_lr_ratio", "1"]))
    saved["regular_lr_ratio"] = None  # not given then: one lr was the default
    (conflict,) = resume_conflicts(saved, parse_config(adafactor))
    assert conflict == "--regular_lr 0.04 (the checkpoint: None; one lr on every group: --regular_lr_ratio 1)"
    assert resume_conflicts(saved, parse_config([*adafactor, "--regular_lr_ratio", "1"])) == []


def test_an_adafactor_checkpoint_of_sessions_42_to_80_resumes_its_draws_at_2x():
    """plumage_adafactor drew PLUMAGE's sample at 2x the regular group's lr in sessions 42-80; its default is now
    GaLore's basis at 4x. The draws come back with the optimizer's state (its param groups); the conflict names the
    ratio it ran at, and that flag clears it."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    adafactor = ["--optimizer", "plumage_adafactor", "--lr", "1e-2"]
    saved = asdict(parse_config([*adafactor, "--regular_lr_ratio", "2"]))
    saved["regular_lr_ratio"] = None  # not given then: 2x was the default
    (conflict,) = resume_conflicts(saved, parse_config(adafactor))
    assert conflict == "--regular_lr 0.04 (the checkpoint: 0.02; as it ran: --regular_lr_ratio 2)"
    assert resume_conflicts(saved, parse_config([*adafactor, "--regular_lr_ratio", "2"])) == []


def test_a_checkpoint_from_sessions_36_to_55_resumes_with_its_warm_up_and_lr():
    """A plumage_adamw run at 2048 tokens an update saved in sessions 36-55 warmed its floor up over 200 updates at the
    library's lr 1e-2; today's default is m2's own warm-up at 2e-2 (PRETRAIN_LR). The conflicts name the one flag that
    resumes it as it ran (the lr follows the warm-up), and that flag clears them."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    saved = asdict(parse_config([*SHORT_RUN, "--v_floor_horizon", "200"]))
    assert (saved["lr"], saved["low_rank"]) == (1e-2, {"v_floor_horizon": 200})
    assert resume_conflicts(saved, parse_config(SHORT_RUN)) == [
        "--lr 0.02 (the checkpoint: 0.01)",
        "--regular_lr 0.04 (the checkpoint: 0.02)",
        "--v_floor_horizon not given (the checkpoint: 200; as it ran, at the lr it ran at: --v_floor_horizon 200)"]
    assert resume_conflicts(saved, parse_config([*SHORT_RUN, "--v_floor_horizon", "200"])) == []


def test_a_checkpoint_from_before_session_36_resumes_at_its_lr():
    """A plumage_adamw run saved before session 36 had m2's own warm-up, as today's default, but at lr 1e-2: the
    conflicts name the lr, and giving it clears them."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    saved = asdict(parse_config([*SHORT_RUN, "--lr", "1e-2"]))
    assert saved["low_rank"] == {}
    assert resume_conflicts(saved, parse_config(SHORT_RUN)) == ["--lr 0.02 (the checkpoint: 0.01)",
                                                                "--regular_lr 0.04 (the checkpoint: 0.02)"]
    assert resume_conflicts(saved, parse_config([*SHORT_RUN, "--lr", "1e-2"])) == []


@pytest.mark.parametrize("optimizer", ["plumage_adamw", "plumage_adamw8bit"])
def test_a_long_run_from_before_its_long_run_lr_resumes_at_its_lr(optimizer):
    """A run of 1000 updates or more below 2048 tokens an update saved before its long-run lr (plumage_adamw before
    session 64, plumage_adamw8bit before session 82) ran at the library's 1e-2; today's default there is 0.7 x 1e-2
    (PRETRAIN_LONG_RUN_LR). The conflicts name the lr, and giving it clears them."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    argv = [*SMALL_BATCH, "--optimizer", optimizer]  # GaLore's 10,000 updates
    saved = asdict(parse_config([*argv, "--lr", "1e-2"]))  # at that run's default lr
    assert resume_conflicts(saved, parse_config(argv)) == ["--lr 0.007 (the checkpoint: 0.01)",
                                                           "--regular_lr 0.014 (the checkpoint: 0.02)"]
    assert resume_conflicts(saved, parse_config([*argv, "--lr", "1e-2"])) == []


def test_a_long_run_from_session_66_resumes_at_its_lr():
    """A plumage_adamw run of 1000 updates or more at 2048 tokens an update saved in session 66 pretrained as a large
    batch (no floor, Fira's complement) at the library's 1e-2; today's default there is 0.7 x 1e-2
    (PRETRAIN_LONG_RUN_LR). The conflicts name the lr, and giving it clears them."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    saved = asdict(parse_config(["--lr", "1e-2"]))  # GaLore's 10,000 updates at the demo's 8 x 256 tokens
    assert resume_conflicts(saved, parse_config([])) == ["--lr 0.007 (the checkpoint: 0.01)",
                                                         "--regular_lr 0.014 (the checkpoint: 0.02)"]
    assert resume_conflicts(saved, parse_config(["--lr", "1e-2"])) == []


AS_IT_RAN = ["--v_floor_horizon", "none", "--residual", "none"]  # m2's own warm-up and no complement, given


def _saved_with_m2s_own_warm_up(lr: str) -> dict:
    """The config a plumage_adamw run of GaLore's 10,000 updates at the demo's 8 x 256 tokens saved before session
    66 at `lr`: the class's floor (m2, its own warm-up) and no complement, neither written into the options."""
    from dataclasses import asdict

    saved = asdict(parse_config(["--lr", lr, *AS_IT_RAN]))
    del saved["low_rank"]["v_floor_horizon"], saved["low_rank"]["residual"]
    return saved


def test_a_long_run_from_session_65_resumes_with_the_floor_it_ran_with():
    """A plumage_adamw run of 1000 updates or more at 2048 tokens an update saved in session 65 ran with m2's own
    warm-up at 0.7 x 2e-2; today's default there is a large batch's (PRETRAIN_LONG_RUN_LARGE_BATCH: no floor, Fira's
    complement, 0.7 x 1e-2). The conflicts name the flags that resume it as it ran, and those flags clear them (the
    lr derived again from the floor they keep)."""
    from galore_plumage.training.config import resume_conflicts

    saved = _saved_with_m2s_own_warm_up("1.4e-2")
    assert resume_conflicts(saved, parse_config([])) == [
        "--lr 0.007 (the checkpoint: 0.014)", "--regular_lr 0.014 (the checkpoint: 0.028)",
        "--residual norm_matched (the checkpoint: not given; as it ran: --residual none)",
        "--residual_cap None (the checkpoint: not given)", "--residual_horizon None (the checkpoint: not given)",
        "--residual_limiter fira (the checkpoint: not given)", "--residual_scale 1.0 (the checkpoint: not given)",
        "--v_floor none (the checkpoint: not given; the floor it ran with: --v_floor_horizon none)"]
    assert resume_conflicts(saved, parse_config(AS_IT_RAN)) == []


def test_a_long_run_from_before_session_65_resumes_at_its_lr():
    """The same run saved in sessions 56-64 ran at PRETRAIN_LR's 2e-2: with the flags above the conflicts name the
    lr (0.7 x 2e-2 under m2's own warm-up, PRETRAIN_LONG_RUN_LR), and giving it clears them."""
    from galore_plumage.training.config import resume_conflicts

    saved = _saved_with_m2s_own_warm_up("2e-2")
    assert resume_conflicts(saved, parse_config(AS_IT_RAN)) == ["--lr 0.014 (the checkpoint: 0.02)",
                                                                "--regular_lr 0.028 (the checkpoint: 0.04)"]
    assert resume_conflicts(saved, parse_config([*AS_IT_RAN, "--lr", "2e-2"])) == []


# ----------------------------------------------------------------- defaults
def test_default_dtype_follows_the_device():
    """float32 where bf16 is not supported (CPU), bfloat16 where it is; an explicit --dtype always wins."""
    assert parse_config([], cuda_bf16=False).dtype == "float32"
    assert parse_config([], cuda_bf16=True).dtype == "bfloat16"
    assert parse_config(["--dtype", "float32"], cuda_bf16=True).dtype == "float32"
    assert parse_config(["--dtype", "bfloat16"], cuda_bf16=False).dtype == "bfloat16"


def test_default_save_dir_names_model_and_optimizer():
    assert parse_config([]).save_dir == "runs/llama_tiny-plumage_adamw"
    config = parse_config(["--model_config", "configs/llama_micro.json", "--optimizer", "GaLore_AdamW"])
    assert config.save_dir == "runs/llama_micro-galore_adamw"
    assert parse_config(["--save_dir", "elsewhere"]).save_dir == "elsewhere"


def test_defaults_and_progress_toggle():
    """Defaults a GaLore user relies on, and --no-progress (a BooleanOptionalAction)."""
    config = parse_config([])
    assert isinstance(config, TrainConfig)
    assert (config.optimizer, config.scheduler, config.proj_type, config.dataset, config.tokenizer) == (
        "plumage_adamw", "cosine", "std", "shakespeare", "bpe")
    assert (config.projector, config.realign, config.galore_scale, config.continue_from, config.stop_at) == (None,) * 5
    assert config.progress is True and parse_config(["--no-progress"]).progress is False
    assert config.tokens_per_update == config.total_batch_size * config.max_length


@pytest.mark.parametrize("flag,value", [("--dataset", "no/such/corpus.txt"), ("--dataset", "missing.jsonl"),
                                        ("--model_config", "configs/llama_nosuch.json")])
def test_missing_files_are_refused_before_the_run_starts(flag, value):
    """A local dataset or model config that does not exist fails in parsing, naming the path, so under torchrun
    no rank starts work (or waits at a barrier) on behalf of a job that cannot run."""
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        parse_config([flag, value])


def test_a_file_in_another_format_is_named_not_sent_to_the_hub(tmp_path):
    """foo.csv used to reach the tokenizer as a hub dataset name; now a missing one is "no such file" and an
    existing one is told which formats are read."""
    with pytest.raises(ValueError, match=re.escape("--dataset 'foo.csv': no such file")):
        parse_config(["--dataset", "foo.csv"])
    table = tmp_path / "corpus.csv"
    table.write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"read from \.txt .* or \.jsonl .*; convert the file"):
        parse_config(["--dataset", str(table)])


def test_eval_budget_follows_the_dataset(tmp_path):
    """GaLore's 10M tokens for a streamed hub dataset; 100K for the bundled or a local corpus, where 10M meant
    the whole split at every evaluation of a short run; a given value always wins."""
    local = tmp_path / "docs.txt"
    local.write_text("a\n\nb\n")
    assert parse_config([]).eval_tokens == 100_000
    assert parse_config(["--dataset", str(local)]).eval_tokens == 100_000
    assert parse_config(["--dataset", "allenai/c4"]).eval_tokens == 10_000_000
    assert parse_config(["--dataset", "allenai/c4", "--eval_tokens", "5000"]).eval_tokens == 5000


def test_a_checkpoint_from_before_the_ratio_resumes_with_one_lr():
    """A plumage_adamw run saved before --regular_lr_ratio existed had one lr (regular_lr None); resumed with today's
    default (2x) it would be another run, so the conflict names the flag that restores it, and that flag clears it."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    saved = asdict(parse_config([*SHORT_RUN, "--regular_lr_ratio", "1"]))
    del saved["regular_lr_ratio"]  # the checkpoint predates the flag
    (conflict,) = resume_conflicts(saved, parse_config(SHORT_RUN))
    assert conflict == "--regular_lr 0.04 (the checkpoint: None; one lr on every group: --regular_lr_ratio 1)"
    assert resume_conflicts(saved, parse_config([*SHORT_RUN, "--regular_lr_ratio", "1"])) == []


@pytest.mark.parametrize("argv, sample_until", [
    (["--optimizer", "plumage_adafactor", "--projector", "plumage", "--num_training_steps", "5000"], 1000),
    (["--optimizer", "plumage_adafactor", "--projector", "plumage", "--num_training_steps", "4999"], "absent"),
    (["--optimizer", "plumage_adafactor", "--projector", "plumage", "--max_train_tokens", "2560000", "--batch_size", "8",
      "--max_length", "64"], 1000),  # 5000 updates of 512 tokens
    (["--optimizer", "plumage_adafactor_per_layer", "--projector", "plumage", "--num_training_steps", "5000"], 1000),
    (["--optimizer", "plumage_adafactor", "--projector", "plumage", "--num_training_steps", "5000", "--sample_until",
      "none"], None),
    (["--optimizer", "plumage_adafactor", "--projector", "plumage", "--num_training_steps", "5000", "--sample_until",
      "2000"], 2000),
    (["--optimizer", "plumage_adafactor", "--num_training_steps", "5000"], "absent"),  # GaLore's basis since session 81
    (["--optimizer", "plumage_adafactor", "--num_training_steps", "5000", "--preset", "paper"], "absent"),
    (["--optimizer", "plumage_adamw", "--num_training_steps", "5000", "--projector", "plumage"], "absent"),
    (["--optimizer", "galore_adafactor", "--num_training_steps", "5000"], "absent"),
])
def test_a_long_plumage_adafactor_run_draws_over_its_first_1000_updates(argv, sample_until):
    """optimizers.PRETRAIN_SAMPLE_UNTIL: plumage_adafactor with PLUMAGE's projector (--projector plumage; its default
    of sessions 42-80) pretrains with the draws until update 1000 in a run of 5000 updates or more, unless --sample_until
    is given (as 'none' too) or a preset is named; its default projector does not sample, and no other name derives it."""
    assert parse_config(argv).low_rank.get("sample_until", "absent") == sample_until


def test_a_long_plumage_adafactor_checkpoint_from_before_session_77_resumes_drawing_throughout():
    """A run of 5000 updates saved before PRETRAIN_SAMPLE_UNTIL drew throughout: the conflict names the flag that
    resumes it as it ran, and that flag clears it."""
    from dataclasses import asdict

    from galore_plumage.training.config import resume_conflicts

    argv = ["--optimizer", "plumage_adafactor", "--projector", "plumage", "--num_training_steps", "5000"]
    saved = asdict(parse_config([*argv, "--sample_until", "none"]))
    del saved["low_rank"]["sample_until"]
    assert resume_conflicts(saved, parse_config(argv)) == [
        "--sample_until 1000 (the checkpoint: not given; as it ran: --sample_until none)"]
    assert resume_conflicts(saved, parse_config([*argv, "--sample_until", "none"])) == []
