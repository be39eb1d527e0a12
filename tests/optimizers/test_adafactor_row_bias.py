"""Adafactor's row_bias_correction: the factor along the basis divided by each direction's own weight c, so a
direction entering at a refresh or a draw reads its own mean square instead of (1 − β2ₜ) times it.

Without it an entering direction's update is t^0.4 times a settled one's (Adafactor's β2ₜ = 1 − t^−0.8), and the
update clip (RMS ≤ 1) then shrinks every direction of the weight: session 78 measured that clip at 3.5–8.5× on
PLUMAGE's draws (docs/adafactor_clip.md). Directions that never moved step exactly as plain Adafactor's.
"""

from __future__ import annotations

import pytest
import torch

from galore_plumage import GaLoreAdafactor, PlumageAdafactor
from galore_plumage.optimizers.adafactor import AdafactorBackend
from galore_plumage.projectors import SVDProjector

# lr 1 and no clip: the update is G / √V̂ itself
GROUP = {"lr": 1.0, "eps": (1e-30, 1e-3), "clip_threshold": float("inf"), "decay_rate": -0.8, "beta1": None,
         "weight_decay": 0.0, "scale_parameter": False, "relative_step": False, "warmup_init": False,
         "row_bias_correction": True}
RANK, WIDTH, SETTLE = 3, 64, 1000
PARAM = torch.zeros(1)  # the weight: read for its RMS, which scale_parameter=False leaves unused


@pytest.mark.parametrize("rows", [0, 1])
def test_directions_that_never_moved_step_as_plain_adafactor(rows):
    backend, generator = AdafactorBackend(), torch.Generator().manual_seed(0)
    corrected, plain = {"step": 0}, {"step": 0}
    for _ in range(7):
        grad = _gaussian(rows, generator)
        corrected["step"] += 1
        plain["step"] += 1
        a = backend.update(corrected, grad, GROUP, PARAM, rows=rows)
        b = backend.update(plain, grad, {**GROUP, "row_bias_correction": False}, PARAM, rows=rows)
        torch.testing.assert_close(a.direction, b.direction, rtol=1e-6, atol=0)
    torch.testing.assert_close(corrected["row_bias2"], torch.ones(RANK), rtol=1e-6, atol=0)


def _projector_moving_two_of_three(side: str) -> SVDProjector:
    """An SVD projector refreshed twice, on gradients spanned by basis vectors {0, 1, 2} and then {0, 3, 4}: the
    second basis keeps its first direction and takes two new ones (B's rows: ±e₀, 0, 0)."""
    q = torch.linalg.qr(torch.randn(12, 12, generator=torch.Generator().manual_seed(1))).Q
    right = torch.linalg.qr(torch.randn(10, 3, generator=torch.Generator().manual_seed(2))).Q.T
    scale = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    grads = [q[:, columns] @ scale @ right for columns in ([0, 1, 2], [0, 3, 4])]
    projector = SVDProjector(RANK, proj_type=side, update_proj_gap=SETTLE)
    for step, grad in enumerate(grads):
        projector.refresh(grad if side == "left" else grad.T, step * SETTLE)
    (mode,) = projector.factors
    kept = projector.transition[mode].square().sum(dim=1)
    torch.testing.assert_close(kept, torch.tensor([1.0, 0.0, 0.0]), rtol=0, atol=1e-6)
    return projector


def _stepped(updates: int, seed: int, rows: int = 0, group: dict = GROUP) -> tuple[dict, torch.Generator]:
    """An Adafactor state after `updates` updates of the low-rank gradient on N(0, 1) draws, and the draws' generator."""
    backend, generator, state = AdafactorBackend(), torch.Generator().manual_seed(seed), {"step": 0}
    for _ in range(updates):
        state["step"] += 1
        backend.update(state, _gaussian(rows, generator), group, PARAM, rows=rows)
    return state, generator


def _gaussian(rows: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn((RANK, WIDTH) if rows == 0 else (WIDTH, RANK), generator=generator)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_direction_entering_at_a_refresh_steps_at_a_settled_one_s_size(side):
    """SETTLE updates on N(0, 1) gradients, a refresh that brings two new directions, one more update: corrected, each
    direction's update has RMS ≈ 1 (an entering one's exactly, its V̂ being this update's own mean square); plain,
    the entering ones' is ≈ t^0.4 (15.8 at t = 1001)."""
    rows = 0 if side == "left" else 1
    sizes = {}
    for corrected in (True, False):
        group = {**GROUP, "row_bias_correction": corrected}
        state, generator = _stepped(SETTLE, 3, rows, group)
        AdafactorBackend().realign(state, _projector_moving_two_of_three(side), "mv")
        if corrected:
            torch.testing.assert_close(state["row_bias2"], torch.tensor([1.0, 0.0, 0.0]), rtol=0, atol=1e-6)
        state["step"] += 1
        update = AdafactorBackend().update(state, _gaussian(rows, generator), group, PARAM, rows=rows)
        per_direction = update.direction.square().mean(dim=1 - rows).sqrt()
        sizes[corrected] = per_direction
    t_power = (SETTLE + 1) ** 0.4
    # the settled direction: ~1 either way (the realigned factors keep its V̂); 64 entries an estimate, so ±25%
    assert 0.75 < sizes[True][0] < 1.25 and 0.75 < sizes[False][0] < 1.25
    # entering, corrected: V̂'s row (left) reads this update's own mean square; right, this update's over the column
    # factor (itself an average over 64 rows), so ~1 within the same ±25%
    assert torch.all((sizes[True][1:] > 0.75) & (sizes[True][1:] < 1.25)), sizes[True]
    assert torch.all(sizes[False][1:] > 0.6 * t_power), sizes[False]


def test_the_column_factor_keeps_its_scale_through_a_left_refresh():
    """Plain Adafactor rescales the column factor by mean(new row) / mean(row) at a refresh along the rows (its V̂
    divides by mean(row)); corrected, V̂ divides by mean(row / c), whose new rows are their next mean square: the
    column factor stays."""
    state, _ = _stepped(5, 4)
    col = state["exp_avg_sq_col"].clone()
    AdafactorBackend().realign(state, _projector_moving_two_of_three("left"), "mv")
    assert torch.equal(state["exp_avg_sq_col"], col)
    assert state["exp_avg_sq_row"][1:].abs().max() < 1e-6  # the entering rows: nothing carried


@pytest.mark.parametrize("rule", ["none", "m"])
def test_rules_that_keep_v_keep_the_weights(rule):
    state, _ = _stepped(3, 5)
    before = state["row_bias2"].clone()
    AdafactorBackend().realign(state, _projector_moving_two_of_three("left"), rule)
    assert torch.equal(state["row_bias2"], before)


def test_a_checkpoint_from_before_the_option_resumes_with_settled_weights():
    """Factors written without the option have no weights: they are settled (Adafactor's first β2ₜ is 0), so c = 1."""
    backend = AdafactorBackend()
    corrected, generator = _stepped(4, 6, group={**GROUP, "row_bias_correction": False})
    plain = {key: value.clone() if torch.is_tensor(value) else value for key, value in corrected.items()}
    grad = _gaussian(0, generator)
    for state in (corrected, plain):
        state["step"] += 1
    a = backend.update(corrected, grad, GROUP, PARAM, rows=0)
    b = backend.update(plain, grad, {**GROUP, "row_bias_correction": False}, PARAM, rows=0)
    torch.testing.assert_close(a.direction, b.direction, rtol=1e-6, atol=0)


def test_switched_off_on_resume_the_weights_are_dropped():
    """A checkpoint written with the option, resumed without it: V̂ is plain again, so the weights go and realign
    rescales the column factor at a refresh along the rows, as plain Adafactor's does."""
    state, generator = _stepped(3, 7)
    state["step"] += 1
    AdafactorBackend().update(state, _gaussian(0, generator), {**GROUP, "row_bias_correction": False}, PARAM, rows=0)
    assert "row_bias2" not in state
    together, generator = _stepped(3, 8)  # the same where the weights step together (foreach)
    together["step"] += 1
    AdafactorBackend().update_together([together], [_gaussian(0, generator)], {**GROUP, "row_bias_correction": False},
                                       [PARAM], [0])
    assert "row_bias2" not in together


def test_the_optimizers_take_it_and_refuse_it_with_compile_update():
    weight = torch.nn.Parameter(torch.randn(8, 6))
    for cls in (GaLoreAdafactor, PlumageAdafactor):
        optimizer = cls([{"params": [weight], "rank": 2, "row_bias_correction": True}], lr=1e-2, relative_step=False,
                        foreach=True)
        weight.grad = torch.randn(8, 6)
        optimizer.step()
        assert "row_bias2" in optimizer.state[weight]
        with pytest.raises(ValueError, match="compile_update=True .*row_bias_correction=True .*drop one of them"):
            cls([{"params": [weight], "rank": 2, "row_bias_correction": True, "compile_update": True}], lr=1e-2,
                relative_step=False, foreach=True)
