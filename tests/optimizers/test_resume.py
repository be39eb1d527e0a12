"""Checkpoint round trips mid-run: save just before a refresh, reload into fresh objects, continue in lockstep.

The resumed run must repeat the uninterrupted one bit for bit (torch.equal), through the refresh that
follows the save (the sampled basis is a function of the seed and the refresh count, both in the state),
for fp32 and bf16 weights. The checkpoint goes through torch.save / torch.load(weights_only=True).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from galore_plumage import build_optimizer
from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS, PLUMAGE_SAMPLED

GAP, SAVE_AFTER, TOTAL = 3, 6, 11  # refreshes at steps 0, 3, 6, 9: the first resumed step (6) refreshes
CONFIGS = {  # name -> options; min_8bit_size=64 puts these small tensors on the blockwise 8-bit path
    "plumage_adamw": {"lr": 1e-2, "weight_decay": 0.1},  # the default: top-r basis, v_floor
    # PLUMAGE's draws (the default of sessions 14-16): pool, draw count, complement limiter
    "plumage_adamw sampled": {"lr": 1e-2, "weight_decay": 0.1, **PLUMAGE_SAMPLED},
    "galore_adamw": {"lr": 1e-2, "weight_decay": 0.1},
    "flora_adamw": {"lr": 1e-2, "weight_decay": 0.1},  # factors not stored: regenerated from the seed on load
    "plumage_adamw8bit": {"lr": 1e-2, "weight_decay": 0.1, "min_8bit_size": 64},
    "plumage_adamw8bit sampled": {"lr": 1e-2, "weight_decay": 0.1, "min_8bit_size": 64, **PLUMAGE_SAMPLED},
    "plumage_adafactor": {"lr": 1e-2, "relative_step": False, "beta1": 0.9, "weight_decay": 0.1},
    # PLUMAGE's draws on Adafactor (its default of sessions 42-80): pool, draw count, the complement's limiter
    "plumage_adafactor draws": {"lr": 1e-2, "relative_step": False, "beta1": 0.9, "weight_decay": 0.1,
                                **PLUMAGE_ADAFACTOR_DRAWS},
    "plumage_sgdm": {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1},
    # the remedies keep state of their own: the limiter's last norm, each row's bias-correction weights
    "plumage_adamw norm_matched": {"lr": 1e-2, "weight_decay": 0.1, **PLUMAGE_SAMPLED, "sampled_step": "norm_matched"},
    "plumage_adamw row_bias": {"lr": 1e-2, "weight_decay": 0.1, **PLUMAGE_SAMPLED, "row_bias_correction": True},
    "plumage_adafactor row_bias": {"lr": 1e-2, "relative_step": False, "beta1": 0.9, "weight_decay": 0.1,
                                   "row_bias_correction": True},
    # a draw between refreshes: the pool, the draw count and the next draw's step are state
    "plumage_adamw resample": {"lr": 1e-2, "weight_decay": 0.1, **PLUMAGE_SAMPLED, "sampled_step": "norm_matched",
                               "resample_every": 1},
    # Fira's complement: its limiter keeps the last norm
    "plumage_adamw residual": {"lr": 1e-2, "weight_decay": 0.1, **PLUMAGE_SAMPLED, "residual": "norm_matched"},
    "galore_adamw8bit residual": {"lr": 1e-2, "weight_decay": 0.1, "residual": "norm_matched", "min_8bit_size": 64},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(24, 16)
        self.mlp = nn.Linear(16, 20)
        self.head = nn.Linear(20, 4)


def _model(dtype):
    torch.manual_seed(0)
    return Tiny().to(dtype)


def _build(name, model):
    return build_optimizer(name.split()[0], model, rank=4, update_proj_gap=GAP, **CONFIGS[name])


def _step(model, optimizer, generator):
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator).to(p.dtype)
    optimizer.step()


def _assert_equal_states(a, b, where=""):
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal_states(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal_states(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    else:
        assert a == b, where


def _continue_in_lockstep(run, resumed_run):
    """Steps SAVE_AFTER to TOTAL of the uninterrupted run and the resumed one on the same gradients: the same weights
    after each, the same state at the end."""
    model, optimizer, generator = run
    resumed_model, resumed = resumed_run
    resumed_generator = torch.Generator()
    resumed_generator.set_state(generator.get_state())
    for _ in range(SAVE_AFTER, TOTAL):
        _step(model, optimizer, generator)
        _step(resumed_model, resumed, resumed_generator)
        for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
            assert torch.equal(a, b)
    _assert_equal_states(resumed.state_dict(), optimizer.state_dict())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_resume_continues_bit_for_bit(name, dtype, tmp_path):
    model = _model(DTYPES[dtype])
    optimizer = _build(name, model)
    generator = torch.Generator().manual_seed(1)
    for _ in range(SAVE_AFTER):
        _step(model, optimizer, generator)
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    torch.save(model.state_dict(), tmp_path / "model.pt")

    resumed_model = _model(DTYPES[dtype])
    resumed_model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    resumed = _build(name, resumed_model)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    _assert_equal_states(resumed.state_dict(), optimizer.state_dict())

    _continue_in_lockstep((model, optimizer, generator), (resumed_model, resumed))
    refreshes = [s["refreshes"] for s in resumed.projector_stats().values()]
    assert refreshes == [len(range(0, TOTAL, GAP))] * 2  # the resumed run went through two refreshes


def test_a_checkpoint_of_plumage_adafactors_draws_goes_on_drawing_under_todays_default(tmp_path):
    """plumage_adafactor drew PLUMAGE's sample in sessions 42-80; its checkpoint loaded into today's default (GaLore's
    basis) brings its groups' settings back with it, and the run goes on drawing, bit for bit."""
    model = _model(torch.float32)
    optimizer = _build("plumage_adafactor draws", model)
    generator = torch.Generator().manual_seed(1)
    for _ in range(SAVE_AFTER):
        _step(model, optimizer, generator)
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    resumed_model = copy.deepcopy(model)
    resumed = _build("plumage_adafactor", resumed_model)
    assert {g["projector"] for g in resumed.param_groups if "rank" in g} == {"svd"}
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    assert {(g["projector"], g["realign"], g["residual"]) for g in resumed.param_groups if "rank" in g} == {
        ("plumage", "mv", "norm_matched")}
    _continue_in_lockstep((model, optimizer, generator), (resumed_model, resumed))


def _low_rank_params(optimizer):
    return [p for group in optimizer.param_groups if "rank" in group for p in group["params"]]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_load_keeps_fp32_and_uint8_state_for_bf16_weights(name, tmp_path):
    """torch's load_state_dict would cast every floating state tensor to bf16: this one must not."""
    model = _model(torch.bfloat16)
    optimizer = _build(name, model)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        _step(model, optimizer, generator)
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    resumed_model = _model(torch.bfloat16)
    resumed = _build(name, resumed_model)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    (group,) = [g for g in resumed.param_groups if "rank" in g]
    for p in _low_rank_params(resumed):
        state = resumed.state[p]
        assert p.dtype == torch.bfloat16
        projector = resumed.projector_for(p, group)
        factors = projector.factors  # stored, or regenerated (flora) at load
        # float32, or the saved dtype of a pool kept in bfloat16 (plumage's default; projections still in float32)
        saved = torch.bfloat16 if projector.pool_bf16 and projector.pool is not None else torch.float32
        assert factors and all(f.dtype == saved for f in factors.values())
        assert projector.project(torch.ones(p.shape, dtype=torch.bfloat16)).dtype == torch.float32
        if "inv_p" in state["projector"]:
            assert state["projector"]["inv_p"].dtype == torch.float32
        moments = [v for k, v in state.items() if torch.is_tensor(v)]
        assert moments
        for key, value in state.items():
            if not torch.is_tensor(value):
                continue
            expected = torch.uint8 if key in ("state1", "state2") else torch.float32
            assert value.dtype == expected, (key, value.dtype)
    _assert_equal_states(resumed.state_dict()["state"], optimizer.state_dict()["state"])


def test_golden_state_layout_of_a_plumage_adamw_weight():
    """A change of checkpoint keys breaks old checkpoints: make it deliberate by updating this test."""
    model = _model(torch.float32)
    optimizer = _build("plumage_adamw sampled", model)
    _step(model, optimizer, torch.Generator().manual_seed(1))
    state_dict = optimizer.state_dict()
    assert set(state_dict) == {"state", "param_groups"}
    low_rank_group = next(g for g in state_dict["param_groups"] if "rank" in g)
    assert set(low_rank_group) == {
        "params", "lr", "betas", "eps", "weight_decay", "correct_bias", "rank", "update_proj_gap", "scale",
        "proj_type", "projector", "realign", "adaptive_interval", "tau_max", "seed", "stagger", "solver", "max_inv_p",
        "sampled_step", "row_bias_correction", "resample_every", "sample_until", "align_signs", "pool_factor", "pool_bf16",
        "residual", "residual_limiter", "residual_scale", "residual_cap", "residual_horizon", "refresh_ema", "v_floor",
        "v_floor_horizon", "refresh_batch",
        "foreach", "compile_update",
    }
    state = state_dict["state"][low_rank_group["params"][0]]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq", "projector", "residual_norm"}  # the complement's limiter
    assert set(state["projector"]) == {
        "name", "rank", "proj_type", "scale", "seed", "index", "tau", "refresh_count", "next_refresh", "refreshed_at",
        "shape", "rank_per_mode", "stats", "dtype", "factors", "inv_p", "pool",
    }
    assert set(state["projector"]["pool"]) == {"vectors", "p", "order", "draws", "next_resample"}  # resample_every (default 1)
    assert state["projector"]["name"] == "plumage" and set(state["projector"]["factors"]) == {0}
    assert state["exp_avg"].shape == state["exp_avg_sq"].shape == (4, 24)  # attn: 16 × 24, std → left, rank 4
    # the default (top-r basis with the floor) keeps GaLore's layout: no pool, no 1/p, no limiter
    default = _build("plumage_adamw", model)
    _step(model, default, torch.Generator().manual_seed(1))
    default_state = default.state_dict()
    low_rank_group = next(g for g in default_state["param_groups"] if "rank" in g)
    state = default_state["state"][low_rank_group["params"][0]]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq", "projector"}
    assert state["projector"]["name"] == "svd" and "pool" not in state["projector"]


def test_checkpoint_from_before_the_newest_group_keys_loads_with_their_defaults():
    """Group keys added since the first release (solver, max_inv_p, sampled_step, row_bias_correction, resample_every,
    align_signs, pool_factor, pool_bf16, residual, residual_limiter, residual_scale, residual_cap, residual_horizon,
    refresh_ema, v_floor, v_floor_horizon, sample_until) are missing
    from older checkpoints; loading one fills the values those runs were trained with (whatever today's defaults), and
    the run continues exactly as with a checkpoint that has them."""
    model, generator = _model(torch.float32), torch.Generator().manual_seed(2)
    # the values of the runs written before those keys
    paper = {"projector": "plumage", "realign": "mv", "sampled_step": "adaptive", "max_inv_p": None,
             "row_bias_correction": False, "resample_every": 0, "residual": "none", "v_floor": "none", "solver": "svd"}
    optimizer = build_optimizer("plumage_adamw", model, rank=4, update_proj_gap=GAP, lr=1e-2, **paper)
    for _ in range(SAVE_AFTER):
        _step(model, optimizer, generator)
    current = optimizer.state_dict()
    older = {"state": current["state"],
             "param_groups": [{k: v for k, v in g.items()
                               if k not in ("solver", "max_inv_p", "sampled_step", "row_bias_correction",
                                            "resample_every", "align_signs", "pool_factor", "pool_bf16", "residual",
                                            "residual_limiter", "residual_scale", "residual_cap", "residual_horizon",
                                            "refresh_ema", "v_floor", "v_floor_horizon", "sample_until")}
                              for g in current["param_groups"]]}
    twins = []
    for state_dict in (current, older):
        twin_model = _model(torch.float32)
        twin_model.load_state_dict(model.state_dict())
        twin = build_optimizer("plumage_adamw", twin_model, rank=4, update_proj_gap=GAP, lr=1e-2)  # today's defaults
        twin.load_state_dict(copy.deepcopy(state_dict))  # as from torch.load: the twins share no state tensors
        _step(twin_model, twin, torch.Generator().manual_seed(3))  # the first step after the load refreshes
        twins.append(twin_model)
    low_rank = next(g for g in twin.param_groups if "rank" in g)
    assert low_rank["solver"] == "svd" and low_rank["max_inv_p"] is None  # the values it was written with
    assert low_rank["sampled_step"] == "adaptive" and low_rank["row_bias_correction"] is False
    assert low_rank["resample_every"] == 0 and low_rank["align_signs"] is False and low_rank["residual"] == "none"
    assert (low_rank["projector"], low_rank["realign"], low_rank["v_floor"]) == ("plumage", "mv", "none")
    assert low_rank["v_floor_horizon"] is None
    for a, b in zip(twins[0].parameters(), twins[1].parameters(), strict=True):
        assert torch.equal(a, b)
