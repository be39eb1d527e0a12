"""metrics.jsonl (one JSON object a line: train, eval and projector records) and the progress bar."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from tqdm import tqdm

from ..optimizers.layerwise import inner_optimizer

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends records to `<save_dir>/metrics.jsonl` on rank 0 (a resumed run continues the same file), and hands
    each to an experiment tracker when one is given (trackers.py)."""

    def __init__(self, save_dir: str | Path, enabled: bool, tracker=None):
        self.path = Path(save_dir) / METRICS_FILE
        self.enabled = enabled
        self.tracker = tracker if enabled else None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, **record) -> None:
        if self.enabled:
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"type": kind, **record}) + "\n")
        if self.tracker is not None:
            self.tracker.log(kind, record)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))  # capped so a diverged run logs a number, not an overflow


def projector_records(optimizer, names: dict[int, str]) -> list[dict]:
    """One record per low-rank weight: r*, ρ, τ, max 1/p and refresh counts from its projector's stats."""
    inner = inner_optimizer(optimizer)
    if not hasattr(inner, "projector_stats"):
        return []
    records = []
    for index, stats in sorted(inner.projector_stats().items()):
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items()}
        records.append({"param": names.get(index, str(index)), **clean})
    return records


class Progress:
    """A tqdm bar over updates showing loss, lr and tokens/s; silent off rank 0 or with --no-progress."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = tqdm(total=total, initial=initial, desc="updates", dynamic_ncols=True, disable=not enabled)
        self._last = time.perf_counter()

    def update(self, loss: float, lr: float, tokens: int) -> float:
        now = time.perf_counter()
        rate = tokens / max(now - self._last, 1e-9)
        self._last = now
        self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}", refresh=False)
        self.bar.update(1)
        return rate

    def write(self, message: str) -> None:
        if not self.bar.disable:
            self.bar.write(message)

    def close(self) -> None:
        self.bar.close()
