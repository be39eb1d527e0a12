"""The fine-tuning run behind run_glue.py: task, model, optimizer, epochs of training and validation, summary.

An update sums the gradients of --gradient_accumulation_steps batches; a partial accumulation at the end of an epoch
carries into the next, so every update (per-layer mode's too) sums the same number of batches. Per epoch,
metrics.jsonl gets the mean training loss (over its batches) and the validation scores (scores.py: accuracy, or for a
regression task Pearson's r and Spearman's ρ); at the end one `final` record: terminal train loss (the mean over the
last epoch), the best and final validation score (best_accuracy or best_pearson), optimizer-state bytes, trainable
parameters and wall time, also printed as a table.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils.data import DataLoader

from ..optimizers import build_optimizer, describe_routing
from ..optimizers.layerwise import inner_optimizer
from ..optimizers.memory import state_bytes
from ..training.loop import seed_everything
from ..training.metrics import METRICS_FILE, MetricsLog, Progress, projector_records
from ..training.schedule import step_scheduler
from ..training.trackers import open_tracker
from .config import FinetuneConfig
from .model import apply_lora, llama_classifier, load_classifier, load_pretrained, target_modules
from .resume import Position, checkpoint_every, restore, save
from .scores import primary_score, validation_scores
from .tasks import Split, load_files, load_task


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of the tensors held in the optimizer's state (moments, the projector's basis and probabilities)."""
    return state_bytes(dict(inner_optimizer(optimizer).state))[0]


def build_model_and_optimizer(config: FinetuneConfig, num_labels: int, label_names=None):
    """(model, tokenizer, optimizer): GaLore's routing for low-rank names, peft adapters for --peft lora."""
    if config.eval_llama:
        model, tokenizer = llama_classifier(config.model_name_or_path, num_labels, label_names, config.tokenizer)
    else:
        model, tokenizer = load_classifier(config.model_name_or_path, num_labels, label_names)
    if config.load_pretrained_model is not None:
        print(load_pretrained(model, config.load_pretrained_model))
    targets = target_modules(model, config.lora_all_modules)
    if config.peft == "lora":
        model = apply_lora(model, targets, config.lora_r, config.lora_alpha, config.lora_dropout)
    optimizer = build_optimizer(
        config.optimizer, model, lr=config.learning_rate, rank=config.lora_r, target_modules=targets,
        accumulation_steps=config.gradient_accumulation_steps,
        update_proj_gap=config.update_proj_gap, scale=config.galore_scale, proj_type=config.proj_type,
        projector=config.projector, realign=config.realign, preset=config.preset, weight_decay=config.weight_decay,
        seed=config.seed, **config.low_rank,
    )
    return model, tokenizer, optimizer


def batches(split: Split, tokenizer, max_length: int, batch_size: int, shuffle: bool, seed: int,
            pad_to_max_length: bool = False) -> DataLoader:
    """Tokenized once; each batch padded to its longest example, or every example to max_length. Shuffling uses its own
    generator (seeded)."""
    from transformers import DataCollatorWithPadding

    columns = list(zip(*split.texts, strict=True))
    encoded = tokenizer(*columns, truncation=True, max_length=max_length,
                        padding="max_length" if pad_to_max_length else False)
    rows = [{**{key: values[i] for key, values in encoded.items()}, "labels": label} for i, label in enumerate(split.labels)]
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(rows, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      collate_fn=DataCollatorWithPadding(tokenizer))


def finetune(config: FinetuneConfig) -> dict:
    """Run the whole job; returns the final summary (also the last line of metrics.jsonl)."""
    return run(config)[1]


class Parts(NamedTuple):
    """What the updates work on, set up once before the first."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    train_loader: DataLoader
    eval_loader: DataLoader
    total_steps: int
    regression: bool  # one output and mean squared error (scores.py says how it is judged)


def run(config: FinetuneConfig):
    """(the trained model, the final summary)."""
    output_dir = Path(config.output_dir)
    if (output_dir / METRICS_FILE).exists() and config.resume_from_checkpoint is None:
        raise FileExistsError(f"{output_dir / METRICS_FILE} exists: pick another --output_dir, delete that folder, or "
                              "continue its run with --resume_from_checkpoint")
    start = time.perf_counter()
    if config.train_file is not None:
        task = load_files(config.train_file, config.validation_file, config.max_train_samples, config.max_eval_samples)
    else:
        task = load_task(config.task_name, config.data_dir, config.max_train_samples, config.max_eval_samples)
    seed_everything(config.seed)
    parts = set_up(config, task)
    position = Position(shuffle_state=parts.train_loader.generator.get_state())
    resumed = None
    if config.resume_from_checkpoint is not None:
        resumed, position = restore(config, parts.model, parts.optimizer, parts.scheduler)

    tracker = open_tracker("wandb", config.wandb_project, Path(output_dir).name, None, asdict(config)) \
        if config.with_tracking else None
    log = MetricsLog(output_dir, enabled=True, tracker=tracker)
    try:
        return _train_and_report(config, task, parts, position, resumed, log, start)
    finally:
        log.close()


def _train_and_report(config: FinetuneConfig, task, parts: Parts, position: Position, resumed, log: MetricsLog,
                      start: float):
    """run's epochs, then its projector records and summary: (the trained model, the summary)."""
    trainable = sum(p.numel() for p in parts.model.parameters() if p.requires_grad)
    if resumed is None:
        log.write("config", **asdict(config), trainable_parameters=trainable, train_examples=len(task.train.labels),
                  eval_examples=len(task.validation.labels))
    else:
        log.write("resumed", step=position.step, checkpoint=str(resumed))
    progress = Progress(parts.total_steps, position.step, config.progress)
    routing = describe_routing(parts.optimizer.routing, config.lora_r if config.peft == "none" else None)
    progress.write(routing.splitlines()[0] + f"; {trainable:,} trainable parameters"
                   + (f"; resumed from {resumed} at update {position.step}" if resumed else ""))
    train_epochs(config, parts, position, log, progress)
    progress.close()

    inner = inner_optimizer(parts.optimizer)
    names = {i: n for i, n in enumerate(_names_in_group_order(inner, parts.model))}
    for record in projector_records(parts.optimizer, names):
        log.write("projector", step=position.step, **record)
    epoch_losses, scores, metric = position.epoch_losses, position.scores, primary_score(parts.regression)
    summary = {
        "method": config.method, "optimizer": config.optimizer, "seed": config.seed, "epochs": len(epoch_losses),
        "steps": position.step, "terminal_train_loss": epoch_losses[-1], "metric": metric, f"best_{metric}": max(scores),
        f"final_{metric}": scores[-1], "optimizer_state_bytes": optimizer_state_bytes(parts.optimizer),
        "trainable_parameters": trainable, "wall_time_s": time.perf_counter() - start,
    }
    log.write("final", **summary)
    if config.progress:
        print(summary_table([summary]))
    return parts.model, summary


def set_up(config: FinetuneConfig, task) -> Parts:
    """Model, optimizer, the two loaders, the number of updates and the lr schedule over them."""
    from transformers import get_scheduler

    model, tokenizer, optimizer = build_model_and_optimizer(config, task.num_labels, task.label_names or None)
    pad = config.pad_to_max_length
    train_loader = batches(task.train, tokenizer, config.max_length, config.per_device_train_batch_size, True,
                           config.seed, pad)
    eval_loader = batches(task.validation, tokenizer, config.max_length, config.per_device_eval_batch_size, False, 0, pad)
    accumulation = config.gradient_accumulation_steps
    total_steps = len(train_loader) * config.num_train_epochs // accumulation
    if total_steps == 0:
        raise ValueError(f"--gradient_accumulation_steps {accumulation} is more than the {len(train_loader)} batches "
                         f"x {config.num_train_epochs} epochs of training: lower it, or train on more examples or epochs")
    if config.max_train_steps is not None:
        total_steps = min(total_steps, config.max_train_steps)
    inner = inner_optimizer(optimizer)  # per-layer mode: the scheduler drives the wrapped optimizer
    scheduler = get_scheduler(config.lr_scheduler_type, inner, config.num_warmup_steps, total_steps)
    return Parts(model, optimizer, scheduler, train_loader, eval_loader, total_steps, task.regression)


def train_epochs(config: FinetuneConfig, parts: Parts, position: Position, log: MetricsLog, progress: Progress) -> None:
    """Epochs from `position` (a resumed run's, mid-epoch included) until the last update; `position` advances."""
    model, optimizer, scheduler, train_loader = parts.model, parts.optimizer, parts.scheduler, parts.train_loader
    shuffler = train_loader.generator  # each epoch's order is drawn from it as the epoch begins
    accumulation, total_steps = config.gradient_accumulation_steps, parts.total_steps
    every = checkpoint_every(config.checkpointing_steps)
    model.train()
    pending, tokens, epoch_save_due = [], 0, False  # the losses and tokens of the batches summed into the next update
    while position.epoch <= config.num_train_epochs and (position.step < total_steps or position.batches_done):
        epoch = position.epoch
        shuffler.set_state(position.shuffle_state)
        for batch in itertools.islice(train_loader, position.batches_done, None):  # a resumed epoch: the same order
            if position.step >= total_steps:
                break
            loss = model(**batch).loss
            (loss / accumulation).backward()
            position.batches_done += 1
            position.losses.append(loss.item())
            pending.append(position.losses[-1])
            tokens += int(batch["attention_mask"].sum())
            if len(pending) < accumulation:
                continue
            optimizer.step()
            step_scheduler(scheduler)
            optimizer.zero_grad(set_to_none=True)
            position.step += 1
            update_loss = sum(pending) / len(pending)
            lr = scheduler.get_last_lr()[-1]
            log.write("train", step=position.step, epoch=epoch, loss=update_loss, lr=lr)
            progress.update(update_loss, lr, tokens)
            pending, tokens = [], 0
            if epoch_save_due or (isinstance(every, int) and position.step % every == 0):
                progress.write(f"saved {save(config, position, model, optimizer, scheduler)}")
                epoch_save_due = False
        position.epoch_losses.append(sum(position.losses) / len(position.losses))
        scores = validation_scores(model, parts.eval_loader, parts.regression)
        position.scores.append(scores[primary_score(parts.regression)])
        log.write("epoch", epoch=epoch, step=position.step, train_loss=position.epoch_losses[-1],
                  **{f"eval_{name}": value for name, value in scores.items()})
        progress.write(f"epoch {epoch}: train loss {position.epoch_losses[-1]:.4f}, validation "
                       + ", ".join(f"{name} {value:.4f}" for name, value in scores.items()))
        position.epoch, position.batches_done, position.losses = epoch + 1, 0, []
        position.shuffle_state = shuffler.get_state()  # the next epoch begins from here
        if every == "epoch":  # between updates: now, or after the update that takes the pending batches
            if pending:
                epoch_save_due = True
            else:
                progress.write(f"saved {save(config, position, model, optimizer, scheduler)}")


def _names_in_group_order(optimizer, model) -> list[str]:
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def summary_table(summaries: list[dict]) -> str:
    """A markdown table: one row per run. Runs scored alike share the column's name (best accuracy, best pearson);
    a table mixing classification and regression runs names each run's metric beside its score."""
    metrics = [s.get("metric", "accuracy") for s in summaries]
    shared = len(set(metrics)) <= 1
    header = f"best {metrics[0]}" if metrics and shared else "best score"
    lines = [f"| method | seed | terminal train loss | {header} | optimizer state | wall time |",
             "|---|---:|---:|---:|---:|---:|"]
    for s, metric in zip(summaries, metrics, strict=True):
        best = f"{s[f'best_{metric}']:.4f}" + ("" if shared else f" ({metric})")
        lines.append(f"| {s['method']} | {s['seed']} | {s['terminal_train_loss']:.4f} | {best} | "
                     f"{s['optimizer_state_bytes'] / 2**20:.2f} MiB | {s['wall_time_s']:.0f} s |")
    return "\n".join(lines)
