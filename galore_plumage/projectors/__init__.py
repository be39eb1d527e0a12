"""Low-rank gradient projectors and their registry.

    build_projector("plumage", rank=128)        # or "svd", "random", "tucker", or one you registered
    list_projectors()                           # ['plumage', 'random', 'svd', 'tucker']
    register_projector(MyProjector)             # a Projector subclass with name/description/flags set

Each registry entry is data read off the class: its description and what it can do (proj_types, unbiased,
tensors), so command lines and docs list the same choices the code accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Projector
from .interval import mean_principal_cosine, next_interval
from .modes import PROJ_TYPES, mode_product, projected_modes
from .plumage import PlumageProjector
from .pool import Basis
from .random import RandomProjector
from .sampling import inclusion_probabilities, systematic_sample
from .seeding import refresh_generator
from .svd import SVDProjector
from .tucker import TuckerProjector


@dataclass(frozen=True)
class ProjectorSpec:
    name: str
    cls: type[Projector]
    description: str
    proj_types: tuple[str, ...]
    unbiased: bool
    tensors: bool  # accepts gradients with more than 2 dims


_REGISTRY: dict[str, ProjectorSpec] = {}


def register_projector(cls: type[Projector], replace: bool = False) -> type[Projector]:
    """Add a Projector subclass under `cls.name`; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Projector)):
        raise TypeError(f"register_projector takes a Projector subclass, got {cls!r}")
    if cls.name in _REGISTRY and not replace:
        raise ValueError(f"a projector named {cls.name!r} is already registered; pass replace=True to override it")
    _REGISTRY[cls.name] = ProjectorSpec(cls.name, cls, cls.description, cls.proj_types, cls.unbiased, cls.tensors)
    return cls


def projector_spec(name: str) -> ProjectorSpec:
    if name not in _REGISTRY:
        raise ValueError(f"unknown projector {name!r}; registered projectors: {', '.join(list_projectors())}")
    return _REGISTRY[name]


def list_projectors() -> list[str]:
    return sorted(_REGISTRY)


def build_projector(
    name: str,
    rank: int,
    proj_type: str = "std",
    update_proj_gap: int = 200,
    scale: float = 1.0,
    seed: int = 0,
    **options,
) -> Projector:
    """A fresh projector; `options` are index, adaptive_interval, tau_max, solver, max_inv_p (see Projector)."""
    return projector_spec(name).cls(
        rank, proj_type=proj_type, update_proj_gap=update_proj_gap, scale=scale, seed=seed, **options
    )


for _cls in (SVDProjector, RandomProjector, PlumageProjector, TuckerProjector):
    register_projector(_cls)

__all__ = [
    "PROJ_TYPES",
    "Basis",
    "PlumageProjector",
    "Projector",
    "ProjectorSpec",
    "RandomProjector",
    "SVDProjector",
    "TuckerProjector",
    "build_projector",
    "inclusion_probabilities",
    "list_projectors",
    "mean_principal_cosine",
    "mode_product",
    "next_interval",
    "projected_modes",
    "projector_spec",
    "refresh_generator",
    "register_projector",
    "systematic_sample",
]
