"""torchrun_main.py under `torchrun --standalone --nproc_per_node 2` on CPU (gloo), offline.

Data-parallel training must be the single-process run in disguise: every rank ends with the same weights
(the summary's rank fingerprints agree), and those weights equal a one-process run with the same total batch,
because the data order gives each update the same sequences however they are split over ranks and micro-batches.
Per-layer optimizers, which step before DDP's all-reduce, are refused under more than one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import DIST_VARS, read_metrics, tiny_run_flags, torchrun, write_corpus  # noqa: E402

import torchrun_main  # noqa: E402

UPDATES = 4
# The weight-for-weight comparison with one process uses flora_adamw: low-rank (refreshes at updates 1 and 3,
# momentum transferred) with a basis drawn from the seed alone, so the two runs differ only in the order of the
# gradient sum. plumage_adamw and galore_adamw build the basis from the gradient's singular vectors, and PLUMAGE
# samples single tail vectors whose singular values are nearly equal: a rounding-level change of the gradient can
# rotate them or change a sampled index, which moved weights by up to 3e-4 here. Both ranks see the very same
# all-reduced gradient, though, so plumage_adamw is checked for identical weights across ranks.
COMPARED = "flora_adamw"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Corpus, data_dir and the flags every job here shares (4 updates, projection refreshes at 1 and 3)."""
    root = tmp_path_factory.mktemp("train_distributed")
    dataset = write_corpus(root / "corpus.txt")
    flags = tiny_run_flags(root, dataset, UPDATES)
    return {"root": root, "flags": flags}


@pytest.fixture(scope="module")
def single_process(workspace):
    """1 process x batch 2 x accumulation 4 of COMPARED, in process (it also warms the tokenizer cache, so the
    2-rank jobs only read it)."""
    save_dir = workspace["root"] / f"single-{COMPARED}"
    with pytest.MonkeyPatch.context() as patch:
        for var in DIST_VARS:
            patch.delenv(var, raising=False)
        code = torchrun_main.main(workspace["flags"] + ["--optimizer", COMPARED, "--batch_size", "2",
                                                        "--gradient_accumulation", "4", "--save_dir", str(save_dir)])
    assert code == 0
    return save_dir


@pytest.fixture(scope="module")
def two_ranks(workspace, single_process):
    """optimizer -> (save_dir, completed process) of 2 processes x batch 2 x accumulation 2, launched once each:
    the same 8 sequences per update as the single process."""
    jobs = {}

    def get(optimizer: str):  # a name, then any flags of its own ("plumage_adamw --projector plumage")
        if optimizer not in jobs:
            name, *own = optimizer.split()
            save_dir = workspace["root"] / f"ddp-{'-'.join(optimizer.split())}"
            result = torchrun(workspace["flags"] + ["--optimizer", name, *own, "--batch_size", "2",
                                                    "--gradient_accumulation", "2", "--save_dir", str(save_dir)])
            assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
            jobs[optimizer] = save_dir, result
        return jobs[optimizer]

    return get


# PLUMAGE's projector by name: plumage_adamw's default since session 17 is GaLore's deterministic basis
@pytest.mark.parametrize("optimizer", ["plumage_adamw --projector plumage", COMPARED])
def test_two_ranks_end_with_identical_weights(two_ranks, optimizer):
    """Exit 0, the run reports 2 processes, and both ranks' weight fingerprints (each computed by its own rank
    from its own weights, then gathered) are exactly equal: DDP handed both the same all-reduced gradients and
    both ranks' projectors drew the same bases (PLUMAGE samples: its generator must agree across ranks).
    Records are written once (rank 0), with the token count of 2 ranks x 4 sequences x 32 tokens per update."""
    save_dir, result = two_ranks(optimizer)
    assert "2 process(es) on cpu" in result.stdout
    assert "WARNING: the ranks ended with different weights" not in result.stdout
    records = read_metrics(save_dir)
    (config,) = records["config"]
    assert config["world_size"] == 2 and config["total_batch_size"] == 8
    assert [r["step"] for r in records["train"]] == list(range(1, UPDATES + 1))
    assert [r["tokens"] for r in records["train"]] == [8 * 32 * s for s in range(1, UPDATES + 1)]
    assert len(records["eval"]) == 1
    assert records["projector"] and all(r["refreshes"] == 2 for r in records["projector"])
    (summary,) = records["summary"]
    fingerprints = summary["rank_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    assert (save_dir / "latest").read_text().strip() == f"model_{UPDATES}"


def test_two_ranks_equal_one_process_with_the_same_total_batch(two_ranks, single_process):
    """2 ranks x batch 2 x accumulation 2 vs 1 process x batch 2 x accumulation 4 (COMPARED, see above): update u
    reads sequences 8u..8u+7 of the shuffled order in both, so losses and final weights agree to float rounding
    (the gradient sum is taken in another order: DDP's all-reduce of two partial sums vs four accumulated
    micro-gradients; measured 1e-7 against the 1e-5 allowed). The eval loss is token-weighted over both ranks'
    shares of the same validation sequences, so it agrees too."""
    ddp_dir, _ = two_ranks(COMPARED)
    ddp, single = read_metrics(ddp_dir), read_metrics(single_process)
    assert [r["loss"] for r in ddp["train"]] == pytest.approx([r["loss"] for r in single["train"]], rel=1e-5)
    assert [r["lr"] for r in ddp["train"]] == [r["lr"] for r in single["train"]]
    assert ddp["summary"][0]["tokens"] == single["summary"][0]["tokens"] == UPDATES * 8 * 32
    assert ddp["eval"][0]["eval_tokens"] == single["eval"][0]["eval_tokens"]
    assert ddp["summary"][0]["eval_loss"] == pytest.approx(single["summary"][0]["eval_loss"], rel=1e-5)
    a = load_file(ddp_dir / f"model_{UPDATES}" / "model.safetensors")
    b = load_file(single_process / f"model_{UPDATES}" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def test_per_layer_optimizer_is_refused_under_two_processes(workspace):
    """A *_per_layer optimizer steps each weight inside its gradient hook, before DDP all-reduces that gradient, so
    the ranks would drift apart: the job exits non-zero before anything is written, saying why and what to do."""
    save_dir = workspace["root"] / "ddp-per-layer"
    result = torchrun(workspace["flags"] + ["--optimizer", "plumage_adamw_per_layer", "--batch_size", "2",
                                            "--save_dir", str(save_dir)])
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "--optimizer plumage_adamw_per_layer steps each weight inside its gradient hook" in output, output[-4000:]
    assert "--single_gpu" in output
    assert not save_dir.exists()


def test_a_data_failure_on_rank_zero_stops_every_rank(workspace):
    """Rank 0 prepares the data while the others wait; if it fails (here: a corpus of one document, too few to hold
    out a validation split), every rank must exit with an error instead of waiting at the barrier forever."""
    one_document = workspace["root"] / "one_document.txt"
    one_document.write_text("only one document here\n")
    flags = [f for f in workspace["flags"]]
    flags[flags.index("--dataset") + 1] = str(one_document)
    save_dir = workspace["root"] / "rank0-failure"
    result = torchrun(flags + ["--optimizer", "plumage_adamw", "--batch_size", "2", "--save_dir", str(save_dir)])
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "holds 1 document(s)" in output, output[-4000:]
    assert "rank 0 could not prepare the data" in output, output[-4000:]


def _computed_on_main_worker(rank: int, folder: str, port: int) -> None:
    import os

    import torch.distributed as dist

    from galore_plumage.training.distributed import Dist, computed_on_main

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = Path(folder)
    for case in ("result", "failure"):
        def verify(case=case):  # stands for hashing a checkpoint's files
            (out / f"{case}_ran_on_{rank}").write_text("")
            if case == "failure":
                raise ValueError("model_4/trainer.pt: sha256 differs")
            return out / "model_4"

        try:
            outcome = str(computed_on_main(verify, Dist(rank, rank, 2, torch.device("cpu"))))
        except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
            outcome = f"{type(error).__name__}: {error}"
        (out / f"{case}_{rank}").write_text(outcome)
    dist.destroy_process_group()


def test_only_rank_zero_verifies_a_checkpoint_and_every_rank_hears_the_outcome(tmp_path):
    """find_resume hashes a checkpoint's files on rank 0 alone (computed_on_main) and shares the folder, or the error,
    so no other rank repeats the hashing or waits for an answer that will not come."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_computed_on_main_worker, args=(str(tmp_path), port), nprocs=2, join=True)
    for case in ("result", "failure"):
        assert (tmp_path / f"{case}_ran_on_0").exists() and not (tmp_path / f"{case}_ran_on_1").exists()
    assert [(tmp_path / f"result_{r}").read_text() for r in (0, 1)] == [str(tmp_path / "model_4")] * 2
    failure = "ValueError: model_4/trainer.pt: sha256 differs"
    assert (tmp_path / "failure_0").read_text() == failure
    assert (tmp_path / "failure_1").read_text() == f"RuntimeError: rank 0 failed: {failure}"
