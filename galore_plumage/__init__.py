"""galore_plumage: memory-lean training with pluggable low-rank gradient projectors (svd, random, plumage, tucker)."""

from .projectors import build_projector, list_projectors, register_projector

__version__ = "0.1.0"

__all__ = ["build_projector", "list_projectors", "register_projector"]
