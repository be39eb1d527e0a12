"""A Llama-like layer's projected weights and a short training loop on seeded gradients, for the tests that compare
ways of stepping a group (test_multi_tensor.py: together against one by one; test_compiled_together.py: compiled
against eager)."""

from __future__ import annotations

import torch
from torch import nn

from galore_plumage import PlumageAdamW


class Layer(nn.Module):
    """Four same-shaped projections, two of another shape, one wider than tall, a norm (a full-rank group)."""

    def __init__(self, square: int = 4):
        super().__init__()
        self.square = nn.ModuleList(nn.Linear(40, 40, bias=False) for _ in range(square))
        self.up = nn.ModuleList(nn.Linear(40, 72, bias=False) for _ in range(2))
        self.down = nn.Linear(72, 40, bias=False)
        self.norm = nn.LayerNorm(40)

    def matrices(self):
        return [*self.square.parameters(), *self.up.parameters(), self.down.weight]


def train(foreach: bool, steps: int = 12, resting: int | None = None, dtype: torch.dtype = torch.float32,
          optimizer_class=PlumageAdamW, hyper: dict | None = None, lrs: list[float] | None = None, **options):
    """`resting`: the index of a weight that gets no gradient on every third step; `hyper`: the optimizer's own
    arguments (AdamW's lr and decay by default); `lrs`: every group's lr at each step (a schedule)."""
    torch.manual_seed(0)
    layer = Layer().to(dtype)
    groups = [{"params": layer.matrices(), "rank": 6, "update_proj_gap": 4, "foreach": foreach, **options},
              {"params": list(layer.norm.parameters())}]
    optimizer = optimizer_class(groups, **(hyper or {"lr": 1e-2, "weight_decay": 0.1}))
    data = torch.Generator().manual_seed(1)
    for step in range(steps):
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
        for param in layer.parameters():
            param.grad = torch.randn(param.shape, generator=data).to(dtype)
        if resting is not None and step % 3 == 2:
            layer.matrices()[resting].grad = None
        optimizer.step()
    return layer, optimizer
