"""run_glue.py end to end on a tiny random BERT and a synthetic two-play corpus: plumage, per-layer, LoRA, GaLore flags."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from finetune_helpers import save_tiny_bert, write_plays
from safetensors.torch import load_file
from train_helpers import REPO  # noqa: F401  (puts the repository root on sys.path for run_glue)

from galore_plumage.finetune import parse_config
from galore_plumage.finetune.loop import build_model_and_optimizer, optimizer_state_bytes, run
from galore_plumage.finetune.model import bundled_model_path, load_classifier, target_modules
from galore_plumage.finetune.tasks import load_task

TARGETED = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
            "intermediate.dense", "output.dense")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    write_plays(root / "data")
    return {"model": str(save_tiny_bert(root / "bert")), "data": str(root / "data"), "root": root}


def _argv(assets, out, *extra):
    return ["--model_name_or_path", assets["model"], "--data_dir", assets["data"], "--output_dir", str(out),
            "--max_train_samples", "64", "--max_eval_samples", "32", "--num_train_epochs", "1", "--no-progress", *extra]


def _records(out):
    records = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["type"], []).append(record)
    return records


def test_plumage_one_epoch_writes_metrics(assets, tmp_path):
    import run_glue

    out = tmp_path / "plumage"
    argv = _argv(assets, out, "--optimizer", "plumage_adamw", "--lora_all_modules", "--lora_r", "4",
                 "--update_proj_gap", "2", "--learning_rate", "1e-3")
    assert run_glue.main(argv) == 0
    records = _records(out)
    train, (epoch,), (final,) = records["train"], records["epoch"], records["final"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]  # 64 examples / 16 a batch
    assert epoch["train_loss"] == pytest.approx(sum(r["loss"] for r in train) / 4)
    assert final["terminal_train_loss"] == epoch["train_loss"]
    assert final["best_accuracy"] == epoch["eval_accuracy"]
    assert final["steps"] == 4 and final["method"] == "plumage_adamw" and final["optimizer_state_bytes"] > 0
    projected = {r["param"] for r in records["projector"]}  # every targeted weight, nothing else
    assert projected == {f"bert.encoder.layer.{i}.{m}.weight" for i in range(2) for m in TARGETED}
    assert all(r["refreshes"] == 2 for r in records["projector"])  # steps 0 and 2 with update_proj_gap 2


def test_learns_a_separable_task(assets, tmp_path):
    """The synthetic plays use disjoint words: texts and labels wired correctly give near-perfect accuracy.

    24 updates at lr 1e-2. At 3e-3 neither full AdamW nor GaLore leaves the coin-flip loss in 24 updates (measured
    0.68); only the paper's PLUMAGE did, on its 1/p-amplified steps, so that lr tested the estimator, not the wiring.
    PLUMAGE's projector with the paper's realignment (mv) and no floor: the floor (v_floor m2, the default since
    session 17, and what mv_meansplit does at every draw) holds a coordinate with a steady gradient to Adam's
    bias-correction ratio √(1 − β2^t) / (1 − β1^t), 0.15 at t = 10, in the first updates (accuracy 0.53 here;
    docs/results.md §3, session 14), which would test that warm-up, not the wiring."""
    config = parse_config(_argv(assets, tmp_path / "learn", "--optimizer", "plumage_adamw", "--projector", "plumage",
                                "--realign", "mv", "--v_floor", "none",
                                "--lora_all_modules",
                                "--lora_r", "4", "--learning_rate", "1e-2", "--num_train_epochs", "4",
                                "--max_train_samples", "192", "--per_device_train_batch_size", "32",
                                "--max_eval_samples", "64"))
    _, summary = run(config)
    assert summary["best_accuracy"] >= 0.9
    assert summary["terminal_train_loss"] < 0.65  # below ln 2, the loss of a coin flip


def test_per_layer_equals_normal_mode(assets, tmp_path):
    models = {}
    for name in ("plumage_adamw", "plumage_adamw_per_layer"):
        config = parse_config(_argv(assets, tmp_path / name, "--optimizer", name, "--lora_all_modules", "--lora_r", "4",
                                    "--update_proj_gap", "2", "--learning_rate", "1e-3"))
        models[name], _ = run(config)
    normal, layered = (dict(m.named_parameters()) for m in models.values())
    for key, value in normal.items():
        torch.testing.assert_close(layered[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_lora_one_epoch_trains_adapters_only(assets, tmp_path):
    config = parse_config(_argv(assets, tmp_path / "lora", "--peft", "lora", "--lora_r", "4", "--lora_all_modules",
                                "--learning_rate", "1e-2"))
    model, summary = run(config)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or "classifier" in n for n in trained)
    assert sum(p.numel() for p in trained.values()) == summary["trainable_parameters"]
    # AdamW keeps two fp32 moments per trainable number (its step count is a Python int)
    assert summary["optimizer_state_bytes"] == 8 * summary["trainable_parameters"]
    saved = load_file(f"{assets['model']}/model.safetensors")
    prefix = "base_model.model.bert."  # the encoder; the frozen copy of the fresh head is not in the file
    frozen = {n.removeprefix(prefix).replace(".base_layer", ""): p
              for n, p in model.named_parameters() if not p.requires_grad and n.startswith(prefix)}
    assert len(frozen) == len(saved)
    for name, value in frozen.items():  # the pretrained weights are untouched
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    lora_b = [p for n, p in trained.items() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # B starts at zero: it moved
    assert _records(tmp_path / "lora")["final"][0]["method"] == "lora"


def test_galore_command_maps_onto_build_optimizer(assets):
    """GaLore's README command: --lora_r is the rank, --galore_scale and --update_proj_gap go to the group."""
    config = parse_config(["--model_name_or_path", assets["model"], "--enable_galore", "--lora_all_modules",
                           "--lora_r", "4", "--galore_scale", "4", "--update_proj_gap", "500", "--learning_rate", "3e-5"])
    assert config.optimizer == "galore_adamw"
    _, _, optimizer = build_model_and_optimizer(config, num_labels=2)
    regular, low = optimizer.param_groups
    assert (low["rank"], low["scale"], low["update_proj_gap"], low["projector"], low["lr"]) == (4, 4.0, 500, "svd", 3e-5)
    assert len(low["params"]) == 12 and "rank" not in regular
    query_only = parse_config(["--model_name_or_path", assets["model"], "--enable_galore"])
    _, _, optimizer = build_model_and_optimizer(query_only, num_labels=2)
    assert [r.name for r in optimizer.routing if r.low_rank] == [f"bert.encoder.layer.{i}.attention.self.query.weight"
                                                                for i in range(2)]


def test_state_bytes_count_nested_projector_state():
    layer = torch.nn.Linear(6, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    optimizer.state[layer.weight] = {"m": torch.zeros(4, 6), "projector": {"P": torch.zeros(4, 2, dtype=torch.float64)}}
    assert optimizer_state_bytes(optimizer) == 4 * 24 + 8 * 8


def test_bundled_minilm_loads_with_a_fresh_head():
    assert (bundled_model_path() / "model.safetensors").is_file()
    model, tokenizer = load_classifier(None, num_labels=2)
    assert model.config.model_type == "bert" and model.classifier.weight.shape == (2, 384)
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    chosen = [n for n in linear if any(t in n for t in target_modules(model, all_modules=True))]
    assert len(chosen) == 36 and not any("classifier" in n or "pooler" in n for n in chosen)
    assert tokenizer("to be or not to be")["input_ids"][0] == tokenizer.cls_token_id


def test_offline_task_split_is_fixed_and_balanced(assets):
    first, second = (load_task("shakespeare_plays", assets["data"]) for _ in range(2))
    assert first == second and len(first.train.labels) == 1200 and len(first.validation.labels) == 360
    assert sum(first.train.labels) == 600 and sum(first.validation.labels) == 180
    assert not set(first.train.texts) & set(first.validation.texts)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
