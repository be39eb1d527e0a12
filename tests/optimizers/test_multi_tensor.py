"""foreach: the plain steady updates of a group's low-rank weights taken together train as one by one (exactly, or to
float32 rounding where the complement moves), launch a number of elementwise kernels that does not grow with the
number of weights, and leave every other update alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from group_helpers import Layer, train
from torch.utils._python_dispatch import TorchDispatchMode

from galore_plumage import PlumageAdafactor, PlumageAdamW, PlumageAdamW8bit, build_optimizer
from galore_plumage.optimizers import (
    FIRA_COMPLEMENT,
    PLUMAGE_ADAFACTOR_DRAWS,
    PLUMAGE_PAPER,
    PLUMAGE_SAMPLED,
    PlumageSGDM,
    base,
    multi_tensor,
)
from galore_plumage.optimizers.multi_tensor import foreach_on
from galore_plumage.projectors.modes import add_product

SETTINGS = {
    "default": {},  # GaLore's top-r basis with v_floor m2
    "m2_corrected": {"v_floor": "m2_corrected"},
    "paper": {**PLUMAGE_PAPER, "scale": 0.5},  # PLUMAGE's 1/p rescaled rows
    # draws after every update; the complement on the first 2 updates after a refresh (the refresh's own one by one)
    "sampled": {**PLUMAGE_SAMPLED, "residual_horizon": 2},
    # torchrun's large-batch default: Fira's complement at every update, its limiter referenced on every one
    "fira_complement": {**FIRA_COMPLEMENT, "v_floor": "none"},
    # plumage_adamw's own complement: a quarter step, capped, referenced off refreshes, staggered refreshes so that
    # some weights of a step move it and some do not
    "capped_complement": {"residual": "norm_matched", "residual_limiter": "steady", "residual_scale": 0.25,
                          "residual_cap": 0.5, "residual_horizon": 3, "stagger": True},
    "random": {"projector": "random", "realign": "m", "v_floor": "none"},
    "no_bias_correction": {"correct_bias": False},
}


# where the complement moves, its per-column norms run over the weights' columns laid side by side, which may add in
# another order than one weight's own norm: the same numbers to float32 rounding (3e-7 of the weights after 40 steps)
MOVES_THE_COMPLEMENT = {"sampled", "fira_complement", "capped_complement"}


def same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    if exact or not a.is_floating_point():
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", SETTINGS)
def test_taken_together_trains_as_one_by_one(name, monkeypatch):
    check_together_as_one_by_one(SETTINGS[name], name not in MOVES_THE_COMPLEMENT, monkeypatch)


# the other backends, each on its plumage_* defaults, without a complement and with torchrun's large-batch one: 8-bit
# AdamW advances each weight's moments on its own (Backend.update_together), Adafactor and SGD momentum in _foreach
# calls; the complement and the decay are taken together for all. Adafactor at its relative step scaled by each
# weight's RMS: every weight its own step size (Update.unit) and decay
OTHER_BACKENDS = {
    "adamw8bit": (PlumageAdamW8bit, {"lr": 1e-2, "weight_decay": 0.1}, {}),
    "adafactor": (PlumageAdafactor, {"weight_decay": 0.1, "beta1": 0.9}, {}),
    # ... at an lr, as torchrun_main.py runs it (no relative step, no parameter scaling: one step size for all), on
    # PLUMAGE's draws (its default of sessions 42-80, with their complement after a refresh)
    "adafactor_lr": (PlumageAdafactor, {"lr": 1e-2, "relative_step": False, "scale_parameter": False,
                                        "weight_decay": 0.1, "beta1": 0.9}, {**PLUMAGE_ADAFACTOR_DRAWS, "residual_horizon": 2}),
    "sgdm": (PlumageSGDM, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1}, {}),
}


@pytest.mark.parametrize("complement", ["defaults", "none", "fira"])
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_every_backend_takes_its_updates_together_as_one_by_one(backend, complement, monkeypatch):
    optimizer_class, hyper, options = OTHER_BACKENDS[backend]
    if complement == "none":
        options = {**options, "residual": "none"}
    elif complement == "fira":
        options = {**FIRA_COMPLEMENT, **({"v_floor": "none"} if backend == "adamw8bit" else {})}
    # PLUMAGE's draws (plumage_sgdm's default, adafactor_lr's) move their own complement after a refresh
    moves = complement == "fira" or (complement == "defaults" and backend in ("adafactor_lr", "sgdm"))
    check_together_as_one_by_one(options, not moves, monkeypatch, optimizer_class=optimizer_class, hyper=hyper)


def check_together_as_one_by_one(options: dict, exact: bool, monkeypatch, **build):
    calls = []
    real = base.step_together
    monkeypatch.setattr(base, "step_together", lambda opt, group, params, after: calls.append(len(params))
                        or real(opt, group, params, after))
    together, together_optimizer = train(True, resting=2, **build, **options)
    single, single_optimizer = train(False, resting=2, **build, **options)
    # every weight of the group, or those not refreshing (staggered: one or two refresh at most steps)
    assert calls and max(calls) >= (5 if options.get("stagger") else 7) and min(calls) >= 2, calls
    for a, b in zip(together.parameters(), single.parameters(), strict=True):
        assert same(a, b, exact), (a - b).abs().max()
    for a, b in zip(together.parameters(), single.parameters(), strict=True):
        state_a, state_b = together_optimizer.state[a], single_optimizer.state[b]
        assert state_a.keys() == state_b.keys()
        for key, value in state_a.items():
            if isinstance(value, torch.Tensor):
                assert same(value, state_b[key], exact), key
            elif key != "projector":
                assert value == state_b[key], key
    assert together_optimizer.projector_stats() == single_optimizer.projector_stats()


def test_bfloat16_weights_with_the_complement_train_together_as_one_by_one():
    """A bfloat16 weight (torchrun's --dtype bfloat16) takes the low-rank product in float32, rounded once, and β φ ⊙ G
    in bfloat16, as one by one; the float32 rounding of the complement's norms may flip a bfloat16 rounding."""
    together, _ = train(True, resting=2, dtype=torch.bfloat16, **SETTINGS["fira_complement"])
    single, _ = train(False, resting=2, dtype=torch.bfloat16, **SETTINGS["fira_complement"])
    torch.manual_seed(0)
    start = Layer().to(torch.bfloat16)
    for a, b, initial in zip(together.parameters(), single.parameters(), start.parameters(), strict=True):
        assert a.dtype == torch.bfloat16 and not torch.equal(b, initial)
        assert (a.float() - b.float()).abs().max() <= 2**-7 * b.float().abs().max(), (a - b).abs().max()


@pytest.mark.parametrize("name", ["fira_complement", "capped_complement"])
def test_the_complement_is_moved_together_also_where_only_some_weights_move_it(name, monkeypatch):
    calls = []  # [weights taken together, how many of them move the complement] at each step_together
    real_step, real_weights = base.step_together, multi_tensor.complement_weights_together
    monkeypatch.setattr(base, "step_together", lambda opt, group, params, after: calls.append([len(params), 0])
                        or real_step(opt, group, params, after))
    monkeypatch.setattr(multi_tensor, "complement_weights_together", lambda z, r, grads, *args, **kwargs: calls[-1].
                        __setitem__(1, len(grads)) or real_weights(z, r, grads, *args, **kwargs))
    train(True, resting=2, **SETTINGS[name])
    if name == "fira_complement":  # every update moves it, so every weight taken together does
        assert calls and all(moving == taken for taken, moving in calls), calls
    else:  # a horizon of 3 with staggered refreshes: some steps move it for part of the weights only
        assert any(0 < moving < taken for taken, moving in calls), calls


class CountKernels(TorchDispatchMode):
    """Counts the aten calls that run a kernel over a tensor's elements, leaving out matmuls and views."""

    LEFT_OUT = ("mm", "addmm", "t", "view", "transpose", "permute", "expand", "alias", "detach", "_to_copy", "slice")

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__.rstrip("_") not in self.LEFT_OUT:
            self.count += 1
        return func(*args, **(kwargs or {}))


def elementwise_kernels_of_a_steady_step(square: int, foreach: bool, **options) -> int:
    torch.manual_seed(0)
    layer = Layer(square)
    optimizer = PlumageAdamW([{"params": list(layer.square.parameters()), "rank": 6, "update_proj_gap": 50,
                               "foreach": foreach, **options}], lr=1e-2, weight_decay=0.1)
    for _ in range(2):  # a refresh, then a steady update: the moments exist
        for param in layer.square.parameters():
            param.grad = torch.randn_like(param)
        optimizer.step()
    with CountKernels() as counter:
        optimizer.step()
    return counter.count


def test_the_elementwise_kernels_of_a_steady_step_do_not_grow_with_the_weights():
    assert elementwise_kernels_of_a_steady_step(8, True) == elementwise_kernels_of_a_steady_step(4, True)
    one_by_one = elementwise_kernels_of_a_steady_step(8, False), elementwise_kernels_of_a_steady_step(4, False)
    assert one_by_one[0] > one_by_one[1] > elementwise_kernels_of_a_steady_step(4, True)


def test_the_complement_taken_together_launches_two_elementwise_kernels_a_weight():
    """What is left per weight with Fira's complement (torchrun's large-batch default): the norms of its gradient's
    columns and the add-back of β φ ⊙ G, two passes over G, where one by one it launches 40 elementwise kernels (on a
    GPU each costs its launch: a 350M layer's step took 3.9x galore-torch's one by one, docs/step_time_cuda.md)."""
    complement = {**FIRA_COMPLEMENT, "v_floor": "none"}
    together = [elementwise_kernels_of_a_steady_step(n, True, **complement) for n in (4, 8)]
    one_by_one = [elementwise_kernels_of_a_steady_step(n, False, **complement) for n in (4, 8)]
    per_weight_together, per_weight_alone = (together[1] - together[0]) / 4, (one_by_one[1] - one_by_one[0]) / 4
    assert per_weight_together <= 2 and per_weight_alone >= 20 * per_weight_together, (together, one_by_one)


def test_updates_that_cannot_be_taken_together_step_one_by_one(monkeypatch):
    calls = []
    monkeypatch.setattr(base, "step_together", lambda *args: calls.append(args))
    for options in ({"row_bias_correction": True, "v_floor": "none"}, {"refresh_ema": 0.5},
                    {**PLUMAGE_PAPER, "sampled_step": "norm_matched"}):
        train(True, steps=4, **options)
        assert not calls, options
    torch.manual_seed(0)
    layer = Layer()
    optimizer = PlumageAdamW([{"params": layer.matrices(), "rank": 6, "foreach": True}], lr=1e-2)
    optimizer.step_observers.append(lambda *args: None)  # diagnostics see each weight's update on its own
    for _ in range(3):
        for param in layer.matrices():
            param.grad = torch.randn_like(param)
        optimizer.step()
    assert not calls


def test_per_layer_mode_steps_one_by_one_and_trains_as_without_foreach():
    def run(foreach):
        torch.manual_seed(0)
        layer = Layer()
        optimizer = build_optimizer("plumage_adamw_per_layer", layer, rank=6, update_proj_gap=2,
                                    target_modules=("square", "up", "down"), foreach=foreach)
        data = torch.Generator().manual_seed(1)
        for _ in range(4):
            x = torch.randn(5, 40, generator=data)
            hidden = torch.relu(layer.up[0](sum(linear(x) for linear in layer.square)) + layer.up[1](x))
            layer.norm(layer.down(hidden)).square().mean().backward()  # each weight steps in its gradient hook
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in layer.parameters()]
    together, single = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(together, single, strict=True))
    assert not torch.equal(together[0], Layer().square[0].weight)


def test_foreach_left_unset_is_on_for_weights_on_a_gpu_unless_each_update_is_compiled():
    """None resolves as torch.optim's foreach does: on a GPU, launches cost more than the work (docs/step_time_cuda.md);
    on a CPU the batched calls were slower (docs/step_time.md). Only the weights' device type is read."""
    on_gpu = [SimpleNamespace(device=torch.device("cuda"))]
    on_cpu = Layer().matrices()
    assert foreach_on({"foreach": None}, on_gpu) and not foreach_on({"foreach": None}, on_cpu)
    assert foreach_on({"foreach": None, "compile_update": True}, on_gpu)  # the group compiled together
    assert foreach_on({"foreach": True}, on_cpu) and not foreach_on({"foreach": False}, on_gpu)
    PlumageAdamW([{"params": on_cpu, "rank": 6, "compile_update": True}], lr=1e-2)  # unset foreach does not clash


@pytest.mark.parametrize("bad", ["yes", 1])
def test_a_bad_foreach_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="foreach"):
        PlumageAdamW([{"params": Layer().matrices(), "rank": 6, "foreach": bad}], lr=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1])
def test_a_part_given_as_columns_is_added_back_as_add_product_adds_it(mode, dtype):
    """add_columns_product (the compiled group's add-backs) takes the mixed part in the layout mixed_together returns;
    on mode 1 it adds to the weight's transpose instead of transposing the part and the factor: the same bits."""
    generator = torch.Generator().manual_seed(mode)
    m, n, r = 24, 40, 6
    factor = torch.randn((m if mode == 0 else n, r), generator=generator)
    part = torch.randn((r, n if mode == 0 else m), generator=generator)  # r rows: one column a column of `columns`
    weight = torch.randn((m, n), generator=generator).to(dtype)
    expected, got = weight.clone(), weight.clone()
    add_product(expected, factor, multi_tensor.columns(part, mode), mode)
    multi_tensor.add_columns_product(got, factor, part, mode)
    assert torch.equal(got, expected) and not torch.equal(got, weight)
