"""The smaller parts of the training package: schedule, model config, atomic checkpoints, RNG state, metrics, fingerprint.

Each is checked on its own with the micro Llama (hidden 64, 2 layers), so a failure here names the part
that broke rather than a whole run.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from torch import nn
from train_helpers import hidden_entries

from galore_plumage import build_optimizer
from galore_plumage.training import checkpoint as checkpoint_lib
from galore_plumage.training.checkpoint import (
    LATEST,
    TRAINER_FILE,
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from galore_plumage.training.loop import weight_fingerprint
from galore_plumage.training.metrics import MetricsLog, projector_records
from galore_plumage.training.model import build_model, load_model_config
from galore_plumage.training.schedule import build_scheduler, lr_factor

MICRO = Path(__file__).resolve().parents[2] / "configs" / "llama_micro.json"
VOCAB = 96


# ----------------------------------------------------------------- schedule
@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_warmup_is_linear_from_zero(kind):
    """Update s < warmup runs at s / warmup of the peak, starting from exactly 0."""
    factors = [lr_factor(s, kind, 10, 100, 0.1) for s in range(10)]
    assert factors == pytest.approx([s / 10 for s in range(10)], abs=1e-15)
    assert factors[0] == 0.0


@pytest.mark.parametrize("kind", ["cosine", "linear"])
@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1, 1.0])
def test_decay_runs_from_peak_to_the_floor(kind, min_lr_ratio):
    """1 at the end of warmup, min_lr_ratio at the last update (and after), monotone, half way at the midpoint."""
    warmup, total = 10, 110
    factors = [lr_factor(s, kind, warmup, total, min_lr_ratio) for s in range(total + 5)]
    assert factors[warmup] == pytest.approx(1.0)
    assert factors[total] == pytest.approx(min_lr_ratio) and factors[-1] == pytest.approx(min_lr_ratio)
    assert factors[warmup + 50] == pytest.approx((1 + min_lr_ratio) / 2)
    decay = factors[warmup:]
    assert all(a >= b - 1e-15 for a, b in zip(decay, decay[1:], strict=False))
    assert min(factors[warmup:]) >= min_lr_ratio - 1e-12


def test_cosine_and_linear_differ_in_shape():
    """A quarter of the way through the decay, cosine is still above the straight line."""
    cosine, linear = lr_factor(35, "cosine", 10, 110, 0.0), lr_factor(35, "linear", 10, 110, 0.0)
    assert cosine == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert linear == pytest.approx(0.75) and cosine > linear


def test_constant_and_no_warmup():
    assert [lr_factor(s, "constant", 3, 10, 0.1) for s in (3, 9, 50)] == [1.0, 1.0, 1.0]
    assert lr_factor(0, "cosine", 0, 10, 0.1) == 1.0  # no warmup: the first update runs at the peak
    with pytest.raises(ValueError, match="unknown scheduler 'step'"):
        lr_factor(5, "step", 0, 10, 0.1)


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_scheduler_state_round_trips_through_weights_only(kind, tmp_path):
    """Saved mid-run with torch.save and read back with weights_only=True, the scheduler continues identically."""
    def fresh():
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.5)
        return optimizer, build_scheduler(optimizer, kind, 4, 20, 0.1)

    optimizer, scheduler = fresh()
    start = optimizer.param_groups[0]["lr"]
    lrs = []
    for _ in range(7):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[2] == pytest.approx(0.5 * 3 / 4)
    assert start == 0.0  # warmup starts from 0
    torch.save({"scheduler": scheduler.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "state.pt")
    expected = []
    for _ in range(8):
        optimizer.step()
        scheduler.step()
        expected.append(optimizer.param_groups[0]["lr"])

    optimizer, scheduler = fresh()
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])  # the lr in use comes back with the optimizer, as in the loop
    scheduler.load_state_dict(saved["scheduler"])
    assert scheduler.last_epoch == 7 and scheduler.get_last_lr() == [lrs[-1]]
    assert optimizer.param_groups[0]["lr"] == lrs[-1]
    resumed = []
    for _ in range(8):
        optimizer.step()
        scheduler.step()
        resumed.append(optimizer.param_groups[0]["lr"])
    assert resumed == expected


def test_a_regular_change_scales_only_the_first_group_from_its_update():
    """regular_change = (3, 0.25): the regular group (first, no rank) follows the schedule times 1 before update 3 and
    times 0.25 from it; the projected group keeps the schedule; the state still round-trips."""
    regular, projected = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([{"params": [regular], "lr": 0.4}, {"params": [projected], "rank": 1}], lr=0.1)
    scheduler = build_scheduler(optimizer, "linear", 0, 10, 0.0, regular_change=(3, 0.25))
    lrs = []
    for _ in range(6):
        lrs.append((optimizer.param_groups[0]["lr"], optimizer.param_groups[1]["lr"]))
        optimizer.step()
        scheduler.step()
    for step, (first, second) in enumerate(lrs):
        factor = lr_factor(step, "linear", 0, 10, 0.0)
        assert second == pytest.approx(0.1 * factor)
        assert first == pytest.approx(0.4 * factor * (0.25 if step >= 3 else 1.0))
    again = build_scheduler(optimizer, "linear", 0, 10, 0.0, regular_change=(3, 0.25))
    again.load_state_dict(scheduler.state_dict())
    assert again.get_last_lr() == scheduler.get_last_lr()


def test_a_regular_change_needs_a_regular_first_group():
    optimizer = torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(2))], "rank": 1}], lr=0.1)
    with pytest.raises(ValueError, match="needs a regular group .* this optimizer's first group is projected"):
        build_scheduler(optimizer, "cosine", 0, 10, 0.1, regular_change=(3, 0.25))


# ----------------------------------------------------------------- model config
def _config_file(tmp_path, content) -> Path:
    path = tmp_path / "model.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _micro(**changes) -> dict:
    raw = json.loads(MICRO.read_text())
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def test_model_config_takes_vocabulary_and_eos_from_the_tokenizer():
    config = load_model_config(MICRO, VOCAB, 7)
    assert (config.vocab_size, config.eos_token_id, config.bos_token_id, config.pad_token_id) == (VOCAB, 7, None, None)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 4)
    assert config.use_cache is False


def test_missing_model_config_names_the_path(tmp_path):
    missing = tmp_path / "llama_nope.json"
    with pytest.raises(FileNotFoundError, match=f"--model_config '{missing}': no such file"):
        load_model_config(missing, VOCAB, 0)


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object, got list"),
    (_micro(model_type="gpt2"), "has model_type 'gpt2'; only 'llama' is supported"),
    (_micro(hidden_size=None, num_hidden_layers=None), "lacks hidden_size, num_hidden_layers"),
    (_micro(num_attention_heads=5), "hidden_size 64 is not a multiple of num_attention_heads 5"),
])
def test_bad_model_config_names_the_path_and_the_problem(tmp_path, content, message):
    path = _config_file(tmp_path, content)
    with pytest.raises(ValueError, match=message) as error:
        load_model_config(path, VOCAB, 0)
    assert f"--model_config '{path}'" in str(error.value)


def test_model_type_may_be_omitted(tmp_path):
    config = load_model_config(_config_file(tmp_path, _micro(model_type=None, architectures=None)), VOCAB, 0)
    assert config.model_type == "llama" and config.hidden_size == 64


def test_build_model_depends_only_on_the_seed():
    config = load_model_config(MICRO, VOCAB, 0)
    a, b = build_model(config, torch.float32, torch.device("cpu"), 3), build_model(config, torch.float32,
                                                                                    torch.device("cpu"), 3)
    c = build_model(config, torch.float32, torch.device("cpu"), 4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.lm_head.weight.shape == (VOCAB, 64)


# ----------------------------------------------------------------- checkpoints
def _model(seed: int = 0, **changes):
    raw = load_model_config(MICRO, VOCAB, 0)
    for key, value in changes.items():
        setattr(raw, key, value)
    return build_model(raw, torch.float32, torch.device("cpu"), seed)


def _trainer_state(model, step: int) -> dict:
    """What the loop saves: a real optimizer's state after one update, a scheduler, data position, RNG, counters."""
    # PLUMAGE's projector: its state holds every kind the loop must save (pool, 1/p, draw counters)
    optimizer = build_optimizer("plumage_adamw", model, rank=4, update_proj_gap=2, lr=1e-3, projector="plumage")
    scheduler = build_scheduler(optimizer, "cosine", 1, 10, 0.1)
    batch = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(step))
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "data": {"position": step, "sequences": 100, "seed": 0}, "rng": rng_state(), "update_step": step,
            "tokens_seen": step * 16}


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_save_checkpoint_writes_the_folder_and_latest(tmp_path):
    """model_<step>/ (config, safetensors, trainer.pt, summary) and `latest` naming it; no hidden temp left."""
    model = _model()
    state = _trainer_state(model, 3)
    folder = save_checkpoint(tmp_path, 3, model, state, {"update_step": 3})
    assert folder == tmp_path / "model_3"
    assert {"config.json", "model.safetensors", TRAINER_FILE, "training_state.json"} <= {p.name for p in folder.iterdir()}
    assert (tmp_path / LATEST).read_text() == "model_3\n"
    assert json.loads((folder / "training_state.json").read_text()) == {"update_step": 3}
    assert hidden_entries(tmp_path) == [] and hidden_entries(folder) == []
    loaded = torch.load(folder / TRAINER_FILE, weights_only=True)
    assert loaded["update_step"] == 3 and loaded["data"] == state["data"]
    assert loaded["optimizer"]["state"].keys() == state["optimizer"]["state"].keys()
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])


def test_resolve_checkpoint_accepts_the_folder_or_the_save_dir(tmp_path):
    model = _model()
    first = save_checkpoint(tmp_path, 2, model, {"update_step": 2}, {})
    assert resolve_checkpoint(first) == first and resolve_checkpoint(tmp_path) == first
    second = save_checkpoint(tmp_path, 4, model, {"update_step": 4}, {})
    assert resolve_checkpoint(tmp_path) == second and resolve_checkpoint(first) == first
    with pytest.raises(FileNotFoundError, match="is neither a checkpoint folder"):
        resolve_checkpoint(tmp_path / "elsewhere")
    (tmp_path / LATEST).write_text("model_9\n")  # names a folder that is gone: the newest complete one is taken
    warnings = []
    assert resolve_checkpoint(tmp_path, warn=warnings.append) == second
    assert warnings == [f"'latest' in {tmp_path} names model_9, the newest complete checkpoint is model_4: resuming it"]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / LATEST).write_text("model_9\n")
    with pytest.raises(CheckpointError, match="no complete checkpoint \\('latest' names model_9, which is missing\\)"):
        resolve_checkpoint(empty)


def test_saving_the_same_step_twice_replaces_it(tmp_path):
    """A second save of step 5 holds the new weights and state; no old copy or temp folder is left."""
    model = _model(seed=0)
    save_checkpoint(tmp_path, 5, model, {"update_step": 5, "tag": torch.tensor([1])}, {})
    other = _model(seed=1)
    folder = save_checkpoint(tmp_path, 5, other, {"update_step": 5, "tag": torch.tensor([2])}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "model_5"]
    target = _model(seed=2)
    state = load_checkpoint(folder, target)
    assert torch.equal(state["tag"], torch.tensor([2]))
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), other.state_dict().values(), strict=True))


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """torch.save failing after the weights are written: `latest` still names model_3 and no model_6 exists.

    A later save of the same step (same process) clears the temp folder the crash left.
    """
    model = _model()
    save_checkpoint(tmp_path, 3, model, {"update_step": 3}, {})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_lib.torch, "save", crash)
        with pytest.raises(OSError, match="disk full"):
            save_checkpoint(tmp_path, 6, model, {"update_step": 6}, {})
    assert (tmp_path / LATEST).read_text() == "model_3\n"
    assert not (tmp_path / "model_6").exists()
    assert resolve_checkpoint(tmp_path) == tmp_path / "model_3"
    leftovers = hidden_entries(tmp_path)
    assert leftovers and all(name.startswith(".model_6.tmp-") for name in leftovers)
    assert any((tmp_path / name / "model.safetensors").exists() for name in leftovers)  # the crash came after it

    save_checkpoint(tmp_path, 6, model, {"update_step": 6}, {})
    assert hidden_entries(tmp_path) == [] and resolve_checkpoint(tmp_path) == tmp_path / "model_6"


@pytest.mark.parametrize("tied", [False, True])
def test_load_checkpoint_restores_weights_exactly(tmp_path, tied):
    """Weights saved from one model and loaded into a differently seeded one are bit-identical (tied or not)."""
    source = _model(seed=0, tie_word_embeddings=tied)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 1e-3)  # not the init: what training leaves
    expected = _weights(source)
    state = _trainer_state(_model(seed=5), 7)
    folder = save_checkpoint(tmp_path, 7, source, state, {})
    target = _model(seed=1, tie_word_embeddings=tied)
    assert not torch.equal(target.model.embed_tokens.weight, expected["model.embed_tokens.weight"])
    loaded = load_checkpoint(folder, target)
    got = target.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert loaded["update_step"] == 7 and loaded["tokens_seen"] == 112
    if tied:
        assert target.lm_head.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()


# ----------------------------------------------------------------- RNG state
def test_rng_state_round_trip(tmp_path):
    """After set_rng_state, torch and python draws (gauss's cached second value included) repeat exactly."""
    torch.manual_seed(11)
    random.seed(11)
    random.gauss(0, 1)  # leaves a cached second normal in python's state
    torch.save(rng_state(), tmp_path / "rng.pt")

    def draws():
        return torch.rand(4), torch.randn(3), [random.random(), random.gauss(0, 1), random.randint(0, 10**9)]

    first = draws()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    second = draws()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1]) and first[2] == second[2]
    assert not torch.equal(draws()[0], first[0])  # and the stream moves on


# ----------------------------------------------------------------- metrics
def test_metrics_log_appends_json_lines(tmp_path):
    """One JSON object a line with its type; a second log on the same folder (a resume) appends; disabled writes nothing."""
    log = MetricsLog(tmp_path / "run", enabled=True)
    log.write("train", step=1, loss=3.5)
    log.write("eval", step=1, eval_loss=3.25)
    MetricsLog(tmp_path / "run", enabled=True).write("train", step=2, loss=3.0)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"type": "train", "step": 1, "loss": 3.5}, {"type": "eval", "step": 1, "eval_loss": 3.25},
        {"type": "train", "step": 2, "loss": 3.0}]
    silent = MetricsLog(tmp_path / "other", enabled=False)
    silent.write("train", step=1)
    assert not (tmp_path / "other").exists()


class _StatsOptimizer:
    def projector_stats(self):
        return {2: {"rank": 4, "rho": float("nan"), "tau": 200, "max_inv_p": float("inf"), "refreshes": 1},
                0: {"rank": 8, "rho": 0.5, "tau": 100, "max_inv_p": float("-inf"), "refreshes": 3}}


def test_projector_records_name_params_and_drop_non_finite():
    """Sorted by index, named from the map (the index if unnamed), NaN/inf -> None so the line stays valid JSON."""
    records = projector_records(_StatsOptimizer(), {0: "model.layers.0.self_attn.q_proj.weight"})
    assert records == [
        {"param": "model.layers.0.self_attn.q_proj.weight", "rank": 8, "rho": 0.5, "tau": 100, "max_inv_p": None,
         "refreshes": 3},
        {"param": "2", "rank": 4, "rho": None, "tau": 200, "max_inv_p": None, "refreshes": 1}]
    json.dumps(records, allow_nan=False)

    class PerLayer:  # the per-layer wrapper holds the optimizer as .optimizer
        optimizer = _StatsOptimizer()

    assert projector_records(PerLayer(), {}) == projector_records(_StatsOptimizer(), {})
    assert projector_records(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), {}) == []


def test_projector_records_of_a_real_optimizer_are_strict_json():
    model = _model()
    optimizer = build_optimizer("plumage_adamw", model, rank=4, update_proj_gap=2, projector="plumage")  # r*, 1/p stats
    batch = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    names = {i: name for i, (name, _) in enumerate(model.named_parameters())}
    records = projector_records(optimizer, names)
    assert records and all(r["param"] in names.values() for r in records)
    json.dumps(records, allow_nan=False)


# ----------------------------------------------------------------- weight fingerprint
def test_weight_fingerprint_sees_a_tiny_change_anywhere():
    """Equal for equal models; a 1e-6 change to any single weight (first, middle, last tensor) changes it."""
    a, b = _model(seed=0), _model(seed=0)
    reference = weight_fingerprint(a)
    assert isinstance(reference, float) and weight_fingerprint(b) == reference
    params = list(b.parameters())
    for param, index in [(params[0], 0), (params[len(params) // 2], 17), (params[-1], -1)]:
        with torch.no_grad():
            flat = param.view(-1)
            before = flat[index].clone()
            flat[index] += 1e-6
            assert flat[index] != before
            assert weight_fingerprint(b) != reference
            flat[index] = before
        assert weight_fingerprint(b) == reference
    assert weight_fingerprint(_model(seed=1)) != reference


def test_weight_fingerprint_sees_swapped_values():
    """A permutation of values inside a tensor (same sum) changes it: positions are weighted differently."""
    model = _model(seed=0)
    reference = weight_fingerprint(model)
    with torch.no_grad():
        flat = model.model.norm.weight.view(-1)
        flat[0], flat[1] = 2.0, 0.5
        first = weight_fingerprint(model)
        flat[0], flat[1] = 0.5, 2.0
        assert weight_fingerprint(model) != first
    assert first != reference
