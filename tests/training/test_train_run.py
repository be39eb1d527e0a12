"""End-to-end runs of torchrun_main.py, in process, on CPU, offline: a local .txt corpus and the micro Llama.

Each job goes through `torchrun_main.main(argv)` exactly as the command line does (parse, validate, train,
checkpoint, metrics.jsonl) and is judged from what it leaves on disk: metrics.jsonl and the checkpoint
folders. Covered: every registered optimizer name runs and logs what it should; --stop_at/--continue_from
resumes bit for bit across projection refreshes; --max_train_tokens counts updates right; bad input fails
loudly before any checkpoint is touched; per-layer mode under accumulation matches the normal optimizer;
a longer run lowers the eval loss.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import DIST_VARS, MODEL_CONFIG, read_metrics, write_corpus  # noqa: E402
from transformers import LlamaConfig

import torchrun_main  # noqa: E402
from galore_plumage import list_optimizers
from galore_plumage.optimizers import optimizer_spec
from galore_plumage.training.model import build_model

PER_LAYER = [name for name in list_optimizers() if name.endswith("_per_layer")]


def base_flags(corpus: dict) -> list[str]:
    return ["--dataset", str(corpus["dataset"]), "--vocab_size", "256", "--max_length", "32",
            "--model_config", MODEL_CONFIG, "--data_dir", str(corpus["data_dir"]), "--no-progress",
            "--rank", "8", "--update_proj_gap", "2", "--eval_tokens", "256", "--warmup_steps", "0"]


def final_weights(save_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(Path(save_dir) / f"model_{step}" / "model.safetensors")


def initial_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The weights a run with --seed 0 starts from, rebuilt from a checkpoint's config as the loop builds them."""
    model = build_model(LlamaConfig.from_pretrained(checkpoint), torch.float32, torch.device("cpu"), seed=0)
    return {key: value.detach() for key, value in model.state_dict().items()}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The corpus file and a data_dir whose BPE cache is already warm (one 1-update job trains it)."""
    root = tmp_path_factory.mktemp("train_corpus")
    corpus = {"dataset": write_corpus(root / "corpus.txt"), "data_dir": root / "data"}
    with pytest.MonkeyPatch.context() as patch:
        for var in DIST_VARS:
            patch.delenv(var, raising=False)
        code = torchrun_main.main(base_flags(corpus) + ["--optimizer", "adamw", "--batch_size", "2",
                                                        "--num_training_steps", "1", "--save_dir", str(root / "warm")])
    assert code == 0
    assert len(list((root / "data" / "tokenizers").glob("bpe256-*.json"))) == 1
    return corpus


@pytest.fixture
def run(corpus, monkeypatch):
    """run(save_dir, *flags) -> exit code of one in-process job on the shared corpus."""
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)

    def _run(save_dir: Path, *flags: str) -> int:
        return torchrun_main.main(base_flags(corpus) + ["--save_dir", str(save_dir), *map(str, flags)])

    return _run


# ----------------------------------------------------------------- 1. every name runs
def test_initial_weights_rebuilds_the_start_of_a_run(run, tmp_path):
    """The helper the "weights moved" checks compare against: a run at --lr 0 (no weight decay) ends exactly on
    initial_weights(), so a moved tensor elsewhere really moved, rather than being compared with another init."""
    save_dir = tmp_path / "run"
    assert run(save_dir, "--optimizer", "adamw", "--batch_size", "2", "--num_training_steps", "2", "--lr", "0") == 0
    trained, initial = final_weights(save_dir, 2), initial_weights(save_dir / "model_2")
    assert trained.keys() <= initial.keys() and len(trained) == 21
    for key, value in trained.items():
        assert torch.equal(value, initial[key]), key


CASES = [(name, 1) for name in list_optimizers()] + [(name, 2) for name in PER_LAYER]


@pytest.mark.parametrize("name,accumulation", CASES, ids=[f"{n}-acc{a}" for n, a in CASES])
def test_every_optimizer_runs_end_to_end(run, tmp_path, name, accumulation):
    """2 updates of each registered name (per-layer names also with accumulation 2): what a run must leave.

    Exit 0; train records for updates 1 and 2 with finite losses and the token count of each update; one eval
    with eval_ppl = exp(eval_loss); one summary; model_2/ named by `latest`; projector records exactly for the
    low-rank names. Every weight tensor moved from its initial value, so a name that builds an optimizer
    which never steps (e.g. a per-layer hook that never reaches its accumulation boundary) fails here.
    """
    save_dir = tmp_path / "run"
    assert run(save_dir, "--optimizer", name, "--batch_size", "2", "--gradient_accumulation", accumulation,
               "--num_training_steps", "2", "--lr", "1e-2") == 0
    records = read_metrics(save_dir)
    per_update = 2 * accumulation * 32
    train = records["train"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["tokens"] for r in train] == [per_update, 2 * per_update]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in train)
    (evaluation,) = records["eval"]
    assert evaluation["step"] == 2 and math.isfinite(evaluation["eval_loss"])
    assert evaluation["eval_ppl"] == pytest.approx(math.exp(evaluation["eval_loss"]), rel=1e-12)
    (summary,) = records["summary"]
    assert summary["step"] == 2 and summary["tokens"] == 2 * per_update and summary["optimizer"] == name
    assert summary["eval_loss"] == evaluation["eval_loss"]
    assert (save_dir / "latest").read_text().strip() == "model_2"
    assert (save_dir / "model_2" / "model.safetensors").is_file() and (save_dir / "model_2" / "trainer.pt").is_file()
    projector = records.get("projector", [])
    if optimizer_spec(name).projector is not None:
        assert projector, "a low-rank optimizer logged no projector record"
        assert all(r["step"] == 2 and r["refreshes"] >= 1 for r in projector)
    else:
        assert not projector

    # the weights at step 2 differ from the initial ones in every tensor
    initial = initial_weights(save_dir / "model_2")
    trained = final_weights(save_dir, 2)
    assert trained.keys() <= initial.keys()
    unchanged = [key for key, value in trained.items() if torch.equal(value, initial[key])]
    assert not unchanged, f"{name}: weights never updated: {unchanged}"


# ----------------------------------------------------------------- 2. exact resume
RESUME_CASES = [
    ("plumage_adamw", ()),
    ("plumage_adamw", ("--projector", "plumage")),  # PLUMAGE's seeded draws and pool
    ("galore_adamw8bit", ()),
    ("plumage_adafactor", ()),
    ("plumage_adamw_per_layer", ()),
    ("plumage_adamw", ("--adaptive_interval",)),
]


@pytest.mark.parametrize("name,extra", RESUME_CASES, ids=[n + "".join(e) for n, e in RESUME_CASES])
def test_stop_and_resume_is_bit_exact(run, tmp_path, name, extra):
    """6 updates straight vs --stop_at 3 then --continue_from <save_dir>: identical losses and final weights.

    Accumulation 2 and a projection refresh every 2 updates (at updates 1, 3, 5), so the resumed part starts
    mid-interval (update 4 reuses the basis built at update 3) and refreshes again at update 5: projector
    state, optimizer moments, scheduler, data position and RNG must all come back exactly.
    On CPU a resumed run is documented to continue bit for bit, so equality is exact.
    """
    flags = ["--optimizer", name, "--batch_size", "2", "--gradient_accumulation", "2", "--num_training_steps", "6",
             "--save_every", "3", "--lr", "3e-3", *extra]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run(straight, *flags) == 0
    assert run(resumed, *flags, "--stop_at", "3") == 0
    stopped = read_metrics(resumed)
    assert [r["step"] for r in stopped["train"]] == [1, 2, 3] and "summary" not in stopped
    assert (resumed / "latest").read_text().strip() == "model_3" and not (resumed / "model_6").exists()
    assert run(resumed, *flags, "--continue_from", resumed) == 0

    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b["train"]] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in b["train"]] == [r["loss"] for r in a["train"]]
    assert [r["lr"] for r in b["train"]] == [r["lr"] for r in a["train"]]
    assert b["summary"][0]["tokens"] == a["summary"][0]["tokens"] == 6 * 4 * 32
    assert b["summary"][0]["eval_loss"] == a["summary"][0]["eval_loss"]
    if optimizer_spec(name).projector is not None:
        assert [(r["param"], r["refreshes"]) for r in b["projector"]] == [(r["param"], r["refreshes"]) for r in a["projector"]]
    weights_a, weights_b = final_weights(straight, 6), final_weights(resumed, 6)
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        assert torch.equal(weights_a[key], weights_b[key]), key
    first = final_weights(straight, 3)
    assert any(not torch.equal(first[k], weights_a[k]) for k in weights_a)  # updates 4..6 did change something


# ----------------------------------------------------------------- 3. it learns
def test_training_lowers_eval_loss(run, tmp_path):
    """A sanity check that the pieces add up to learning: 30 plumage_adamw updates at lr 3e-3 (its regular group at
    its default 2x) lower the eval loss measured at update 5 by a clear margin (the corpus is random words, so the
    floor is high, but word frequencies alone are far below the ~5.5 nats of a fresh model)."""
    save_dir = tmp_path / "run"
    assert run(save_dir, "--optimizer", "plumage_adamw", "--batch_size", "4", "--num_training_steps", "30",
               "--warmup_steps", "3", "--lr", "3e-3", "--eval_every", "5") == 0
    evals = read_metrics(save_dir)["eval"]
    assert [r["step"] for r in evals] == [5, 10, 15, 20, 25, 30]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.3, [r["eval_loss"] for r in evals]  # measured: 4.52 -> 3.13


def test_clipping_logs_the_gradient_norm_before_it(run, tmp_path):
    """--grad_clipping logs each update's global gradient norm before clipping (how often the clip binds): the first
    is the same whatever the clip, a clip far below it changes the run from there on, and without clipping none is
    logged."""
    norms = {}
    for clip in ("0", "1e-3", "1e3"):
        save_dir = tmp_path / clip
        assert run(save_dir, "--optimizer", "sgdm", "--batch_size", "2", "--num_training_steps", "3", "--lr", "0.1",
                   "--grad_clipping", clip) == 0
        norms[clip] = [record.get("grad_norm") for record in read_metrics(save_dir)["train"]]
    assert norms["0"] == [None] * 3
    assert all(1e-3 < norm < 1e3 for norm in norms["1e-3"] + norms["1e3"]), norms  # 1e-3 binds, 1e3 does not
    assert norms["1e-3"][0] == norms["1e3"][0]
    assert norms["1e-3"][1] != norms["1e3"][1]


# ----------------------------------------------------------------- 4. token accounting
def test_max_train_tokens_sets_the_number_of_updates(run, tmp_path):
    """--max_train_tokens 1000 with 4 x 32 tokens per update: ceil(1000 / 128) = 8 updates, 1024 tokens, each
    update run exactly once (GaLore's script ran one extra update and divided by sequences, not tokens)."""
    save_dir = tmp_path / "run"
    assert run(save_dir, "--optimizer", "adamw", "--batch_size", "2", "--total_batch_size", "4",
               "--max_train_tokens", "1000", "--warmup_steps", "1") == 0
    records = read_metrics(save_dir)
    (config,) = records["config"]
    assert config["num_training_steps"] == math.ceil(1000 / 128) == 8 and config["gradient_accumulation"] == 2
    assert [r["step"] for r in records["train"]] == list(range(1, 9))
    assert [r["tokens"] for r in records["train"]] == [128 * s for s in range(1, 9)]
    assert records["summary"][0]["tokens"] == 8 * 128 and records["summary"][0]["step"] == 8
    assert (save_dir / "latest").read_text().strip() == "model_8"


def test_the_summary_records_the_passes_over_the_training_text(run, tmp_path, capsys):
    """The summary's `passes` counts the training text read (a run twice as long reads it twice as often) and the
    last line says it: past one pass the eval loss also measures a fit to text seen again."""
    passes = {}
    for updates in (3, 6):
        save_dir = tmp_path / str(updates)
        assert run(save_dir, "--optimizer", "adamw", "--batch_size", "2", "--num_training_steps", updates,
                   "--lr", "1e-3") == 0
        passes[updates] = read_metrics(save_dir)["summary"][0]["passes"]
        assert f"({passes[updates]:.2f} passes over the training text)" in capsys.readouterr().out
    assert 0 < passes[3] and passes[6] == pytest.approx(2 * passes[3])


def test_the_regular_lr_changes_where_the_text_is_read_again(run, tmp_path, capsys):
    """--regular_lr_ratio_on_repeat 1 after --regular_lr_ratio 4: the regular group runs at 4x --lr through the first
    pass over the training text and at 1x from the update that begins the second (the summary's `passes` gives the
    text's length); a run stopped before that update and resumed switches at the same one, bit for bit."""
    flags = ["--optimizer", "plumage_adamw", "--batch_size", "16", "--num_training_steps", "70", "--lr", "1e-3",
             "--regular_lr_ratio", "4", "--regular_lr_ratio_on_repeat", "1", "--scheduler", "constant",
             "--save_every", "40"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run(straight, *flags) == 0
    records = read_metrics(straight)
    sequences = round(70 * 16 / records["summary"][0]["passes"])
    first_repeat = sequences // 16  # updates 1..first_repeat read the text once; the next begins it again
    assert 0 < first_repeat < 69
    assert f"through update {first_repeat}, 1 x from update {first_repeat + 1}" in capsys.readouterr().out
    assert [r["regular_lr"] for r in records["train"]] == pytest.approx([4e-3] * first_repeat +
                                                                        [1e-3] * (70 - first_repeat))
    assert all(r["lr"] == pytest.approx(1e-3) for r in records["train"])
    assert run(resumed, *flags, "--stop_at", "40") == 0
    assert run(resumed, *flags, "--continue_from", resumed) == 0
    again = read_metrics(resumed)
    assert [r["regular_lr"] for r in again["train"]] == [r["regular_lr"] for r in records["train"]]
    assert [r["loss"] for r in again["train"]] == [r["loss"] for r in records["train"]]


# ----------------------------------------------------------------- 5. bad input
FINISHED_FLAGS = ["--optimizer", "plumage_adamw", "--batch_size", "2", "--num_training_steps", "2"]


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    """A save_dir holding a finished 2-update run, which no failed job may touch."""
    save_dir = tmp_path_factory.mktemp("finished") / "run"
    with pytest.MonkeyPatch.context() as patch:
        for var in DIST_VARS:
            patch.delenv(var, raising=False)
        assert torchrun_main.main(base_flags(corpus) + FINISHED_FLAGS + ["--save_dir", str(save_dir)]) == 0
    return save_dir


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _bad_missing_dataset(tmp):
    return ["--dataset", str(tmp / "no_such_corpus.txt")], "no_such_corpus.txt"


def _bad_model_config(tmp):
    path = tmp / "broken_config.json"
    path.write_text('{"hidden_size": 64, "num_hidden_layers": ')
    return ["--model_config", str(path)], "broken_config.json"


def _bad_optimizer(tmp):
    return ["--optimizer", "nosuch_adamw"], "nosuch_adamw"


def _bad_clipping(tmp):
    return ["--optimizer", "plumage_adamw_per_layer", "--grad_clipping", "1.0"], "--grad_clipping 1.0"


def _bad_continue_from(tmp):
    (tmp / "not_a_checkpoint").mkdir()
    (tmp / "not_a_checkpoint" / "notes.txt").write_text("hello\n")
    return ["--continue_from", str(tmp / "not_a_checkpoint")], "not_a_checkpoint"


BAD = {"missing-dataset": _bad_missing_dataset, "malformed-model-config": _bad_model_config,
       "unknown-optimizer": _bad_optimizer, "clipping-per-layer": _bad_clipping,
       "continue-from-non-checkpoint": _bad_continue_from}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_clearly_and_keeps_the_checkpoint(run, finished_run, tmp_path, capsys, case):
    """Each bad value makes the job exit non-zero with a message on stderr that names it, and the save_dir of a
    finished run it points at is left byte for byte (and mtime for mtime) as it was: nothing is written, not even
    the deletion --overwrite asks for, before the input is known good. argparse's own refusals exit with
    SystemExit(2)."""
    bad_flags, named = BAD[case](tmp_path)
    before = _snapshot(finished_run)
    assert {"latest", "metrics.jsonl", "model_2/model.safetensors", "model_2/trainer.pt"} <= before.keys()
    capsys.readouterr()
    try:
        code = run(finished_run, *FINISHED_FLAGS, *bad_flags, "--overwrite")
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code not in (0, None)
    assert named in err, err
    assert "error" in err
    assert _snapshot(finished_run) == before
    assert sorted(p.name for p in finished_run.iterdir()) == ["latest", "metrics.jsonl", "model_2"]


# ----------------------------------------------------------------- 6. per-layer == normal
@pytest.mark.parametrize("normal_name, extra", [
    ("plumage_adamw", ()),  # the default: GaLore's basis with v_floor
    # PLUMAGE's projector with the paper's step (see below)
    ("plumage_adamw", ("--projector", "plumage", "--sampled_step", "adaptive", "--resample_every", "0")),
    ("galore_adamw", ())], ids=["plumage_adamw", "plumage_adamw-projector_plumage", "galore_adamw"])
def test_per_layer_with_accumulation_matches_normal_mode(run, tmp_path, normal_name, extra):
    """<name> vs <name>_per_layer, accumulation 2, 4 updates: the same losses and final weights to float32 rounding.

    Per-layer mode sums the projected micro-gradients, normal mode projects the summed gradient: equal up to
    rounding. The tolerance is the library's own per-layer test's (tests/optimizers/test_per_layer_accumulation.py: rtol 1e-5,
    atol 1e-7). --update_proj_gap 4 puts the only refresh at update 1 (full gradient kept in both modes) and runs
    updates 2-4 through the projected-accumulation path. With a second refresh after the weights have drifted by
    rounding (gap 2), the basis re-derived from the gradient's spectrum amplifies that ulp-level drift by
    1/(singular-value gap): measured 2e-6 for plumage and 5e-4 for galore (near-degenerate 8th/9th singular values;
    flora's gradient-free basis stays at 5e-8), a property of SVD-based refreshes, not of per-layer mode.
    PLUMAGE runs the paper's step here: the default's norm-matched sampled step amplifies float32 rounding in the same
    way (it divides by near-cancelled projected gradients), so it is checked in float64 by that library test.
    """
    # lr 1e-2 (GaLore's recipe): at 3e-3 the floor's warm-up (the default) moves a weight by only ~1e-3 in 4 updates
    flags = ["--batch_size", "2", "--gradient_accumulation", "2", "--num_training_steps", "4", "--lr", "1e-2",
             "--update_proj_gap", "4", *extra]
    normal, per_layer = tmp_path / "normal", tmp_path / "per_layer"
    assert run(normal, "--optimizer", normal_name, *flags) == 0
    assert run(per_layer, "--optimizer", f"{normal_name}_per_layer", *flags) == 0
    records_normal, records_per_layer = read_metrics(normal), read_metrics(per_layer)
    losses_normal = [r["loss"] for r in records_normal["train"]]
    assert [r["loss"] for r in records_per_layer["train"]] == pytest.approx(losses_normal, rel=1e-5)
    assert [r["lr"] for r in records_per_layer["train"]] == [r["lr"] for r in records_normal["train"]]
    for records in (records_normal, records_per_layer):  # one refresh each: updates 2-4 kept the basis
        assert records["projector"] and all(r["refreshes"] == 1 for r in records["projector"])
    a, b = final_weights(normal, 4), final_weights(per_layer, 4)
    assert a.keys() == b.keys()
    initial = initial_weights(normal / "model_4")
    for key in a:
        assert (a[key] - initial[key]).abs().max() > 1e-3, key  # the weights moved far beyond the tolerance
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-7, msg=lambda m, key=key: f"{key}: {m}")


# ----------------------------------------------------------------- activation checkpointing, bf16
def test_activation_checkpointing_gives_the_same_run(run, tmp_path):
    """Recomputing activations in the backward pass changes memory, not math: the same losses and final weights."""
    flags = ["--optimizer", "plumage_adamw", "--batch_size", "2", "--num_training_steps", "3", "--lr", "3e-3"]
    assert run(tmp_path / "plain", *flags) == 0
    assert run(tmp_path / "ckpt", *flags, "--activation_checkpointing") == 0
    plain, ckpt = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "ckpt")
    assert [r["loss"] for r in ckpt["train"]] == pytest.approx([r["loss"] for r in plain["train"]], rel=1e-6)
    a, b = final_weights(tmp_path / "plain", 3), final_weights(tmp_path / "ckpt", 3)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-7)


def test_bfloat16_weights_train_on_cpu(run, tmp_path):
    """--dtype bfloat16 keeps bf16 weights (fp32 low-rank state) and still lowers the loss on CPU."""
    assert run(tmp_path / "bf16", "--optimizer", "plumage_adamw", "--dtype", "bfloat16", "--batch_size", "4",
               "--num_training_steps", "12", "--lr", "3e-3", "--eval_every", "12") == 0
    weights = final_weights(tmp_path / "bf16", 12)
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    losses = [r["loss"] for r in read_metrics(tmp_path / "bf16")["train"]]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.2, losses
