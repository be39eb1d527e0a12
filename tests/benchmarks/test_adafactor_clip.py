"""benchmarks/adafactor_clip.py: its measurement leaves Adafactor's updates as they are and records their RMS before
the clip; its summary counts the low-rank weights only; an arm that is not Adafactor is refused by name."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from adafactor_clip import arm_argv, recording, summary_rows  # noqa: E402

from galore_plumage.optimizers.adafactor import factored_directions_together  # noqa: E402


def _inputs(seed: int) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    grads = [torch.randn(4, 9, generator=generator), torch.randn(4, 5, generator=generator) * 30]
    rows = [torch.rand(4, generator=generator) + 0.1 for _ in grads]
    rows[1][0] = 0.0  # a row just entered: its second moment zeroed, so its step is large and the clip acts
    cols = [torch.rand(grad.shape[1], generator=generator) + 0.1 for grad in grads]
    return grads, rows, cols


def test_the_recorded_clip_gives_the_librarys_updates_and_their_rms_before_it():
    grads, rows, cols = _inputs(0)
    expected = factored_directions_together(grads, [r.clone() for r in rows], [c.clone() for c in cols], 0.9, 1e-30, 1.0)
    records = []
    _, clipped_together = recording(records)
    unclipped = factored_directions_together(grads, [r.clone() for r in rows], [c.clone() for c in cols], 0.9, 1e-30,
                                             float("inf"))
    measured = clipped_together(grads, [r.clone() for r in rows], [c.clone() for c in cols], 0.9, 1e-30, 1.0)
    for got, want in zip(measured, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert [shape for shape, _ in records] == [[4, 9], [4, 5]]
    for (_, value), update in zip(records, unclipped, strict=True):
        assert value == pytest.approx(float(update.norm() / update.numel() ** 0.5), rel=1e-6)
    assert records[1][1] > 1.0  # the zeroed row's weight was clipped


def test_the_summary_counts_updates_of_the_ranks_shape_only():
    records = [([64, 300], 4.0), ([300, 64], 2.0), ([256, 256], 50.0), ([64, 300], 0.5), ([300, 64], 1.0)]
    (row,) = summary_rows("arm", 1e-2, records, rank=64, parts=1)
    # the [256, 256] record (a parameter's RMS, or a regular weight) is left out: median of 4, 2, 0.5, 1 is 1.5
    assert row == "| arm | 0.01 | 1 of 1 | 1.50 | 0.50 | 2.00 |"


def test_an_arm_that_is_not_adafactor_is_refused_by_name(tmp_path):
    args = SimpleNamespace(model_config="configs/llama_tiny.json", updates=10, rank=64)
    with pytest.raises(SystemExit, match="galore_recipe.*not Adafactor"):
        arm_argv("galore_recipe", 1e-2, args, tmp_path)
    assert arm_argv("galore_adafactor_recipe", 3e-3, args, tmp_path)[:2] == ["--optimizer", "galore_adafactor"]
