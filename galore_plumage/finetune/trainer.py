"""Our optimizers inside `transformers.Trainer`: `Trainer(..., optimizers=optimizer_for_trainer(model, args, name))`.

`optimizer_for_trainer` reads what Trainer users already set in `TrainingArguments`: `optim_target_modules`
(HF's patterns: a list of substrings or regexes, a single regex, or "all-linear"), `optim_args` (HF's GaLore keys:
"rank=64, update_proj_gap=100, scale=0.25, proj_type=std"), `learning_rate`, `weight_decay`, Adam's betas and eps,
`gradient_accumulation_steps` and `max_grad_norm`, and returns `(optimizer, scheduler)`:

    args = TrainingArguments("out", optim_target_modules=["attention", "intermediate", "output.dense"],
                             learning_rate=1e-4, max_steps=1000, save_steps=100)
    trainer = Trainer(model, args, train_dataset=..., optimizers=optimizer_for_trainer(model, args, "plumage_adamw"))
    trainer.train()                              # later: trainer.train(resume_from_checkpoint=True)

Normal mode returns no scheduler (Trainer builds its own from `lr_scheduler_type`). Per-layer mode
(`*_per_layer` names) steps each weight inside its gradient hook; Trainer cannot build a scheduler over
that wrapper, so one is built here over the wrapped optimizer (`num_training_steps` or `args.max_steps`
must be known), gradient clipping must be off (`max_grad_norm=0`) and accumulation 1, because Trainer
may end an epoch on a partial accumulation that the hooks would carry into the next. torch then warns once
that the scheduler stepped before `optimizer.step()`: expected, the weights stepped in their hooks. Trainer's
checkpoints hold the optimizer's `state_dict()` (plain tensors and numbers), so they resume.
"""

from __future__ import annotations

import re

from torch import nn

from ..optimizers import LayerwiseOptimizer, build_optimizer, optimizer_spec

ADAM_BACKENDS = ("adamw", "adamw8bit")


def resolve_target_modules(model: nn.Module, patterns) -> list[str]:
    """Names of the nn.Linear modules that HF-style `optim_target_modules` patterns select.

    A string is "all-linear" or a regex the whole module name must match; a list selects a module when an
    entry is a substring of its name or a regex matching all of it (the rules Trainer applies for GaLore).
    """
    if isinstance(patterns, str):
        if patterns.replace("_", "-") == "all-linear":
            def selected(name):
                return True
        else:
            compiled = re.compile(patterns)

            def selected(name):
                return compiled.fullmatch(name) is not None
    elif isinstance(patterns, (list, tuple)) and patterns and all(isinstance(p, str) for p in patterns):
        def selected(name):
            return any(p in name or re.fullmatch(p, name) for p in patterns)
    else:
        raise ValueError(f"optim_target_modules must be a non-empty list of strings, a regex or 'all-linear'; got {patterns!r}")
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and selected(name)]
    if not names:
        raise ValueError(f"optim_target_modules {patterns!r} select no nn.Linear module of {type(model).__name__}")
    return names


# HF Trainer's GaLore reads these keys of TrainingArguments.optim_args, as these types
OPTIM_ARGS = {"rank": int, "update_proj_gap": int, "scale": float, "proj_type": str}
DEFAULTS = {"rank": 8, "update_proj_gap": 200}  # where neither the call nor optim_args sets them


def low_rank_settings(optim_args: str | None, given: dict) -> dict:
    """rank, update_proj_gap, scale and proj_type from HF's `optim_args` string ("rank=64, scale=0.25"), under the
    values `given` to optimizer_for_trainer (None: not given); a key given both ways must agree."""
    settings = {key: value for key, value in given.items() if value is not None}
    for item in filter(None, (optim_args or "").replace(" ", "").split(",")):
        key, sep, text = item.partition("=")
        if not sep or key not in OPTIM_ARGS:
            raise ValueError(f"TrainingArguments(optim_args={optim_args!r}): {item!r} is not one of "
                             f"{', '.join(f'{k}=...' for k in OPTIM_ARGS)} (HF's GaLore keys)")
        try:
            value = OPTIM_ARGS[key](text)
        except ValueError:
            raise ValueError(f"TrainingArguments(optim_args={optim_args!r}): {key} must be {OPTIM_ARGS[key].__name__}, "
                             f"got {text!r}") from None
        if key in given and given[key] is not None and given[key] != value:
            raise ValueError(f"{key}={given[key]!r} passed to optimizer_for_trainer, {key}={value!r} in "
                             f"TrainingArguments(optim_args=...): give it once")
        settings[key] = value
    return {**DEFAULTS, **settings}


def registry_name(name: str) -> str:
    """Our name for HF Trainer's spelling of an optimizer (its `optim`: galore_adamw_8bit, galore_adamw_layerwise,
    galore_adafactor_layerwise, ...); other names unchanged."""
    return name.replace("_8bit", "8bit").replace("_layerwise", "_per_layer")


def optimizer_for_trainer(model: nn.Module, args, name: str = "plumage_adamw", rank: int | None = None,
                          update_proj_gap: int | None = None, num_training_steps: int | None = None, **options):
    """(optimizer, scheduler or None) for `Trainer(optimizers=...)`; `options` go to build_optimizer
    (scale, proj_type, projector, realign, seed, ...). rank, update_proj_gap, scale and proj_type come from the call or
    from `args.optim_args` (defaults: rank 8, update_proj_gap 200, the optimizer's own scale and proj_type). `name` may
    be spelled as HF's `optim` is (galore_adamw_8bit_layerwise: our galore_adamw8bit_per_layer)."""
    name = registry_name(name)
    spec = optimizer_spec(name)
    given = {"rank": rank, "update_proj_gap": update_proj_gap, "scale": options.pop("scale", None),
             "proj_type": options.pop("proj_type", None)}
    settings = low_rank_settings(getattr(args, "optim_args", None) if spec.projector is not None else None, given)
    patterns = getattr(args, "optim_target_modules", None)
    targets: list[str] = []
    if spec.projector is not None:
        if patterns is None:
            raise ValueError(f"{name} is low-rank: set TrainingArguments(optim_target_modules=...) to the modules to "
                             "project, e.g. ['attention', 'intermediate', 'output.dense'] or 'all-linear'")
        targets = resolve_target_modules(model, patterns)
    kwargs = {"lr": args.learning_rate, "weight_decay": args.weight_decay}
    if spec.backend in ADAM_BACKENDS:
        kwargs.update(betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    if spec.per_layer:
        if args.gradient_accumulation_steps != 1:
            raise ValueError(f"{name} under Trainer needs gradient_accumulation_steps=1, got "
                             f"{args.gradient_accumulation_steps}: Trainer can end an epoch on a partial accumulation")
        try:
            LayerwiseOptimizer.refuse_clipping(args.max_grad_norm)
        except ValueError as error:
            raise ValueError(f"TrainingArguments(max_grad_norm={args.max_grad_norm}) with {name}: {error}") from None
    optimizer = build_optimizer(name, model, target_modules=tuple(targets) or ("attn", "mlp"), **settings, **kwargs,
                                **options)
    chosen = {r.name.removesuffix(".weight") for r in optimizer.routing if r.low_rank}
    if spec.projector is not None and chosen != set(targets):  # substring routing must not pick up extra modules
        raise RuntimeError(f"routing picked {sorted(chosen ^ set(targets))} differently from optim_target_modules")
    if not spec.per_layer:
        return optimizer, None
    return optimizer, _scheduler_for_wrapped(optimizer, args, num_training_steps)


def _scheduler_for_wrapped(optimizer: LayerwiseOptimizer, args, num_training_steps: int | None):
    from transformers import get_scheduler

    total = num_training_steps if num_training_steps is not None else args.max_steps
    if total is None or total <= 0:
        raise ValueError("per-layer mode builds the lr scheduler itself: set TrainingArguments(max_steps=...) or pass "
                         "num_training_steps")
    return get_scheduler(args.lr_scheduler_type, optimizer.optimizer, num_warmup_steps=args.get_warmup_steps(total),
                         num_training_steps=total, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
