"""compile_update with foreach: the weights a step takes together are compiled as a group (their moments' _foreach
calls and the complement's arithmetic on all their columns) and train as the same group eager, to float32 rounding,
without compiling again when the lr changes."""

from __future__ import annotations

import pytest
import torch
from group_helpers import Layer, train

from galore_plumage import PlumageAdafactor, PlumageAdamW, PlumageAdamW8bit
from galore_plumage.optimizers import FIRA_COMPLEMENT, PLUMAGE_ADAFACTOR_DRAWS, PLUMAGE_SAMPLED, adafactor, adamw, multi_tensor

RESTING = 1  # a weight that rests every third step: the weights taken together change, and their step counts, so
# their (α, β) pairs, differ: several runs of the mixing


def run(compile_update: bool, resting: int | None = RESTING, **options):
    """Ten steps of the group helpers' layer, every low-rank update taken together where it can be."""
    return train(True, steps=10, resting=resting, compile_update=compile_update, **options)


@pytest.fixture(autouse=True)
def fresh_compilations():
    """torch's recompile limit (8 a function) counts every layout compiled in the process: each test starts afresh,
    so that its compiled functions do compile (a layout past the limit would run eager, and prove nothing)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


COMPILED_ONLY = pytest.mark.filterwarnings("error:.*recompile limit")  # the steps compared ran compiled


def assert_trained_alike(compiled: tuple, eager: tuple, keys: tuple[str, ...]) -> None:
    """Each (layer, optimizer) trained by run(True) and run(False): the weights moved the same, to float32 rounding,
    by updates that are not vanishing, and the projected weights' state `keys` agree."""
    (compiled_layer, compiled_optimizer), (eager_layer, eager_optimizer) = compiled, eager
    torch.manual_seed(0)
    for a, b, before in zip(compiled_layer.parameters(), eager_layer.parameters(), Layer().parameters(), strict=True):
        assert (b - before).abs().max() > 1e-3  # the updates compared are not vanishing
        torch.testing.assert_close(a - before, b - before, rtol=1e-4, atol=1e-7)
    for a, b in zip(compiled_layer.matrices(), eager_layer.matrices(), strict=True):
        for key in keys:
            torch.testing.assert_close(compiled_optimizer.state[a][key], eager_optimizer.state[b][key],
                                       rtol=1e-4, atol=1e-7)


SETTINGS = {
    # torchrun's large-batch default: Fira's complement at every update
    "fira_complement": {**FIRA_COMPLEMENT, "v_floor": "none"},
    # PLUMAGE's draws (1/p rescaling Z after φ is taken), the floor (eager, before the compiled moments), the
    # complement on the 2 updates after each refresh, refreshes staggered: some weights of a step move it, some not
    "sampled_staggered": {**PLUMAGE_SAMPLED, "residual_horizon": 2, "stagger": True},
    # PLUMAGE's draws with the complement at every update: the moments in the complement's call, 1/p rescaling Z there
    "sampled_every_update": {**PLUMAGE_SAMPLED, "residual_horizon": None},
}


@COMPILED_ONLY
@pytest.mark.parametrize("name", SETTINGS)
def test_compiled_together_trains_as_together_eager(name, monkeypatch):
    calls = {"moments": 0, "complement": 0, "projections, moments, complement": 0}

    def counted(module, function, key):
        real = getattr(module, function)

        def call(*args):
            calls[key] += 1
            return real(*args)

        monkeypatch.setattr(module, function, call)

    counted(adamw, "compiled_directions_together", "moments")
    counted(multi_tensor, "mixed_compiled", "complement")
    counted(multi_tensor, "whole_compiled", "projections, moments, complement")
    compiled, eager = run(True, **SETTINGS[name]), run(False, **SETTINGS[name])
    # the compiled group did the steps compared: where every weight taken together moves the complement (Fira's at
    # every update) its projections, moments and complement are one compiled call, otherwise the moments and the
    # complement are a call each
    if name == "sampled_staggered":
        assert calls["moments"] >= 4 and calls["complement"] >= 2, calls
    else:
        assert calls["projections, moments, complement"] >= 4 and calls["moments"] + calls["complement"] == 0, calls
    assert_trained_alike(compiled, eager, ("exp_avg", "exp_avg_sq", "residual_norm"))


@COMPILED_ONLY
def test_bfloat16_weights_compiled_together_train_as_eager():
    """torchrun's --dtype bfloat16: G in bfloat16, its norms in float32 (inside the compiled function), φ rounded to
    bfloat16 for β φ ⊙ G (eager): the weights come out as eager's, to a bfloat16 rounding at most."""
    compiled, _ = run(True, dtype=torch.bfloat16, **SETTINGS["fira_complement"])
    eager, _ = run(False, dtype=torch.bfloat16, **SETTINGS["fira_complement"])
    for a, b in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert a.dtype == torch.bfloat16
        assert (a.float() - b.float()).abs().max() <= 2**-7 * b.float().abs().max()


@COMPILED_ONLY
def test_8bit_compiled_together_trains_as_together_eager(monkeypatch):
    """On 8-bit AdamW (its large-batch default, the complement at every update) only the complement's arithmetic is
    compiled: each weight's moments are bitsandbytes' kernel."""
    calls = []
    real_complement = multi_tensor.mixed_compiled
    monkeypatch.setattr(multi_tensor, "mixed_compiled", lambda *args: calls.append(1) or real_complement(*args))
    compiled = run(True, optimizer_class=PlumageAdamW8bit, **SETTINGS["fira_complement"])
    eager = run(False, optimizer_class=PlumageAdamW8bit, **SETTINGS["fira_complement"])
    assert len(calls) >= 4
    assert_trained_alike(compiled, eager, ("residual_norm",))


# Adafactor as torchrun_main.py runs it: at an lr, no relative step, no parameter scaling, momentum
ADAFACTOR = {"lr": 1e-2, "relative_step": False, "scale_parameter": False, "weight_decay": 0.1, "beta1": 0.9}


@COMPILED_ONLY
def test_adafactor_compiled_together_trains_as_together_eager(monkeypatch):
    """plumage_adafactor's draws (its default of sessions 42-80, the complement after each refresh): its factored step
    (adafactor.factored_directions_together) and the complement's arithmetic compiled. Adafactor's β2ₜ follows each
    weight's step count: once the resting weight falls behind, a step makes a call for it and one for the others."""
    calls = []
    real = adafactor.compiled_directions_together
    monkeypatch.setattr(adafactor, "compiled_directions_together", lambda *args: calls.append(1) or real(*args))
    compiled = run(True, optimizer_class=PlumageAdafactor, hyper=ADAFACTOR, **PLUMAGE_ADAFACTOR_DRAWS)
    eager = run(False, optimizer_class=PlumageAdafactor, hyper=ADAFACTOR, **PLUMAGE_ADAFACTOR_DRAWS)
    assert len(calls) >= 4
    assert_trained_alike(compiled, eager, ("exp_avg", "exp_avg_sq_row", "exp_avg_sq_col"))


@COMPILED_ONLY
@pytest.mark.parametrize("optimizer_class", [PlumageAdamW, PlumageAdamW8bit, PlumageAdafactor],
                         ids=["adamw", "adamw8bit", "adafactor"])
def test_the_compiled_group_does_not_compile_again_as_the_lr_changes(optimizer_class):
    """Floats are not specialized: once the group's layouts have compiled (with the resting weight's and without),
    the lr schedule's changing α and β (and the bias corrections; 8-bit's units, lr × bias correction) reuse the
    compiled code, which runs (a function past torch's recompile limit would run eager instead, and no stance would
    notice)."""
    lrs = [1e-2 * (1 - k / 20) for k in range(16)]
    adafactor = optimizer_class is PlumageAdafactor  # β2ₜ changes every step too
    layer, optimizer = run(True, lrs=lrs, optimizer_class=optimizer_class, hyper=ADAFACTOR if adafactor else None,
                           **SETTINGS["fira_complement"])
    data = torch.Generator().manual_seed(2)
    with torch.compiler.set_stance("fail_on_recompile"), torch.profiler.profile() as profile:
        for k, lr in enumerate(lrs[10:]):
            for group in optimizer.param_groups:
                group["lr"] = lr
            for param in layer.parameters():
                param.grad = torch.randn(param.shape, generator=data)
            if k % 3 == 2:
                layer.matrices()[RESTING].grad = None
            optimizer.step()
    compiled_calls = [event for event in profile.events() if event.name.startswith("Torch-Compiled Region")]
    # the complement (and AdamW's moments, Adafactor's factored step) of the four steps without a refresh (gap 4: two
    # of the six refresh a weight, whose update is AdamW's one weight's compiled one), at least
    assert len(compiled_calls) >= 4 * (1 if optimizer_class is PlumageAdamW8bit else 2), [e.name for e in compiled_calls]
    assert all(torch.isfinite(p).all() for p in layer.parameters())


def test_layouts_past_the_recompile_limit_run_eager_with_a_warning():
    """Staggered refreshes and resting weights change which weights a step takes together; past torch's recompile
    limit (1 here, 8 by default) a new layout runs the same function eager instead of failing the step."""
    with torch._dynamo.config.patch(recompile_limit=1), pytest.warns(UserWarning, match="recompile limit"):
        limited, _ = run(True, **SETTINGS["sampled_staggered"])
    eager, _ = run(False, **SETTINGS["sampled_staggered"])
    for a, b in zip(limited.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
