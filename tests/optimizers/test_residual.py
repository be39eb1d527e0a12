"""residual='norm_matched' (Fira's complement): the gradient outside the basis moves at the basis's step size.

Checked against the definition computed here by hand: the projector's fused add_back with an Outside against
target + α · project_back(Z) + β · φ ⊙ (G − P Pᵀ G), written out; φ per column, its limiter and its zero-gradient
columns; one optimizer step of GaLoreAdamW and PlumageAdamW against Adam's step plus the complement; the 8-bit backend
moving the complement downhill; Adafactor's limiter per unit of its step size; per-layer mode with accumulation equal
to normal mode; and the cases refused.
"""

from __future__ import annotations

import math

import pytest
import torch
from accumulation_helpers import assert_same_weights, train_alike
from torch import nn

from galore_plumage import GaLoreAdafactor, GaLoreAdamW, PlumageAdamW, build_optimizer
from galore_plumage.optimizers import PLUMAGE_SAMPLED
from galore_plumage.optimizers.limiter import GROWTH_LIMIT
from galore_plumage.optimizers.residual import complement_weights
from galore_plumage.projectors import build_projector
from galore_plumage.projectors.base import Outside


def _gradient(shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _refreshed(name, shape, mode_dtype=torch.float64, **options):
    projector = build_projector(name, 3, update_proj_gap=10, **options)
    projector.refresh(_gradient(shape, 1, mode_dtype), 0)
    return projector


@pytest.mark.parametrize("shape", [(6, 9), (9, 6)], ids=["left", "right"])
@pytest.mark.parametrize("name,options", [("svd", {"scale": 0.25}), ("plumage", {"max_inv_p": None}),
                                          ("plumage", {"resample_every": 1, "pool_bf16": True})],
                         ids=["svd", "plumage-paper", "plumage-bf16-pool"])
def test_add_back_with_the_outside_adds_the_weighted_gradient_outside_the_basis(shape, name, options):
    dtype = torch.float32 if options.get("pool_bf16") else torch.float64
    projector = _refreshed(name, shape, dtype, **options)
    grad = _gradient(shape, 2, dtype)
    low = projector.project(grad)
    ((mode, factor),) = projector.factors.items()
    weights = _gradient(low.norm(dim=mode, keepdim=True).shape, 3, dtype).abs()
    z = _gradient(low.shape, 5, dtype)
    basis = factor.to(dtype)
    inside = basis @ basis.T @ grad if mode == 0 else grad @ basis @ basis.T
    target = _gradient(shape, 4, dtype)
    expected = target - 0.7 * projector.project_back(z) + 0.3 * weights * (grad - inside)
    projector.add_back(target, z, -0.7, Outside(grad, low, weights, 0.3))
    torch.testing.assert_close(target, expected, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)


def test_add_back_with_the_outside_on_a_bfloat16_weight_rounds_once():
    projector = _refreshed("svd", (6, 9), torch.float32)
    grad = _gradient((6, 9), 2, torch.float32)
    low = projector.project(grad)
    weights = torch.rand(1, 9, generator=torch.Generator().manual_seed(3))
    target = torch.zeros(6, 9, dtype=torch.bfloat16)
    projector.add_back(target, torch.zeros_like(low), 1.0, Outside(grad.bfloat16(), low, weights, 1.0))
    outside = grad - projector.factors[0] @ low
    torch.testing.assert_close(target.float(), weights * outside, rtol=0.02, atol=0.02)


def test_weights_are_the_column_ratio_of_step_to_gradient_norms():
    z, low, grad = _gradient((4, 7), 5), _gradient((4, 7), 6), _gradient((10, 7), 7)
    low[:, 2] = 0  # a column with no gradient inside the basis: nothing to copy, its complement stays put
    state = {}
    phi = complement_weights(z, low, grad, 0, state)
    expected = z.norm(dim=0) / low.norm(dim=0)
    expected[2] = 0
    torch.testing.assert_close(phi, expected.view(1, -1), rtol=1e-12, atol=0)
    outside_sq = (grad.square().sum(dim=0) - low.square().sum(dim=0)).clamp_min(0)
    torch.testing.assert_close(state["residual_norm"], (expected.square() * outside_sq).sum().sqrt(), rtol=1e-12, atol=0)
    right = complement_weights(z.T, low.T, grad.T, 1, {})  # the right side: φ per row
    torch.testing.assert_close(right, expected.view(-1, 1), rtol=1e-12, atol=0)


def test_the_limiter_lets_the_complement_grow_by_at_most_one_percent_a_step():
    z, low, grad = _gradient((4, 7), 5), _gradient((4, 7), 6), _gradient((10, 7), 7)
    state = {}
    first = complement_weights(z, low, grad, 0, state)
    size = state["residual_norm"].clone()
    limited = complement_weights(10 * z, low, grad, 0, state)  # Adam's step 10x as long: φ would grow 10x
    torch.testing.assert_close(state["residual_norm"], GROWTH_LIMIT * size, rtol=1e-12, atol=0)
    torch.testing.assert_close(limited, GROWTH_LIMIT * first, rtol=1e-12, atol=0)  # one factor for every column
    shrunk = complement_weights(0.1 * z, low, grad, 0, state)  # shrinking is never limited
    torch.testing.assert_close(shrunk, 0.1 * first, rtol=1e-12, atol=0)


def test_a_zero_previous_norm_does_not_freeze_the_complement():
    z, low, grad = _gradient((4, 7), 5), _gradient((4, 7), 6), _gradient((10, 7), 7)
    state = {"residual_norm": torch.zeros((), dtype=torch.float64)}
    assert complement_weights(z, low, grad, 0, state).abs().sum() > 0


def test_the_steady_limiter_takes_no_reference_on_a_refresh_step():
    z, low, grad = _gradient((4, 7), 5), _gradient((4, 7), 6), _gradient((10, 7), 7)
    state = {}
    complement_weights(z, low, grad, 0, state)
    size = state["residual_norm"].clone()
    unlimited = complement_weights(10 * z, low, grad, 0, state, fitted=True, limiter="steady")
    torch.testing.assert_close(unlimited, 10 * complement_weights(z, low, grad, 0, {}), rtol=1e-12, atol=0)
    assert torch.equal(state["residual_norm"], size)  # the refresh step's size is not the next reference
    complement_weights(0.001 * z, low, grad, 0, state, fitted=True, limiter="fira")  # Fira's takes it there too
    torch.testing.assert_close(state["residual_norm"], 0.001 * size, rtol=1e-12, atol=0)


@pytest.mark.parametrize("fitted, limiter", [(False, "fira"), (True, "steady")])
def test_the_cap_keeps_every_column_of_the_complement_within_cap_times_the_basis_step(fitted, limiter):
    z, low, grad = _gradient((4, 7), 5), _gradient((4, 7), 6), _gradient((10, 7), 7)
    low[:, 3] *= 20  # a column the basis holds almost whole: ‖G⊥‖ < ‖R‖, no cap on it
    grad[:4] = low  # so that R = G's first four rows, as for a basis of the first four axes
    outside = grad[4:].norm(dim=0)
    uncapped = complement_weights(z, low, grad, 0, {}, fitted=fitted, limiter=limiter)
    capped = complement_weights(z, low, grad, 0, {}, fitted=fitted, limiter=limiter, cap=0.5)
    moved = capped.view(-1) * outside  # ‖φ_j G⊥_j‖ per column
    assert (moved <= 0.5 * z.norm(dim=0) * (1 + 1e-12)).all()
    binds = outside > 0.5 * low.norm(dim=0)
    assert binds.any() and not binds.all()
    torch.testing.assert_close(moved[binds], 0.5 * z.norm(dim=0)[binds], rtol=1e-12, atol=0)
    torch.testing.assert_close(capped.view(-1)[~binds], uncapped.view(-1)[~binds], rtol=1e-12, atol=0)


def test_the_cap_leaves_a_column_with_nothing_outside_the_basis_alone():
    z, low = _gradient((4, 3), 5), _gradient((4, 3), 6)
    grad = torch.cat([low, torch.zeros(6, 3, dtype=low.dtype)])  # G⊥ = 0: a cap has nothing to bound (0/0 is NaN)
    capped = complement_weights(z, low, grad, 0, {}, cap=1.0)
    torch.testing.assert_close(capped, complement_weights(z, low, grad, 0, {}), rtol=1e-12, atol=0)


def _complement_moves(limiter: str) -> list[float]:
    """‖the step outside span(P)‖ at each of 5 updates of GaLoreAdamW (rank 2, τ = 3); the gradients share a rank-2
    part and differ by noise, except update 4's (a refresh), whose noise is 1000x smaller: its own basis leaves a
    complement near zero, as a refresh does on real gradients (1 % of ‖G‖² on llama_tiny)."""
    generator = torch.Generator().manual_seed(0)
    shared = torch.randn(8, 2, generator=generator, dtype=torch.float64) @ torch.randn(2, 12, generator=generator,
                                                                                      dtype=torch.float64)
    weight = nn.Parameter(torch.zeros(8, 12, dtype=torch.float64))
    optimizer = GaLoreAdamW([{"params": [weight], "rank": 2, "update_proj_gap": 3, "residual": "norm_matched",
                              "residual_limiter": limiter}], lr=0.1)
    moves = []
    for update in range(1, 6):
        noise = 1e-3 if update == 4 else 0.3
        weight.grad = 10 * shared + noise * torch.randn(8, 12, generator=generator, dtype=torch.float64)
        start = weight.detach().clone()
        optimizer.step()
        moved = weight.detach() - start
        basis = optimizer._projectors[weight].factors[0]
        moves.append((moved - basis @ basis.T @ moved).norm().item())
    return moves


def test_fira_limiter_holds_the_complement_near_zero_after_a_refresh_and_steady_does_not():
    fira, steady = _complement_moves("fira"), _complement_moves("steady")
    assert fira[:3] == steady[:3]  # identical until the second refresh
    assert fira[4] < 0.01 * fira[2]  # after it, Fira's reference is update 4's near-zero complement
    assert steady[4] > 0.5 * steady[2]  # steady's is still update 3's


@pytest.mark.parametrize("cls,extra", [(GaLoreAdamW, {}), (PlumageAdamW, {"projector": "plumage", "max_inv_p": None,
                                                                          "resample_every": 0}),
                                       (GaLoreAdamW, {"residual_scale": 0.3})],
                         ids=["galore", "plumage-paper", "galore-residual_scale"])
def test_one_step_is_adams_step_in_the_basis_plus_the_scaled_complement(cls, extra):
    weight = nn.Parameter(_gradient((8, 12), 8))
    start = weight.detach().clone()
    grad = _gradient((8, 12), 9)
    weight.grad = grad.clone()
    optimizer = cls([{"params": [weight], "rank": 3, "update_proj_gap": 10, "scale": 0.25,
                      "residual": "norm_matched", **extra}], lr=0.1)
    optimizer.step()
    projector = optimizer._projectors[weight]
    ((mode, basis),) = projector.factors.items()
    assert mode == 0
    low = basis.T @ grad
    adam = (0.1 * low) / ((0.001 * low.square()).sqrt() + 1e-6)  # M / (√V + ε) after one step
    step_size = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)
    inv_p = projector.inv_p.view(-1, 1) if projector.inv_p is not None else 1.0
    # the group's residual_scale: the one given, else the family's (GaLore 1, Fira's; plumage_* 0.25)
    residual_scale = optimizer.param_groups[0]["residual_scale"]
    assert residual_scale == extra.get("residual_scale", 0.25 if cls is PlumageAdamW else 1.0)
    phi = residual_scale * adam.norm(dim=0, keepdim=True) / low.norm(dim=0, keepdim=True)
    # ... each column held within residual_cap x the basis's step on it (plumage_*: 0.5; other families: no cap)
    cap = optimizer.param_groups[0]["residual_cap"]
    assert cap == (0.5 if cls is PlumageAdamW else None)
    outside = grad - basis @ low
    if cap is not None:
        phi = phi * (cap * low.norm(dim=0, keepdim=True) / outside.norm(dim=0, keepdim=True)).clamp(max=1)
        assert (phi < residual_scale * adam.norm(dim=0, keepdim=True) / low.norm(dim=0, keepdim=True)).any()  # binds
    expected = start - step_size * (0.25 * basis @ (inv_p * adam) + phi * outside)
    torch.testing.assert_close(weight.detach(), expected, rtol=1e-10, atol=1e-12)
    # and the complement is what residual='none' leaves out: the step has a part outside span(P)
    moved = weight.detach() - start
    assert (moved - basis @ basis.T @ moved).norm() > 0.1 * moved.norm()


def test_the_eight_bit_backend_moves_the_complement_downhill():
    grad = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    moves = {}
    for residual in ("none", "norm_matched"):
        torch.manual_seed(0)
        model = nn.Module()
        model.attn = nn.Linear(96, 64, bias=False)
        start = model.attn.weight.detach().clone()
        model.attn.weight.grad = grad.clone()
        optimizer = build_optimizer("galore_adamw8bit", model, lr=1e-2, rank=8, update_proj_gap=10, min_8bit_size=64,
                                    residual=residual)
        optimizer.step()
        moves[residual] = model.attn.weight.detach() - start
    complement = moves["norm_matched"] - moves["none"]  # the 8-bit backend returns its finished step (step_size −1)
    cosine = (complement * grad).sum() / (complement.norm() * grad.norm())
    assert cosine < -0.5, cosine


def _adafactor_limiter_series(lrs: list[float]) -> list[float]:
    """GaLoreAdafactor with Fira's complement and limiter on a fixed gradient sequence at the lr of each update:
    the limiter's recorded size after each."""
    weight = nn.Parameter(_gradient((48, 32), 3, torch.float32))
    optimizer = GaLoreAdafactor([{"params": [weight], "rank": 8, "update_proj_gap": 50, "residual": "norm_matched",
                                  "residual_limiter": "fira"}], lr=lrs[0], relative_step=False, scale_parameter=False,
                                warmup_init=False)
    drift, sizes = _gradient((48, 32), 4, torch.float32), []
    for step, lr in enumerate(lrs):
        optimizer.param_groups[0]["lr"] = lr
        weight.grad = drift + 0.5 * _gradient((48, 32), 10 + step, torch.float32)
        optimizer.step()
        sizes.append(optimizer.state[weight]["residual_norm"].item())
    return sizes


def test_adafactors_limiter_sees_the_step_per_unit_of_its_step_size():
    """Adafactor's step carries its step size (the lr); the limiter must not (Update.unit), or a warm-up's rising lr
    is held to 1 % an update and its first update, at lr 0, gives a reference of zero that limits nothing."""
    warm_up = _adafactor_limiter_series([1e-3 * step for step in range(6)])
    constant = _adafactor_limiter_series([5e-3] * 6)
    assert warm_up[0] > 0
    torch.testing.assert_close(warm_up, constant, rtol=1e-5, atol=0)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(24, 16)
        self.mlp = nn.Linear(16, 20)

    def forward(self, x):
        return self.mlp(torch.tanh(self.attn(x)))


def _tiny_twins() -> list[Tiny]:
    """Two identical float64 Tiny models, one for normal mode and one for per-layer mode."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(Tiny().double())
    return models


def test_per_layer_accumulation_with_the_complement_equals_normal_mode():
    accumulation, updates = 3, 5
    models = _tiny_twins()
    options = {"lr": 1e-2, "rank": 4, "update_proj_gap": 2, **PLUMAGE_SAMPLED, "residual": "norm_matched"}
    normal = build_optimizer("plumage_adamw", models[0], **options)
    with pytest.warns(UserWarning, match="keeps each low-rank weight's full gradient"):
        per_layer = build_optimizer("plumage_adamw_per_layer", models[1], accumulation_steps=accumulation, **options)
    train_alike(models, normal, accumulation, updates, in_dim=24, out_dim=20)
    assert_same_weights(models[0], models[1])
    assert [s["refreshes"] for s in per_layer.optimizer.projector_stats().values()] == [3, 3]  # the hooks stepped


@pytest.mark.parametrize("options,message", [
    ({"projector": "random"}, "orthonormal basis"),
    ({"projector": "tucker"}, "one-sided projection"),
    ({"residual": "fira"}, "unknown residual 'fira'"),
])
def test_refused_where_the_complement_is_not_defined(options, message):
    model = nn.Module()
    model.attn = nn.Linear(12, 8, bias=False)
    with pytest.raises(ValueError, match=message):
        build_optimizer("galore_adamw", model, rank=3, **{"residual": "norm_matched", **options})


def test_plumage_default_is_left_out_where_it_cannot_apply():
    """plumage_*'s residual default does nothing for a projector that makes no orthonormal one-sided basis (as its
    resample_every does nothing under svd): FLORA's basis and proj_type 'full' step without a complement."""
    for options in ({"projector": "random"}, {"projector": "svd", "proj_type": "full", "v_floor": "none"}):
        weight = nn.Parameter(_gradient((8, 12), 8))
        weight.grad = _gradient((8, 12), 9)
        optimizer = PlumageAdamW([{"params": [weight], "rank": 3, "residual": "norm_matched", **options}])
        optimizer.step()
        assert optimizer.param_groups[0]["residual"] == "norm_matched"
        assert "residual_norm" not in optimizer.state[weight], options


def test_a_projected_gradient_alone_is_refused():
    weight = nn.Parameter(torch.randn(8, 12))
    optimizer = GaLoreAdamW([{"params": [weight], "rank": 3, "residual": "norm_matched"}])
    optimizer.step_param(weight, optimizer.param_groups[0], grad=torch.randn(8, 12))
    with pytest.raises(ValueError, match="needs the full gradient"):
        optimizer.step_param(weight, optimizer.param_groups[0], low_grad=torch.randn(3, 12))


def _complement_schedule(horizon, gap=5, updates=12, stagger=False):
    """For each update of GaLoreAdamW with the complement: (did the complement move, did the optimizer ask for the
    full gradient before it)."""
    weight = nn.Parameter(_gradient((8, 12), 10))
    optimizer = GaLoreAdamW([{"params": [weight], "rank": 3, "update_proj_gap": gap, "residual": "norm_matched",
                              "residual_horizon": horizon, "stagger": stagger}], lr=1e-2)
    moved = []
    optimizer.step_observers.append(lambda param, projector, update, state, refreshed:
                                    moved.append(update.complement is not None))
    asked = []
    for update in range(updates):
        asked.append(optimizer.needs_full_grad(weight, optimizer.param_groups[0]))
        weight.grad = _gradient((8, 12), 20 + update)
        optimizer.step()
    return moved, asked


def test_the_horizon_moves_the_complement_only_on_the_first_updates_after_each_refresh():
    moved, asked = _complement_schedule(horizon=2)  # refreshes on updates 0, 5, 10
    assert moved == [True, True, False, False, False] * 2 + [True, True]
    assert asked == moved  # the other updates need only the projected gradient
    assert _complement_schedule(horizon=None)[0] == [True] * 12
    assert _complement_schedule(horizon=5)[0] == [True] * 12  # a horizon of τ moves it at every update


def test_the_horizon_counts_from_each_weights_own_refresh_when_staggered():
    """A staggered first interval is shorter than τ; the age restarts at the refresh that ends it, not at k·τ."""
    weights = [nn.Parameter(_gradient((8, 12), 30 + k)) for k in range(2)]
    optimizer = GaLoreAdamW([{"params": weights, "rank": 3, "update_proj_gap": 4, "residual": "norm_matched",
                              "residual_horizon": 1, "stagger": True}], lr=1e-2)
    moved = {0: [], 1: []}
    optimizer.step_observers.append(lambda param, projector, update, state, refreshed: moved[
        0 if param is weights[0] else 1].append(update.complement is not None))
    for update in range(7):
        for k, weight in enumerate(weights):
            weight.grad = _gradient((8, 12), 40 + 2 * update + k)
        optimizer.step()
    assert moved[0] == [True, False, False, False, True, False, False]  # refreshes at 0, 4
    assert moved[1] == [True, False, True, False, False, False, True]  # refreshes at 0, 2 (staggered: 4 − 2), 6


def test_per_layer_accumulation_with_a_horizon_equals_normal_mode():
    """Per-layer mode keeps the full gradient only on the updates whose complement moves."""
    accumulation, updates = 3, 6
    models = _tiny_twins()
    options = {"lr": 1e-2, "rank": 4, "update_proj_gap": 3, **PLUMAGE_SAMPLED, "residual": "norm_matched",
               "residual_horizon": 1}
    normal = build_optimizer("plumage_adamw", models[0], **options)
    with pytest.warns(UserWarning, match="keeps each low-rank weight's full gradient"):
        per_layer = build_optimizer("plumage_adamw_per_layer", models[1], accumulation_steps=accumulation, **options)
    projected = []  # per low-rank weight and update: stepped from an accumulated projected gradient
    step_param = per_layer.optimizer.step_param
    per_layer.optimizer.step_param = lambda param, group, grad=None, low_grad=None: (
        "rank" in group and projected.append(low_grad is not None), step_param(param, group, grad=grad, low_grad=low_grad))
    train_alike(models, normal, accumulation, updates, in_dim=24, out_dim=20)
    assert_same_weights(models[0], models[1])
    assert projected == [False, False, True, True, True, True] * 2  # ages 0 (refresh), 1, 2, 0, 1, 2 of 2 weights


def test_a_projector_saved_before_refreshed_at_existed_dates_its_basis_one_interval_back():
    projector = _refreshed("svd", (6, 9))
    projector.refresh(_gradient((6, 9), 2), 7)
    state = projector.state_dict()
    assert state["refreshed_at"] == 7 and projector.age(9) == 2
    del state["refreshed_at"]
    older = build_projector("svd", 3, update_proj_gap=10)
    older.load_state_dict(state)
    assert older.refreshed_at == 7 and older.age(9) == 2  # next_refresh 17 − τ 10
