"""The training run behind torchrun_main.py: setup, the update loop, evaluation, checkpoints, summary.

Differences from GaLore's script, on purpose: exactly `num_training_steps` updates (GaLore ran one
more); `--max_train_tokens` counts tokens; eval loss is the token-weighted mean over all ranks;
saving works without DDP and in per-layer mode; checkpoints are atomic and carry the data position
and RNG, so a resumed run continues bit for bit on CPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from ..optimizers import build_optimizer, describe_routing, optimizer_spec
from . import data as data_lib
from .checkpoint import load_checkpoint, resolve_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import TrainConfig, resume_conflicts
from .distributed import Dist, all_reduce_sum, barrier, gather_floats
from .fsdp import ensure_process_group, load_sharded_checkpoint, save_sharded_checkpoint, shard_model
from .metrics import MetricsLog, Progress, projector_records
from .model import build_model, load_model_config
from .run_folder import clear_run, remove_stale_temps, truncate_metrics
from .schedule import build_scheduler, step_scheduler
from .tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Batches:
    """One interface over the two data sources: next(), state_dict(), and the fixed validation batches."""

    def __init__(self, config: TrainConfig, context: Dist):
        self.config, self.context = config, context
        self.streamed = data_lib.is_streamed(config.dataset)
        texts = (None, None) if self.streamed else data_lib.load_texts(config)
        self.tokenizer = load_tokenizer(config.tokenizer, texts[0], config.vocab_size, config.data_dir, config.max_length)
        rank, world = context.rank, context.world_size
        if self.streamed:
            self._train_stream = data_lib.stream_hub_dataset(config.dataset, "train", config.seed)
            self.position = 0
            self._iterator = None
            validation = data_lib.stream_hub_dataset(config.dataset, "validation", config.seed)
            self.validation = data_lib.streamed_eval_batches(validation, self.tokenizer, config.max_length,
                                                             config.batch_size, config.eval_tokens, rank, world)
        else:
            train = data_lib.pack(texts[0], self.tokenizer, config.max_length)
            self.shuffled = data_lib.ShuffledBatches(train, config.batch_size, config.seed, rank, world)
            self.validation = data_lib.eval_batches(data_lib.pack(texts[1], self.tokenizer, config.max_length),
                                                    config.batch_size, config.eval_tokens, rank, world)

    def next(self) -> torch.Tensor:
        if not self.streamed:
            return self.shuffled.next_batch()
        if self._iterator is None:
            dataset = data_lib.StreamedBatches(self._train_stream, self.tokenizer, self.config.max_length,
                                               self.config.batch_size, self.context.rank, self.context.world_size,
                                               skip=self.position)
            loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=self.config.workers)
            self._iterator = iter(loader)
        self.position += 1
        return next(self._iterator)

    def state_dict(self) -> dict:
        return {"position": self.position} if self.streamed else self.shuffled.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.streamed:
            self.position, self._iterator = state["position"], None
        else:
            self.shuffled.load_state_dict(state)


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
    options["seed"] = config.seed
    options.update(config.low_rank)
    return options


def make_optimizer(config: TrainConfig, model: torch.nn.Module):
    """The run's optimizer over `model`, from the command line's optimizer flags."""
    return build_optimizer(
        config.optimizer, model, rank=config.rank, update_proj_gap=config.update_proj_gap, scale=config.galore_scale,
        proj_type=config.proj_type, projector=config.projector, realign=config.realign,
        accumulation_steps=config.gradient_accumulation, grad_clipping=config.grad_clipping, **optimizer_options(config),
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


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr)


def find_resume(config: TrainConfig, main: bool) -> Path | None:
    """The checkpoint to resume (None for a new run), found before any data is read; one written by a run with
    other flags is refused, naming each."""
    if config.continue_from is None:
        return None
    folder = resolve_checkpoint(config.continue_from, warn=_warn if main else lambda _: None)
    state_file = folder / "training_state.json"  # its "config" is the run that wrote it (absent before session 7)
    saved = json.loads(state_file.read_text()).get("config") if state_file.is_file() else None
    if conflicts := resume_conflicts(saved, config) if saved else []:
        raise ValueError(f"--continue_from {config.continue_from!r}: {folder.name} was written by a run with other "
                         f"flags: {'; '.join(conflicts)}. Give the checkpoint's values (or drop those flags), or start "
                         "a new run in a new --save_dir")
    return folder


def claim_save_dir(config: TrainConfig) -> None:
    """Main rank, once data, model and optimizer are built (the input is known good): delete the old run for
    --overwrite and the temp folders of killed saves."""
    save_dir = Path(config.save_dir)
    if config.overwrite and (removed := clear_run(save_dir)):
        print(f"--overwrite: deleted {', '.join(removed)} from {save_dir}")
    if stale := remove_stale_temps(save_dir):
        _warn(f"removed {', '.join(stale)} from {save_dir}: left by a save that was killed")


def train(config: TrainConfig, context: Dist) -> dict:
    """Run the whole job; returns the final summary (also the last line of metrics.jsonl)."""
    seed_everything(config.seed)
    main = context.is_main
    resume_folder = find_resume(config, main)
    log = MetricsLog(config.save_dir, enabled=main)

    # the main rank fetches the corpus and trains the tokenizer first, so ranks never race on the cache; the
    # all-reduce doubles as the barrier and tells the other ranks to stop if it failed, instead of waiting
    failure = None
    if main:
        try:
            batches = Batches(config, context)
        except Exception as error:  # noqa: BLE001 - re-raised below, after the other ranks know
            failure = error
    (ready,) = all_reduce_sum(0.0 if failure else 1.0, context=context)
    if failure is not None:
        raise failure
    if ready < context.world_size:
        raise RuntimeError("rank 0 could not prepare the data (its error is above); stopping")
    if not main:
        batches = Batches(config, context)

    tokenizer = batches.tokenizer
    model_config = load_model_config(config.model_config, len(tokenizer), tokenizer.eos_token_id)
    dtype = DTYPES[config.dtype]
    model = build_model(model_config, dtype, context.device, config.seed, config.activation_checkpointing)
    if config.fsdp:  # before the optimizer is built: it must hold the sharded (DTensor) parameters
        ensure_process_group(context)
        shard_model(model)

    optimizer = make_optimizer(config, model)
    inner = getattr(optimizer, "optimizer", optimizer)  # per-layer mode: the scheduler drives the wrapped optimizer
    scheduler = build_scheduler(inner, config.scheduler, config.warmup_steps, config.num_training_steps,
                                config.min_lr_ratio)
    index_names = _names_by_group_index(inner, model)

    if main:
        claim_save_dir(config)
    update_step, tokens_seen = 0, 0
    if resume_folder is not None:
        folder = resume_folder
        if config.fsdp:
            state = load_sharded_checkpoint(folder, model, optimizer)
        else:
            state = load_checkpoint(folder, model)
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        batches.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        update_step, tokens_seen = state["update_step"], state["tokens_seen"]
        if main:
            print(f"resumed from {folder} at update {update_step} ({tokens_seen:,} tokens)")
            if folder.parent.resolve() == Path(config.save_dir).resolve():  # its own log: the replayed updates go
                truncate_metrics(Path(config.save_dir), update_step)

    if main:
        params = sum(p.numel() for p in model.parameters())
        print(f"model {config.model_config}: {params / 1e6:.2f}M parameters, vocab {len(tokenizer)}, {config.dtype}, "
              f"{context.world_size} process(es) on {context.device.type}")
        print(f"optimizer {config.optimizer}: " + describe_routing(optimizer.routing, config.rank))
        print(f"{config.num_training_steps} updates of {config.total_batch_size} x {config.max_length} tokens "
              f"(batch {config.batch_size} x accumulation {config.gradient_accumulation} x world {context.world_size})")
        log.write("config", step=update_step, **{k: v for k, v in asdict(config).items()})

    ddp_model = model
    if context.active and not config.fsdp:
        ddp_model = DistributedDataParallel(model, device_ids=[context.local_rank] if context.device.type == "cuda"
                                            else None)

    def autocast():
        return torch.autocast(context.device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)

    trainable = [p for p in model.parameters() if p.requires_grad]
    progress = Progress(config.num_training_steps, update_step, enabled=main and config.progress)
    last_saved, last_eval = None, None
    accumulation = config.gradient_accumulation

    def checkpoint(step: int) -> None:
        trainer_state = {"scheduler": scheduler.state_dict(), "data": batches.state_dict(), "rng": rng_state(),
                         "update_step": step, "tokens_seen": tokens_seen}
        summary = {"update_step": step, "tokens_seen": tokens_seen, "optimizer": config.optimizer,
                   "config": asdict(config)}  # what a resume is checked against
        if config.fsdp:  # every rank writes its own shards of the model and the optimizer
            folder = save_sharded_checkpoint(config.save_dir, step, model, optimizer, trainer_state, summary, main)
        elif main:
            folder = save_checkpoint(config.save_dir, step, model, {"optimizer": optimizer.state_dict(), **trainer_state},
                                     summary)
        if main:
            progress.write(f"saved {folder}")
            remove_stale_temps(Path(config.save_dir))
        barrier(context)

    def run_eval(step: int) -> float:
        eval_loss, eval_count = evaluate(ddp_model, batches.validation, context, autocast)
        eval_ppl = perplexity(eval_loss)
        log.write("eval", step=step, eval_loss=eval_loss, eval_ppl=eval_ppl, eval_tokens=eval_count,
                  tokens=tokens_seen)
        for record in projector_records(optimizer, index_names):
            log.write("projector", step=step, **record)
        progress.write(f"update {step}: eval loss {eval_loss:.4f}, ppl {eval_ppl:.2f} on {eval_count:,} tokens")
        return eval_loss

    start = time.perf_counter()
    stop = config.stop_at if config.stop_at is not None else config.num_training_steps
    while update_step < stop:
        loss_sum = torch.zeros((), dtype=torch.float64, device=context.device)  # summed on device: one sync an update
        for micro in range(accumulation):
            batch = batches.next().to(context.device)
            last_micro = micro == accumulation - 1
            # only all-reduce (FSDP2: reduce-scatter) gradients at the last micro-step of an update
            sync = contextlib.nullcontext() if last_micro or not context.active or config.fsdp else ddp_model.no_sync()
            if config.fsdp:
                model.set_requires_gradient_sync(last_micro)
            with sync:
                with autocast():
                    loss = ddp_model(input_ids=batch, labels=batch).loss
                (loss / accumulation).backward()
            loss_sum += loss.detach().double()
        if not torch.isfinite(loss_sum):
            raise FloatingPointError(f"non-finite training loss at update {update_step + 1}; lower --lr or enable "
                                     f"--grad_clipping. The last checkpoint is left untouched")
        if config.grad_clipping > 0:  # resolve() refused clipping for per-layer optimizers
            torch.nn.utils.clip_grad_norm_(trainable, config.grad_clipping)
        lr = inner.param_groups[0]["lr"]
        optimizer.step()
        step_scheduler(scheduler)
        optimizer.zero_grad(set_to_none=True)
        update_step += 1
        tokens_seen += config.tokens_per_update

        (loss_total,) = all_reduce_sum(loss_sum.item(), context=context)
        train_loss = loss_total / (accumulation * context.world_size)
        rate = progress.update(train_loss, lr, config.tokens_per_update)
        log.write("train", step=update_step, loss=train_loss, lr=lr, tokens=tokens_seen, tokens_per_s=rate)

        if update_step % config.eval_every == 0:
            last_eval = (update_step, run_eval(update_step))
        if update_step % config.save_every == 0:
            checkpoint(update_step)
            last_saved = update_step
    progress.close()

    if last_saved != update_step:
        checkpoint(update_step)
    if update_step < config.num_training_steps:
        if main:
            print(f"stopped at update {update_step} of {config.num_training_steps} (--stop_at); "
                  f"resume with --continue_from {config.save_dir}")
        return {"step": update_step, "tokens": tokens_seen, "stopped": True, "save_dir": config.save_dir}
    eval_loss = last_eval[1] if last_eval and last_eval[0] == update_step else run_eval(update_step)
    fingerprints = gather_floats(weight_fingerprint(model), context=context)
    if main and len(set(fingerprints)) > 1:
        print(f"WARNING: the ranks ended with different weights (fingerprints {fingerprints})")
    summary = {
        "step": update_step, "tokens": tokens_seen, "eval_loss": eval_loss, "eval_ppl": perplexity(eval_loss),
        "seconds": time.perf_counter() - start, "optimizer": config.optimizer, "save_dir": config.save_dir,
        "rank_fingerprints": fingerprints,
    }
    log.write("summary", **summary)
    if main:
        print(f"done: {update_step} updates, {tokens_seen:,} tokens, final eval loss {eval_loss:.4f}, "
              f"ppl {summary['eval_ppl']:.2f}; metrics in {log.path}, checkpoint in {config.save_dir}/model_{update_step}")
    return summary


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


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))  # capped so a diverged run logs a number, not an overflow


def _names_by_group_index(optimizer, model) -> dict[int, str]:
    """Index of each parameter in the optimizer's groups (how projector_stats keys them) -> its name."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    return {i: name_of[id(p)] for i, p in enumerate(flat)}
