"""Shared by the end-to-end training tests: a synthetic corpus, metrics.jsonl reading, the repo's paths."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # torchrun_main.py lives at the repository root
    sys.path.insert(0, str(REPO))
MODEL_CONFIG = str(REPO / "configs" / "llama_micro.json")
DIST_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def write_corpus(path: Path, documents: int = 150, seed: int = 0) -> Path:
    """`documents` random "documents" of 20-60 words from a 300-word vocabulary, separated by blank lines."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(documents)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def read_metrics(save_dir: Path) -> dict[str, list[dict]]:
    """metrics.jsonl grouped by record type."""
    records: dict[str, list[dict]] = {}
    for line in (Path(save_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["type"], []).append(record)
    return records
