"""What torchrun_main.py runs: config (flags), corpus and data, tokenizer, model, schedule, checkpoint, metrics, loop."""

from .config import TrainConfig, build_parser, parse_config, resolve
from .distributed import Dist, init_distributed
from .loop import DIVERGED, train

__all__ = ["DIVERGED", "Dist", "TrainConfig", "build_parser", "init_distributed", "parse_config", "resolve", "train"]
