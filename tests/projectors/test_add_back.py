"""Projector.add_back, the optimizer's fused update W ← W + α · project_back(Z), and the one-pass gradient guard.

add_back takes one addmm for a one-sided projection of a weight in the compute dtype; it must equal adding
project_back's result for every projector and side, with PLUMAGE's 1/p and a bfloat16 pool, and fall back (same
result) where it cannot fuse: both sides, Tucker, a bfloat16 weight.
"""

from __future__ import annotations

import pytest
import torch

from galore_plumage.projectors import build_projector
from galore_plumage.projectors.base import gradient_usable

CASES = [
    ("svd", "std", {}), ("svd", "reverse_std", {}), ("svd", "full", {}), ("random", "left", {}), ("random", "right", {}),
    ("plumage", "left", {}), ("plumage", "right", {"max_inv_p": 3.0}),
    ("plumage", "std", {"resample_every": 1, "pool_bf16": True}),
]


@pytest.mark.parametrize("name,proj_type,options", CASES)
@pytest.mark.parametrize("shape", [(12, 30), (30, 12)])
def test_add_back_equals_adding_project_back(name, proj_type, options, shape):
    generator = torch.Generator().manual_seed(0)
    grad = torch.randn(shape, generator=generator)
    projector = build_projector(name, 4, proj_type=proj_type, scale=0.25, **options)
    projector.refresh(grad, 0)
    low = projector.project(grad)
    weight = torch.randn(shape, generator=generator)
    expected = weight + (-0.1) * projector.project_back(low)
    projector.add_back(weight, low, -0.1)
    torch.testing.assert_close(weight, expected, rtol=1e-6, atol=1e-6)


def test_add_back_to_a_bfloat16_weight_matches_the_unfused_update():
    grad = torch.randn(12, 30, generator=torch.Generator().manual_seed(1))
    projector = build_projector("plumage", 4, proj_type="left")
    projector.refresh(grad, 0)
    low = projector.project(grad)
    weight = torch.randn(12, 30, generator=torch.Generator().manual_seed(2)).bfloat16()
    expected = weight.clone().add_(projector.project_back(low), alpha=-0.1)
    projector.add_back(weight, low, -0.1)
    assert weight.dtype == torch.bfloat16
    assert torch.equal(weight, expected)


def test_add_back_before_a_basis_is_refused():
    projector = build_projector("svd", 4)
    with pytest.raises(RuntimeError, match="before any basis"):
        projector.add_back(torch.zeros(8, 8), torch.zeros(4, 8), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_gradient_usable(dtype):
    # a 0-d bool tensor (read by the caller, with the refresh's other figures)
    def usable(tensor):
        flag = gradient_usable(tensor)
        assert flag.shape == () and flag.dtype == torch.bool
        return bool(flag)

    grad = torch.randn(50, 7, generator=torch.Generator().manual_seed(3)).to(dtype)
    assert usable(grad)
    assert not usable(torch.zeros(50, 7, dtype=dtype))
    assert not usable(torch.zeros(0, 7, dtype=dtype))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for position in ((0, 0), (25, 3), (49, 6)):
            broken = grad.clone()
            broken[position] = bad
            assert not usable(broken), (bad, position)
    lone = torch.zeros(50, 7, dtype=dtype)
    lone[10, 2] = -1e-30 if dtype != torch.bfloat16 else -1e-3
    assert usable(lone)


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("shape", [(12, 30), (30, 12), (6, 5, 4)])
def test_onto_basis_is_mode_product_with_the_transposed_basis_bit_for_bit(mode, shape):
    """project()'s onto_basis(x, F, mode) takes a matrix's coordinates in one matmul of F as stored, where
    mode_product(x, Fᵀ, mode) transposed Fᵀ back: the same products, so the same bits (a 3-D x takes mode_product)."""
    from galore_plumage.projectors.modes import mode_product, onto_basis

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=generator)
    basis, _ = torch.linalg.qr(torch.randn(shape[mode], 4, generator=generator))
    assert torch.equal(onto_basis(x, basis, mode), mode_product(x, basis.T, mode))
    assert onto_basis(x, basis, mode).shape[mode] == 4


@pytest.mark.parametrize("name,proj_type,options", [case for case in CASES if case[1] != "full"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_one_sided_operands_project_and_add_back_as_the_projector(name, proj_type, options, grad_dtype):
    """What a compiled group step multiplies by (multi_tensor.projected_and_mixed): the gradient in the dtype given,
    onto the factor as stored, is project()'s R bit for bit (a bfloat16 pool and a bfloat16 gradient cast as project
    casts them); add_product with that factor is add_back_mixed."""
    from galore_plumage.projectors.modes import add_product, onto_basis

    generator = torch.Generator().manual_seed(4)
    grad = torch.randn(12, 30, generator=generator).to(grad_dtype)
    projector = build_projector(name, 4, proj_type=proj_type, **options)
    projector.refresh(grad, 0)
    mode, factor, dtype = projector.one_sided_operands(grad)
    assert dtype == torch.float32 and factor.data_ptr() == projector.factors[mode].data_ptr()
    assert torch.equal(onto_basis(grad.to(dtype), factor.to(dtype), mode), projector.project(grad))
    low = torch.randn(projector.project(grad).shape, generator=generator)
    weight = torch.randn(12, 30, generator=generator)
    expected = weight.clone()
    projector.add_back_mixed(expected, low)
    add_product(weight, factor, low, mode)
    assert torch.equal(weight, expected)


def test_one_sided_operands_of_a_two_sided_basis_are_refused():
    grad = torch.randn(12, 30, generator=torch.Generator().manual_seed(5))
    projector = build_projector("svd", 4, proj_type="full")
    projector.refresh(grad, 0)
    with pytest.raises(ValueError, match="one-sided projection of a matrix; this projector has factors on modes"):
        projector.one_sided_operands(grad)


def test_one_sided_operands_before_any_basis_are_refused_and_follow_the_gradient_to_its_device():
    grad = torch.randn(12, 30, generator=torch.Generator().manual_seed(6))
    projector = build_projector("svd", 4)
    with pytest.raises(RuntimeError, match=r"one_sided_operands\(\) before any basis exists"):
        projector.one_sided_operands(grad)
    projector.refresh(grad, 0)
    mode, factor, _ = projector.one_sided_operands(grad.to("meta"))  # a device move between steps (model.to)
    assert factor.device.type == "meta" and projector.factors[mode] is factor
