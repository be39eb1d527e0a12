"""CUDA checks of torchrun_main.py (skipped without a GPU): a bf16 run trains, resumes exactly, and saves; so does
an --fsdp run (FSDP2 over nccl: fully_shard, the all-reduced Gram refresh, DCP checkpoints; the CPU tests in
tests/test_fsdp_*.py compare sharded runs with one process number by number).

Run on a GPU machine with `python -m pytest tests/gpu -q`. On CUDA the kernels are not bit-reproducible in
general, so the resume check compares losses to a tolerance instead of bit for bit.
"""

import json
import math
import random

import pytest
import torch

import torchrun_main

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(0)
    words = "king queen lord love death night day sword crown heart fair sweet noble brave speak".split()
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(6)) for _ in range(150)]
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(docs))
    return path


def _run(corpus, save_dir, *extra):
    argv = ["--model_config", "configs/llama_micro.json", "--dataset", str(corpus), "--vocab_size", "256",
            "--max_length", "64", "--batch_size", "4", "--gradient_accumulation", "2", "--num_training_steps", "6",
            "--warmup_steps", "1", "--eval_every", "3", "--save_every", "3", "--rank", "8", "--update_proj_gap", "2",
            "--data_dir", str(save_dir.parent / "data"), "--save_dir", str(save_dir), "--no-progress",
            "--dtype", "bfloat16", *extra]
    assert torchrun_main.main(argv) == 0
    return [json.loads(line) for line in (save_dir / "metrics.jsonl").read_text().splitlines()]


# "plumage_adamw --projector plumage": PLUMAGE's draws (plumage_adamw's default is GaLore's basis with v_floor)
@pytest.mark.parametrize("optimizer", ["plumage_adamw", "plumage_adamw --projector plumage", "galore_adamw8bit",
                                       "plumage_adamw8bit_per_layer"])
def test_bf16_run_trains_on_cuda(corpus, tmp_path, optimizer):
    records = _run(corpus, tmp_path / "run", "--optimizer", *optimizer.split())
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    summary = records[-1]
    assert summary["type"] == "summary" and math.isfinite(summary["eval_loss"])
    assert (tmp_path / "run" / "model_6" / "model.safetensors").is_file()


@pytest.mark.parametrize("optimizer", ["plumage_adamw", "plumage_adamw --projector plumage", "galore_adamw",
                                       "plumage_adamw8bit", "plumage_adafactor"])
def test_fsdp_run_trains_on_cuda(corpus, tmp_path, optimizer):
    records = _run(corpus, tmp_path / "run", "--fsdp", "--optimizer", *optimizer.split())
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert (tmp_path / "run" / "model_6" / "dcp").is_dir()


@pytest.mark.parametrize("projector", [[], ["--projector", "plumage"]], ids=["default", "plumage"])
@pytest.mark.parametrize("extra", [[], ["--fsdp"]], ids=["ddp", "fsdp"])
def test_resume_on_cuda_matches_uninterrupted_run(corpus, tmp_path, extra, projector):
    extra = [*extra, *projector]
    full = _run(corpus, tmp_path / "full", "--optimizer", "plumage_adamw", *extra)
    _run(corpus, tmp_path / "half", "--optimizer", "plumage_adamw", "--stop_at", "3", *extra)
    resumed = _run(corpus, tmp_path / "half", "--optimizer", "plumage_adamw", "--continue_from", str(tmp_path / "half"),
                   *extra)
    a = [r["loss"] for r in full if r["type"] == "train"]
    b = [r["loss"] for r in resumed if r["type"] == "train"]
    assert b == pytest.approx(a, rel=1e-2)
