"""The model: transformers' LlamaForCausalLM built from a configs/llama_*.json, its vocabulary from the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")


def load_model_config(path: str | Path, vocab_size: int, eos_token_id: int, flag: str = "--model_config") -> LlamaConfig:
    """Read and check a Llama config (given by `flag`, named in errors); `vocab_size` and the EOS id come from the
    tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {str(path)!r}: no such file; choose one of configs/llama_*.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag} {str(path)!r} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{flag} {str(path)!r} must hold a JSON object, got {type(raw).__name__}")
    if raw.get("model_type", "llama") != "llama":
        raise ValueError(f"{flag} {str(path)!r} has model_type {raw['model_type']!r}; only 'llama' is supported")
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise ValueError(f"{flag} {str(path)!r} lacks {', '.join(missing)}")
    if raw["hidden_size"] % raw["num_attention_heads"]:
        raise ValueError(f"{flag} {str(path)!r}: hidden_size {raw['hidden_size']} is not a multiple of "
                         f"num_attention_heads {raw['num_attention_heads']}")
    raw = {k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")}
    raw.update(vocab_size=vocab_size, eos_token_id=eos_token_id, bos_token_id=None, pad_token_id=None, use_cache=False)
    return LlamaConfig(**raw)


def build_model(config: LlamaConfig, dtype: torch.dtype, device: torch.device, seed: int,
                activation_checkpointing: bool = False) -> LlamaForCausalLM:
    """Initialised from `seed` alone, so every rank starts from the same weights without a broadcast."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device=device, dtype=dtype)
