"""The training run behind torchrun_main.py: `Trainer` (setup, resume, update, evaluate, checkpoint, summary) and
the helpers it shares with the benchmarks (seed_everything, make_optimizer, evaluate, weight_fingerprint).

Differences from GaLore's script, on purpose: exactly `num_training_steps` updates (GaLore ran one
more); `--max_train_tokens` counts tokens; eval loss is the token-weighted mean over all ranks;
saving works without DDP and in per-layer mode; checkpoints are atomic and carry the data position
and RNG, so a resumed run continues bit for bit on CPU.
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from ..optimizers import build_optimizer, describe_routing, optimizer_spec
from ..optimizers.layerwise import inner_optimizer
from .checkpoint import (
    load_checkpoint,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    saved_config,
    set_rng_state,
    warn,
)
from .config import BATCH_LAYOUT, RESUME_MAY_CHANGE, TrainConfig, is_streamed, resume_conflicts
from .data import Batches
from .distributed import Dist, all_reduce_sum, barrier, computed_on_main, gather_floats
from .fsdp import ensure_process_group, load_sharded_checkpoint, save_sharded_checkpoint, shard_model
from .metrics import MetricsLog, Progress, perplexity, projector_records
from .model import build_model, load_model_config
from .run_folder import clear_run, remove_stale_temps, truncate_metrics
from .schedule import build_scheduler, step_scheduler
from .trackers import open_tracker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# torchrun_main.py's exit status when the loss became non-finite: a run that diverged, told apart from one that failed
# (benchmarks/pretrain_protocol.py counts it as a result, +inf)
DIVERGED = 3


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def optimizer_options(config: TrainConfig) -> dict:
    """GaLore's per-backend arguments: Adafactor with a fixed lr and beta1 (0 -> none), SGD's momentum = beta1."""
    backend = optimizer_spec(config.optimizer).backend
    options = {"lr": config.lr, "weight_decay": config.weight_decay}
    if backend == "adafactor":
        options.update(beta1=config.beta1 or None, relative_step=False, scale_parameter=False, warmup_init=False,
                       eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8)
    elif backend == "sgdm":
        options.update(momentum=config.beta1)
    options["seed"] = config.seed if config.projection_seed is None else config.projection_seed
    options.update(config.low_rank)
    return options


def make_optimizer(config: TrainConfig, model: torch.nn.Module):
    """The run's optimizer over `model`, from the command line's optimizer flags."""
    return build_optimizer(
        config.optimizer, model, rank=config.rank, update_proj_gap=config.update_proj_gap, scale=config.galore_scale,
        proj_type=config.proj_type, projector=config.projector, realign=config.realign, preset=config.preset,
        accumulation_steps=config.gradient_accumulation, grad_clipping=config.grad_clipping, regular_lr=config.regular_lr,
        **optimizer_options(config),
    )


@torch.no_grad()
def evaluate(model, batches: list[torch.Tensor], context: Dist, autocast) -> tuple[float, int]:
    """Token-weighted mean loss over the fixed validation set of all ranks, and the number of target tokens."""
    model.eval()
    loss_sum, count = 0.0, 0
    for batch in batches:
        batch = batch.to(context.device)
        with autocast():
            loss = model(input_ids=batch, labels=batch).loss
        targets = batch[:, 1:].numel()  # each sequence predicts its max_length - 1 next tokens
        loss_sum += loss.float().item() * targets
        count += targets
    model.train()
    loss_sum, count = all_reduce_sum(loss_sum, count, context=context)
    if count == 0:
        raise ValueError("the validation split is empty: use more text or a shorter --max_length")
    return loss_sum / count, int(count)


def find_resume(config: TrainConfig, context: Dist) -> tuple[Path | None, dict]:
    """The checkpoint to resume (None for a new run) and the flags of the run that wrote it ({} if it predates them),
    found before any data is read; one written by a run with other flags is refused, naming each. The main rank
    verifies the files (hashes them) and tells the others."""
    if config.continue_from is None:
        return None, {}
    folder = computed_on_main(lambda: resolve_checkpoint(config.continue_from), context)
    saved = saved_config(folder) or {}
    if conflicts := resume_conflicts(saved, config, may_change(saved, config)) if saved else []:
        raise ValueError(f"--continue_from {config.continue_from!r}: {folder.name} was written by a run with other "
                         f"flags: {'; '.join(conflicts)}. Give the checkpoint's values (or drop those flags), or start "
                         "a new run in a new --save_dir")
    return folder, saved


def may_change(saved: dict, config: TrainConfig) -> frozenset[str]:
    """The flags a resume of the run `saved` may change: RESUME_MAY_CHANGE, and how each update's sequences are split
    over processes and micro-batches (BATCH_LAYOUT) while --total_batch_size stays. An in-memory corpus's position
    moves over in sequences; a streamed one is split by process and packed by micro-batch, so it keeps the writer's."""
    if saved.get("total_batch_size") == config.total_batch_size and not is_streamed(config.dataset, config.streaming):
        return RESUME_MAY_CHANGE | BATCH_LAYOUT
    return RESUME_MAY_CHANGE


def claim_save_dir(config: TrainConfig) -> None:
    """Main rank, once data, model and optimizer are built (the input is known good): delete the old run for
    --overwrite and the temp folders of killed saves."""
    save_dir = Path(config.save_dir)
    if config.overwrite and (removed := clear_run(save_dir)):
        print(f"--overwrite: deleted {', '.join(removed)} from {save_dir}")
    if stale := remove_stale_temps(save_dir):
        warn(f"removed {', '.join(stale)} from {save_dir}: left by a save that was killed")


def load_data(config: TrainConfig, context: Dist) -> Batches:
    """The run's batches. The main rank fetches the corpus and trains the tokenizer first, so ranks never race on
    the cache; the all-reduce doubles as the barrier and tells the other ranks to stop if it failed."""
    batches, failure = None, None
    if context.is_main:
        try:
            batches = Batches(config, context)
        except Exception as error:  # noqa: BLE001 - re-raised below, after the other ranks know
            failure = error
    (ready,) = all_reduce_sum(0.0 if failure else 1.0, context=context)
    if failure is not None:
        raise failure
    if ready < context.world_size:
        raise RuntimeError("rank 0 could not prepare the data (its error is above); stopping")
    return batches if context.is_main else Batches(config, context)


class Trainer:
    """One pretraining job: `Trainer(config, context)` sets it up (data, model, optimizer, schedule, the resumed
    state), `run()` does the updates, evaluations and checkpoints and returns the summary."""

    def __init__(self, config: TrainConfig, context: Dist):
        seed_everything(config.seed)
        self.config, self.context, self.main = config, context, context.is_main
        resume_folder, saved = find_resume(config, context)
        tracker = open_tracker(config.report_to, config.wandb_project, config.name, config.tags, asdict(config)) \
            if self.main else None
        self.log = MetricsLog(config.save_dir, enabled=self.main, tracker=tracker)
        self.batches = load_data(config, context)
        tokenizer = self.batches.tokenizer
        model_config = load_model_config(config.model_config, len(tokenizer), tokenizer.eos_token_id)
        self.dtype = DTYPES[config.dtype]
        self.model = build_model(model_config, self.dtype, context.device, config.seed, config.activation_checkpointing)
        if config.fsdp:  # before the optimizer is built: it must hold the sharded (DTensor) parameters
            ensure_process_group(context)
            shard_model(self.model)
        self.optimizer = make_optimizer(config, self.model)
        self.inner = inner_optimizer(self.optimizer)  # per-layer mode: the scheduler drives the wrapped optimizer
        self.regular_change = self._regular_change()
        self.scheduler = build_scheduler(self.inner, config.scheduler, config.warmup_steps, config.num_training_steps,
                                         config.min_lr_ratio, self.regular_change)
        # the regular group's own lr is logged beside --lr's where it has one (built first, the only group without rank)
        self.logs_regular_lr = (config.regular_lr is not None or self.regular_change is not None) \
            and "rank" not in self.inner.param_groups[0]
        self.index_names = _names_by_group_index(self.inner, self.model)
        if self.main:
            claim_save_dir(config)
        self.update_step, self.tokens_seen = 0, 0
        if resume_folder is not None:
            self.resume(resume_folder, saved)
        self.announce()
        self.ddp_model = self.model
        if context.active and not config.fsdp:
            self.ddp_model = DistributedDataParallel(
                self.model, device_ids=[context.local_rank] if context.device.type == "cuda" else None)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.progress = Progress(config.num_training_steps, self.update_step, enabled=self.main and config.progress)

    def _regular_change(self) -> tuple[int, float] | None:
        """(update, times): --regular_lr_ratio_on_repeat's change of the regular group's lr, from the update that
        begins the training text's second pass; None without it. (On the plays read 1.9 times, 4x then 1x lowered
        plumage_adafactor's training loss and raised its eval loss; docs/results.md §3, session 87.)"""
        config = self.config
        if config.regular_lr_ratio_on_repeat is None:
            return None
        before = config.regular_lr if config.regular_lr is not None else config.lr
        times = config.regular_lr_ratio_on_repeat * config.lr / before if before > 0 else 1.0
        return self.batches.shuffled.first_repeat_update(config.gradient_accumulation), times

    def resume(self, folder: Path, saved: dict) -> None:
        """Model, optimizer, schedule, data position, RNG and counters from a checkpoint (`saved`: its writer's flags,
        whose batch layout may differ: may_change); the run's own log is cut back to it, so the updates about to be
        replayed are not counted twice."""
        if self.config.fsdp:
            state = load_sharded_checkpoint(folder, self.model, self.optimizer, saved.get("world_size"))
        else:
            state = load_checkpoint(folder, self.model)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        saved_width = saved["batch_size"] * saved["world_size"] if "world_size" in saved else None
        self.batches.load_state_dict(state["data"], saved_width)
        set_rng_state(state["rng"])
        self.update_step, self.tokens_seen = state["update_step"], state["tokens_seen"]
        if self.main:
            print(f"resumed from {folder} at update {self.update_step} ({self.tokens_seen:,} tokens)")
            if folder.parent.resolve() == Path(self.config.save_dir).resolve():
                truncate_metrics(Path(self.config.save_dir), self.update_step)

    def announce(self) -> None:
        """What runs, on stdout and as the log's config record (main rank)."""
        if not self.main:
            return
        config, context = self.config, self.context
        params = sum(p.numel() for p in self.model.parameters())
        print(f"model {config.model_config}: {params / 1e6:.2f}M parameters, vocab {len(self.batches.tokenizer)}, "
              f"{config.dtype}, {context.world_size} process(es) on {context.device.type}")
        print(f"optimizer {config.optimizer}: " + describe_routing(self.optimizer.routing, config.rank))
        print(f"{config.num_training_steps} updates of {config.total_batch_size} x {config.max_length} tokens "
              f"(batch {config.batch_size} x accumulation {config.gradient_accumulation} x world {context.world_size})")
        change = self.regular_change
        if change is not None:
            before = (config.regular_lr or config.lr) / config.lr if config.lr > 0 else 1.0
            print(f"the regular group's lr: {before:g} x --lr's through update {change[0]}, "
                  f"{config.regular_lr_ratio_on_repeat:g} x from update {change[0] + 1}, where the training text is "
                  "read a second time (--regular_lr_ratio_on_repeat)")
        self.log.write("config", step=self.update_step, **asdict(config))

    def autocast(self):
        return torch.autocast(self.context.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def forward_backward(self) -> torch.Tensor:
        """The micro-batches of one update, gradients accumulated; their summed loss (on device: one sync an update)."""
        config, context, accumulation = self.config, self.context, self.config.gradient_accumulation
        loss_sum = torch.zeros((), dtype=torch.float64, device=context.device)
        for micro in range(accumulation):
            batch = self.batches.next().to(context.device)
            last_micro = micro == accumulation - 1
            # only all-reduce (FSDP2: reduce-scatter) gradients at the last micro-step of an update
            sync = (contextlib.nullcontext() if last_micro or not context.active or config.fsdp
                    else self.ddp_model.no_sync())
            if config.fsdp:
                self.model.set_requires_gradient_sync(last_micro)
            with sync:
                with self.autocast():
                    loss = self.ddp_model(input_ids=batch, labels=batch).loss
                (loss / accumulation).backward()
            loss_sum += loss.detach().double()
        return loss_sum

    def update(self) -> None:
        """One optimizer update, logged; FloatingPointError on a non-finite loss (torchrun_main.py exits DIVERGED)."""
        config = self.config
        loss_sum = self.forward_backward()
        if not torch.isfinite(loss_sum):
            raise FloatingPointError(f"non-finite training loss at update {self.update_step + 1}; lower --lr or enable "
                                     f"--grad_clipping. The last checkpoint is left untouched")
        extra = {}  # the record's optional fields
        if config.grad_clipping > 0:  # resolve() refused clipping for per-layer optimizers
            norm = torch.nn.utils.clip_grad_norm_(self.trainable, config.grad_clipping)
            # the norm before clipping, logged: how often the clip binds. FSDP2's is a replicated DTensor
            extra["grad_norm"] = (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
        lr = self.inner.param_groups[-1]["lr"]  # --lr's group: the low-rank one is built last (--regular_lr: the first)
        if self.logs_regular_lr:
            extra["regular_lr"] = self.inner.param_groups[0]["lr"]
        self.optimizer.step()
        step_scheduler(self.scheduler)
        self.optimizer.zero_grad(set_to_none=True)
        self.update_step += 1
        self.tokens_seen += config.tokens_per_update
        (loss_total,) = all_reduce_sum(loss_sum.item(), context=self.context)
        train_loss = loss_total / (config.gradient_accumulation * self.context.world_size)
        rate = self.progress.update(train_loss, lr, config.tokens_per_update)
        self.log.write("train", step=self.update_step, loss=train_loss, lr=lr, tokens=self.tokens_seen,
                       tokens_per_s=rate, **extra)

    def evaluate(self) -> float:
        """Eval loss on the fixed validation batches, logged with the projectors' statistics."""
        step = self.update_step
        eval_loss, eval_count = evaluate(self.ddp_model, self.batches.validation, self.context, self.autocast)
        eval_ppl = perplexity(eval_loss)
        self.log.write("eval", step=step, eval_loss=eval_loss, eval_ppl=eval_ppl, eval_tokens=eval_count,
                       tokens=self.tokens_seen)
        for record in projector_records(self.optimizer, self.index_names):
            self.log.write("projector", step=step, **record)
        self.progress.write(f"update {step}: eval loss {eval_loss:.4f}, ppl {eval_ppl:.2f} on {eval_count:,} tokens")
        return eval_loss

    def checkpoint(self) -> None:
        config, step, main = self.config, self.update_step, self.main
        trainer_state = {"scheduler": self.scheduler.state_dict(), "data": self.batches.state_dict(),
                         "rng": rng_state(), "update_step": step, "tokens_seen": self.tokens_seen}
        summary = {"update_step": step, "tokens_seen": self.tokens_seen, "optimizer": config.optimizer,
                   "config": asdict(config)}  # what a resume is checked against
        if config.fsdp:  # every rank writes its own shards of the model and the optimizer
            folder = save_sharded_checkpoint(config.save_dir, step, self.model, self.optimizer, trainer_state, summary,
                                             main)
        elif main:
            folder = save_checkpoint(config.save_dir, step, self.model,
                                     {"optimizer": self.optimizer.state_dict(), **trainer_state}, summary,
                                     self.batches.tokenizer)
        if main:
            self.progress.write(f"saved {folder}")
            remove_stale_temps(Path(config.save_dir))
        barrier(self.context)

    def run(self) -> dict:
        """The updates up to --stop_at or the end, evaluating and saving on schedule; the summary."""
        config = self.config
        last_saved, last_eval = None, None
        start = time.perf_counter()
        stop = config.stop_at if config.stop_at is not None else config.num_training_steps
        while self.update_step < stop:
            self.update()
            if self.update_step % config.eval_every == 0:
                last_eval = (self.update_step, self.evaluate())
            if self.update_step % config.save_every == 0:
                self.checkpoint()
                last_saved = self.update_step
        self.progress.close()
        if last_saved != self.update_step:
            self.checkpoint()
        if self.update_step < config.num_training_steps:
            if self.main:
                print(f"stopped at update {self.update_step} of {config.num_training_steps} (--stop_at); "
                      f"resume with --continue_from {config.save_dir}")
            return {"step": self.update_step, "tokens": self.tokens_seen, "stopped": True, "save_dir": config.save_dir}
        eval_loss = last_eval[1] if last_eval and last_eval[0] == self.update_step else self.evaluate()
        return self.finish(eval_loss, time.perf_counter() - start)

    def finish(self, eval_loss: float, seconds: float) -> dict:
        """The summary record (and the check that every rank ended with the same weights)."""
        config, step = self.config, self.update_step
        fingerprints = gather_floats(weight_fingerprint(self.model), context=self.context)
        if self.main and len(set(fingerprints)) > 1:
            print(f"WARNING: the ranks ended with different weights (fingerprints {fingerprints})")
        summary = {"step": step, "tokens": self.tokens_seen, "eval_loss": eval_loss, "eval_ppl": perplexity(eval_loss),
                   "seconds": seconds, "optimizer": config.optimizer, "save_dir": config.save_dir,
                   "rank_fingerprints": fingerprints, "passes": self.batches.passes}
        self.log.write("summary", **summary)
        if self.main:
            passes = summary["passes"]
            read = "" if passes is None else f" ({passes:.2f} passes over the training text)"
            print(f"done: {step} updates, {self.tokens_seen:,} tokens{read}, final eval loss {eval_loss:.4f}, "
                  f"ppl {summary['eval_ppl']:.2f}; metrics in {self.log.path}, checkpoint in "
                  f"{config.save_dir}/model_{step}")
        return summary


def train(config: TrainConfig, context: Dist) -> dict:
    """Run the whole job; returns the final summary (also the last line of metrics.jsonl)."""
    trainer = Trainer(config, context)
    try:
        return trainer.run()
    finally:
        trainer.log.close()  # the tracker's run ends with the job, stopped or failed too


@torch.no_grad()
def weight_fingerprint(model) -> float:
    """One float64 that changes with any weight: Σ_tensors Σ_i w_i·cos(i + k) — cheap, with no full copy."""
    total, chunk = 0.0, 1 << 22  # chunked so a 7B embedding never needs a float64 copy of itself
    for k, param in enumerate(model.parameters()):
        if isinstance(param, DTensor):  # FSDP2: every rank fingerprints the whole weight, not its shard
            param = param.full_tensor()
        flat = param.detach().reshape(-1)
        for start in range(0, flat.numel(), chunk):
            piece = flat[start : start + chunk].double()
            phase = torch.arange(start, start + piece.numel(), device=piece.device, dtype=torch.float64).add_(k).cos_()
            total += float(piece.dot(phase))
    return total


def _names_by_group_index(optimizer, model) -> dict[int, str]:
    """Index of each parameter in the optimizer's groups (how projector_stats keys them) -> its name."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    return {i: name_of[id(p)] for i, p in enumerate(flat)}
