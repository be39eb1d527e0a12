"""The protocol's arms (benchmarks/protocol_arms.py) as torchrun_main.py reads them: every arm's command parses (a
flag a backend refuses fails here, not an hour into a sweep), the arms that measure plumage_adafactor's settings
(its default since and until session 42, the top-r basis beside it) train as the bare name does with them, and the
arm that measured plumage_sgdm's default is what the bare name pretrains with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "optimizers"))
import pretrain_protocol  # noqa: E402
from plumage_flags import with_family_pins  # noqa: E402
from protocol_arms import ARMS  # noqa: E402
from test_build_optimizer import _model  # noqa: E402

from galore_plumage.training.config import parse_config  # noqa: E402
from galore_plumage.training.loop import make_optimizer  # noqa: E402


@pytest.mark.parametrize("label", sorted(ARMS))
def test_every_arm_parses(label, tmp_path):
    optimizer, extra, lrs = ARMS[label]
    command = pretrain_protocol.command_for(optimizer, extra, 0, lrs[0], pretrain_protocol.parse_args([]), tmp_path)
    config = parse_config(command[2:])  # past the interpreter and torchrun_main.py
    assert config.optimizer == optimizer and config.lr == lrs[0]


def _trained(argv: list[str]) -> tuple[list[torch.Tensor], list[float]]:
    """The weights after 5 updates (refreshes at 1, 3 and 5) of the optimizer argv builds, and its groups' lrs."""
    model = _model()
    optimizer = make_optimizer(parse_config(argv), model)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        for param in model.parameters():
            if param.requires_grad:
                param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], [g["lr"] for g in optimizer.param_groups]


def _arm(label: str) -> list[str]:
    optimizer, extra, _ = ARMS[label]
    return ["--optimizer", optimizer, *with_family_pins(optimizer, extra)]


# plumage_adafactor's draws of sessions 42-80 by flag (PLUMAGE_ADAFACTOR_DRAWS)
DRAWS = ["--projector", "plumage", "--realign", "mv", "--solver", "svd", "--residual", "norm_matched"]


@pytest.mark.parametrize(("label", "bare"), [
    # plumage_adafactor's default since session 81: GaLore's top-r basis at scale 0.25, the regular group at 4x
    ("galore_adafactor_recipe_gram_ratio4", ["--optimizer", "plumage_adafactor", "--beta1", "0.9"]),
    # its default of sessions 42-80: PLUMAGE's draws at scale 0.25, the regular group at 2x
    ("plumage_adafactor_draws_recipe_ratio2", ["--optimizer", "plumage_adafactor", "--beta1", "0.9", *DRAWS,
                                               "--regular_lr_ratio", "2"]),
    # its default until then: the same draws at scale 1, one lr
    ("plumage_adafactor_default", ["--optimizer", "plumage_adafactor", "--beta1", "0.9", "--galore_scale", "1",
                                   *DRAWS, "--regular_lr_ratio", "1"]),
    # GaLore's top-r basis at the draws' scale and lrs, through the Gram
    ("galore_adafactor_recipe_gram_ratio2", ["--optimizer", "plumage_adafactor", "--beta1", "0.9", "--solver", "gram",
                                             "--regular_lr_ratio", "2"]),
    # plumage_sgdm's default since session 46 (its momentum 0.9 the name's own since session 89)
    ("plumage_sgdm_draws_recipe_clip1", ["--optimizer", "plumage_sgdm"]),
])
def test_an_arm_trains_as_the_setting_it_measures(label, bare):
    common = ["--lr", "1e-2", "--rank", "4", "--update_proj_gap", "2"]
    (arm_weights, arm_lrs), (bare_weights, bare_lrs) = _trained(_arm(label) + common), _trained(bare + common)
    assert arm_lrs == bare_lrs
    assert all(torch.equal(a, b) for a, b in zip(arm_weights, bare_weights, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(arm_weights, _model().parameters(), strict=True))


def test_plumage_sgdm_pretrains_at_the_clip_and_lr_its_arm_was_best_at():
    """Sessions 88-89: the bare name clips at 1 and takes lr 0.8, the arm's bracketed best clipped (the protocol gives
    the arm its lr and clip by flag)."""
    short = ["--num_training_steps", "600", "--warmup_steps", "60"]
    bare = parse_config(["--optimizer", "plumage_sgdm", *short])
    arm = parse_config([*_arm("plumage_sgdm_draws_recipe_clip1"), "--lr", "0.8", *short])
    assert (bare.lr, bare.beta1, bare.grad_clipping) == (arm.lr, arm.beta1, arm.grad_clipping) == (0.8, 0.9, 1.0)
