"""Peak device memory of one training step, split into weights, gradients, optimizer state and activations: a
by-hand benchmark (docs/memory.md), not a test.

    python benchmarks/peak_memory.py                       # CPU: the term model for every size and optimizer
    python benchmarks/peak_memory.py --device cuda         # also measure each row (torch.cuda.max_memory_allocated)
    python benchmarks/peak_memory.py --sizes 60m,1b --optimizers adamw8bit,plumage_adamw8bit_per_layer

The terms, for a Llama config, a dtype, a batch of b sequences of s tokens and an optimizer (rank r):
    weights      Σ numel × bytes of the dtype (exact)
    gradients    the same for every weight; per-layer optimizers step and free each gradient inside its hook, so
                 only the largest one is held
    state        bytes of optimizer.state after one step (projector bases, pools and 8-bit absmax included),
                 counted exactly: one weight of each distinct shape is stepped on the CPU, times its count
    activations  what autograd saves in the forward pass, counted by a saved-tensors hook on the CPU for a model of
                 one and of two decoder layers at the real width and batch: head + L × layer; with activation
                 checkpointing, head + L × (b·s·h, the layer inputs kept) + one layer (recomputed in backward)
    refresh      the transient of the largest SVD at a refresh (float32 gradient copy, U, Vᵀ), low-rank only
Peak: weights + state + gradients + max(activations, refresh); per-layer: weights + state + largest gradient +
activations + refresh (the refresh runs inside backward, while activations are alive).
Not counted: the allocator's fragmentation and cuBLAS/cuSOLVER workspaces (measured on CUDA, they are in the
measured column). The attention counted on the CPU keeps its probabilities (b·heads·s² per layer) where CUDA's
flash attention keeps none: with checkpointing only one layer's worth is affected.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from galore_plumage.optimizers import build_optimizer, optimizer_spec  # noqa: E402
from galore_plumage.optimizers.layerwise import inner_optimizer  # noqa: E402
from galore_plumage.optimizers.memory import state_bytes  # noqa: E402

GIB = 2**30
SIZES = {"60m": (128, 256), "130m": (256, 256), "350m": (256, 256), "1b": (512, 256), "7b": (1024, 256)}  # rank, s
OPTIMIZERS = ("adamw", "adamw8bit", "galore_adamw", "galore_adamw8bit", "galore_adamw8bit_per_layer",
              "plumage_adamw", "plumage_adamw8bit", "plumage_adamw8bit_per_layer", "plumage_adafactor",
              "flora_adamw8bit_per_layer")
# PLUMAGE's projector without a pool: what the H100 figures ran (commit e088428)
PAPER_PLUMAGE = {"projector": "plumage", "max_inv_p": None, "resample_every": 0}
SAMPLED = {"projector": "plumage"}  # PLUMAGE's draws (its pool in bfloat16); plumage_adamw's default is svd since session 17


@dataclass
class Terms:
    weights: int
    gradients: int
    state: int
    activations: int
    refresh: int
    per_layer: bool

    @property
    def peak(self) -> int:
        if self.per_layer:
            return self.weights + self.state + self.gradients + self.activations + self.refresh
        return self.weights + self.state + self.gradients + max(self.activations, self.refresh)


def llama_config(size: str, vocab: int | None) -> LlamaConfig:
    config = LlamaConfig.from_json_file(str(ROOT / "configs" / f"llama_{size}.json"))
    if vocab:
        config.vocab_size = vocab
    return config


def weight_shapes(config: LlamaConfig) -> list[tuple[str, tuple[int, ...], int]]:
    """(module name, shape, count) of every parameter of LlamaForCausalLM; attn/mlp weights are the low-rank ones."""
    h, i, layers, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    return [("embed", (v, h), 1), ("head", (v, h), 1), ("norm", (h,), 2 * layers + 1),
            ("attn", (h, h), 2 * layers), ("attn", (kv, h), 2 * layers),
            ("mlp", (i, h), 2 * layers), ("mlp", (h, i), layers)]


class _One(nn.Module):
    def __init__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype):
        super().__init__()
        module = nn.Linear(shape[-1], shape[0], bias=False) if len(shape) == 2 else nn.LayerNorm(shape[0], bias=False)
        self.add_module(name, module.to(dtype))


@functools.cache
def state_of_one(optimizer: str, name: str, shape: tuple[int, ...], rank: int, dtype: torch.dtype,
                 options: tuple) -> int:
    """Bytes of the optimizer state of one parameter of `shape` after one step (exact)."""
    torch.manual_seed(0)
    module = _One(name, shape, dtype)
    built = build_optimizer(optimizer, module, rank=rank, target_modules=("attn", "mlp"), **dict(options))
    for param in module.parameters():
        param.grad = torch.randn(param.shape, dtype=torch.float32).to(dtype)
    inner = inner_optimizer(built)
    inner.step()  # per-layer optimizers step inside hooks; here the same step by hand
    counted = state_bytes(inner.state)[0]
    del module, built, inner
    gc.collect()  # optimizer and module hold each other: free a 7B weight now, not at the next collection
    return counted


def _saved_bytes(config: LlamaConfig, layers: int, batch: int, seq: int, dtype: torch.dtype) -> int:
    """Bytes autograd saves in one forward + loss of a `layers`-layer model (each storage once)."""
    small = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": layers})
    small._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(small).to(dtype)
    storages: dict[int, int] = {}

    def pack(tensor):
        if not isinstance(tensor, nn.Parameter):  # weights are already counted
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    tokens = torch.randint(0, small.vocab_size, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=tokens, labels=tokens).loss  # kept: its graph holds every saved tensor alive
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(size for pointer, size in storages.items() if pointer not in params)
    del loss, model
    gc.collect()
    return saved


@functools.cache
def activation_bytes(size: str, vocab: int | None, batch: int, seq: int, dtype: torch.dtype,
                     checkpointing: bool) -> int:
    config = llama_config(size, vocab)
    one, two = (_saved_bytes(config, n, batch, seq, dtype) for n in (1, 2))
    layer, head = two - one, 2 * one - two
    layers = config.num_hidden_layers
    if not checkpointing:
        return head + layers * layer
    kept = batch * seq * config.hidden_size * torch.finfo(dtype).bits // 8
    return head + layers * kept + layer


def refresh_bytes(config: LlamaConfig) -> int:
    """float32 gradient copy + U (m × k) + Vᵀ (k × n) of the largest projected weight's thin SVD."""
    shapes = [shape for name, shape, _ in weight_shapes(config) if name in ("attn", "mlp")]
    return max(4 * (m * n + m * min(m, n) + min(m, n) * n) for m, n in shapes)


def terms(size: str, optimizer: str, vocab: int | None, batch: int, dtype: torch.dtype, checkpointing: bool,
          options: dict | None = None) -> Terms:
    rank, seq = SIZES[size]
    config = llama_config(size, vocab)
    width = torch.finfo(dtype).bits // 8
    shapes = weight_shapes(config)
    numel = {shape: int(torch.Size(shape).numel()) for _, shape, _ in shapes}
    spec = optimizer_spec(optimizer)
    per_layer = spec.per_layer
    from_svd = spec.projector in ("svd", "plumage")  # FLORA's random bases need no SVD
    # the solver does not change the state, and eigh is several times faster than an SVD on the CPU
    solver = {"solver": "gram"} if from_svd else {}
    options_key = tuple(sorted({**solver, **(options or {})}.items()))
    return Terms(
        weights=sum(width * numel[shape] * count for _, shape, count in shapes),
        gradients=(max(width * numel[shape] for _, shape, _ in shapes) if per_layer
                   else sum(width * numel[shape] * count for _, shape, count in shapes)),
        state=sum(state_of_one(optimizer, name, shape, rank, dtype, options_key) * count
                  for name, shape, count in shapes),
        activations=activations_at(size, vocab, batch, dtype, checkpointing),
        refresh=refresh_bytes(config) if from_svd else 0,
        per_layer=per_layer,
    )


def activations_at(size: str, vocab: int | None, batch: int, dtype: torch.dtype, checkpointing: bool) -> int:
    """Activations are linear in the batch: counted at 1 and 2 sequences, extended to `batch`."""
    seq = SIZES[size][1]
    one, two = (activation_bytes(size, vocab, b, seq, dtype, checkpointing) for b in (1, 2))
    return one + (batch - 1) * (two - one)


def measured_peak(size: str, optimizer: str, vocab: int | None, batch: int, dtype: torch.dtype,
                  checkpointing: bool, options: dict | None) -> int:
    """torch.cuda.max_memory_allocated over two training steps of the real model (the first refreshes)."""
    from galore_plumage.training.model import build_model

    rank, seq = SIZES[size]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build_model(llama_config(size, vocab), dtype, torch.device("cuda"), 0, checkpointing)
    built = build_optimizer(optimizer, model, rank=rank, target_modules=("attn", "mlp"), **(options or {}))
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    for _ in range(2):
        model(input_ids=tokens, labels=tokens).loss.backward()
        built.step()
        built.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated()
    del model, built
    return peak


ROWS = ([(name, None) for name in OPTIMIZERS] + [("plumage_adamw", SAMPLED), ("plumage_adamw8bit_per_layer", SAMPLED),
                                                  ("plumage_adamw8bit_per_layer", PAPER_PLUMAGE)])


def label(optimizer: str, options: dict | None) -> str:
    if options is None:
        return optimizer
    return f"{optimizer} --projector plumage" + (" (κ = 0: no pool)" if options is PAPER_PLUMAGE else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="60m,130m,350m,1b,7b")
    parser.add_argument("--optimizers", default=None, help="comma-separated names (default: the table's rows)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (of 256 tokens)")
    parser.add_argument("--vocab", type=int, default=None, help="override the configs' vocabulary (H100 check: 8192)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", default="docs/memory_table.md")
    args = parser.parse_args()
    rows = ROWS if args.optimizers is None else [(name, None) for name in args.optimizers.split(",")]
    dtype = torch.bfloat16
    lines = [f"# Peak memory of a training step (bf16 weights, batch {args.batch} × 256, vocabulary "
             f"{args.vocab or 'of each config'})", "",
             f"Command: `python benchmarks/peak_memory.py --sizes {args.sizes} --batch {args.batch}"
             + (f" --vocab {args.vocab}" if args.vocab else "") + f" --device {args.device}`. GiB; ckpt = activation "
             "checkpointing. Terms and peak as in the script's docstring.", "",
             "| size | optimizer | weights | gradients | state | activations (ckpt / none) | refresh | peak ckpt | "
             "peak no ckpt |" + (" measured ckpt |" if args.device == "cuda" else ""),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.device == "cuda" else "")]
    for size in args.sizes.split(","):
        for optimizer, options in rows:
            with_ckpt = terms(size, optimizer, args.vocab, args.batch, dtype, True, options)
            without = terms(size, optimizer, args.vocab, args.batch, dtype, False, options)
            cells = [with_ckpt.weights, with_ckpt.gradients, with_ckpt.state]
            line = (f"| {size} | {label(optimizer, options)} | " + " | ".join(f"{c / GIB:.2f}" for c in cells)
                    + f" | {with_ckpt.activations / GIB:.2f} / {without.activations / GIB:.2f} | "
                    f"{with_ckpt.refresh / GIB:.2f} | {with_ckpt.peak / GIB:.2f} | {without.peak / GIB:.2f} |")
            if args.device == "cuda":
                line += f" {measured_peak(size, optimizer, args.vocab, args.batch, dtype, True, options) / GIB:.2f} |"
            lines.append(line)
            print(line, flush=True)
    lines += fits(args.sizes.split(","), rows, args.vocab, dtype)
    (ROOT / args.out).write_text("\n".join(lines) + "\n")


BUDGETS_GIB = (12, 16, 24, 80)
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def fits(sizes: list[str], rows, vocab: int | None, dtype: torch.dtype) -> list[str]:
    """Per budget and optimizer: the largest size whose step fits with checkpointing, and its largest batch."""
    lines = ["", "## What fits (activation checkpointing on; the model's peak, not counting the allocator's slack)", "",
             "| optimizer | " + " | ".join(f"{b} GiB" for b in BUDGETS_GIB) + " |", "|---|" + "---|" * len(BUDGETS_GIB)]
    ascending = sorted(sizes, key=lambda size: terms(size, "adamw", vocab, 1, dtype, True).weights)
    for optimizer, options in rows:
        cells = []
        for budget in BUDGETS_GIB:
            best = "—"
            for size in ascending:
                fitting = [b for b in BATCHES
                           if terms(size, optimizer, vocab, b, dtype, True, options).peak <= budget * GIB]
                if fitting:
                    best = f"{size}, batch ≤ {fitting[-1]}"
            cells.append(best)
        lines.append(f"| {label(optimizer, options)} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
