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


def test_a_bfloat16_pool_costs_what_galores_basis_costs():
    """PLUMAGE's draws (PLUMAGE_SAMPLED) keep a pool of 2r float32 vectors (the basis a view of it) where GaLore keeps
    r; stored in bfloat16 (pool_bf16) the pool takes GaLore's basis bytes. Beyond it: the pool's p (float64) and order
    (int64), 2r each, the drawn 1/p (r float32), and the complement's limiter (one float32 norm). plumage_adamw's
    default since session 17 (GaLore's basis, v_floor) holds exactly GaLore's state."""
    from galore_plumage import PlumageAdamW
    from galore_plumage.optimizers import PLUMAGE_SAMPLED

    torch.manual_seed(0)
    weight = torch.randn(12, 6, requires_grad=True)  # std: right side, vectors of length 6, moments 12 × r
    rank, galore = 2, _one_step(GaLoreAdamW, weight.detach().clone().requires_grad_())
    sizes = {}
    for bf16 in (False, True):
        optimizer = PlumageAdamW([{"params": [weight], "rank": rank, "update_proj_gap": 5, **PLUMAGE_SAMPLED,
                                   "pool_bf16": bf16}])
        weight.grad = torch.randn_like(weight)
        optimizer.step()
        sizes[bf16] = state_bytes(dict(optimizer.state))[0]
    bookkeeping = 2 * rank * (8 + 8) + rank * 4 + 4
    assert sizes[True] == galore[0] + bookkeeping
    assert sizes[False] == galore[0] + bookkeeping + 6 * rank * 4  # r more float32 vectors than GaLore
    assert _one_step(PlumageAdamW, weight.detach().clone().requires_grad_()) == galore
