"""Validation scores of a fine-tuning run: accuracy for a classifier; for a regression task (stsb, a file of fractional
labels) Pearson's r, the score a run is judged by, and Spearman's ρ, as HF's run_glue.py reports for stsb."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader


def primary_score(regression: bool) -> str:
    """The score that names a run's best epoch: "pearson" for a regression task, else "accuracy"."""
    return "pearson" if regression else "accuracy"


@torch.no_grad()
def validation_scores(model, loader: DataLoader, regression: bool) -> dict[str, float]:
    """{"accuracy": ...}, or {"pearson": ..., "spearmanr": ...} for a regression task, over the whole loader."""
    model.eval()
    outputs, targets = [], []
    for batch in loader:
        labels = batch.pop("labels")
        logits = model(**batch).logits
        outputs.append(logits.squeeze(-1) if regression else logits.argmax(dim=-1))
        targets.append(labels)
    model.train()
    predicted, target = torch.cat(outputs), torch.cat(targets)
    if not regression:
        return {"accuracy": (predicted == target).double().mean().item()}
    return {"pearson": pearson(predicted, target), "spearmanr": pearson(ranks(predicted), ranks(target))}


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson's correlation; 0 when either side is constant (an untrained head can predict one value for every row)."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    scale = (x.square().sum() * y.square().sum()).sqrt()
    return (x @ y / scale).item() if scale > 0 else 0.0


def ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks from 0, ties given the mean of the ranks they span (Spearman's ρ is Pearson's r of these)."""
    unique, inverse, counts = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts
    return (first + (counts - 1) / 2).double()[inverse]
