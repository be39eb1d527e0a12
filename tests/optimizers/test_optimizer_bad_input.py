"""Bad input fails at construction with a message naming the value; bad gradients never reach the state."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from galore_plumage import (
    GaLoreAdamW,
    GaLoreAdamW8bit,
    PlumageAdafactor,
    PlumageAdamW,
    PlumageAdamW8bit,
    build_optimizer,
)
from galore_plumage.optimizers import PLUMAGE_SAMPLED, PlumageSGDM


def _weight(*shape):
    return nn.Parameter(torch.randn(*shape, generator=torch.Generator().manual_seed(0)))


def _low_rank(param, **keys):
    return [{"params": [param], "rank": 2, "update_proj_gap": 2, **keys}]


def test_unknown_optimizer_name_lists_the_choices():
    with pytest.raises(ValueError, match="unknown optimizer 'adamw9bit'") as error:
        build_optimizer("adamw9bit", nn.Linear(4, 4))
    for choice in ("adamw8bit", "plumage_adamw", "galore_adafactor", "flora_sgdm_per_layer"):
        assert choice in str(error.value)


def test_unknown_projector_in_a_group_lists_the_choices():
    with pytest.raises(ValueError, match="unknown projector 'pca'") as error:
        GaLoreAdamW(_low_rank(_weight(8, 6), projector="pca"))
    assert all(name in str(error.value) for name in ("plumage", "random", "svd", "tucker"))


def test_unknown_projector_through_build_optimizer():
    model = nn.ModuleDict({"attn": nn.Linear(6, 6)})
    with pytest.raises(ValueError, match="unknown projector 'pca'"):
        build_optimizer("plumage_adamw", model, projector="pca", rank=2)


def test_unknown_realign_rule_lists_the_choices():
    with pytest.raises(ValueError, match="unknown realign rule 'ms'") as error:
        PlumageAdamW(_low_rank(_weight(8, 6), realign="ms"))
    assert all(rule in str(error.value) for rule in ("none", "m", "mv", "mv_meansplit"))


def test_one_dimensional_param_in_a_low_rank_group_names_its_shape():
    with pytest.raises(ValueError, match=re.escape("shape (8,)")) as error:
        PlumageAdamW(_low_rank(_weight(8)))
    assert "group without 'rank'" in str(error.value)


def test_four_dimensional_param_needs_tucker():
    conv = _weight(6, 4, 3, 3)
    with pytest.raises(ValueError, match=re.escape("shape (6, 4, 3, 3)")) as error:
        GaLoreAdamW(_low_rank(conv))
    assert "tucker" in str(error.value)
    optimizer = GaLoreAdamW(_low_rank(conv, projector="tucker"), lr=1e-2)
    start = conv.detach().clone()
    conv.grad = torch.randn(6, 4, 3, 3, generator=torch.Generator().manual_seed(1))
    optimizer.step()
    assert torch.isfinite(conv).all() and not torch.equal(conv, start)


@pytest.mark.parametrize(
    "cls,options,message",
    [
        (PlumageAdamW, {"lr": -1.0}, "Invalid lr: -1.0"),
        (PlumageAdamW8bit, {"lr": -1.0}, "Invalid lr: -1.0"),
        (PlumageSGDM, {"lr": -1.0}, "Invalid lr: -1.0"),
        (PlumageAdafactor, {"lr": -1.0, "relative_step": False}, "Invalid learning rate: -1.0"),
        (PlumageAdamW, {"lr": float("nan")}, "Invalid lr: nan"),
        (PlumageAdamW, {"betas": (1.2, 0.999)}, "Invalid beta parameter at index 0: 1.2"),
        (PlumageAdamW, {"betas": (0.9, -0.1)}, "Invalid beta parameter at index 1: -0.1"),
        (PlumageAdamW8bit, {"betas": (1.2, 0.999)}, "Invalid beta parameter at index 0: 1.2"),
        (PlumageAdafactor, {"beta1": 1.2}, "Invalid beta1: 1.2"),
        (PlumageSGDM, {"momentum": 1.0}, "Invalid momentum value: 1.0"),
        (PlumageAdamW, {"eps": -1e-8}, "Invalid eps: -1e-08"),
        (PlumageAdamW8bit, {"eps": -1e-8}, "Invalid eps: -1e-08"),
        (PlumageAdamW, {"weight_decay": -0.1}, "Invalid weight_decay: -0.1"),
        (PlumageAdafactor, {"lr": 1e-3}, "Cannot combine manual lr=0.001 and relative_step=True"),
    ],
)
def test_bad_hyper_parameters_are_named(cls, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(_low_rank(_weight(8, 6)), **options)


# Our options (optimizers/options.py) with a bad value, or where they do not apply, each refused with the message that
# names why; tests/optimizers/test_options_table.py also runs every bad value of the table through groups and names.
OPTION_REFUSALS = [
    *((PlumageAdamW, {"row_bias_correction": bad}, "row_bias_correction must be True or False") for bad in ("yes", 1, None)),
    *((cls, {"row_bias_correction": True}, r"row_bias_correction=True .*needs the adamw or adafactor backend")
      for cls in (GaLoreAdamW8bit, PlumageSGDM)),
    *((PlumageAdamW, {"sampled_step": bad}, r"sampled_step .*adaptive, norm_matched") for bad in ("fira", None, 1)),
    *((GaLoreAdamW, {"max_inv_p": 2.0, "projector": name}, f"projector {name!r} does not rescale") for name in ("svd", "random")),
]


@pytest.mark.parametrize("cls, options, message", OPTION_REFUSALS,
                         ids=[f"{cls.__name__}-{'-'.join(f'{k}={v!r}' for k, v in o.items())}" for cls, o, _ in OPTION_REFUSALS])
def test_our_options_are_refused_where_bad_or_inapplicable(cls, options, message):
    with pytest.raises(ValueError, match=message):
        cls(_low_rank(_weight(8, 6)), lr=1e-2, **options)


def test_a_cap_given_to_a_full_rank_optimizer_names_it():
    with pytest.raises(ValueError, match=r"max_inv_p=2.0 .*'adamw' is full-rank; pick plumage_adamw"):
        build_optimizer("adamw", nn.Sequential(nn.Linear(10, 8)), lr=1e-3, max_inv_p=2.0)


@pytest.mark.parametrize("rank", [0, -3, 2.5])
def test_bad_rank_is_named(rank):
    with pytest.raises(ValueError, match=re.escape(f"rank must be an integer >= 1, got {rank!r}")):
        PlumageAdamW([{"params": [_weight(8, 6)], "rank": rank}])


def test_bad_low_rank_keys_are_named():
    with pytest.raises(ValueError, match="proj_type='diagonal'"):
        GaLoreAdamW(_low_rank(_weight(8, 6), proj_type="diagonal"))
    with pytest.raises(ValueError, match="proj_type='full'"):  # PLUMAGE samples one side only
        PlumageAdamW(_low_rank(_weight(8, 6), projector="plumage", v_floor="none", proj_type="full"))
    # the default's floor needs rows to floor: a two-sided basis is refused, naming the key and how to turn it off
    with pytest.raises(ValueError, match="v_floor='m2'.*needs a one-sided projection.*v_floor='none'"):
        PlumageAdamW(_low_rank(_weight(8, 6), proj_type="full"))
    PlumageAdamW(_low_rank(_weight(8, 6), proj_type="full", v_floor="none"))  # GaLore's two-sided basis, no floor
    with pytest.raises(ValueError, match="update_proj_gap must be an integer >= 1, got 0"):
        PlumageAdamW(_low_rank(_weight(8, 6), update_proj_gap=0))


def test_unknown_option_is_refused():
    with pytest.raises(TypeError, match="unexpected options \\['rnak'\\]"):
        PlumageAdamW(_low_rank(_weight(8, 6)), rnak=4)


def test_rank_above_min_dimension_is_clamped_with_a_warning():
    weight = _weight(8, 6)
    optimizer = GaLoreAdamW([{"params": [weight], "rank": 10}], lr=1e-2)
    weight.grad = torch.randn(8, 6)
    with pytest.warns(UserWarning, match="rank 10 >= min\\(m, n\\) = 6"):
        optimizer.step()
    assert optimizer.state[weight]["exp_avg"].shape == (8, 6)


BACKENDS = [
    (PlumageAdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    (PlumageAdamW, {"lr": 1e-2, "weight_decay": 0.1, **PLUMAGE_SAMPLED}),  # PLUMAGE's draws
    (PlumageAdamW8bit, {"lr": 1e-2, "weight_decay": 0.1, "min_8bit_size": 16}),
    (PlumageAdafactor, {"lr": 1e-2, "relative_step": False, "beta1": 0.9, "weight_decay": 0.1}),
    (PlumageSGDM, {"lr": 1e-2, "weight_decay": 0.1}),
]
IDS = [cls.__name__ + ("-sampled" if "projector" in options else "") for cls, options in BACKENDS]


def _tensors(state):
    for value in state.values():
        if isinstance(value, dict):
            yield from _tensors(value)
        elif torch.is_tensor(value):
            yield value


def _two_steps(optimizer, weight):
    """Steps 0 and 1 on random gradients (the first basis is made at step 0); returns the generator."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        weight.grad = torch.randn(12, 8, generator=generator)
        optimizer.step()
    return generator


def _snapshot(optimizer, weight):
    state = optimizer.state[weight]
    return weight.detach().clone(), {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}


@pytest.mark.parametrize("cls,options", BACKENDS, ids=IDS)
def test_nan_gradient_at_a_refresh_skips_the_step(cls, options):
    weight = _weight(12, 8)
    optimizer = cls(_low_rank(weight), **options)
    generator = _two_steps(optimizer, weight)
    before_weight, before_state = _snapshot(optimizer, weight)
    bad = torch.randn(12, 8, generator=generator)
    bad[3, 2] = float("nan")
    weight.grad = bad
    optimizer.step()  # step 2: a refresh is due
    assert torch.equal(weight, before_weight)
    state = optimizer.state[weight]
    assert state["step"] == before_state["step"] == 2
    for value in _tensors(state):
        assert torch.isfinite(value.float()).all()
    projector = optimizer.projector_for(weight, optimizer.param_groups[0])
    assert projector.refresh_count == 1 and projector.stats["skipped_refreshes"] == 1
    weight.grad = torch.randn(12, 8, generator=generator)
    optimizer.step()  # the refresh is retried with the next, finite gradient
    assert projector.refresh_count == 2 and torch.isfinite(weight).all()


@pytest.mark.parametrize("cls,options", BACKENDS, ids=IDS)
@pytest.mark.parametrize("bad_value", [0.0, float("nan")], ids=["zero", "nan"])
def test_bad_first_gradient_defers_the_basis(cls, options, bad_value):
    weight = _weight(12, 8)
    start = weight.detach().clone()
    optimizer = cls(_low_rank(weight), **options)
    weight.grad = torch.full((12, 8), bad_value)
    optimizer.step()
    projector = optimizer.projector_for(weight, optimizer.param_groups[0])
    assert not projector.ready
    assert torch.equal(weight, start)  # no basis, no step (not even weight decay)
    assert all(torch.isfinite(v.float()).all() for v in _tensors(optimizer.state[weight]))
    weight.grad = torch.randn(12, 8, generator=torch.Generator().manual_seed(1))
    optimizer.step()
    assert projector.ready and optimizer.state[weight]["step"] == 1
    assert torch.isfinite(weight).all() and not torch.equal(weight, start)


@pytest.mark.parametrize("cls,options", BACKENDS, ids=IDS)
def test_zero_gradient_at_a_later_refresh_keeps_the_basis(cls, options):
    weight = _weight(12, 8)
    optimizer = cls(_low_rank(weight), **options)
    _two_steps(optimizer, weight)
    projector = optimizer.projector_for(weight, optimizer.param_groups[0])
    # what the refresh made: its factors, or (PLUMAGE resampling between refreshes) the pool later draws come from
    basis = lambda: {0: projector.pool.vectors} if projector.pool is not None else projector.factors  # noqa: E731
    factors, refreshes = {k: f.clone() for k, f in basis().items()}, projector.refresh_count
    weight.grad = torch.zeros(12, 8)
    optimizer.step()  # a zero gradient is sound: the step runs on the old basis
    assert projector.refresh_count == refreshes
    assert all(torch.equal(basis()[k], factors[k]) for k in factors)
    assert optimizer.state[weight]["step"] == 3
    assert torch.isfinite(weight).all()
    assert all(torch.isfinite(v.float()).all() for v in _tensors(optimizer.state[weight]))


def test_adafactor_refuses_factored_realignment_of_a_tensor_weight_up_front():
    """Adafactor's factored V transports exactly only for 2-D weights: say so at construction, not mid-run."""
    model = nn.ModuleDict({"mlp": nn.Conv2d(8, 12, 3)})
    options = {"rank": 2, "lr": 1e-2, "update_proj_gap": 2, "projector": "tucker", "relative_step": False}
    with pytest.raises(ValueError, match=re.escape("realign='mv'") + ".*" + re.escape("shape (12, 8, 3, 3)")):
        build_optimizer("plumage_adafactor", model, realign="mv", **options)
    optimizer = build_optimizer("plumage_adafactor", model, realign="m", **options)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):  # refreshes at steps 0, 2 and 4, the moments realigned at the last two
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    assert torch.isfinite(model["mlp"].weight).all()
