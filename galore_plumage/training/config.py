"""The run's settings: one dataclass whose fields are the command-line flags (GaLore's names), each with its help.

`parse_config(argv)` builds the parser from the fields, takes `choices` from the registries (so a new
optimizer or projector appears here at once), and validates everything up front, before any file is
written, with errors that say what to do.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from ..optimizers import (
    PRESET_FLAG_HELP,
    PRESETS,
    RULES,
    LayerwiseOptimizer,
    check_optimizer_options,
    check_regular_lr,
    check_regular_lr_ratio,
)
from ..optimizers.options import BY_KEY, OPTIONS
from ..optimizers.pretrain_defaults import (
    PRETRAIN_BATCH_LR,
    PRETRAIN_BETA1,
    PRETRAIN_CLIPPED_LR,
    PRETRAIN_GRAD_CLIPPING,
    PRETRAIN_LONG_RUN_LR,
    PRETRAIN_LR,
    PRETRAIN_REGULAR_LR_RATIO,
)
from ..optimizers.registry import (
    DEFAULT_LR,
    PLUMAGE_CLASSES,
    REALIGN_FLAG_HELP,
    RECOMMENDED_LR,
    family_defaults,
    list_optimizers,
    optimizer_spec,
)
from ..projectors import list_projectors
from ..projectors.modes import PROJ_TYPES
from .pretrain_settings import fill_pretrain_settings
from .run_folder import check_save_dir
from .trackers import REPORT_TO

SCHEDULERS = ("cosine", "linear", "constant")
DTYPES = ("float32", "bfloat16")
BUNDLED = "shakespeare"
DEFAULT_TOKENIZER = "bpe"
STREAMED_EVAL_TOKENS = 10_000_000
LOCAL_EVAL_TOKENS = 100_000
LOCAL_FORMATS = (".txt", ".jsonl")
# suffixes that say --dataset means a local file (a hub name has none)
FILE_SUFFIXES = (*LOCAL_FORMATS, ".json", ".csv", ".tsv", ".parquet", ".arrow", ".gz", ".zst", ".xz", ".bz2")
# flags a resume may change: where and how often it writes and evaluates, names, the display, and memory-only
# settings; every other flag must match the checkpoint's, or the resumed run would silently be a different one
RESUME_MAY_CHANGE = frozenset({"save_dir", "continue_from", "overwrite", "stop_at", "eval_every", "save_every",
                               "eval_tokens", "name", "tags", "progress", "workers", "data_dir", "single_gpu",
                               "use_hf_model", "activation_checkpointing", "report_to", "wandb_project"})
# how one update's --total_batch_size sequences are split over processes and micro-batches: a resume may change it while
# the total stays (fewer or more GPUs); the data position is counted in sequences (data.ShuffledBatches.load_state_dict)
BATCH_LAYOUT = frozenset({"world_size", "batch_size", "gradient_accumulation"})


def _per_name(table: dict[tuple[str, str], float]) -> str:
    """'plumage_adamw: 2, plumage_adafactor: 4' from a (family, backend) -> value table, for a flag's help."""
    return ", ".join(f"{family}_{backend}: {value:g}" for (family, backend), value in table.items())


def _recommended_lrs() -> str:
    banded = [f"{family}_{backend} {lr:g} from {tokens} tokens an update while the floor is m2 with its own warm-up"
              for (family, backend), (tokens, lr) in PRETRAIN_LR.items()]
    banded += [f"{family}_{backend} x{factor:g} from {updates} updates while the floor is m2 with its own warm-up, "
               "or none where the run pretrains as a large batch for its length"
               for (family, backend), (updates, factor) in PRETRAIN_LONG_RUN_LR.items()]
    banded += [f"{family}_{backend} {lr:g} from {updates} updates where --grad_clipping is at most {norm:g}"
               for (family, backend), (norm, by_length) in PRETRAIN_CLIPPED_LR.items() for updates, lr in by_length]
    banded += [f"{family}_{backend} {lr:g} from {tokens} tokens an update with its own projector"
               for (family, backend), bands in PRETRAIN_BATCH_LR.items() for tokens, lr in bands]
    listed = (": " + _per_name(RECOMMENDED_LR) + f"; {DEFAULT_LR:g} otherwise") if RECOMMENDED_LR else f": {DEFAULT_LR:g}"
    tables = "optimizers.PRETRAIN_LR, PRETRAIN_LONG_RUN_LR, PRETRAIN_CLIPPED_LR, PRETRAIN_BATCH_LR"
    return listed + (" (pretraining: " + ", ".join(banded) + "; " + tables + ")" if banded else "")


def _plumage_scales() -> str:
    scales = [f"{cls.class_defaults['scale']:g} for plumage_{backend}" for backend, cls in PLUMAGE_CLASSES.items()]
    return ", " + ", ".join(scales)


def _regular_lr_ratios() -> str:
    return " (" + _per_name(PRETRAIN_REGULAR_LR_RATIO) + "; 1, one lr on every group as GaLore, otherwise and under --preset)"


def _grad_clippings() -> str:
    return " (" + _per_name(PRETRAIN_GRAD_CLIPPING) + "; 0 otherwise, in per-layer mode and under --preset)"


def _beta1s() -> str:
    return " (" + _per_name(PRETRAIN_BETA1) + "; 0 otherwise, as galore-torch's script; optimizers.PRETRAIN_BETA1)"


def flag(default, help: str, **argparse_options):
    """A config dataclass field that add_flags turns into --<name> with this help (torchrun_main.py and run_glue.py)."""
    return field(default=default, metadata={"help": help, **argparse_options})


def parse_token_count(text: str) -> int:
    """'100M' -> 100_000_000, '1.5B' -> 1_500_000_000, '20000' -> 20000 (GaLore's suffixes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMBkmb]?)\s*", str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"--max_train_tokens {text!r}: expected a number with an optional K, M or B suffix")
    number, suffix = match.groups()
    return int(Decimal(number) * {"": 1, "K": 10**3, "M": 10**6, "B": 10**9}[suffix.upper()])  # exact: 1.001K is 1001


@dataclass
class TrainConfig:
    # --- model
    model_config: str = flag("configs/llama_tiny.json",
                              "LlamaConfig JSON (configs/llama_*.json); vocab_size follows the tokenizer")
    use_hf_model: bool = flag(False, "accepted for GaLore compatibility: the model is always transformers' LlamaForCausalLM")
    activation_checkpointing: bool = flag(False, "recompute activations in the backward pass to save memory")
    dtype: str = flag(None, "weight dtype; bfloat16 also runs the forward under bf16 autocast. Default: bfloat16 on a "
                             "CUDA device that supports it, float32 otherwise", choices=DTYPES)
    # --- data
    dataset: str = flag(BUNDLED, f"'{BUNDLED}' (the bundled public-domain corpus), 'allenai/c4' (streamed as GaLore "
                                  "does), or a local .txt (documents separated by blank lines) / .jsonl ('text' field)")
    streaming: bool = flag(False, "read a local .txt/.jsonl as a stream, a line at a time, instead of tokenizing it "
                                   "into memory first (for a corpus larger than memory): shuffled through a buffer, "
                                   "read again at its end, the offline BPE trained on its first 20 MB; a hub dataset is "
                                   "always streamed")
    tokenizer: str = flag(DEFAULT_TOKENIZER, f"'{DEFAULT_TOKENIZER}': a byte-level BPE trained offline on the training "
                                              "split and cached; or a name/path for AutoTokenizer (t5-base for C4)")
    vocab_size: int = flag(8192, f"vocabulary of the '{DEFAULT_TOKENIZER}' tokenizer")
    data_dir: str = flag("data", "where the bundled corpus, tokenizers and other downloads are cached")
    max_length: int = flag(256, "tokens per packed training sequence")
    eval_tokens: int = flag(None, "validation token budget of one evaluation (the whole split if smaller); default: "
                                   f"{STREAMED_EVAL_TOKENS:,} for a streamed hub dataset (GaLore's), {LOCAL_EVAL_TOKENS:,} "
                                   "otherwise, so a short run does not spend most of its time evaluating")
    workers: int = flag(8, "DataLoader worker processes for a streamed dataset (C4, --streaming); in-memory corpora "
                           "need none")
    # --- batch and length of the run
    batch_size: int = flag(8, "sequences per micro-batch on each process")
    gradient_accumulation: int = flag(None, "micro-batches per update (derived from --total_batch_size if omitted)")
    total_batch_size: int = flag(None, "sequences per update over all processes; default batch_size x world size")
    num_training_steps: int = flag(10_000, "number of optimizer updates (gradient accumulation taken into account)")
    max_train_tokens: int = flag(None, "train on this many tokens instead (K/M/B suffixes); overrides "
                                        "--num_training_steps", type=parse_token_count)
    # --- optimizer
    optimizer: str = flag("plumage_adamw", "optimizer name (case-insensitive)", choices=list_optimizers(), type=str.lower)
    lr: float = flag(None, "peak learning rate; default: the optimizer's recommended lr (optimizers.recommended_lr: "
                            "the best of benchmarks/pretrain_protocol.py where it was run" + _recommended_lrs() + ")")
    regular_lr: float = flag(None, "peak learning rate of the weights that are not projected (embeddings, norms, the "
                                   "head), following the same schedule; default: --regular_lr_ratio x --lr")
    regular_lr_ratio: float = flag(None, "the regular group's peak lr as a multiple of --lr, when --regular_lr is not "
                                         "given; default: the optimizer's" + _regular_lr_ratios() + " (docs/results.md "
                                         "§3, sessions 32-33)")
    regular_lr_ratio_on_repeat: float = flag(None, "the regular group's peak lr as a multiple of --lr from the update "
                                                   "that begins reading the training text a second time (text held in "
                                                   "memory, not streamed); default: as before it")
    weight_decay: float = flag(0.0, "decoupled weight decay")
    beta1: float = flag(None, "Adafactor's beta1 (0 = no first moment) and SGD's momentum, as in GaLore; default: the "
                              "optimizer's" + _beta1s())
    grad_clipping: float = flag(None, "clip the global gradient norm to this (0 = off; refused by *_per_layer); "
                                      "default: the optimizer's" + _grad_clippings() + " (docs/results.md §3, session 88)")
    scheduler: str = flag("cosine", "learning-rate schedule after the linear warmup", choices=SCHEDULERS)
    min_lr_ratio: float = flag(0.1, "final learning rate as a fraction of --lr (cosine and linear)")
    warmup_steps: int = flag(1_000, "linear warmup updates")
    # --- low-rank projection
    rank: int = flag(128, "rank of the low-rank projection")
    update_proj_gap: int = flag(200, "updates between projection refreshes (τ)")
    galore_scale: float = flag(None, "scale of the projected-back update; default: the optimizer's (0.25 for galore_* "
                                      "as GaLore's recipe" + _plumage_scales() + ")")
    proj_type: str = flag("std", "which side of each weight is projected", choices=PROJ_TYPES)
    projector: str = flag(None, "override the optimizer's projector (plumage_adamw(8bit): svd since session 17, the "
                                "pretraining protocol's best; 'plumage' for PLUMAGE's draws)", choices=list_projectors())
    realign: str = flag(None, REALIGN_FLAG_HELP, choices=RULES)
    preset: str = flag(None, PRESET_FLAG_HELP + "; it sets --lr and --galore_scale too where they are not given",
                       choices=list(PRESETS))
    # --- evaluation, checkpoints, logging
    eval_every: int = flag(5_000, "evaluate every this many updates (and at the end)")
    save_every: int = flag(10_000, "checkpoint every this many updates (and at the end)")
    save_dir: str = flag(None, "checkpoints and metrics.jsonl go here; default runs/<model>-<optimizer>")
    continue_from: str = flag(None, "resume from a checkpoint folder, or a save_dir: its newest complete checkpoint. "
                                     "Flags that define the run must match the checkpoint's (a resume may change "
                                     "only " + ", ".join(f"--{k}" for k in sorted(RESUME_MAY_CHANGE - {"continue_from"}))
                                     + ", and --batch_size, --gradient_accumulation and the number of processes while "
                                       "--total_batch_size stays)")
    overwrite: bool = flag(False, "delete the run already in --save_dir (its checkpoints and metrics.jsonl) and start "
                                   "afresh; without it a used --save_dir is refused unless --continue_from resumes it")
    stop_at: int = flag(None, "checkpoint and stop at this update, as a preempted job would, keeping the schedule "
                               "of --num_training_steps; resume later with --continue_from")
    seed: int = flag(0, "seeds the model init, data order and projections")
    projection_seed: int = flag(None, "seeds the projections (random bases, PLUMAGE's draws) apart from the model "
                                      "and data; default: --seed. Separates an estimator's own randomness from the "
                                      "run's in a seed study")
    single_gpu: bool = flag(False, "one process without DistributedDataParallel")
    fsdp: bool = flag(False, "shard the model over the processes with FSDP2 (fully_shard on each decoder layer and the "
                              "model) instead of DDP; optimizer state is sharded too, checkpoints are written with "
                              "torch.distributed.checkpoint (resumable on another number of processes too)")
    name: str = flag("test", "run name, recorded in the metrics (and the tracker's run name)")
    tags: str = flag(None, "comma-separated tags, recorded in the metrics (and given to the tracker)")
    report_to: str = flag("none", "also send the metrics to an experiment tracker: 'wandb', as GaLore's script does "
                                  "(needs the wandb package; WANDB_MODE=offline keeps the run on disk)", choices=REPORT_TO)
    wandb_project: str = flag("galore_plumage", "the wandb project of --report_to wandb")
    proj_quant: bool = flag(False, "accepted for GaLore compatibility; quantized projections are not implemented "
                                    "and setting it is an error")
    progress: bool = flag(True, "show a progress bar (--no-progress to hide)", action=argparse.BooleanOptionalAction)

    # the options of optimizers/options.py given on the command line (flags made from that table); the rest take
    # the optimizer's defaults
    low_rank: dict = field(default_factory=dict, metadata={"derived": True})
    # derived by resolve()
    world_size: int = field(default=1, metadata={"derived": True})

    @property
    def tokens_per_update(self) -> int:
        return self.total_batch_size * self.max_length


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrun_main.py", description="Pretrain Llama with a low-rank gradient optimizer (GaLore-compatible flags).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    return add_option_flags(add_flags(parser, TrainConfig))


# each plumage_* name's own option defaults, which each flag's help names where they differ from the table's
PLUMAGE_OPTION_DEFAULTS = {f"plumage_{backend}": cls.class_defaults for backend, cls in PLUMAGE_CLASSES.items()}
# an option flag left out: the optimizer's own default (a flag given as 'none' is None, which some defaults are not)
NOT_GIVEN = argparse.SUPPRESS


def add_option_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """One --flag per option of optimizers/options.py; not given means the optimizer's own default."""
    group = parser.add_argument_group("low-rank options", "not given: the optimizer's default, named in each help")
    for option in OPTIONS:
        group.add_argument(f"--{option.key}", default=NOT_GIVEN,
                           help=_literal_help(option.flag_help(PLUMAGE_OPTION_DEFAULTS)), **option.argparse_options())
    return parser


def _literal_help(text: str) -> str:
    """A help text as argparse prints it verbatim: argparse %-formats every help (for %(default)s, which none of ours
    uses), so a bare "%" (e.g. "3-6 % slower", read as the specifier "% s") would print the action's dict instead."""
    return text.replace("%", "%%")


def split_options(arguments: dict) -> tuple[dict, dict]:
    """(the other flags, the table's options that were given) from a parsed namespace's dict: a flag left out is
    absent from it (argparse.SUPPRESS), so `--residual_cap none` (None) is kept where plumage_*'s default is 0.5."""
    given = {k: v for k, v in arguments.items() if k in BY_KEY}
    return {k: v for k, v in arguments.items() if k not in BY_KEY}, given


def add_flags(parser: argparse.ArgumentParser, config_class) -> argparse.ArgumentParser:
    """One --flag per field of a config dataclass, its help and choices from the field's metadata; fields marked
    `derived` are computed by resolve(), not given. (Field types are strings under `from __future__ import annotations`.)"""
    for spec in dataclasses.fields(config_class):
        meta = dict(spec.metadata)
        if meta.pop("derived", False):
            continue
        if spec.type == "bool" and "action" not in meta:
            meta["action"] = "store_true"
        elif "action" not in meta and "type" not in meta:
            meta["type"] = {"int": int, "float": float, "str": str}[spec.type]
        if "help" in meta:
            meta["help"] = _literal_help(meta["help"])
        parser.add_argument(f"--{spec.name}", default=spec.default, **meta)
    return parser


def parse_config(argv: list[str] | None = None, world_size: int = 1, cuda_bf16: bool = False) -> TrainConfig:
    """Parse and validate; raises SystemExit (argparse) or ValueError with a message that says what to do."""
    flags, low_rank = split_options(vars(build_parser().parse_args(argv)))
    return resolve(TrainConfig(**flags, low_rank=low_rank), world_size, cuda_bf16)


def resolve(config: TrainConfig, world_size: int = 1, cuda_bf16: bool = False) -> TrainConfig:
    """Fill the derived fields (batch arithmetic, steps from tokens, dtype, save_dir) and check every value, in the
    order a user would fix them: numbers, combinations of flags, batch arithmetic, the run's length, files."""
    c = dataclasses.replace(config, world_size=world_size)
    if c.eval_tokens is None:
        c.eval_tokens = LOCAL_EVAL_TOKENS if c.dataset == BUNDLED or is_local_file(c.dataset) else STREAMED_EVAL_TOKENS
    _check_numbers(c)
    _check_combinations(c, world_size)
    _derive_batch(c, world_size)
    if c.max_train_tokens is not None:
        # GaLore divided by the batch size in sequences, not tokens; an update holds total_batch_size x max_length
        c.num_training_steps = max(1, math.ceil(c.max_train_tokens / c.tokens_per_update))
    fill_pretrain_settings(c)  # they read the batch and the run's length: after both
    if c.warmup_steps >= c.num_training_steps and c.scheduler != "constant":
        raise ValueError(f"--warmup_steps {c.warmup_steps} leaves no room for the {c.scheduler} decay in "
                         f"{c.num_training_steps} updates; lower it (10% of the run is usual)")
    if c.stop_at is not None and not 1 <= c.stop_at <= c.num_training_steps:
        raise ValueError(f"--stop_at must be in [1, num_training_steps={c.num_training_steps}], got {c.stop_at}")
    _check_files(c)
    if c.dtype is None:
        c.dtype = "bfloat16" if cuda_bf16 else "float32"
    if c.save_dir is None:
        c.save_dir = str(Path("runs") / f"{Path(c.model_config).stem}-{c.optimizer}")
    check_save_dir(c.save_dir, c.continue_from, c.overwrite)
    return c


def _check_numbers(c: TrainConfig) -> None:
    for name in ("batch_size", "max_length", "num_training_steps", "eval_every", "save_every", "rank",
                 "update_proj_gap", "eval_tokens", "vocab_size"):
        if getattr(c, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(c, name)}")
    for name in ("lr", "regular_lr", "regular_lr_ratio", "regular_lr_ratio_on_repeat", "weight_decay", "grad_clipping",
                 "min_lr_ratio", "beta1", "galore_scale"):
        value = getattr(c, name)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"--{name} must be a finite number, got {value}")
    for name in ("lr", "weight_decay", "grad_clipping", "warmup_steps", "workers"):
        if getattr(c, name) is not None and getattr(c, name) < 0:  # lr None: derived after the batch
            raise ValueError(f"--{name} must be >= 0, got {getattr(c, name)}")
    if not 0.0 <= c.min_lr_ratio <= 1.0:
        raise ValueError(f"--min_lr_ratio must be in [0, 1], got {c.min_lr_ratio}")
    if c.beta1 is not None and not 0.0 <= c.beta1 < 1.0:
        raise ValueError(f"--beta1 must be in [0, 1), got {c.beta1}")


def _check_combinations(c: TrainConfig, world_size: int) -> None:
    if c.proj_quant:
        raise ValueError("--proj_quant (Q-GaLore's quantized projections) is not implemented; drop the flag")
    if c.single_gpu and world_size > 1:
        raise ValueError(f"--single_gpu runs one process, but WORLD_SIZE is {world_size}: launch with --nproc_per_node 1")
    spec = optimizer_spec(c.optimizer)
    per_layer = spec.per_layer
    check_optimizer_options(c.optimizer, c.projector, c.low_rank, preset=c.preset)  # before any file is written
    check_regular_lr(c.regular_lr, c.optimizer)
    check_regular_lr_ratio(c.regular_lr_ratio, c.optimizer)
    check_regular_lr_ratio(c.regular_lr_ratio_on_repeat, c.optimizer, "--regular_lr_ratio_on_repeat")
    if c.regular_lr_ratio_on_repeat is not None and is_streamed(c.dataset, c.streaming):
        raise ValueError(f"--regular_lr_ratio_on_repeat {c.regular_lr_ratio_on_repeat:g} needs the training text's "
                         f"length, which a stream does not know (--dataset {c.dataset!r}"
                         f"{' --streaming' if c.streaming else ''}): read a local file into memory, or drop it")
    if c.regular_lr_ratio is not None and c.regular_lr is not None:
        raise ValueError(f"--regular_lr {c.regular_lr:g} and --regular_lr_ratio {c.regular_lr_ratio:g} both set the "
                         "regular group's lr: give one")
    if c.fsdp and c.single_gpu:
        raise ValueError("--fsdp shards the model over the launched processes and --single_gpu asks for no wrapper: "
                         "drop one (for one process under FSDP2: torchrun --nproc_per_node 1 ... --fsdp)")
    if c.fsdp and per_layer:
        raise ValueError(f"--optimizer {c.optimizer} steps each weight inside its gradient hook, before FSDP2 has "
                         f"reduce-scattered that gradient: drop '_per_layer' (use {c.optimizer.removesuffix('_per_layer')}) "
                         "or drop --fsdp")
    if per_layer:
        try:  # the optimizer would refuse it too, but only after the data and model are built
            LayerwiseOptimizer.refuse_clipping(c.grad_clipping)
        except ValueError as error:
            raise ValueError(f"--grad_clipping {c.grad_clipping} with --optimizer {c.optimizer}: {error}") from None
    if per_layer and world_size > 1:
        raise ValueError(f"--optimizer {c.optimizer} steps each weight inside its gradient hook, before DDP has "
                         f"all-reduced that gradient; run it on one process (--single_gpu), not {world_size}")


def _derive_batch(c: TrainConfig, world_size: int) -> None:
    """gradient_accumulation and total_batch_size from whichever was given (GaLore's arithmetic), checked."""
    per_process = c.batch_size * world_size
    if c.gradient_accumulation is None:
        total = c.total_batch_size if c.total_batch_size is not None else per_process
        if total % per_process:
            raise ValueError(f"--total_batch_size {total} is not a multiple of batch_size x world_size = "
                             f"{c.batch_size} x {world_size}; change one of them")
        c.gradient_accumulation = total // per_process
    if c.gradient_accumulation < 1:
        raise ValueError(f"--gradient_accumulation must be >= 1, got {c.gradient_accumulation}")
    if c.total_batch_size is None:
        c.total_batch_size = c.gradient_accumulation * per_process
    if c.gradient_accumulation * per_process != c.total_batch_size:
        raise ValueError(f"gradient_accumulation x batch_size x world_size = {c.gradient_accumulation} x {c.batch_size} x "
                         f"{world_size} != --total_batch_size {c.total_batch_size}")


def _check_files(c: TrainConfig) -> None:
    if c.streaming and c.dataset == BUNDLED:
        raise ValueError(f"--streaming reads a local .txt/.jsonl a line at a time; the bundled corpus ('{BUNDLED}', "
                         "5 MB) is read into memory: drop --streaming, or pass --dataset <your file>")
    if is_local_file(c.dataset) and not Path(c.dataset).is_file():
        raise ValueError(f"--dataset {c.dataset!r}: no such file; pass an existing .txt/.jsonl, '{BUNDLED}' or "
                         "'allenai/c4'")
    if is_local_file(c.dataset) and not c.dataset.endswith(LOCAL_FORMATS):
        raise ValueError(f"--dataset {c.dataset!r}: a local corpus is read from .txt (documents separated by blank "
                         "lines) or .jsonl (a 'text' field); convert the file to one of them")
    if not Path(c.model_config).is_file():
        raise ValueError(f"--model_config {c.model_config!r}: no such file; choose one of configs/llama_*.json")


def is_local_file(dataset: str) -> bool:
    """A --dataset that names a file (by its suffix, or because it exists); any other name but the bundled corpus is a
    hub dataset, streamed. A file must then be .txt/.jsonl (checked above)."""
    return Path(dataset).suffix.lower() in FILE_SUFFIXES or Path(dataset).is_file()


def is_streamed(dataset: str, streaming: bool = False) -> bool:
    """A hub dataset is always streamed; a local file only with --streaming; the bundled corpus never."""
    return dataset != BUNDLED and (streaming or not is_local_file(dataset))


def _ratio(run: dict) -> float | None:
    """A run's regular group's lr over its lr (None: one lr), rounded as the flag would give it."""
    return float(f"{run['regular_lr'] / run['lr']:.6g}") if run.get("regular_lr") and run.get("lr") else None


def resume_conflicts(saved: dict, config, may_change: frozenset[str] = RESUME_MAY_CHANGE) -> list[str]:
    """`--flag value (the checkpoint: value)` for each flag of `config` (a TrainConfig, or run_glue.py's FinetuneConfig)
    that differs from the run the checkpoint was written by (`saved`: that run's asdict(config)); flags in
    `may_change` and flags the checkpoint predates are not compared."""
    current = dataclasses.asdict(config)
    conflicts = []
    derived = {spec.name for spec in dataclasses.fields(config) if spec.metadata.get("derived")}
    # --regular_lr_ratio only derives regular_lr, which is compared: a checkpoint that left it out (one lr, where the
    # optimizer's default has since become 2x) resumes as it ran with --regular_lr_ratio 1
    for key in sorted(saved.keys() & current.keys() - may_change - {"low_rank", "regular_lr_ratio"}):
        if saved[key] != current[key]:
            name = "processes (WORLD_SIZE)" if key == "world_size" else key if key in derived else f"--{key}"
            # a run before session 33 had one lr where plumage_adamw's default now sets the regular group's; one of
            # plumage_adafactor's before session 81 set it at 2x where the default is now 4x; one of plumage_sgdm's
            # before session 88 was not clipped, and before session 89 ran with the script's β1 0 and lr 1e-3
            hint = ""
            if key == "regular_lr" and saved[key] is None:
                hint = "; one lr on every group: --regular_lr_ratio 1"
            elif key == "regular_lr" and _ratio(saved) not in (None, _ratio(current)):
                hint = f"; as it ran: --regular_lr_ratio {_ratio(saved):g}"
            elif key in ("grad_clipping", "beta1"):  # derived per name since sessions 88-89 where not given
                hint = f"; as it ran: --{key} {saved[key]:g}"
            conflicts.append(f"{name} {current[key]} (the checkpoint: {saved[key]}{hint})")
    saved_options, options = saved.get("low_rank", {}), current["low_rank"]
    # an option one side leaves out has the optimizer's own default there (its family's; a preset's are not looked up)
    defaults = family_defaults(optimizer_spec(config.optimizer)) if config.optimizer and config.preset is None else {}
    for key in sorted(saved_options.keys() | options.keys()):
        if saved_options.get(key, defaults.get(key)) != options.get(key, defaults.get(key)):
            # a run before session 36 warmed plumage_adamw's floor up over m2's own ~1000 updates; one before session
            # 37 kept the floor at any batch (PRETRAIN_NO_FLOOR_FROM_TOKENS), one before session 38 had no complement
            # (PRETRAIN_COMPLEMENT): one flag given stops each derivation
            hint = ""
            if key == "v_floor_horizon" and key not in saved_options:
                hint = "; m2's own warm-up: --v_floor_horizon none"
            elif (key == "v_floor_horizon" and key not in options
                  and options.get("v_floor", defaults.get("v_floor")) == "m2"):
                # plumage_adamw's 200 of sessions 36-55, now m2's own at twice the lr (PRETRAIN_LR): the flag brings
                # the lr back too
                hint = f"; as it ran, at the lr it ran at: --v_floor_horizon {saved_options[key]}"
            elif key == "v_floor" and key not in saved_options:
                hint = f"; the floor it ran with: --v_floor_horizon {saved_options.get('v_floor_horizon') or 'none'}"
            elif key == "residual" and key not in saved_options:  # before session 38 no complement at any batch
                hint = "; as it ran: --residual none"
            elif key == "sample_until" and key not in saved_options:  # before session 77 plumage_adafactor drew throughout
                hint = "; as it ran: --sample_until none"
            conflicts.append(f"--{key} {options.get(key, 'not given')} (the checkpoint: "
                             f"{saved_options.get(key, 'not given')}{hint})")
    return conflicts
