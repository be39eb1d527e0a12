"""What run_glue.py runs: flags, tasks (offline default and GLUE), model and LoRA, the loop; and HF Trainer glue."""

from .config import FinetuneConfig, build_parser, parse_config, resolve
from .loop import finetune, optimizer_state_bytes, summary_table
from .trainer import optimizer_for_trainer, resolve_target_modules

__all__ = ["FinetuneConfig", "build_parser", "finetune", "optimizer_for_trainer", "optimizer_state_bytes",
           "parse_config", "resolve", "resolve_target_modules", "summary_table"]
