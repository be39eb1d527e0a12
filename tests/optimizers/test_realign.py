"""Moment realignment: every rule against its formula on real transitions B = P_newᵀ P_old.

Bases come from an SVDProjector refreshed twice with unrelated gradients (so B is far from I). All
dense checks run in float64 (the projector follows the gradient's dtype), so 1e-12 is rounding only.
"""

from __future__ import annotations

import pytest
import torch

from galore_plumage.optimizers import PlumageAdamW, PlumageSGDM
from galore_plumage.optimizers.adafactor import AdafactorBackend
from galore_plumage.optimizers.adamw import AdamWBackend
from galore_plumage.optimizers.adamw8bit import BLOCKSIZE, AdamW8bitBackend, dequantize, quantile_map, quantize_into
from galore_plumage.optimizers.realign import RULES, realign_dense, realign_factored
from galore_plumage.projectors import SVDProjector

SIDES = {"left": (0,), "right": (1,), "full": (0, 1)}  # proj_type -> projected modes of a 20 × 14 gradient
RANK = 5


def _moved_projector(proj_type, shape=(20, 14), rank=RANK, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    projector = SVDProjector(rank, proj_type=proj_type, update_proj_gap=1)
    for step in range(2):
        assert projector.refresh(torch.randn(shape, generator=generator, dtype=dtype), step)
    assert projector.transition is not None
    return projector


def _moments(low_shape, seed=1, dtype=torch.float64):
    """M and V with V >= M² (each test that wants entries with V < M² makes them)."""
    generator = torch.Generator().manual_seed(seed)
    m = torch.randn(low_shape, generator=generator, dtype=dtype)
    v = m.square() + torch.rand(low_shape, generator=generator, dtype=dtype)
    return m, v


def _low_shape(projector, shape=(20, 14)):
    return tuple(projector.project(torch.zeros(shape, dtype=torch.float64)).shape)


def _apply(x, transition, squared=False):
    """Explicit matrix form: B x (mode 0), x Bᵀ (mode 1), squared using B∘B."""
    for mode, b in transition.items():
        b = b * b if squared else b
        x = b @ x if mode == 0 else x @ b.T
    return x


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("side", list(SIDES))
def test_identity_transition_changes_nothing(side, rule):
    projector = _moved_projector(side)
    projector.transition = {mode: torch.eye(RANK, dtype=torch.float64) for mode in SIDES[side]}
    m, v = _moments(_low_shape(projector))
    m_new, v_new = realign_dense(m.clone(), v.clone(), projector, rule)
    # mv_meansplit rebuilds V as M² + (V − M²): equal up to one rounding, hence the 1e-12
    torch.testing.assert_close(m_new, m, rtol=0, atol=1e-12)
    torch.testing.assert_close(v_new, v, rtol=0, atol=1e-12)


@pytest.mark.parametrize("side", list(SIDES))
def test_each_rule_matches_its_formula(side):
    projector = _moved_projector(side)
    b = projector.transition
    assert set(b) == set(SIDES[side])
    for factor in b.values():
        assert (factor - torch.eye(RANK, dtype=torch.float64)).abs().max() > 0.1  # a real change of basis
    m, v = _moments(_low_shape(projector))
    v[0] = 0.5 * m[0].square()  # some entries with V < M²: meansplit clamps their spread to 0
    expected = {
        "none": (m, v),
        "m": (_apply(m, b), v),
        "mv": (_apply(m, b), _apply(v, b, squared=True)),
        "mv_meansplit": (_apply(m, b), _apply(m, b).square() + _apply((v - m.square()).clamp(min=0), b, squared=True)),
    }
    for rule, (m_expected, v_expected) in expected.items():
        m_new, v_new = realign_dense(m.clone(), v.clone(), projector, rule)
        torch.testing.assert_close(m_new, m_expected, rtol=0, atol=1e-12, msg=rule)
        torch.testing.assert_close(v_new, v_expected, rtol=0, atol=1e-12, msg=rule)
    # LDAdam's rule keeps the transported V at least the transported M²
    _, v_split = realign_dense(m, v, projector, "mv_meansplit")
    assert (v_split >= _apply(m, b).square() - 1e-12).all()


def test_no_transition_yet_changes_nothing():
    projector = SVDProjector(RANK, proj_type="left")
    projector.refresh(torch.randn(20, 14, dtype=torch.float64), 0)  # first basis: nothing to move from
    assert projector.transition is None
    m, v = _moments((RANK, 14))
    for rule in RULES:
        m_new, v_new = realign_dense(m, v, projector, rule)
        assert m_new is m and v_new is v


@pytest.mark.parametrize("side", list(SIDES))
def test_factored_transport_equals_dense_transport_of_the_estimate(side):
    projector = _moved_projector(side)
    low = _low_shape(projector)
    generator = torch.Generator().manual_seed(2)
    row = torch.rand(low[0], generator=generator, dtype=torch.float64) + 0.1
    col = torch.rand(low[1], generator=generator, dtype=torch.float64) + 0.1

    def estimate(r, c):  # Adafactor's V̂ = row ⊗ col / mean(row)
        return torch.outer(r, c) / r.mean()

    new_row, new_col = realign_factored(row.clone(), col.clone(), projector)
    expected = _apply(estimate(row, col), projector.transition, squared=True)
    torch.testing.assert_close(estimate(new_row, new_col), expected, rtol=1e-12, atol=0)
    assert (estimate(new_row, new_col) - estimate(row, col)).abs().max() > 1e-2  # it did move


def test_adafactor_backend_realign_rules():
    projector = _moved_projector("left")
    m, _ = _moments((RANK, 14))
    state = {"RMS": 1.0, "step": 3, "exp_avg": m.clone(),
             "exp_avg_sq_row": torch.rand(RANK, dtype=torch.float64) + 0.1,
             "exp_avg_sq_col": torch.rand(14, dtype=torch.float64) + 0.1}
    backend = AdafactorBackend()

    only_m = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
    backend.realign(only_m, projector, "m")
    torch.testing.assert_close(only_m["exp_avg"], projector.transition[0] @ m, rtol=0, atol=1e-12)
    assert torch.equal(only_m["exp_avg_sq_row"], state["exp_avg_sq_row"])
    assert torch.equal(only_m["exp_avg_sq_col"], state["exp_avg_sq_col"])

    both = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
    backend.realign(both, projector, "mv")
    row, col = realign_factored(state["exp_avg_sq_row"], state["exp_avg_sq_col"], projector)
    torch.testing.assert_close(both["exp_avg"], projector.transition[0] @ m, rtol=0, atol=1e-12)
    torch.testing.assert_close(both["exp_avg_sq_row"], row, rtol=0, atol=0)
    torch.testing.assert_close(both["exp_avg_sq_col"], col, rtol=0, atol=0)


def test_sgdm_transports_its_momentum():
    projector = _moved_projector("right")
    m, _ = _moments((20, RANK))
    for rule in ("m", "mv", "mv_meansplit"):  # one moment: every moving rule moves it the same way
        state = {"momentum_buffer": m.clone()}
        PlumageSGDM.backend.realign(state, projector, rule)
        torch.testing.assert_close(state["momentum_buffer"], m @ projector.transition[1].T, rtol=0, atol=1e-12)
    assert PlumageSGDM([torch.nn.Parameter(torch.zeros(2, 2))]).defaults["realign"] == "mv"  # its draws' (session 46)


def _states_for_every_backend(low_shape):
    """One realistic state per backend, on a float32 low-rank tensor of `low_shape`."""
    generator = torch.Generator().manual_seed(3)
    m = torch.randn(low_shape, generator=generator) * 0.01
    v = m.square() + torch.rand(low_shape, generator=generator) * 1e-4
    eightbit = {"step": 4}
    AdamW8bitBackend._init(eightbit, m, {"min_8bit_size": 4096})
    quantize_into(eightbit, 1, m)
    quantize_into(eightbit, 2, v)
    return {
        "adamw": (AdamWBackend(), {"step": 4, "exp_avg": m.clone(), "exp_avg_sq": v.clone()}),
        "adamw8bit": (AdamW8bitBackend(), eightbit),
        "adafactor": (AdafactorBackend(), {"step": 4, "RMS": 0.5, "exp_avg": m.clone(),
                                            "exp_avg_sq_row": v.mean(1), "exp_avg_sq_col": v.mean(0)}),
        "sgdm": (PlumageSGDM.backend, {"step": 4, "momentum_buffer": m.clone()}),
    }


def test_rule_none_leaves_every_backend_state_alone():
    projector = _moved_projector("right", shape=(80, 72), rank=64, dtype=torch.float32)
    for name, (backend, state) in _states_for_every_backend((80, 64)).items():
        before = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
        backend.realign(state, projector, "none")
        assert state.keys() == before.keys(), name
        for key, value in before.items():
            assert torch.equal(state[key], value) if torch.is_tensor(value) else state[key] == value, (name, key)


def test_eightbit_realign_is_the_fp32_transport_up_to_requantization():
    projector = _moved_projector("right", shape=(80, 72), rank=64, dtype=torch.float32)
    backend, state = _states_for_every_backend((80, 64))["adamw8bit"]
    assert state["state1"].dtype == torch.uint8  # 80 × 64 >= 4096: the blockwise 8-bit path
    m0, v0 = dequantize(state, 1), dequantize(state, 2)  # what the 8-bit state stands for
    m_expected, v_expected = realign_dense(m0, v0, projector, "mv")
    backend.realign(state, projector, "mv")
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8
    for which, expected, code_signed in ((1, m_expected, True), (2, v_expected, False)):
        # Requantizing maps each value, divided by its block's absmax, to a neighbouring code point of
        # bitsandbytes' dynamic map (nearly always the nearest: its CPU search overshoots half the gap by
        # up to ~0.2% near ±1), so the error is below the widest gap of the map times the block absmax.
        code = quantile_map(expected.device, signed=code_signed).sort().values
        widest_gap = code.diff().max().item()
        blocks = expected.flatten().view(-1, BLOCKSIZE)
        error = (dequantize(state, which).flatten().view(-1, BLOCKSIZE) - blocks).abs()
        bound = widest_gap * blocks.abs().amax(dim=1, keepdim=True)
        assert (error <= bound).all(), (which, (error - bound).max().item())
        moved = (expected - (m0 if which == 1 else v0)).abs().max()
        assert moved > 10 * bound.max()  # the transport is far bigger than the tolerance


def _carried_v(projector, m, v, rule):
    """V through the latest transition: (B∘B) V (mv), or (B M)² + (B∘B) max(V − M², 0) (mv_meansplit)."""
    if rule == "mv":
        return projector.transport(v, squared=True)
    return projector.transport(m).square() + projector.transport((v - m.square()).clamp(min=0), squared=True)


@pytest.mark.parametrize("rule", ["mv", "mv_meansplit"])  # the paper's; LDAdam's (PLUMAGE's draws train best with it)
def test_optimizer_realigns_at_a_refresh(rule):
    """Through PlumageAdamW: at the refresh step M ← β₁·B M + (1−β₁) R, V ← β₂·V' + (1−β₂) R², V' as the rule carries V."""
    generator = torch.Generator().manual_seed(6)
    weight = torch.nn.Parameter(torch.randn(24, 16, generator=generator))
    # no draws between refreshes (they realign too: tests/projectors/test_resample.py), so the refresh's is the last transition
    optimizer = PlumageAdamW([{"params": [weight], "rank": 4, "update_proj_gap": 3, "realign": rule,
                               "projector": "plumage", "v_floor": "none"}], lr=1e-2, betas=(0.9, 0.99), resample_every=0)
    group = optimizer.param_groups[0]
    for _ in range(3):
        weight.grad = torch.randn(24, 16, generator=generator)
        optimizer.step()
    state = optimizer.state[weight]
    m_old, v_old = state["exp_avg"].clone(), state["exp_avg_sq"].clone()
    weight.grad = torch.randn(24, 16, generator=generator)
    optimizer.step()  # step 3: refresh
    projector = optimizer.projector_for(weight, group)
    assert projector.refresh_count == 2 and projector.transition is not None
    r = projector.project(weight.grad)
    torch.testing.assert_close(state["exp_avg"], 0.9 * projector.transport(m_old) + 0.1 * r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        state["exp_avg_sq"], 0.99 * _carried_v(projector, m_old, v_old, rule) + 0.01 * r.square(), rtol=1e-5, atol=1e-7
    )


def test_keeping_the_moments_computes_no_transition_and_changes_no_step():
    """realign="none" (GaLore's way, plumage_adamw's default) reads no B, so its refreshes compute none: `moved` still
    says the basis changed, reading `transition` says why it is missing, and every weight is bit for bit what the same
    run gives with B computed (an observer makes the optimizer keep it)."""
    generator = torch.Generator().manual_seed(8)
    grads = [torch.randn(24, 16, generator=generator) for _ in range(7)]

    def run(observe: bool):
        weight = torch.nn.Parameter(torch.ones(24, 16))
        optimizer = PlumageAdamW([{"params": [weight], "rank": 4, "update_proj_gap": 3}], lr=1e-2)
        assert optimizer.param_groups[0]["realign"] == "none"
        if observe:
            optimizer.step_observers.append(lambda *args: None)
        for grad in grads:  # refreshes at steps 0, 3 and 6
            weight.grad = grad
            optimizer.step()
        return weight, optimizer.projector_for(weight, optimizer.param_groups[0])

    plain, projector = run(observe=False)
    observed, kept = run(observe=True)
    assert projector.refresh_count == kept.refresh_count == 3
    assert projector.moved and not projector.keeps_transition
    with pytest.raises(RuntimeError, match="keeps_transition"):
        _ = projector.transition
    assert kept.keeps_transition and kept.transition[1].shape == (4, 4)
    assert torch.equal(plain, observed)


def test_a_realigning_optimizer_keeps_the_transition():
    weight = torch.nn.Parameter(torch.ones(24, 16))
    optimizer = PlumageAdamW([{"params": [weight], "rank": 4, "update_proj_gap": 1, "realign": "mv"}], lr=1e-2)
    generator = torch.Generator().manual_seed(9)
    for _ in range(2):
        weight.grad = torch.randn(24, 16, generator=generator)
        optimizer.step()
    projector = optimizer.projector_for(weight, optimizer.param_groups[0])
    assert projector.keeps_transition and projector.transition is not None
