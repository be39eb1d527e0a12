"""pretrain_protocol's arms as torchrun_main.py reads them: every arm's command parses (a flag a backend refuses fails
here, not an hour into a sweep), and the arm that measures plumage_adafactor's default builds the optimizer that the
bare name builds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "optimizers"))
import pretrain_protocol  # noqa: E402
from plumage_flags import with_family_pins  # noqa: E402
from test_build_optimizer import _model  # noqa: E402

from galore_plumage.training.config import parse_config  # noqa: E402
from galore_plumage.training.loop import make_optimizer  # noqa: E402


@pytest.mark.parametrize("label", sorted(pretrain_protocol.ARMS))
def test_every_arm_parses(label, tmp_path):
    optimizer, extra, lrs = pretrain_protocol.ARMS[label]
    command = pretrain_protocol.command_for(optimizer, extra, 0, lrs[0], pretrain_protocol.parse_args([]), tmp_path)
    config = parse_config(command[2:])  # past the interpreter and torchrun_main.py
    assert config.optimizer == optimizer and config.lr == lrs[0]


def _low_rank_group(argv: list[str]) -> dict:
    optimizer = make_optimizer(parse_config(argv), _model())
    (group,) = [g for g in optimizer.param_groups if "rank" in g]
    return {key: value for key, value in group.items() if key != "params"}


def test_the_adafactor_default_arm_is_plumage_adafactors_default():
    optimizer, extra, _ = pretrain_protocol.ARMS["plumage_adafactor_default"]
    arm = _low_rank_group(["--optimizer", optimizer, *with_family_pins(optimizer, extra), "--lr", "1e-2"])
    bare = _low_rank_group(["--optimizer", "plumage_adafactor", "--beta1", "0.9", "--lr", "1e-2"])
    assert arm == bare
    assert arm["projector"] == "plumage" and arm["resample_every"] == 1 and arm["residual"] == "norm_matched"
