"""PLUMAGE's κ (resample_every): the sampled rows drawn again between refreshes from the refresh's pool.

A refresh keeps the top K = pool_factor·r singular vectors (default 2r) and their min-variance inclusion probabilities for σ[:K];
each draw picks r of them with those probabilities. Checked here: a draw is unbiased for G's rank-K truncation with
the closed-form spread Σ_{i<K} (1/p_i − 1) σ_i² (Monte Carlo, test_plumage_estimator's χ² tolerance); kept
directions are in every draw and their moments pass through a draw unchanged, new ones start from zero; the
schedule never draws on a refresh's step; and a draw is refused by projectors that do not sample.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from galore_plumage import PlumageAdamW
from galore_plumage.optimizers import PLUMAGE_SAMPLED
from galore_plumage.projectors import PlumageProjector, inclusion_probabilities
from galore_plumage.projectors.sampling import systematic_sample
from galore_plumage.projectors.seeding import refresh_generator

M, N_COLS, K = 24, 16, 4
SIGMA = [1.0 / i for i in range(1, N_COLS + 1)]  # r* = 1 at k = 4; the pool is the top 8 of 16
N_DRAWS = 800
POWER = 90.0  # the mean must be this many times the bias tolerance away from G (conftest's BIAS_FACTOR is 9)


def _refreshed(g, side="right", seed=3, pool_factor=2):
    projector = PlumageProjector(K, proj_type=side, update_proj_gap=10_000, seed=seed, resample_every=1,
                                 pool_factor=pool_factor)
    projector.refresh(g, 0)
    return projector


@pytest.mark.parametrize("side, pool_factor", [("left", 2), ("right", 2), ("right", 3)])
def test_draws_are_unbiased_for_the_pool_truncation_with_the_closed_form_spread(spectral_matrix, check_draws, side,
                                                                                pool_factor):
    g, u, sigma, v = spectral_matrix(M, N_COLS, SIGMA, seed=0)
    pool = pool_factor * K
    r_star, p = inclusion_probabilities(sigma[:pool], K)
    assert 0 < r_star < K
    truncated = u[:, :pool] @ torch.diag(sigma[:pool]) @ v[:, :pool].T
    spread = ((1.0 / p - 1.0) * sigma[:pool].square()).sum().item()

    projector = _refreshed(g, side, pool_factor=pool_factor)
    assert projector.pool.vectors.shape[1] == pool
    torch.testing.assert_close(projector.pool.canonical(), p)
    estimates = []
    for step in range(1, N_DRAWS + 1):
        projector.resample(step)
        estimates.append(projector.project_back(projector.project(g)))
    estimates = torch.stack(estimates)

    check_draws(estimates, truncated, spread)
    # The check has power: the tail past a pool of 8 is left out, so the mean is far from G itself (past 12 the tail
    # is too small to tell apart in 800 draws)
    if pool_factor == 2:
        assert (estimates.mean(0) - g).square().sum().item() > POWER * spread / N_DRAWS
    assert projector.stats["resamples"] == N_DRAWS and projector.refresh_count == 1


def test_kept_directions_are_in_every_draw_and_their_moments_carry_over(spectral_matrix):
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=1)
    projector = _refreshed(g)
    (mode,) = projector.factors
    r_star = int((projector.pool.p == 1).sum())
    changed = 0
    for step in range(1, 40):
        old = projector.factors[mode].clone()  # the basis is a view of the pool, which a draw rearranges in place
        moments = torch.randn(M, K, dtype=old.dtype)  # the right side: one column per basis vector
        projector.resample(step)
        new = projector.factors[mode]
        assert torch.equal(new[:, :r_star], old[:, :r_star])  # the kept ones keep the first columns
        carried = projector.transport(moments)
        for j in range(K):
            match = [i for i in range(K) if torch.equal(new[:, j], old[:, i])]
            expected = moments[:, match[0]] if match else torch.zeros(M, dtype=old.dtype)
            torch.testing.assert_close(carried[:, j], expected, atol=1e-12, rtol=0)
            assert not match or match == [j]  # a vector drawn again keeps its column: no row of the moments moves
        changed += not torch.equal(new, old)
    assert changed > 10  # the sampled rows do move


def test_the_optimizer_draws_between_refreshes_only():
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(16, 24))
    gap, every, updates = 10, 5, 25
    optimizer = PlumageAdamW([{"params": [weight], "rank": 6, "update_proj_gap": gap, "resample_every": every,
                               **PLUMAGE_SAMPLED}], lr=1e-3)
    draws_seen = []
    for _ in range(updates):
        weight.grad = torch.randn(16, 24) @ torch.diag(torch.logspace(0, -3, 24))
        optimizer.step()
        projector = optimizer._projectors[weight]
        draws_seen.append(projector.stats.get("resamples", 0))
    # refreshes start updates 1, 11, 21; a draw after update 10 or 20 would be thrown away by the refresh that
    # follows, so there is none: draws after updates 5, 15, 25
    drawn_after = [i + 1 for i in range(updates) if draws_seen[i] > (draws_seen[i - 1] if i else 0)]
    assert drawn_after == [5, 15, 25]
    assert projector.refresh_count == 3
    assert optimizer.state[weight]["projector"]["pool"]["draws"] == 1  # the saved state follows every draw


def test_with_every_slot_kept_there_is_nothing_to_draw(spectral_matrix):
    g, *_ = spectral_matrix(M, K, [1.0, 0.5, 0.25, 0.125], seed=2)  # min(m, n) = rank: every direction is kept
    with pytest.warns(UserWarning, match="saves no memory"):
        projector = _refreshed(g)
    assert projector.pool is not None and not projector.resample_due(1)  # a pool (fixed layout), but no draw




@pytest.mark.parametrize("rule", ["mv", "mv_meansplit"])  # the paper's; LDAdam's (PLUMAGE_SAMPLED's)
def test_the_optimizer_carries_the_moments_to_each_draw(rule):
    """After an update with a draw, M is the update's moment moved by the draw's B, and V moved by B∘B (mv) or rebuilt
    as (B M)² + (B∘B) max(V − M², 0) (mv_meansplit: a row that stays keeps max(V, M²), an entering one zero)."""
    generator = torch.Generator().manual_seed(6)
    weight = nn.Parameter(torch.randn(24, 16, generator=generator))
    optimizer = PlumageAdamW([{"params": [weight], "rank": 4, "update_proj_gap": 100, "resample_every": 1,
                               **PLUMAGE_SAMPLED, "realign": rule}], lr=1e-2)
    updated = {}
    optimizer.step_observers.append(
        lambda param, projector, update, state, refreshed: updated.update(
            m=state["exp_avg"].clone(), v=state["exp_avg_sq"].clone()))
    moved = 0
    for _ in range(6):
        weight.grad = torch.randn(24, 16, generator=generator) @ torch.diag(torch.logspace(0, -2, 16))
        optimizer.step()
        projector, state = optimizer._projectors[weight], optimizer.state[weight]
        torch.testing.assert_close(state["exp_avg"], projector.transport(updated["m"]), rtol=0, atol=1e-7)
        m, v = updated["m"], updated["v"]
        expected_v = (projector.transport(v, squared=True) if rule == "mv" else
                      projector.transport(m).square() + projector.transport((v - m.square()).clamp(min=0), squared=True))
        torch.testing.assert_close(state["exp_avg_sq"], expected_v, rtol=0, atol=1e-7)
        moved += not torch.equal(state["exp_avg"], updated["m"])
    assert moved >= 3 and projector.stats["resamples"] == 6


def _shares_storage(projector) -> bool:
    (factor,) = projector.factors.values()
    return factor.untyped_storage().data_ptr() == projector.pool.vectors.untyped_storage().data_ptr()


def test_the_basis_is_a_view_of_the_pool_and_costs_no_memory(spectral_matrix, tmp_path):
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=4)
    projector = _refreshed(g)
    for step in range(1, 6):
        assert _shares_storage(projector)
        projector.resample(step)
    path = tmp_path / "projector.pt"
    torch.save(projector.state_dict(), path)
    loaded = PlumageProjector(K, update_proj_gap=10_000, seed=3, resample_every=1)
    loaded.load_state_dict(torch.load(path, weights_only=True))
    assert _shares_storage(loaded)
    copied = tmp_path / "copied.pt"
    state = projector.state_dict()
    torch.save({**state, "factors": {k: f.clone() for k, f in state["factors"].items()}}, copied)
    (factor,) = projector.factors.values()
    assert path.stat().st_size < copied.stat().st_size - factor.nbytes // 2  # the basis is not saved twice (zip records pad)


def test_draws_follow_the_seeded_stream_in_descending_sigma_order(spectral_matrix):
    """Storing the pool with the drawn vectors first does not change which vectors are drawn: draw d chooses
    systematic_sample(p in descending-σ order, r, refresh_generator(seed, index, refresh, d)), as before session 8."""
    g, u, sigma, v = spectral_matrix(M, N_COLS, SIGMA, seed=5)
    projector = _refreshed(g)
    canonical_vectors = v[:, : 2 * K]  # the right side's top 2K singular vectors, up to sign
    p = projector.pool.canonical()
    for draw in range(1, 8):
        projector.resample(draw)
        expected = systematic_sample(p, K, refresh_generator(3, 0, 0, draw))
        (factor,) = projector.factors.values()
        overlap = (canonical_vectors.T.to(factor) @ factor).abs()
        assert torch.equal(overlap.argmax(dim=0).sort().values, expected)  # the same set (columns in any order)
        torch.testing.assert_close(projector.inv_p, (1.0 / p[overlap.argmax(dim=0)]).to(projector.inv_p))


def test_a_checkpoint_with_a_copied_basis_resumes_the_same(spectral_matrix):
    """Before session 8 the basis was saved as its own copy and the pool in descending-σ order without `order`."""
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=6)
    projector = _refreshed(g)
    projector.resample(1)
    state = projector.state_dict()
    canonical = torch.argsort(state["pool"]["order"])  # stored column of each descending-σ index
    (mode, factor), = state["factors"].items()
    old_format = {**state, "factors": {mode: factor.clone()},
                  "pool": {key: value for key, value in state["pool"].items() if key != "order"}}
    old_format["pool"].update(vectors=state["pool"]["vectors"][:, canonical].clone(), p=state["pool"]["p"][canonical])
    twins = [PlumageProjector(K, update_proj_gap=10_000, seed=3, resample_every=1) for _ in range(2)]
    for twin, saved in zip(twins, (state, old_format), strict=True):
        twin.load_state_dict(saved)
        assert _shares_storage(twin)
        twin.resample(2)
    assert torch.equal(twins[0].factors[mode], twins[1].factors[mode])
    assert torch.equal(twins[0].inv_p, twins[1].inv_p)


# ----------------------------------------------------------------- pool_bf16
def test_a_bfloat16_pool_draws_the_same_vectors_at_half_the_memory(spectral_matrix):
    """pool_bf16 stores the pool (and the basis, a view of it) in bfloat16: the same draws, projections still in
    float32 and within bfloat16's rounding (2⁻⁸ relative) of the float32 pool's, half the pool's bytes."""
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=0, dtype=torch.float32)
    full = _refreshed(g)
    half = PlumageProjector(K, proj_type="right", update_proj_gap=10_000, seed=3, resample_every=1, pool_bf16=True)
    half.refresh(g, 0)
    for step in range(1, 6):
        assert torch.equal(half.pool.order, full.pool.order)
        assert half.pool.vectors.dtype == half.factors[1].dtype == torch.bfloat16
        assert half.factors[1].untyped_storage().data_ptr() == half.pool.vectors.untyped_storage().data_ptr()
        assert half.pool.vectors.nbytes * 2 == full.pool.vectors.nbytes
        low = half.project(g)
        assert low.dtype == half.inv_p.dtype == torch.float32
        torch.testing.assert_close(low, full.project(g), rtol=0, atol=2**-8 * 2 * full.project(g).abs().max().item())
        back = half.project_back(low)
        assert back.dtype == torch.float32
        torch.testing.assert_close(back, full.project_back(full.project(g)), rtol=0, atol=2**-7 * g.abs().max().item())
        full.resample(step)
        half.resample(step)
        assert half.transition[1].dtype == torch.float32


def test_a_bfloat16_pool_resumes_exactly():
    """A checkpoint keeps the bfloat16 pool as it is: a resumed run repeats the uninterrupted one bit for bit."""
    def build(model):
        return PlumageAdamW([{"params": [model.weight], "rank": 4, "update_proj_gap": 5, **PLUMAGE_SAMPLED,
                              "pool_bf16": True}], lr=1e-2)

    torch.manual_seed(0)
    model, twin = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False)
    optimizer = build(model)
    inputs = torch.randn(30, 8, 16, generator=torch.Generator().manual_seed(1))

    def step(net, opt, x):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()

    for x in inputs[:7]:
        step(model, optimizer, x)
    twin.load_state_dict(model.state_dict())
    twin_optimizer = build(twin)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as from torch.load: nothing shared
    assert next(iter(twin_optimizer.state.values()))["projector"]["pool"]["vectors"].dtype == torch.bfloat16
    for x in inputs[7:]:
        step(model, optimizer, x)
        step(twin, twin_optimizer, x)
    assert torch.equal(model.weight, twin.weight)


@pytest.mark.parametrize("side, bf16", [("left", False), ("right", False), ("right", True)])
def test_a_draw_s_transition_is_the_product_of_the_bases_built_from_indices(spectral_matrix, side, bf16):
    """A draw's B (a 0/1 matrix from the draw's indices, applied as a fill) is F_newᵀ F_old: to float32 rounding for
    a float32 pool, and to bfloat16's for a bfloat16 one (its vectors are orthonormal to ~1e-2)."""
    g, *_ = spectral_matrix(M, N_COLS, SIGMA, seed=4, dtype=torch.float32)
    projector = PlumageProjector(K, proj_type=side, update_proj_gap=10_000, seed=5, resample_every=1, pool_bf16=bf16)
    projector.refresh(g, 0)
    ((mode, _),) = projector.factors.items()
    tolerance = 2e-2 if bf16 else 1e-6
    moments = torch.randn(K, N_COLS) if mode == 0 else torch.randn(M, K)
    for step in range(1, 20):
        old = projector.factors[mode].float().clone()  # a draw rearranges the pool (and so this view) in place
        projector.resample(step)
        assert projector.moved and projector._transition is None  # kept as the changed rows until a reader asks for B
        product = projector.factors[mode].float().T @ old
        torch.testing.assert_close(projector.transition[mode], product, atol=tolerance, rtol=0)
        dense = product @ moments if mode == 0 else moments @ product.T
        torch.testing.assert_close(projector.transport(moments), dense, atol=tolerance * 10, rtol=0)
        torch.testing.assert_close(projector.transport(moments, squared=True).abs(), dense.abs(), atol=tolerance * 10,
                                   rtol=0)
