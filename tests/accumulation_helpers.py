"""Shared by the per-layer accumulation tests: feed the same micro-batches to a normal optimizer's model and to a
per-layer one's, then compare the weights."""

from __future__ import annotations

import torch
from torch import nn


def train_alike(models: list[nn.Module], normal, accumulation: int, updates: int, in_dim: int, out_dim: int) -> None:
    """`updates` updates of `accumulation` float64 micro-batches each, identical for every model; `normal` steps
    models[0] after each update (the per-layer optimizers step in their hooks)."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(updates):
        batches = [(torch.randn(5, in_dim, generator=generator, dtype=torch.float64),
                    torch.randn(5, out_dim, generator=generator, dtype=torch.float64)) for _ in range(accumulation)]
        for model in models:
            for x, y in batches:
                (nn.functional.mse_loss(model(x), y) / accumulation).backward()
        normal.step()
        normal.zero_grad()


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for left, right in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(left, right, rtol=1e-12, atol=1e-14)
