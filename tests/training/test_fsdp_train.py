"""torchrun_main.py --fsdp under `torchrun --standalone --nproc_per_node 2` on CPU (gloo), offline.

FSDP2 training must be the single-process run in disguise (same total batch, flora_adamw as in
test_train_distributed.py: a seed-only basis, so the runs differ only in the order of the gradient sum; proj_type
right, because sharded weights are always projected on the right and std would pick the left side of the 64 x 172
down_proj on one process), and a run
stopped at update 2 and resumed from its DCP checkpoint must end with the very same weights as the run that never
stopped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from train_helpers import DIST_VARS, MODEL_CONFIG, read_metrics, tiny_run_flags, torchrun, write_corpus

import torchrun_main
from galore_plumage.training import parse_config

UPDATES = 4
OPTIMIZER = "flora_adamw"


def torchrun_ok(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    done = torchrun(args, nproc)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-6000:]}"
    return done


def sharded_weights(checkpoint) -> dict[str, torch.Tensor]:
    """The full weights of an --fsdp checkpoint (its dcp/ folder gathered into one state dict, no process group)."""
    target = checkpoint / "gathered.pt"
    dcp_to_torch_save(checkpoint / "dcp", target)
    return torch.load(target, weights_only=False)["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_train")
    dataset = write_corpus(root / "corpus.txt")
    # a clip above every gradient norm here: the norm is logged (a DTensor under FSDP2) and the runs are unchanged
    flags = tiny_run_flags(root, dataset, UPDATES) + ["--optimizer", OPTIMIZER, "--batch_size", "2", "--proj_type", "right",
                                                      "--grad_clipping", "1e3"]
    single = root / "single"
    with pytest.MonkeyPatch.context() as patch:  # in process; also trains the tokenizer the 2-rank jobs then read
        for var in DIST_VARS:
            patch.delenv(var, raising=False)
        assert torchrun_main.main(flags + ["--gradient_accumulation", "4", "--save_dir", str(single)]) == 0
    sharded = ["--fsdp", "--gradient_accumulation", "2"]
    whole, resumed = root / "fsdp", root / "fsdp-resumed"
    output = torchrun_ok(flags + sharded + ["--save_dir", str(whole)]).stdout
    torchrun_ok(flags + sharded + ["--save_dir", str(resumed), "--stop_at", "2"])
    resume_output = torchrun_ok(flags + sharded + ["--save_dir", str(resumed), "--continue_from", str(resumed)]).stdout
    # the same total batch over another number of processes: 2 ranks' model_2 resumed by one, one's by 2 ranks
    one = ["--fsdp", "--gradient_accumulation", "4"]
    to_one, to_two = root / "fsdp-2to1", root / "fsdp-1to2"
    to_one_output = torchrun_ok(flags + one + ["--save_dir", str(to_one), "--continue_from", str(resumed / "model_2")],
                                nproc=1).stdout
    torchrun_ok(flags + one + ["--save_dir", str(to_two), "--stop_at", "2"], nproc=1)
    torchrun_ok(flags + sharded + ["--save_dir", str(to_two), "--continue_from", str(to_two)])
    return {"single": single, "fsdp": whole, "resumed": resumed, "output": output, "resume_output": resume_output,
            "flags": flags, "to_one": to_one, "to_one_output": to_one_output, "to_two": to_two}


def test_fsdp_equals_one_process_with_the_same_total_batch(runs):
    """2 ranks x batch 2 x accumulation 2 under FSDP2 vs 1 process x batch 2 x accumulation 4: the same sequences per
    update, so losses and final weights agree to float rounding; both ranks end with the same full weights."""
    fsdp, single = read_metrics(runs["fsdp"]), read_metrics(runs["single"])
    assert "2 process(es) on cpu" in runs["output"]
    assert [r["loss"] for r in fsdp["train"]] == pytest.approx([r["loss"] for r in single["train"]], rel=1e-5)
    norms = [r["grad_norm"] for r in fsdp["train"]]
    assert norms == pytest.approx([r["grad_norm"] for r in single["train"]], rel=1e-5) and max(norms) < 1e3
    fingerprints = fsdp["summary"][0]["rank_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    assert all(r["refreshes"] == 2 for r in fsdp["projector"])
    a = sharded_weights(runs["fsdp"] / f"model_{UPDATES}")
    b = load_file(runs["single"] / f"model_{UPDATES}" / "model.safetensors")
    assert set(a) == set(b)
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def test_fsdp_resume_from_a_sharded_checkpoint_is_exact(runs):
    """--stop_at 2 writes model_2/ (dcp/ with every rank's shards of model and optimizer, trainer.pt); --continue_from
    it runs updates 3-4 (a refresh at 3) to the same losses and bit-identical weights as the uninterrupted run."""
    assert (runs["resumed"] / "model_2" / "dcp").is_dir() and (runs["resumed"] / "model_2" / "trainer.pt").is_file()
    assert "resumed from" in runs["resume_output"] and "at update 2" in runs["resume_output"]
    whole, resumed = read_metrics(runs["fsdp"]), read_metrics(runs["resumed"])
    assert [r["loss"] for r in resumed["train"]] == [r["loss"] for r in whole["train"]]
    a = sharded_weights(runs["fsdp"] / f"model_{UPDATES}")
    b = sharded_weights(runs["resumed"] / f"model_{UPDATES}")
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("run", ["to_one", "to_two"])
def test_fsdp_resume_on_another_number_of_processes(runs, run):
    """model_2 of 2 ranks x accumulation 2 resumed on one process x accumulation 4 (and one process's on 2 ranks): the
    same sequences per update, the data position moved over in sequences and DCP resharding the weights and the
    row-sharded moments, so updates 3-4 (a refresh at 3) reach the uninterrupted 2-rank run's losses and weights to
    float rounding, as one process and 2 ranks do from the start."""
    whole = {r["step"]: r["loss"] for r in read_metrics(runs["fsdp"])["train"]}
    resumed = {r["step"]: r["loss"] for r in read_metrics(runs[run])["train"]}  # to_one's log begins at update 3
    assert sorted(resumed) == ([3, 4] if run == "to_one" else [1, 2, 3, 4])
    assert resumed == pytest.approx({step: whole[step] for step in resumed}, rel=1e-5)
    a = sharded_weights(runs["fsdp"] / f"model_{UPDATES}")
    b = sharded_weights(runs[run] / f"model_{UPDATES}")
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def test_fsdp_resume_on_one_process_reports_it(runs):
    assert "1 process(es) on cpu" in runs["to_one_output"] and "at update 2" in runs["to_one_output"]


@pytest.mark.parametrize("extra, message", [
    (["--optimizer", "plumage_adamw_per_layer"], "before FSDP2 has reduce-scattered that gradient"),
    (["--single_gpu"], "--fsdp shards the model over the launched processes"),
])
def test_fsdp_refuses_what_cannot_work(extra, message):
    with pytest.raises(ValueError, match=message):
        parse_config(["--fsdp", "--model_config", MODEL_CONFIG, *extra])


def test_a_sharded_checkpoint_resumed_without_fsdp_says_so(runs, capsys, monkeypatch):
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    code = torchrun_main.main(runs["flags"] + ["--gradient_accumulation", "4", "--save_dir", str(runs["resumed"]) + "-x",
                                               "--continue_from", str(runs["resumed"])])
    assert code == 1
    err = capsys.readouterr().err
    assert "was written by a run with other flags" in err and "--fsdp False (the checkpoint: True)" in err, err
    assert "WORLD_SIZE" not in err and "--gradient_accumulation" not in err  # the same total batch: may change

    # a checkpoint from before manifests and recorded flags: the loader itself says why
    legacy = Path(str(runs["resumed"]) + "-legacy") / "model_4"
    shutil.copytree(Path(runs["resumed"]) / "model_4", legacy)
    (legacy / "manifest.json").unlink()
    state = json.loads((legacy / "training_state.json").read_text())
    del state["config"]
    (legacy / "training_state.json").write_text(json.dumps(state))
    code = torchrun_main.main(runs["flags"] + ["--gradient_accumulation", "4", "--save_dir", str(legacy.parent) + "-x",
                                               "--continue_from", str(legacy)])
    assert code == 1
    assert "is a sharded checkpoint (written with --fsdp): resume it with --fsdp" in capsys.readouterr().err


@pytest.fixture(scope="module")
def eight_bit(runs):
    """galore_adamw8bit on 2 ranks, checkpointed at update 2 and run to 4; its model_2 resumed on one process."""
    flags = [*runs["flags"], "--optimizer", "galore_adamw8bit", "--fsdp"]
    whole, resumed = Path(str(runs["fsdp"]) + "-8bit"), Path(str(runs["fsdp"]) + "-8bit-2to1")
    torchrun_ok([*flags, "--gradient_accumulation", "2", "--save_dir", str(whole), "--save_every", "2"])
    output = torchrun_ok([*flags, "--gradient_accumulation", "4", "--save_dir", str(resumed), "--continue_from",
                          str(whole / "model_2")], nproc=1).stdout
    return whole, resumed, output


def test_an_8bit_sharded_checkpoint_resumes_on_another_number_of_processes(eight_bit):
    """8-bit AdamW's block scales belong to each rank's own rows; resumed on one process they are re-blocked
    (tests/optimizers/test_eightbit_reblock.py, test_fsdp_optimizers.py), and updates 3-4 follow the 2-rank run to
    the rounding of 8-bit states over another process count."""
    whole, resumed, output = eight_bit
    assert "1 process(es) on cpu" in output and "at update 2" in output
    two = {r["step"]: r["loss"] for r in read_metrics(whole)["train"]}
    one = {r["step"]: r["loss"] for r in read_metrics(resumed)["train"]}
    assert sorted(one) == [3, 4]
    assert one == pytest.approx({step: two[step] for step in one}, rel=1e-3)
    a, b = sharded_weights(whole / f"model_{UPDATES}"), sharded_weights(resumed / f"model_{UPDATES}")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-3, msg=lambda m, key=key: f"{key}: {m}")
