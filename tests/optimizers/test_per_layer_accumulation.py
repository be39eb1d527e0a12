"""Per-layer mode under gradient accumulation equals the normal optimizer stepping once per 4 micro-batches.

Between boundaries a low-rank weight whose basis is fixed has its gradient projected and summed in the
low-rank space (projection is linear); at a refresh the full gradient is kept. Both orders of float32
summation agree to rounding: 1e-5 relative (with a 1e-7 floor for near-zero entries) is ~100 ulps.

The defaults are checked in float32 and float64 (1e-12 relative). sampled_step="norm_matched" (the default of
session 6) moves sampled rows by φ = ‖Z_kept‖ / ‖R_kept‖ per column, which with one kept row divides by a single,
possibly near-cancelled, projected gradient entry: it amplifies float32 rounding of the two sums well past 100 ulps
(measured 6e-6 absolute), so it is checked in float64, where the algebraic equality shows.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from galore_plumage import build_optimizer

ACCUMULATION, UPDATES, GAP = 4, 6, 2  # refreshes at updates 0, 2 and 4
# residual "none": the complement (plumage_*'s default since session 11) reads the full gradient at every update, so
# with it per-layer mode keeps full gradients to the boundary and never takes the projected path checked here;
# tests/optimizers/test_residual.py checks that per-layer accumulation with the complement equals normal mode
OPTIONS = {"lr": 1e-2, "rank": 3, "update_proj_gap": GAP, "weight_decay": 0.05, "residual": "none"}
PAIRS = [("plumage_adamw", "plumage_adamw_per_layer"), ("galore_adamw", "galore_adamw_per_layer")]
PRECISIONS = {  # dtype -> (rtol, atol)
    torch.float32: (1e-5, 1e-7),
    torch.float64: (1e-12, 1e-14),
}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(10, 12)
        self.mlp = nn.Linear(12, 10)
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        return self.head(torch.relu(self.mlp(torch.tanh(self.attn(x)))))


def _batches(updates=UPDATES, dtype=torch.float32):
    generator = torch.Generator().manual_seed(1)
    return [[(torch.randn(8, 10, generator=generator).to(dtype), torch.randn(8, 3, generator=generator).to(dtype))
             for _ in range(ACCUMULATION)] for _ in range(updates)]


def _micro_step(model, x, y):
    (nn.functional.mse_loss(model(x), y) / ACCUMULATION).backward()


def _train(model, optimizer, batches, on_micro_step=None):
    for update, micro_batches in enumerate(batches):
        for micro, (x, y) in enumerate(micro_batches):
            _micro_step(model, x, y)
            if on_micro_step is not None:
                on_micro_step(update, micro)
        optimizer.step()
        optimizer.zero_grad()


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return Tiny().to(dtype)


# PLUMAGE's projector with the draws of the default of sessions 14-16 (its complement off, as above)
DRAWS = {"projector": "plumage", "realign": "mv_meansplit", "v_floor": "none"}
CASES = [(*pair, dtype, {}) for pair in PAIRS for dtype in PRECISIONS] + [
    (*PAIRS[0], torch.float64, DRAWS),
    (*PAIRS[0], torch.float64, {**DRAWS, "sampled_step": "norm_matched", "max_inv_p": None}),
    (*PAIRS[0], torch.float32, {**DRAWS, "max_inv_p": None, "resample_every": 0})]  # the paper's 1/p


@pytest.mark.parametrize("normal_name,per_layer_name,dtype,extra", CASES,
                         ids=[f"{c[0]}-{str(c[2]).removeprefix('torch.')}{'-' if c[3] else ''}{'-'.join(c[3])}"
                              for c in CASES])
def test_per_layer_accumulation_equals_normal_mode(normal_name, per_layer_name, dtype, extra):
    options = {**OPTIONS, **extra}
    normal_model, per_layer_model = _model(dtype), _model(dtype)
    normal = build_optimizer(normal_name, normal_model, **options)
    per_layer = build_optimizer(per_layer_name, per_layer_model, accumulation_steps=ACCUMULATION, **options)
    low_rank = [per_layer_model.attn.weight, per_layer_model.mlp.weight]
    seen = []

    def check(update, micro):
        grads = [p.grad for p in per_layer_model.parameters()]
        if micro == ACCUMULATION - 1:  # the boundary: every weight stepped and freed its gradient
            assert all(g is None for g in grads), update
        elif update % GAP != 0:  # fixed basis: low-rank gradients were projected and freed at once
            assert all(p.grad is None and "grad_accum" in per_layer.state[p] for p in low_rank)
            seen.append(update)
        else:  # a refresh is due: the full gradient is kept for the new basis
            assert all(p.grad is not None for p in low_rank)

    batches = _batches(dtype=dtype)
    start = [p.detach().clone() for p in normal_model.parameters()]
    _train(normal_model, normal, batches)
    _train(per_layer_model, per_layer, batches, on_micro_step=check)
    assert seen  # the projected-accumulation path ran
    for stats in per_layer.optimizer.projector_stats().values():
        assert stats["refreshes"] == len(range(0, UPDATES, GAP))
    for a, b, s in zip(normal_model.parameters(), per_layer_model.parameters(), start, strict=True):
        assert (a - s).abs().max() > 1e-3
        rtol, atol = PRECISIONS[dtype]
        torch.testing.assert_close(b.detach(), a.detach(), rtol=rtol, atol=atol)


def test_per_layer_refuses_gradient_clipping():
    with pytest.raises(ValueError, match=r"gradient clipping \(max norm 1\.5\)"):
        build_optimizer("plumage_adamw_per_layer", _model(), grad_clipping=1.5, **OPTIONS)
    build_optimizer("plumage_adamw_per_layer", _model(), grad_clipping=0.0, **OPTIONS).remove_hooks()
    build_optimizer("plumage_adamw", _model(), grad_clipping=1.5, **OPTIONS)  # normal mode clips itself


@pytest.mark.parametrize("accumulation_steps", [0, 1.5, True])
def test_bad_accumulation_steps_named(accumulation_steps):
    with pytest.raises(ValueError, match=f"accumulation_steps must be an integer >= 1, got {accumulation_steps!r}"):
        build_optimizer("plumage_adamw_per_layer", _model(), accumulation_steps=accumulation_steps, **OPTIONS)


def _equal_states(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            _equal_states(a[key], b[key])
        elif torch.is_tensor(a[key]):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("micro", [ACCUMULATION - 1, 1], ids=["at-boundary", "mid-accumulation"])
def test_per_layer_state_dict_round_trip(micro, tmp_path):
    """Save after micro-batch `micro` of update 3 (no refresh due), reload into a fresh copy, continue both."""
    model = _model()
    optimizer = build_optimizer("plumage_adamw_per_layer", model, accumulation_steps=ACCUMULATION, **OPTIONS)
    batches = _batches(updates=UPDATES + 1)
    _train(model, optimizer, batches[:3])
    for x, y in batches[3][: micro + 1]:
        _micro_step(model, x, y)
    if micro == ACCUMULATION - 1:
        optimizer.step()
        optimizer.zero_grad()
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    if micro != ACCUMULATION - 1:
        assert any("grad_accum" in state for state in optimizer.state.values())  # a partial sum is in the checkpoint

    resumed_model = copy.deepcopy(model)
    for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
        # Full gradients still pending (regular weights mid-accumulation) live in .grad, not in the optimizer
        # state, exactly as for any torch optimizer; carry them over as the interrupted loop would have them.
        b.grad = a.grad.clone() if a.grad is not None else None
    resumed = build_optimizer("plumage_adamw_per_layer", resumed_model, accumulation_steps=ACCUMULATION, **OPTIONS)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    assert resumed.state_dict()["micro_steps"] == optimizer.state_dict()["micro_steps"]

    def finish(m, opt):
        for x, y in batches[3][micro + 1:]:
            _micro_step(m, x, y)
        if micro != ACCUMULATION - 1:
            opt.step()
            opt.zero_grad()
        _train(m, opt, batches[4:])  # crosses the refresh at update 4

    finish(model, optimizer)
    finish(resumed_model, resumed)
    for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
        _equal_states(optimizer.state[a], resumed.state[b])


def test_per_layer_hooks_follow_lr_set_after_load_state_dict():
    """load_state_dict replaces the param-group dicts; the hooks must read the lr a scheduler sets on the new ones.

    (Found by the torchrun_main resume test: hooks holding the old dicts kept stepping with a frozen lr.)
    """
    torch.manual_seed(0)
    model = _model()
    optimizer = build_optimizer("plumage_adamw_per_layer", model, **OPTIONS)
    optimizer.load_state_dict(optimizer.state_dict())  # fresh group dicts, as after a resume
    for group in optimizer.optimizer.param_groups:
        group["lr"] = 0.0  # what a scheduler at lr 0 would write
    before = [p.detach().clone() for p in model.parameters()]
    for x, y in _batches(updates=1)[0][:1]:
        _micro_step(model, x, y)  # accumulation_steps defaults to 1: every weight steps here, with lr 0
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
