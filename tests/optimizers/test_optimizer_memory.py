"""state_bytes: what an optimizer's state keeps alive, as the benchmarks and run_glue report it."""

import torch
from galore_torch import GaLoreAdamW as TorchGaLoreAdamW

from galore_plumage import GaLoreAdamW
from galore_plumage.optimizers.memory import state_bytes


def test_a_view_keeps_its_whole_storage_alive_and_each_tensor_counts_once():
    full = torch.zeros(10, 8)  # 320 bytes
    view = full[:, :2]  # 80 bytes of its own
    shared = torch.ones(4)  # 16 bytes, referenced twice
    assert state_bytes({"a": {"basis": view, "x": shared}, "b": [shared, (3, "text")]}) == (320 + 16, 80 + 16)


def _one_step(optimizer_class, weight):
    optimizer = optimizer_class([{"params": [weight], "rank": 2, "update_proj_gap": 5, "scale": 0.25,
                                  "proj_type": "std"}], lr=1e-3)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    return state_bytes(dict(optimizer.state))


def test_ours_and_galore_torch_hold_the_same_tensor_bytes():
    """Both keep rank-2 moments (12×2 floats each) and a 6×2 basis: 240 bytes of tensors. galore-torch's basis is
    a slice of the full 6×6 SVD factor (reached through its projector object's attributes), so it keeps 36 floats
    alive, not 12."""
    torch.manual_seed(0)
    ours = _one_step(GaLoreAdamW, torch.randn(12, 6, requires_grad=True))
    theirs = _one_step(TorchGaLoreAdamW, torch.randn(12, 6, requires_grad=True))
    tensors = (2 * 12 * 2 + 6 * 2) * 4
    assert ours == (tensors, tensors)
    assert theirs == (tensors + (36 - 12) * 4, tensors)
