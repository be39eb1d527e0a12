"""v_floor: Adam's second moment raised to the square of its mean before each low-rank update (moment_floor.py).

'm2' is what PLUMAGE's mv_meansplit does to a row that stays at a draw, and on a gradient that keeps its sign it slows
the low-rank step to lr · √(1 − β2^t); 'm2_corrected' keeps the bound after bias correction and no such warm-up."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from galore_plumage import GaLoreAdafactor, GaLoreAdamW, GaLoreAdamW8bit, PlumageAdamW
from galore_plumage.optimizers import PLUMAGE_SAMPLED, PlumageSGDM
from galore_plumage.optimizers.adamw import AdamWBackend
from galore_plumage.optimizers.adamw8bit import AdamW8bitBackend
from galore_plumage.optimizers.moment_floor import floor_second_moment
from galore_plumage.optimizers.realign import realign_dense

BETAS = (0.9, 0.999)
GROUP = {"lr": 1.0, "betas": BETAS, "eps": 1e-12, "weight_decay": 0.0, "correct_bias": True,
         "row_bias_correction": False}


def _steps(floor: str, grads, rows=0, horizon: int | None = None) -> list[torch.Tensor]:
    """The weight's move, −step_size · direction, at each update of AdamW's low-rank backend."""
    backend, state, moves = AdamWBackend(), {"step": 0}, []
    for grad in grads:
        state["step"] += 1
        update = backend.update(state, grad, {**GROUP, "v_floor": floor, "v_floor_horizon": horizon}, None, rows=rows)
        moves.append(update.step_size * update.direction)
    return moves


def test_on_a_steady_gradient_m2_warms_the_step_up_by_the_square_root_of_one_minus_beta2_power():
    grad = torch.tensor([[0.3, -2.0, 1e-3], [5.0, -0.7, 0.01]], dtype=torch.float64)
    plain, floored, corrected = (_steps(floor, [grad] * 800) for floor in ("none", "m2", "m2_corrected"))
    for t in (100, 300, 800):  # after M's own bias has died out (β1^100 ≈ 3e-5)
        torch.testing.assert_close(plain[t - 1], grad.sign(), rtol=1e-6, atol=0)  # Adam: ±lr on every coordinate
        expected = math.sqrt(1 - BETAS[1] ** t) * grad.sign()
        torch.testing.assert_close(floored[t - 1], expected, rtol=2e-3, atol=0)
        torch.testing.assert_close(corrected[t - 1], plain[t - 1], rtol=1e-9, atol=0)  # V̂ = M̂² already: no effect


@pytest.mark.parametrize("horizon", [3000, 10000])
def test_a_horizon_stretches_the_warm_up_to_the_square_root_of_one_minus_beta_h_power(horizon):
    """v_floor_horizon H: the step on a steady gradient is lr · √(1 − β_H^t), β_H = 1 − 1/H, a longer warm-up than
    m2's own (H = 1000 at β2 = 0.999)."""
    grad = torch.tensor([[0.3, -2.0, 1e-3], [5.0, -0.7, 0.01]], dtype=torch.float64)
    moves = _steps("m2", [grad] * 2000, horizon=horizon)
    for t in (100, 300, 800, 2000):
        expected = math.sqrt(1 - (1 - 1 / horizon) ** t) * grad.sign()
        torch.testing.assert_close(moves[t - 1], expected, rtol=2e-3, atol=0)


def test_adams_own_horizon_is_m2():
    grad = torch.randn(4, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    noisy = [grad + 0.5 * torch.randn(4, 6, generator=torch.Generator().manual_seed(t), dtype=torch.float64)
             for t in range(300)]
    for own, plain in zip(_steps("m2", noisy, horizon=1000), _steps("m2", noisy), strict=True):
        torch.testing.assert_close(own, plain, rtol=1e-9, atol=0)  # β_H = 1 − 1/1000 is β2 = 0.999 to rounding


def test_a_horizon_needs_m2_and_adams_moments():
    model = _model()
    for floor in ("none", "m2_corrected"):
        with pytest.raises(ValueError, match=rf"v_floor_horizon=2000 .*v_floor={floor!r} it has no effect"):
            GaLoreAdamW([{"params": [model.weight], "rank": 4, "v_floor": floor, "v_floor_horizon": 2000}])
    with pytest.raises(ValueError, match=r"v_floor='m2' .*needs Adam's moments"):  # the floor it needs is refused
        GaLoreAdafactor([{"params": [model.weight], "rank": 4, "v_floor": "m2", "v_floor_horizon": 2000}],
                        relative_step=False, lr=1e-3)
    GaLoreAdamW8bit([{"params": [model.weight], "rank": 4, "v_floor": "m2", "v_floor_horizon": 2000}])


@pytest.mark.parametrize("min_8bit_size", [4096, 10**9], ids=["8-bit", "fp32 (small tensor)"])
def test_8bit_adamw_warms_up_the_same_way(min_8bit_size):
    """bitsandbytes' kernel on dequantized, floored and requantized V: the same √(1 − β2^t) within 8-bit rounding."""
    grad = torch.linspace(0.1, 2.0, 64 * 96).view(64, 96) * torch.tensor([1.0, -1.0]).repeat(48)
    group = {"lr": 1.0, "betas": BETAS, "eps": 1e-8, "weight_decay": 0.0, "min_8bit_size": min_8bit_size}
    moves = {}
    for floor in ("none", "m2"):
        backend, state = AdamW8bitBackend(), {"step": 0}
        for _ in range(300):
            state["step"] += 1
            update = backend.update(state, grad, {**group, "v_floor": floor}, None, rows=0)
        moves[floor] = update.step_size * update.direction
    ratio = (moves["m2"] / moves["none"]).flatten()
    expected = math.sqrt(1 - BETAS[1] ** 300)
    assert (ratio - expected).abs().max() < 0.03 * expected, (ratio.min(), ratio.max(), expected)


def test_m2_is_meansplit_on_a_row_that_stays():
    """At a draw, mv_meansplit sets V ← (B M)² + (B∘B) max(V − M², 0); with B = 1 on a staying row that is max(V, M²)."""
    generator = torch.Generator().manual_seed(0)
    m = torch.randn(5, 7, generator=generator, dtype=torch.float64)
    v = m.square() * torch.rand(5, 7, generator=generator, dtype=torch.float64) * 2  # about half below M²

    class Stays:  # a projector whose latest draw kept every row where it was
        moved = True

        def transport(self, tensor, squared=False):
            return tensor.clone()

    _, v_meansplit = realign_dense(m, v.clone(), Stays(), "mv_meansplit")
    state = {"step": 9, "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    floor_second_moment(state, "m2", *BETAS)
    assert (v < m.square()).any() and (v > m.square()).any()
    torch.testing.assert_close(state["exp_avg_sq"], v_meansplit, rtol=1e-12, atol=0)


def test_the_floor_raises_only_the_second_moment_and_only_where_it_is_below_the_bound():
    generator = torch.Generator().manual_seed(1)
    m = torch.randn(4, 6, generator=generator)
    v = m.square() * torch.rand(4, 6, generator=generator) * 2
    for floor, factor in (("m2", 1.0), ("m2_corrected", (1 - BETAS[1] ** 4) / (1 - BETAS[0] ** 4) ** 2)):
        state = {"step": 5, "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        floor_second_moment(state, floor, *BETAS)
        assert torch.equal(state["exp_avg"], m)
        torch.testing.assert_close(state["exp_avg_sq"], torch.maximum(v, factor * m.square()))


def test_the_first_step_and_full_rank_weights_are_untouched():
    grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(_steps("m2", [grad])[0], _steps("none", [grad])[0])
    backend, states = AdamWBackend(), [{"step": 0}, {"step": 0}]
    for _ in range(5):
        for state, floor in zip(states, ("none", "m2"), strict=True):
            state["step"] += 1
            backend.update(state, grad * state["step"], {**GROUP, "v_floor": floor}, None, rows=None)
    assert torch.equal(states[0]["exp_avg_sq"], states[1]["exp_avg_sq"])


def _model():
    torch.manual_seed(0)
    return nn.Linear(16, 12, bias=False)


@pytest.mark.parametrize("cls, keys", [(GaLoreAdamW, {}), (GaLoreAdamW8bit, {}), (PlumageAdamW, {}),
                                       (PlumageAdamW, PLUMAGE_SAMPLED)], ids=["galore", "galore8bit", "plumage", "sampled"])
def test_a_low_rank_group_trains_with_it_and_saves_it(cls, keys):
    generator, weights = torch.Generator().manual_seed(3), []
    inputs = [torch.randn(8, 16, generator=generator) for _ in range(6)]
    for floor in ("none", "m2"):
        model = _model()
        optimizer = cls([{"params": [model.weight], "rank": 4, "update_proj_gap": 3, **keys, "v_floor": floor}], lr=1e-2)
        for x in inputs:
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        assert optimizer.state_dict()["param_groups"][0]["v_floor"] == floor
        assert torch.isfinite(model.weight).all()
        weights.append(model.weight.detach().clone())
    if keys:  # PLUMAGE's draws with mv_meansplit already floor every row at each draw: the option adds nothing
        assert torch.equal(*weights)
    else:
        assert not torch.equal(*weights)


def test_refused_where_it_cannot_apply():
    model = _model()
    for cls, backend, extra in ((GaLoreAdafactor, "adafactor", {"relative_step": False, "lr": 1e-3}), (PlumageSGDM, "sgdm", {})):
        with pytest.raises(ValueError, match=rf"v_floor='m2' .*needs Adam's moments \(adamw, adamw8bit\), not '{backend}'"):
            cls([{"params": [model.weight], "rank": 4, "v_floor": "m2"}], **extra)
    GaLoreAdamW8bit([{"params": [model.weight], "rank": 4, "v_floor": "m2"}])  # 8-bit AdamW takes it
    with pytest.raises(ValueError, match=r"v_floor='m2' .*needs a one-sided projection"):
        GaLoreAdamW([{"params": [model.weight], "rank": 4, "v_floor": "m2", "proj_type": "full"}])
    with pytest.raises(ValueError, match=r"v_floor='m2_corrected' .*row_bias_correction=True .*drop one"):
        GaLoreAdamW([{"params": [model.weight], "rank": 4, "v_floor": "m2_corrected", "row_bias_correction": True}])
