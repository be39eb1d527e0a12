"""compile_update: AdamW's moment update as one torch.compile'd kernel trains as the eager update to float32 rounding,
compiles a bounded number of times (not once per lr or step), is refused where it does not apply, and says what it
needs when torch.compile fails."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from galore_plumage import PlumageAdamW, build_optimizer
from galore_plumage.optimizers import compiled_update


class Layer(nn.Module):
    """Two shapes of projected weight (one projected on each side) and a norm (a full-rank group)."""

    def __init__(self):
        super().__init__()
        self.square = nn.ModuleList(nn.Linear(24, 24, bias=False) for _ in range(2))
        self.up = nn.Linear(24, 40, bias=False)
        self.norm = nn.LayerNorm(24)

    def matrices(self):
        return [*self.square.parameters(), self.up.weight]


def train(compile_update: bool, steps: int = 7, **options):
    torch.manual_seed(0)
    layer = Layer()
    groups = [{"params": layer.matrices(), "rank": 6, "update_proj_gap": 3, "compile_update": compile_update,
               **options},
              {"params": list(layer.norm.parameters()), "compile_update": compile_update}]
    optimizer = PlumageAdamW(groups, lr=1e-2, weight_decay=0.1)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for param in layer.parameters():
            param.grad = torch.randn(param.shape, generator=data)
        optimizer.step()
    return layer, optimizer


SETTINGS = {
    "default": {},  # GaLore's top-r basis with v_floor m2
    "m2_corrected": {"v_floor": "m2_corrected"},
    "no_floor_no_bias_correction": {"v_floor": "none", "correct_bias": False},
    "paper": {"projector": "plumage", "realign": "mv", "v_floor": "none", "scale": 0.5},  # 1/p rows, moments carried
}


@pytest.mark.parametrize("options", SETTINGS.values(), ids=SETTINGS.keys())
def test_compiled_update_trains_as_the_eager_update(options, monkeypatch):
    calls = []
    real = compiled_update.compiled_moments_and_direction
    monkeypatch.setattr("galore_plumage.optimizers.adamw.compiled_moments_and_direction",
                        lambda *args: calls.append(1) or real(*args))
    compiled, compiled_optimizer = train(True, **options)
    eager, eager_optimizer = train(False, **options)
    assert len(calls) == 7 * 5  # every weight's every update: three projected, the norm's weight and bias
    torch.manual_seed(0)
    start = list(Layer().parameters())  # train()'s initial weights
    for a, b, before in zip(compiled.parameters(), eager.parameters(), start, strict=True):
        assert (b - before).abs().max() > 1e-3  # the updates compared are not vanishing
        torch.testing.assert_close(a - before, b - before, rtol=1e-4, atol=1e-7)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(compiled_optimizer.state[a][key], eager_optimizer.state[b][key],
                                       rtol=1e-4, atol=1e-6)  # moments of order 1


def test_the_moments_are_written_back_in_place():
    """The fused function writes M and V into the state's own tensors (a floor that rebinds V must not lose them)."""
    exp_avg, exp_avg_sq = torch.full((3, 4), 0.5), torch.full((3, 4), 0.01)
    grad = torch.ones(3, 4)
    direction = compiled_update.compiled_moments_and_direction(exp_avg, exp_avg_sq, grad, 0.9, 0.99, 1e-8, 1.0)
    # V ← max(0.01, 0.25) = 0.25, then 0.99 · 0.25 + 0.01 · 1; M ← 0.9 · 0.5 + 0.1 · 1
    torch.testing.assert_close(exp_avg_sq, torch.full((3, 4), 0.99 * 0.25 + 0.01))
    torch.testing.assert_close(exp_avg, torch.full((3, 4), 0.55))
    torch.testing.assert_close(direction, exp_avg / (exp_avg_sq.sqrt() + 1e-8))


def test_no_recompilation_when_the_lr_and_the_step_change():
    """Floats are not specialized: once every shape and both floor variants have run, a changing lr and
    m2_corrected's changing bound (1 − β2^k) / (1 − β1^k)² reuse the compiled code."""
    torch.manual_seed(0)
    layer = Layer()
    optimizer = PlumageAdamW([{"params": layer.matrices(), "rank": 6, "update_proj_gap": 3, "compile_update": True,
                               "v_floor": "m2_corrected"}], lr=1e-2)

    def step(lr):
        for group in optimizer.param_groups:
            group["lr"] = lr
        for param in layer.matrices():
            param.grad = torch.randn_like(param)
        optimizer.step()

    for lr in (1e-2, 9e-3, 8e-3):  # moments made, then floored updates of both shapes
        step(lr)
    with torch.compiler.set_stance("fail_on_recompile"):
        for lr in (7e-3, 5e-3, 3e-3, 1e-3, 5e-4):
            step(lr)


def test_compile_update_on_sgd_momentum_is_refused_naming_it():
    with pytest.raises(ValueError, match="compile_update=True does not apply here: SGD momentum's update is two "
                                         "_foreach calls"):
        build_optimizer("plumage_sgdm", Layer(), rank=6, target_modules=("square",), compile_update=True)


@pytest.mark.parametrize("foreach", [None, False])
@pytest.mark.parametrize("name, backend", [("plumage_adamw8bit", "adamw8bit"), ("plumage_adafactor", "adafactor")])
def test_compile_update_without_foreach_is_refused_where_it_would_compile_nothing(name, backend, foreach):
    """8-bit's own update is bitsandbytes' kernel, Adafactor's is not compiled: compile_update compiles only what their
    weights do together."""
    with pytest.raises(ValueError, match=f"compile_update=True on {backend} .* needs foreach=True, not "
                                         f"foreach={foreach}"):
        build_optimizer(name, Layer(), rank=6, target_modules=("square",), compile_update=True, foreach=foreach)


def test_compile_update_with_row_bias_correction_is_refused_naming_both():
    with pytest.raises(ValueError, match="compile_update=True .*row_bias_correction=True .*drop one of them"):
        PlumageAdamW([{"params": Layer().matrices(), "rank": 6, "compile_update": True, "row_bias_correction": True,
                       "v_floor": "none"}], lr=1e-2)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_a_bad_compile_update_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="compile_update"):
        PlumageAdamW([{"params": Layer().matrices(), "rank": 6, "compile_update": bad}], lr=1e-2)


def test_a_failing_compilation_says_what_the_option_needs(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise OSError("cc: not found")

    monkeypatch.setattr(compiled_update.compiled_moments_and_direction, "_compiled", None)
    monkeypatch.setattr(torch, "compile", lambda function, **options: no_compiler)
    layer = Layer()
    optimizer = PlumageAdamW([{"params": layer.matrices(), "rank": 6, "compile_update": True}], lr=1e-2)
    for param in layer.matrices():
        param.grad = torch.randn_like(param)
    before = [param.detach().clone() for param in layer.matrices()]
    with pytest.raises(RuntimeError, match=r"compile_update=True: .*OSError: cc: not found.*C\+\+ compiler.*drop "
                                           r"compile_update"):
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, layer.matrices(), strict=True))  # no weight moved


def test_per_layer_mode_trains_as_without_compile_update():
    def run(compile_update):
        torch.manual_seed(0)
        layer = Layer()
        optimizer = build_optimizer("plumage_adamw_per_layer", layer, rank=6, update_proj_gap=2,
                                    target_modules=("square", "up"), compile_update=compile_update)
        data = torch.Generator().manual_seed(1)
        for _ in range(4):
            x = torch.randn(32, 24, generator=data)  # gradients of full rank: no basis vector left to rounding
            layer.norm(sum(linear(x) for linear in layer.square) + layer.up(x)[:, :24]).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in layer.parameters()]

    compiled, eager = run(True), run(False)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(compiled[0], Layer().square[0].weight)
