"""run_glue.py on what torchrun_main.py pretrained: its checkpoint folder as --model_name_or_path, and GaLore's route
(--eval_llama from a config, then --load_pretrained_model): the decoder's weights arrive, the head is fresh, batches
are padded with EOS, and a wrong folder, name or shape is refused by name."""

from __future__ import annotations

import json
import math

import pytest
import torch
from finetune_helpers import records, save_tiny_bert, write_plays
from safetensors.torch import load_file
from train_helpers import DIST_VARS, MODEL_CONFIG, tiny_run_flags, write_corpus

import run_glue
import torchrun_main
from galore_plumage.finetune import parse_config
from galore_plumage.finetune.loop import build_model_and_optimizer
from galore_plumage.finetune.tasks import PLAYS

SAMPLES = ["--max_train_samples", "32", "--max_eval_samples", "16", "--num_train_epochs", "1", "--no-progress",
           "--per_device_train_batch_size", "8"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """model_2/ of a 2-update galore_adamw pretraining run (llama_micro, its own 256-token BPE), and the plays task."""
    root = tmp_path_factory.mktemp("pretrained")
    write_plays(root / "data")
    flags = tiny_run_flags(root, write_corpus(root / "corpus.txt"), 2)
    with pytest.MonkeyPatch.context() as patch:
        for var in DIST_VARS:
            patch.delenv(var, raising=False)
        assert torchrun_main.main([*flags, "--optimizer", "galore_adamw", "--save_dir", str(root / "pre")]) == 0
    return {"root": root, "checkpoint": root / "pre" / "model_2", "data": str(root / "data")}


def test_a_pretraining_checkpoint_holds_its_tokenizer(pretrained):
    """The checkpoint folder is a whole model: its tokenizer encodes as the run's own BPE did."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    (trained,) = (pretrained["root"] / "data" / "tokenizers").glob("bpe256-*.json")
    text = "What light through yonder window breaks? 1234"
    saved = AutoTokenizer.from_pretrained(pretrained["checkpoint"])
    assert saved(text)["input_ids"] == PreTrainedTokenizerFast(tokenizer_file=str(trained))(text)["input_ids"]
    vocab = json.loads((pretrained["checkpoint"] / "config.json").read_text())["vocab_size"]
    assert saved.eos_token is not None and len(saved) == vocab  # the model's vocabulary follows its tokenizer


def _decoder_loaded(model, checkpoint) -> None:
    """Every tensor of the classifier but its head equals the checkpoint's; the head is new."""
    weights, own = load_file(checkpoint / "model.safetensors"), model.state_dict()
    assert set(own) - set(weights) == {"score.weight"} and set(weights) - set(own) == {"lm_head.weight"}
    for name in set(own) & set(weights):
        assert torch.equal(own[name], weights[name]), name
    assert own["score.weight"].shape == (2, own["model.norm.weight"].numel())


def test_run_glue_fine_tunes_a_pretraining_checkpoint(pretrained, tmp_path):
    argv = ["--model_name_or_path", str(pretrained["checkpoint"]), "--data_dir", pretrained["data"], *SAMPLES,
            "--optimizer", "galore_adamw", "--lora_all_modules", "--lora_r", "4", "--learning_rate", "1e-3"]
    model, tokenizer, _ = build_model_and_optimizer(parse_config([*argv, "--output_dir", str(tmp_path / "a")]), 2, PLAYS)
    _decoder_loaded(model, pretrained["checkpoint"])
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == model.config.pad_token_id  # the BPE has no pad token

    out = tmp_path / "run"
    assert run_glue.main([*argv, "--output_dir", str(out)]) == 0
    (final,) = records(out, "final")
    assert final["steps"] == 4 and math.isfinite(final["terminal_train_loss"])
    projected = {r["param"] for r in records(out, "projector")}
    assert "model.layers.0.self_attn.q_proj.weight" in projected and "model.layers.1.mlp.down_proj.weight" in projected


def test_galores_eval_llama_route_loads_the_same_decoder(pretrained, tmp_path, capsys):
    """--eval_llama builds LlamaForSequenceClassification from a config with the tokenizer's vocabulary (the
    checkpoint's own tokenizer, found in --load_pretrained_model's folder), then loads the checkpoint by name."""
    argv = ["--eval_llama", "--model_name_or_path", MODEL_CONFIG, "--load_pretrained_model",
            str(pretrained["checkpoint"]), "--data_dir", pretrained["data"], *SAMPLES, "--optimizer", "plumage_adamw",
            "--lora_r", "4", "--learning_rate", "1e-3"]
    config = parse_config([*argv, "--output_dir", str(tmp_path / "a")])
    assert config.tokenizer == str(pretrained["checkpoint"])
    model, _, _ = build_model_and_optimizer(config, 2, PLAYS)
    _decoder_loaded(model, pretrained["checkpoint"])
    report = capsys.readouterr().out
    assert "loaded" in report and "fresh: score.weight" in report and "not used: lm_head.weight" in report

    out = tmp_path / "run"
    assert run_glue.main([*argv, "--output_dir", str(out)]) == 0
    (final,) = records(out, "final")
    assert final["steps"] == 4 and 0.0 <= final["best_accuracy"] <= 1.0
    assert math.isfinite(final["terminal_train_loss"])


def test_what_cannot_load_is_refused_by_name(pretrained, tmp_path):
    base = ["--data_dir", pretrained["data"], "--output_dir", str(tmp_path / "x")]
    with pytest.raises(ValueError, match="--load_pretrained_model .*: no such folder"):
        parse_config([*base, "--load_pretrained_model", str(tmp_path / "missing")])
    with pytest.raises(ValueError, match="--tokenizer is read with --eval_llama only"):
        parse_config([*base, "--tokenizer", str(pretrained["checkpoint"])])
    with pytest.raises(ValueError, match="--eval_llama builds the model from the Llama config"):
        parse_config([*base, "--eval_llama"])

    llama = ["--eval_llama", "--model_name_or_path", MODEL_CONFIG, "--tokenizer", str(pretrained["checkpoint"])]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds neither model.safetensors nor pytorch_model.bin"):
        build_model_and_optimizer(parse_config([*base, *llama, "--load_pretrained_model", str(empty)]), 2, PLAYS)
    bert = save_tiny_bert(tmp_path / "bert")
    with pytest.raises(ValueError, match="none of its .* tensors is named as one of the model's"):
        build_model_and_optimizer(parse_config([*base, *llama, "--load_pretrained_model", str(bert)]), 2, PLAYS)
    wider = json.loads(open(MODEL_CONFIG).read())
    wider.update(hidden_size=2 * wider["hidden_size"], intermediate_size=2 * wider["intermediate_size"])
    (tmp_path / "wider.json").write_text(json.dumps(wider))
    other = ["--eval_llama", "--model_name_or_path", str(tmp_path / "wider.json"), "--load_pretrained_model",
             str(pretrained["checkpoint"])]
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight is \(257, 64\) there and \(257, 128\) in the model"):
        build_model_and_optimizer(parse_config([*base, *other]), 2, PLAYS)
