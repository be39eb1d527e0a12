"""galore_plumage: memory-lean training with pluggable low-rank gradient projectors (svd, random, plumage, tucker)."""

from .optimizers import (
    GaLoreAdafactor,
    GaLoreAdamW,
    GaLoreAdamW8bit,
    PlumageAdafactor,
    PlumageAdamW,
    PlumageAdamW8bit,
    build_optimizer,
    list_optimizers,
)
from .projectors import build_projector, list_projectors, register_projector

__version__ = "0.1.0"

__all__ = [
    "GaLoreAdafactor",
    "GaLoreAdamW",
    "GaLoreAdamW8bit",
    "PlumageAdafactor",
    "PlumageAdamW",
    "PlumageAdamW8bit",
    "build_optimizer",
    "build_projector",
    "list_optimizers",
    "list_projectors",
    "register_projector",
]
