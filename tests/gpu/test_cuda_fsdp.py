"""CUDA checks of torchrun_main.py --fsdp (skipped without a GPU): FSDP2 over nccl trains and resumes.

One process is enough to exercise fully_shard on CUDA, the nccl all-reduce of the Gram refresh and the DCP
checkpoint; the CPU tests (tests/test_fsdp_*.py) compare sharded runs with a single process number by number.
"""

import json
import math

import pytest
import torch
from test_cuda_train import corpus  # noqa: F401 - the shared corpus fixture

import torchrun_main

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _run(corpus_path, save_dir, *extra):
    argv = ["--fsdp", "--model_config", "configs/llama_micro.json", "--dataset", str(corpus_path), "--vocab_size", "256",
            "--max_length", "64", "--batch_size", "4", "--num_training_steps", "6", "--warmup_steps", "1",
            "--eval_every", "3", "--save_every", "3", "--rank", "8", "--update_proj_gap", "2",
            "--data_dir", str(save_dir.parent / "data"), "--save_dir", str(save_dir), "--no-progress", *extra]
    assert torchrun_main.main(argv) == 0
    return [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("optimizer", ["plumage_adamw", "galore_adamw", "plumage_adamw8bit", "plumage_adafactor"])
def test_fsdp_trains_on_cuda(corpus, tmp_path, optimizer):  # noqa: F811
    records = _run(corpus, tmp_path / "run", "--optimizer", optimizer)
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert (tmp_path / "run" / "model_6" / "dcp").is_dir()


def test_fsdp_resume_on_cuda_matches_uninterrupted_run(corpus, tmp_path):  # noqa: F811
    full = _run(corpus, tmp_path / "full", "--optimizer", "plumage_adamw")
    _run(corpus, tmp_path / "half", "--optimizer", "plumage_adamw", "--stop_at", "3")
    resumed = _run(corpus, tmp_path / "half", "--optimizer", "plumage_adamw", "--continue_from", str(tmp_path / "half"))
    a = [r["loss"] for r in full if r["type"] == "train"]
    b = [r["loss"] for r in resumed if r["type"] == "train"]
    assert b == pytest.approx(a, rel=1e-2)
