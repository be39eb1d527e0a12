"""SVDProjector reproduces galore-torch's GaLoreProjector (float32) for every proj_type, across refreshes."""

from __future__ import annotations

import pytest
import torch
from galore_torch.galore_projector import GaLoreProjector

from galore_plumage.projectors import SVDProjector

RANK, GAP, STEPS = 6, 3, 8  # refreshes at steps 0, 3 and 6


def _assert_matches(ours, theirs):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6 * max(theirs.abs().max().item(), 1.0))


@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("shape", [(40, 24), (24, 40)], ids=["tall", "wide"])
@pytest.mark.parametrize("proj_type", ["std", "reverse_std", "left", "right", "full"])
def test_matches_galore_torch(proj_type, shape, scale):
    generator = torch.Generator().manual_seed(sum(shape) + len(proj_type))
    reference = GaLoreProjector(RANK, update_proj_gap=GAP, scale=scale, proj_type=proj_type)
    ours = SVDProjector(RANK, proj_type=proj_type, update_proj_gap=GAP, scale=scale)
    refreshed = []
    for step in range(STEPS):
        # a slowly drifting gradient, as in training, so consecutive bases differ but are related
        grad = torch.randn(shape, generator=generator) + (step + 1) * torch.linspace(-1, 1, shape[0])[:, None]
        expected_low = reference.project(grad, step)
        refreshed.append(ours.maybe_refresh(grad, step))
        low = ours.project(grad)
        _assert_matches(low, expected_low)

        update = torch.randn(low.shape, generator=generator)  # the backend's low-rank update
        _assert_matches(ours.project_back(update), reference.project_back(update))
    assert refreshed == [step % GAP == 0 for step in range(STEPS)]
