"""Shared by the end-to-end training tests: a synthetic corpus, the flags of a tiny run on it, a 2-process torchrun
launch, metrics.jsonl reading, the repo's paths."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # torchrun_main.py lives at the repository root
    sys.path.insert(0, str(REPO))
MODEL_CONFIG = str(REPO / "configs" / "llama_micro.json")
DIST_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_TIMEOUT_S = 180

# torchrun_main.py's flags of a run shorter than optimizers.PRETRAIN_LONG_RUN_LR's 1000 updates (its batch's lr,
# unscaled), and of a batch below 2,048 tokens an update (8 x 64 = 512 tokens: PRETRAIN_LR's band below)
SHORT_RUN = ["--num_training_steps", "600", "--warmup_steps", "60"]
SMALL_BATCH = ["--max_length", "64"]


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


def tiny_run_flags(root: Path, dataset: Path, updates: int) -> list[str]:
    """torchrun_main.py flags of a tiny llama_micro run on `dataset` (rank 8, a refresh every 2 updates)."""
    return ["--dataset", str(dataset), "--vocab_size", "256", "--max_length", "32", "--model_config", MODEL_CONFIG,
            "--data_dir", str(root / "data"), "--no-progress", "--rank", "8", "--update_proj_gap", "2",
            "--eval_tokens", "256", "--warmup_steps", "0", "--num_training_steps", str(updates), "--lr", "3e-3"]


def subprocess_env() -> dict[str, str]:
    """The environment of a training subprocess: no rank variables inherited from whatever launched pytest, one
    thread (so two runs of the same job compute alike), unbuffered output."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def torchrun(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc_per_node <nproc> torchrun_main.py <args>` from the repo
    root, in subprocess_env()."""
    env = subprocess_env()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "torchrun_main.py", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S)


def hidden_entries(folder: Path) -> list[str]:
    """The names in `folder` that start with a dot: what a killed or failed save would leave (temp folders)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
