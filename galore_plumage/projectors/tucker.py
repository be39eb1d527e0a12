"""GaLore's tensor projector for weights with more than 2 dims (convolutions), via a Tucker decomposition.

Each mode whose size exceeds the rank gets an orthonormal factor from tensorly's partial Tucker (HOOI from
an HOSVD start); the low-rank gradient is the core G ×_k F_kᵀ. Unlike galore-torch's tensor projector it
refreshes every update_proj_gap steps (galore-torch's builds its factors once and never again), and
project_back maps back the *update* it is given (galore-torch's maps back the last projected gradient).
"""

from __future__ import annotations

import warnings

from .base import Projector
from .modes import PROJ_TYPES
from .pool import Basis

TUCKER_ITERATIONS = 10  # HOOI sweeps from the HOSVD start; the basis only steers the next τ steps


class TuckerProjector(Projector):
    name = "tucker"
    description = "GaLore tensor projector: Tucker factors of every mode larger than the rank (biased)"
    proj_types = PROJ_TYPES[:1]  # every mode larger than the rank is projected; proj_type has no say
    tensors = True
    signed = True

    def _ranks(self, shape):
        ranks = {mode: self.rank for mode, size in enumerate(shape) if self.rank < size}
        if not ranks:
            warnings.warn(
                f"tucker projector: rank {self.rank} >= every dimension of shape {tuple(shape)}; "
                "nothing is projected and no memory is saved",
                stacklevel=3,
            )
        return ranks

    def _new_basis(self, grad, ranks, generator):
        if not ranks:
            return Basis({})
        import tensorly
        from tensorly.decomposition import partial_tucker

        modes = sorted(ranks)
        with tensorly.backend_context("pytorch"):
            (_, factors), _ = partial_tucker(
                grad, rank=[ranks[m] for m in modes], modes=modes, n_iter_max=TUCKER_ITERATIONS
            )
        if not all(f.isfinite().all() for f in factors):
            return None
        return Basis({mode: factor.contiguous() for mode, factor in zip(modes, factors, strict=True)})
