"""GaLore's projector: the top-r singular vectors of the gradient, refreshed every update_proj_gap steps."""

from __future__ import annotations

from .base import Projector
from .pool import Basis


class SVDProjector(Projector):
    name = "svd"
    description = "GaLore: top-r singular vectors of the gradient (biased, deterministic)"
    from_spectrum = True
    signed = True
    checks_after = True  # an SVD of a non-finite gradient fails or gives NaN: its basis is rejected after the fact

    def auto_solver(self, device):
        # the top r alone: the Gram's eigh gives them and their σ to 1e-4 (tests/projectors/test_solver_accuracy.py) in
        # 0.4x an SVD's time on a CPU (docs/step_time.md), 0.24-0.85x on an H100 (../shared/measurements, e088428); what
        # float32 squaring loses is the tail this basis drops
        return "gram"

    def _basis_from_spectrum(self, decomposition, ranks, generator, step):
        rank = next(iter(ranks.values()))
        energy = decomposition.sigma.double().square()
        captured = energy[:rank].sum() / energy.sum()  # a 0-d tensor: read with the refresh's other figures
        factors = {mode: decomposition.factor(mode, slice(0, r)) for mode, r in ranks.items()}
        return Basis(factors, stats={"energy_captured": captured})
