"""With nothing projected away, the low-rank optimizers are the plain ones (Shampoo's "preconditioning off").

A rank = min(m, n) basis on the short side is a square orthogonal Q, and Adam is elementwise, so low-rank
AdamW is torch's AdamW run in the rotated coordinates W Q (right side) or Qᵀ W (left side). When the
refresh gradient is diagonal, Q is a signed permutation and the low-rank optimizer equals torch's AdamW
on W itself. Everything runs in float64 (the projector then computes in float64 too), so the only
differences are rounding: 1e-12 is ~10⁴ ulps of weights of size ~1 after 10 steps.

Two deliberate differences from torch.optim.AdamW are factored out:
* eps: galore-torch (and so this package) adds eps to √v before the bias correction, torch adds it to √v̂
  after, so for eps > 0 they are different optimizers. The exact comparisons use eps = 1e-30 (eps = 0
  would make 0/0 of the zero entries of a diagonal gradient; at 1e-30 the placement changes nothing
  in float64), and a separate test bounds the gap at the default eps = 1e-6.
* weight decay: galore-style decay comes after the step (W ← W − lr·wd·W), torch's before; compared with
  weight_decay = 0, and the order is checked by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from galore_plumage import GaLoreAdamW, build_optimizer

pytestmark = pytest.mark.filterwarnings("ignore:svd projector. rank")  # rank = min(m, n) is the point here

LR, BETAS, STEPS, TINY_EPS = 1e-2, (0.9, 0.999), 10, 1e-30
SHAPES = {"tall": ((12, 8), "right", 1), "wide": ((8, 12), "left", 0)}  # shape, proj_type, projected mode


def _gradients(shape, seed, count=STEPS):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(count)]


def _diagonal(shape):
    """A rectangular diagonal with distinct entries of both signs: its singular vectors are signed unit vectors."""
    k = min(shape)
    g = torch.zeros(shape, dtype=torch.float64)
    signs = torch.tensor([(-1.0) ** i for i in range(k)], dtype=torch.float64)
    g[range(k), range(k)] = torch.linspace(3.0, 1.0, k, dtype=torch.float64) * signs
    return g


def _low_rank(shape, proj_type, weight_decay=0.0):
    weight = torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    group = {"params": [weight], "rank": min(shape), "update_proj_gap": 1000, "scale": 1.0, "proj_type": proj_type}
    optimizer = GaLoreAdamW([group], lr=LR, betas=BETAS, eps=TINY_EPS, weight_decay=weight_decay, correct_bias=True)
    return weight, optimizer


def _basis(optimizer, weight, mode):
    return optimizer.projector_for(weight, optimizer.param_groups[0]).factors[mode]


@pytest.mark.parametrize("layout", list(SHAPES))
def test_full_rank_group_is_adamw_in_rotated_coordinates(layout):
    shape, proj_type, mode = SHAPES[layout]
    grads = _gradients(shape, seed=1)
    weight, optimizer = _low_rank(shape, proj_type)
    start = weight.detach().clone()
    weight.grad = grads[0]
    optimizer.step()
    q = _basis(optimizer, weight, mode)
    assert q.shape == (min(shape), min(shape))
    torch.testing.assert_close(q.T @ q, torch.eye(min(shape), dtype=torch.float64), rtol=0, atol=1e-12)

    def rotate(x):
        return x @ q if mode == 1 else q.T @ x

    reference = torch.nn.Parameter(rotate(start))
    torch_adamw = torch.optim.AdamW([reference], lr=LR, betas=BETAS, eps=TINY_EPS, weight_decay=0.0)
    reference.grad = rotate(grads[0])
    torch_adamw.step()
    for g in grads[1:]:
        weight.grad = g
        optimizer.step()
        reference.grad = rotate(g)
        torch_adamw.step()
    assert (weight - start).abs().max() > 1e-2
    torch.testing.assert_close(rotate(weight.detach()), reference.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", list(SHAPES))
def test_signed_permutation_basis_equals_torch_adamw(layout):
    shape, proj_type, mode = SHAPES[layout]
    grads = [_diagonal(shape)] + _gradients(shape, seed=2)[1:]
    weight, optimizer = _low_rank(shape, proj_type)
    reference = torch.nn.Parameter(weight.detach().clone())
    start = reference.detach().clone()
    torch_adamw = torch.optim.AdamW([reference], lr=LR, betas=BETAS, eps=TINY_EPS, weight_decay=0.0)
    for g in grads:
        weight.grad, reference.grad = g.clone(), g.clone()
        optimizer.step()
        torch_adamw.step()
    q = _basis(optimizer, weight, mode)
    assert torch.equal(q.abs(), torch.eye(min(shape), dtype=torch.float64))  # SVD of a diagonal: exact ±1
    assert (weight - start).abs().max() > 1e-2
    torch.testing.assert_close(weight.detach(), reference.detach(), rtol=0, atol=1e-12)


def test_decay_is_applied_after_the_step():
    """One step by hand: W₁ = S − lr·wd·S with S = W₀ − lr·d, and d = m̂/(√v̂+ε) = sign(g) at step 1."""
    shape, proj_type, _ = SHAPES["tall"]
    weight_decay = 0.5
    weight, optimizer = _low_rank(shape, proj_type, weight_decay=weight_decay)
    start = weight.detach().clone()
    g = _diagonal(shape)  # a signed-permutation basis, so d is sign(g) entry by entry
    weight.grad = g
    optimizer.step()
    stepped = start - LR * g.sign()
    after = stepped - LR * weight_decay * stepped
    before = start * (1 - LR * weight_decay) - LR * g.sign()  # torch.optim.AdamW's order
    torch.testing.assert_close(weight.detach(), after, rtol=0, atol=1e-12)
    # the orders differ by lr²·wd·|sign g| = 5e-5 where g ≠ 0: far above the 1e-12 tolerance
    assert (after - before).abs().max() > 1e-5


def _linear_pair(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(6, 5).double()
    reference = torch.nn.Linear(6, 5).double()
    reference.load_state_dict(model.state_dict())
    return model, reference


def _lockstep(model, reference, ours, theirs, steps=STEPS):
    generator = torch.Generator().manual_seed(4)
    start = [p.detach().clone() for p in model.parameters()]
    for _ in range(steps):
        x = torch.randn(16, 6, generator=generator, dtype=torch.float64)
        y = torch.randn(16, 5, generator=generator, dtype=torch.float64)
        for net, optimizer in ((model, ours), (reference, theirs)):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
    for p, q, s in zip(model.parameters(), reference.parameters(), start, strict=True):
        assert (p - s).abs().max() > 1e-3
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_full_rank_adamw_name_equals_torch_adamw(name):
    model, reference = _linear_pair()
    ours = build_optimizer(name, model, lr=LR, betas=BETAS, eps=TINY_EPS, weight_decay=0.0)
    theirs = torch.optim.AdamW(reference.parameters(), lr=LR, betas=BETAS, eps=TINY_EPS, weight_decay=0.0)
    _lockstep(model, reference, ours, theirs)


@pytest.mark.parametrize("name", ["sgdm", "sgd"])
def test_full_rank_sgdm_name_equals_torch_sgd(name):
    model, reference = _linear_pair()
    ours = build_optimizer(name, model, lr=0.05, momentum=0.9, weight_decay=0.0)
    theirs = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0)
    _lockstep(model, reference, ours, theirs)


def test_default_eps_differs_from_torch_only_by_its_placement():
    """eps = 1e-6 on both sides: the gap stays inside the bound the eps placement allows.

    Gradient entries have |g| >= 0.5, so √v̂ >= 0.5 and |m̂|/√v̂ <= max|g| / 0.5 =: c. Per step, each
    entry of the two directions differs by at most c · |ε/√(1−β₂ᵗ) − ε| / √v̂, times lr.
    """
    eps = 1e-6
    weight = torch.nn.Parameter(torch.zeros(7, 5, dtype=torch.float64))
    reference = torch.nn.Parameter(torch.zeros(7, 5, dtype=torch.float64))
    ours = build_optimizer("adamw", torch.nn.ParameterList([weight]), lr=LR, betas=BETAS, eps=eps)
    theirs = torch.optim.AdamW([reference], lr=LR, betas=BETAS, eps=eps, weight_decay=0.0)
    grads = [g.sign() * (g.abs() + 0.5) for g in _gradients((7, 5), seed=3)]
    c = max(g.abs().max().item() for g in grads) / 0.5
    bound = 0.0
    for step, g in enumerate(grads, start=1):
        weight.grad, reference.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        bound += LR * c * eps * (1 / math.sqrt(1 - BETAS[1] ** step) - 1) / 0.5
    gap = (weight - reference).abs().max().item()
    assert 0 < gap <= bound, (gap, bound)
