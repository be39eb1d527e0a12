"""row_bias_correction: each basis row bias-corrected by its own weight, so a direction entering at a refresh starts
at Adam's size (±1) instead of (1 − β1)/√(1 − β2) ≈ 3.2; rows that never moved match the global correction."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from galore_plumage.optimizers.adamw import AdamWBackend
from galore_plumage.projectors import SVDProjector

BETAS = (0.9, 0.999)
GROUP = {"lr": 1.0, "betas": BETAS, "eps": 1e-12, "weight_decay": 0.0, "correct_bias": True,
         "row_bias_correction": True}


@pytest.mark.parametrize("rows", [0, 1])
def test_rows_that_never_moved_match_the_global_bias_correction(rows):
    backend, generator = AdamWBackend(), torch.Generator().manual_seed(0)
    per_row, global_ = {"step": 0}, {"step": 0}
    for _ in range(7):
        grad = torch.randn(4, 6, generator=generator, dtype=torch.float64)
        per_row["step"] += 1
        global_["step"] += 1
        a = backend.update(per_row, grad, GROUP, None, rows=rows)
        b = backend.update(global_, grad, {**GROUP, "row_bias_correction": False}, None, rows=rows)
        torch.testing.assert_close(a.step_size * a.direction, b.step_size * b.direction, rtol=1e-9, atol=1e-12)
    assert per_row["row_bias1"].shape == (grad.shape[rows],)
    torch.testing.assert_close(per_row["row_bias1"], torch.full_like(per_row["row_bias1"], 1 - BETAS[0] ** 7))


def test_a_direction_entering_at_a_refresh_starts_at_unit_size():
    """Two refreshes on gradients with orthogonal column spaces: every row of the new basis is new (B = 0)."""
    basis = torch.linalg.qr(torch.randn(12, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)).Q
    first = basis[:, :3] @ torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)) @ torch.randn(3, 8, dtype=torch.float64)
    second = basis[:, 3:6] @ torch.randn(3, 8, dtype=torch.float64)
    backend = AdamWBackend()
    states = {}
    for correct_rows in (True, False):
        projector = SVDProjector(3, proj_type="left", update_proj_gap=10)
        state, group = {"step": 0}, {**GROUP, "row_bias_correction": correct_rows}
        projector.refresh(first, 0)
        for _ in range(50):
            state["step"] += 1
            backend.update(state, projector.project(first), group, None, rows=0)
        projector.refresh(second, 50)
        assert projector.transition[0].abs().max() < 1e-12  # nothing of the old basis carries over
        backend.realign(state, projector, "mv")
        state["step"] += 1
        update = backend.update(state, projector.project(second), group, None, rows=0)
        states[correct_rows] = (update.step_size * update.direction).abs()
    torch.testing.assert_close(states[True], torch.ones_like(states[True]), rtol=1e-9, atol=0)
    expected = (1 - BETAS[0]) / math.sqrt(1 - BETAS[1]) * math.sqrt(1 - BETAS[1] ** 51) / (1 - BETAS[0] ** 51)
    torch.testing.assert_close(states[False], torch.full_like(states[False], expected), rtol=1e-6, atol=0)


def test_realign_none_keeps_the_row_weights():
    projector = SVDProjector(2, proj_type="left", update_proj_gap=1)
    generator = torch.Generator().manual_seed(2)
    state, backend = {"step": 0}, AdamWBackend()
    for step in range(3):
        grad = torch.randn(6, 5, generator=generator, dtype=torch.float64)
        projector.refresh(grad, step)
        before = state.get("row_bias1", torch.zeros(2, dtype=torch.float64)).clone()
        backend.realign(state, projector, "none")
        if "row_bias1" in state:
            assert torch.equal(state["row_bias1"], before)
        state["step"] += 1
        backend.update(state, projector.project(grad), GROUP, None, rows=0)


def _weight():
    torch.manual_seed(0)
    return nn.Linear(10, 8, bias=False).weight


