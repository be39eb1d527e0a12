"""CUDA checks: the same optimizer on CUDA and CPU follows the same path (skipped without a GPU).

Run on a GPU machine with `python -m pytest tests/gpu -q`. Bases are drawn on the CPU from the same
generator, so CPU and CUDA runs sample the same directions; what differs is only float rounding of the
SVD and matmuls, so the weights agree to a loose float32 tolerance.
"""

import pytest
import torch

from galore_plumage import GaLoreAdamW, PlumageAdafactor, PlumageAdamW, PlumageAdamW8bit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CLASSES = [
    (GaLoreAdamW, {"lr": 1e-3}),
    (PlumageAdamW, {"lr": 1e-3}),
    (PlumageAdamW8bit, {"lr": 1e-3}),
    (PlumageAdafactor, {"lr": 1e-3, "relative_step": False}),
]


def _run(cls, options, device, dtype=torch.float32, steps=6):
    generator = torch.Generator().manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(256, 128, generator=generator).to(device, dtype))
    optimizer = cls([{"params": [weight], "rank": 32, "update_proj_gap": 3}], weight_decay=0.01, **options)
    for _ in range(steps):
        weight.grad = torch.randn(256, 128, generator=generator).to(device, dtype)
        optimizer.step()
    return weight.detach().float().cpu(), optimizer


@pytest.mark.parametrize("cls,options", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_cuda_matches_cpu(cls, options):
    on_cpu, _ = _run(cls, options, "cpu")
    on_cuda, _ = _run(cls, options, "cuda")
    assert torch.allclose(on_cpu, on_cuda, rtol=1e-3, atol=1e-4), (on_cpu - on_cuda).abs().max()


@pytest.mark.parametrize("cls,options", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_bf16_weights_keep_fp32_low_rank_state(cls, options):
    weight, optimizer = _run(cls, options, "cuda", dtype=torch.bfloat16)
    assert torch.isfinite(weight).all()
    state = next(iter(optimizer.state.values()))
    for factor in state["projector"]["factors"].values():
        assert factor.dtype == torch.float32
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            assert state[key].dtype == torch.float32
    if "state1" in state:
        assert state["state1"].dtype in (torch.uint8, torch.float32)
