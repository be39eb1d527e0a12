"""The projector registry: entries are data read off the classes, and new ones can be added."""

from __future__ import annotations

import pytest
import torch

import galore_plumage
import galore_plumage.projectors as projectors
from galore_plumage.projectors import (
    PROJ_TYPES,
    Basis,
    PlumageProjector,
    Projector,
    RandomProjector,
    SVDProjector,
    TuckerProjector,
    build_projector,
    list_projectors,
    projector_spec,
    register_projector,
)


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the registry for one test; the real one is put back afterwards."""
    monkeypatch.setattr(projectors, "_REGISTRY", dict(projectors._REGISTRY))


class CoordinateProjector(Projector):
    """Keeps the first r coordinates of the projected side: a minimal subclass."""

    name = "coordinate"
    description = "first r coordinates (test)"
    proj_types = ("left", "right")

    def _new_basis(self, grad, ranks, generator):
        return Basis({mode: torch.eye(grad.shape[mode], r, dtype=grad.dtype) for mode, r in ranks.items()})


def test_builtin_projectors_listed_sorted():
    names = list_projectors()
    assert names == sorted(names)
    assert {"plumage", "random", "svd", "tucker"} <= set(names)
    assert galore_plumage.list_projectors() == names


@pytest.mark.parametrize(
    "name, cls, unbiased, tensors, proj_types",
    [
        ("svd", SVDProjector, False, False, PROJ_TYPES),
        ("random", RandomProjector, True, False, PROJ_TYPES),
        ("plumage", PlumageProjector, True, False, ("std", "reverse_std", "left", "right")),
        ("tucker", TuckerProjector, False, True, ("std",)),
    ],
)
def test_spec_flags(name, cls, unbiased, tensors, proj_types):
    spec = projector_spec(name)
    assert (spec.name, spec.cls, spec.unbiased, spec.tensors, spec.proj_types) == (name, cls, unbiased, tensors, proj_types)
    assert spec.description
    assert isinstance(build_projector(name, rank=2), cls)


def test_plumage_does_not_offer_full():
    assert "full" not in projector_spec("plumage").proj_types
    assert "full" in projector_spec("svd").proj_types


def test_unknown_spec_lists_choices():
    with pytest.raises(ValueError, match="unknown projector 'nope'; registered projectors: plumage, random, svd"):
        projector_spec("nope")


def test_register_a_custom_projector(scratch_registry):
    assert register_projector(CoordinateProjector) is CoordinateProjector
    assert "coordinate" in list_projectors()
    spec = projector_spec("coordinate")
    assert (spec.cls, spec.proj_types, spec.unbiased, spec.tensors) == (CoordinateProjector, ("left", "right"), False, False)

    projector = build_projector("coordinate", rank=2, proj_type="right", scale=0.5)
    grad = torch.arange(12.0).reshape(3, 4)
    projector.refresh(grad, 0)
    torch.testing.assert_close(projector.project(grad), grad[:, :2])
    expected = torch.zeros(3, 4)
    expected[:, :2] = 0.5 * grad[:, :2]
    torch.testing.assert_close(projector.project_back(grad[:, :2]), expected)
    with pytest.raises(ValueError, match="'coordinate' does not support proj_type='std'"):
        build_projector("coordinate", rank=2)


def test_duplicate_name_needs_replace(scratch_registry):
    register_projector(CoordinateProjector)
    with pytest.raises(ValueError, match="'coordinate' is already registered; pass replace=True"):
        register_projector(CoordinateProjector)

    class Other(CoordinateProjector):
        description = "a replacement"

    register_projector(Other, replace=True)
    assert projector_spec("coordinate").cls is Other

    class Impostor(SVDProjector):
        pass

    with pytest.raises(ValueError, match="'svd' is already registered"):
        register_projector(Impostor)
    assert projector_spec("svd").cls is SVDProjector


def test_usable_as_decorator(scratch_registry):
    @register_projector
    class Decorated(CoordinateProjector):
        name = "decorated"

    assert projector_spec("decorated").cls is Decorated


@pytest.mark.parametrize("thing", [object, "svd", SVDProjector(2)])
def test_only_projector_subclasses(scratch_registry, thing):
    with pytest.raises(TypeError, match="Projector subclass"):
        register_projector(thing)


def test_scratch_registry_is_put_back(monkeypatch):
    monkeypatch.setattr(projectors, "_REGISTRY", dict(projectors._REGISTRY))
    register_projector(CoordinateProjector)
    assert "coordinate" in list_projectors()
    monkeypatch.undo()  # what the fixture's teardown does
    assert "coordinate" not in list_projectors()
    assert projector_spec("svd").cls is SVDProjector
