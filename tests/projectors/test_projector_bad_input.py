"""Bad arguments fail at construction naming the value; bad gradients never reach the basis."""

from __future__ import annotations

import math
import re

import pytest
import torch

from galore_plumage.projectors import build_projector, list_projectors

NAMES = list_projectors()


def _grad(name, seed=0):
    shape = (10, 8, 3, 3) if name == "tucker" else (12, 8)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rank", [0, -3, 2.5, "4", True, None])
def test_rank_must_be_a_positive_int(rank):
    with pytest.raises(ValueError, match=re.escape(f"rank must be an integer >= 1, got {rank!r}")):
        build_projector("svd", rank=rank)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"update_proj_gap": 0}, "update_proj_gap.*got 0"),
        ({"scale": 0.0}, "scale.*got 0.0"),
        ({"scale": float("nan")}, "scale.*got nan"),
        ({"adaptive_interval": True, "update_proj_gap": 10, "tau_max": 5}, "tau_max.*got 5"),
        ({"proj_type": "diagonal"}, "'diagonal'.*std, reverse_std, left, right, full"),
    ],
)
def test_other_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_projector("svd", rank=4, **kwargs)


# Our options beyond galore-torch's (the options table, optimizers/options.py), as each projector checks them: a bad
# value is named with what is accepted, and an option a projector cannot honour names the projector.
OPTION_REFUSALS = [
    *(("plumage", {"max_inv_p": bad}, rf"max_inv_p must be a number >= 1 .*got {re.escape(repr(bad))}")
      for bad in (0.5, 0, -3.0, float("nan"), True, "3")),
    *((name, {"max_inv_p": 3}, rf"max_inv_p=3 .*projector {name!r} does not rescale") for name in ("svd", "random", "tucker")),
    *(("plumage", {"resample_every": bad}, rf"resample_every must be an integer >= 0 .*got {re.escape(repr(bad))}")
      for bad in (-1, 1.5, True, "2", None)),
    ("svd", {"resample_every": 2}, "resample_every=2 draws PLUMAGE's sample again, but projector 'svd'"),
    *(("plumage", {"pool_factor": bad}, rf"pool_factor.*got {re.escape(repr(bad))}") for bad in (1, 2.5, True)),
    ("svd", {"pool_bf16": True}, "pool_bf16=True stores PLUMAGE's pool .* 'svd'"),
    ("random", {"align_signs": True}, "align_signs=True .* 'random'"),
    ("svd", {"align_signs": 1}, "align_signs must be True or False, got 1"),
    ("plumage", {"solver": "qr"}, "'qr'"),
]


@pytest.mark.parametrize("name, kwargs, match", OPTION_REFUSALS,
                         ids=[f"{name}-{key}={value!r}" for name, options, _ in OPTION_REFUSALS
                              for key, value in options.items()])
def test_our_options_are_checked(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_projector(name, rank=4, **kwargs)


def test_plumage_refuses_full():
    with pytest.raises(ValueError, match="plumage.*proj_type='full'"):
        build_projector("plumage", rank=4, proj_type="full")


def test_unknown_projector_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown projector 'galore'") as info:
        build_projector("galore", rank=4)
    for name in NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_one_dimensional_gradient_names_the_shape(name):
    projector = build_projector(name, rank=2)
    with pytest.raises(ValueError, match=re.escape("(16,)")):
        projector.refresh(torch.ones(16), 0)


@pytest.mark.parametrize("name", NAMES)
def test_shape_change_and_use_before_refresh(name):
    projector = build_projector(name, rank=2)
    with pytest.raises(RuntimeError, match="refresh"):
        projector.project(_grad(name))
    projector.refresh(_grad(name), 0)
    wrong = torch.ones(7, 5)
    with pytest.raises(ValueError, match=re.escape("(7, 5)")):
        projector.refresh(wrong, 1)


def _bad(grad, kind):
    bad = grad.clone()
    if kind == "zero":
        return torch.zeros_like(grad)
    bad.view(-1)[3] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[kind]
    return bad


BAD_KINDS = ["nan", "inf", "-inf", "zero"]


@pytest.mark.parametrize("kind", BAD_KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_bad_gradient_defers_the_first_refresh(name, kind):
    projector = build_projector(name, rank=2, update_proj_gap=5)
    grad = _grad(name)
    assert projector.refresh(_bad(grad, kind), 0) is False
    assert not projector.ready and projector.factors == {}
    assert projector.stats["skipped_refreshes"] == 1
    assert projector.maybe_refresh(_bad(grad, kind), 1) is False  # still due: retried at every step
    assert projector.stats["skipped_refreshes"] == 2
    assert projector.maybe_refresh(grad, 2) is True  # the first good gradient makes the basis
    assert projector.ready and projector.next_refresh == 7 and projector.transition is None


@pytest.mark.parametrize("kind", BAD_KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_bad_gradient_later_keeps_the_basis(name, kind):
    projector = build_projector(name, rank=2, update_proj_gap=5)
    grad = _grad(name)
    projector.refresh(grad, 0)
    factors = {k: f.clone() for k, f in projector.factors.items()}
    inv_p = None if projector.inv_p is None else projector.inv_p.clone()
    expected = projector.project_back(projector.project(grad))

    assert projector.maybe_refresh(_bad(grad, kind), 5) is False
    assert projector.stats["skipped_refreshes"] == 1 and projector.refresh_count == 1
    assert projector.due(6)  # retried at the next step
    assert all(torch.equal(projector.factors[k], factors[k]) for k in factors)
    assert (projector.inv_p is None and inv_p is None) or torch.equal(projector.inv_p, inv_p)
    assert torch.equal(projector.project_back(projector.project(grad)), expected)
    tensors = [*projector.factors.values()] + ([projector.inv_p] if projector.inv_p is not None else [])
    assert all(torch.isfinite(t).all() for t in tensors)
    assert all(math.isfinite(v) for v in projector.stats.values())
    for value in projector.state_dict().values():
        for t in value.values() if isinstance(value, dict) else [value]:
            assert not isinstance(t, torch.Tensor) or torch.isfinite(t).all()


@pytest.mark.parametrize("proj_type", ["left", "right", "std"])
@pytest.mark.parametrize("rank", [8, 20])
@pytest.mark.parametrize("name", ["svd", "plumage"])
def test_rank_at_least_min_dim_warns_and_is_exact(name, rank, proj_type):
    grad = torch.randn(12, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    projector = build_projector(name, rank=rank, proj_type=proj_type)
    with pytest.warns(UserWarning, match=f"rank {rank} >= min\\(m, n\\) = 8"):
        projector.refresh(grad, 0)
    assert all(f.shape[1] == 8 for f in projector.factors.values())
    torch.testing.assert_close(projector.project_back(projector.project(grad)), grad, rtol=0, atol=1e-12)
