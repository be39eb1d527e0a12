"""GaLoreAdamW / GaLoreAdafactor / GaLoreAdamW8bit reproduce galore-torch's classes (the drop-in promise).

Float32, weight decay > 0, every proj_type, a tall and a wide weight, update_proj_gap=3 so the basis is
rebuilt at steps 0, 3 and 6 of a 7-step run, and a regular (no rank) group beside the low-rank one.
"""

from __future__ import annotations

import galore_torch
import pytest
import torch

from galore_plumage import GaLoreAdafactor, GaLoreAdamW, GaLoreAdamW8bit

PROJ_TYPES = ["std", "reverse_std", "left", "right", "full"]
STEPS, GAP = 7, 3
REFRESHES = len(range(0, STEPS, GAP))  # steps 0, 3, 6


def _run(cls, shapes, regular_shapes, proj_type, rank, **options):
    """Weights and gradients drawn from fixed generators, so both libraries see the very same numbers."""
    generator = torch.Generator().manual_seed(0)
    low_rank = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]
    regular = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in regular_shapes]
    initial = [p.detach().clone() for p in low_rank + regular]
    optimizer = cls(
        [{"params": regular}, {"params": low_rank, "rank": rank, "update_proj_gap": GAP, "scale": 0.25, "proj_type": proj_type}],
        **options,
    )
    grads = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        for p in low_rank + regular:
            p.grad = torch.randn(p.shape, generator=grads)
        optimizer.step()
    return optimizer, initial, [p.detach().clone() for p in low_rank + regular]


def _compare(theirs, ours, atol):
    optimizer, initial, ours_final = ours
    _, _, theirs_final = theirs
    for start, a, b in zip(initial, theirs_final, ours_final, strict=True):
        # Guard against a vacuous pass: both sides must actually have moved the weight.
        assert (a - start).abs().max() > 1e-3 and (b - start).abs().max() > 1e-3
        assert (a - b).abs().max().item() <= atol, (a - b).abs().max().item()
    counts = [stats["refreshes"] for stats in optimizer.projector_stats().values()]
    assert counts == [REFRESHES] * 2


@pytest.mark.parametrize("proj_type", PROJ_TYPES)
def test_adamw_matches_galore_torch(proj_type):
    options = {"lr": 1e-2, "weight_decay": 0.1}
    shapes, regular = [(32, 20), (20, 32)], [(20,), (6, 5)]
    theirs = _run(galore_torch.GaLoreAdamW, shapes, regular, proj_type, 4, no_deprecation_warning=True, **options)
    ours = _run(GaLoreAdamW, shapes, regular, proj_type, 4, **options)
    # The same operations in the same order: bit-exact today; DESIGN.md promises 1e-6.
    _compare(theirs, ours, atol=1e-6)


ADAFACTOR_SETTINGS = {
    "lr-beta1": {"lr": 1e-2, "relative_step": False, "beta1": 0.9},
    "lr-nobeta1": {"lr": 1e-2, "relative_step": False, "beta1": None},
    "relative-beta1": {"lr": None, "relative_step": True, "beta1": 0.9},
    "relative-nobeta1": {"lr": None, "relative_step": True, "beta1": None},
}


@pytest.mark.parametrize("setting", list(ADAFACTOR_SETTINGS))
@pytest.mark.parametrize("proj_type", PROJ_TYPES)
def test_adafactor_matches_galore_torch(proj_type, setting):
    options = {**ADAFACTOR_SETTINGS[setting], "weight_decay": 0.1}
    shapes, regular = [(32, 20), (20, 32)], [(20,), (6, 5)]
    theirs = _run(galore_torch.GaLoreAdafactor, shapes, regular, proj_type, 4, **options)
    ours = _run(GaLoreAdafactor, shapes, regular, proj_type, 4, **options)
    # galore-torch keeps RMS(W) as a float32 0-d tensor and so forms the step size RMS(W)·lr in float32;
    # we keep it as a Python float (state is plain numbers) and form it in double. The step sizes differ in
    # the last bit, which leaves a few ulps on weights of size ~1 after 7 steps (observed 2.4e-7), inside
    # the 1e-6 of DESIGN.md.
    _compare(theirs, ours, atol=1e-6)


@pytest.mark.parametrize("proj_type", PROJ_TYPES)
def test_adamw8bit_matches_galore_torch(proj_type, monkeypatch):
    # galore-torch's 8-bit step calls torch.cuda.synchronize(), which fails without CUDA.
    monkeypatch.setattr(galore_torch.adamw8bit.torch.cuda, "synchronize", lambda *args, **kwargs: None)
    # galore-torch passes percentile_clipping=100 positionally into bitsandbytes' max_unorm; with its zeroed
    # p.data that scales any tensor on bitsandbytes' 32-bit path (< 4096 elements) to a zero update. So
    # every tensor here has >= 4096 elements and takes the blockwise 8-bit path: rank 64 of 128 x 96
    # gives low-rank tensors of 128*64, 64*128 or (full) 64*64 = 4096 elements.
    options = {"lr": 1e-2, "weight_decay": 0.1}
    shapes, regular = [(128, 96), (96, 128)], [(4096,)]
    theirs = _run(galore_torch.GaLoreAdamW8bit, shapes, regular, proj_type, 64, **options)
    ours = _run(GaLoreAdamW8bit, shapes, regular, proj_type, 64, **options)
    # Same bitsandbytes kernel on the same inputs: exact (a quantization flip would show up as ~1e-4).
    _compare(theirs, ours, atol=0.0)
    for state in ours[0].state.values():
        assert state["state1"].dtype == torch.uint8  # the 8-bit path really ran
