"""Experiment trackers beside metrics.jsonl. GaLore's torchrun_main.py logs every run to Weights & Biases, and its
run_glue.py does with --with_tracking; here `--report_to wandb` does the same (off by default: wandb is not a
dependency, and it needs an account or WANDB_MODE=offline).

The tracker receives what MetricsLog writes: each record's numbers under "<type>/<field>" (a projector record's under
"projector/<weight>/<field>") at the record's update, the final record's as the run's summary.
"""

from __future__ import annotations

import numbers

REPORT_TO = ("none", "wandb")
SUMMARY_TYPES = ("summary", "final")  # the last record of torchrun_main.py's and run_glue.py's logs
SKIPPED_TYPES = ("config",)  # passed to init as the run's config


class WandbTracker:
    """One wandb run per launch (a resumed job starts a new one, as GaLore's does)."""

    def __init__(self, project: str, name: str | None, tags: list[str], config: dict):
        try:
            import wandb
        except ImportError as error:
            raise ImportError("--report_to wandb needs the wandb package: pip install wandb (and `wandb login`, or "
                              "WANDB_MODE=offline to keep the run on disk)") from error
        self.run = wandb.init(project=project, name=name, tags=tags or None, config=config)

    def log(self, kind: str, record: dict) -> None:
        if kind in SKIPPED_TYPES:
            return
        prefix = f"{kind}/{record['param']}" if "param" in record else kind
        values = {f"{prefix}/{key}": value for key, value in record.items()
                  if key != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool)}
        if kind in SUMMARY_TYPES:
            self.run.summary.update(values)
        elif values:
            self.run.log(values, step=record.get("step"))

    def finish(self) -> None:
        self.run.finish()


def open_tracker(report_to: str, project: str, name: str | None, tags: str | None, config: dict):
    """The tracker `report_to` names, or None for 'none'."""
    if report_to == "none":
        return None
    if report_to != "wandb":
        raise ValueError(f"--report_to {report_to!r}: choose one of {', '.join(REPORT_TO)}")
    return WandbTracker(project, name, [t for t in (tags or "").split(",") if t], config)
