"""benchmarks/peak_memory.py counts exactly what it claims to: on a small Llama, its per-shape sums equal the real
model's parameters and the real optimizer's state after a step, and its per-layer activation model (head + L ×
layer, from models of one and two layers) predicts a three-layer model's saved tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import peak_memory  # noqa: E402

from galore_plumage.optimizers import build_optimizer  # noqa: E402
from galore_plumage.optimizers.layerwise import inner_optimizer  # noqa: E402
from galore_plumage.optimizers.memory import state_bytes  # noqa: E402

CONFIG = dict(hidden_size=64, intermediate_size=172, num_attention_heads=4, num_key_value_heads=4,
              num_hidden_layers=2, vocab_size=256, tie_word_embeddings=False)
RANK = 8


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG))


def test_the_shapes_are_the_models_parameters():
    shapes = peak_memory.weight_shapes(LlamaConfig(**CONFIG))
    counted = sorted(shape for _, shape, count in shapes for _ in range(count))
    assert counted == sorted(tuple(p.shape) for p in _model().parameters())


@pytest.mark.parametrize("name, options", [("adamw", ()), ("adamw8bit", ()), ("galore_adamw", ()),
                                           ("plumage_adamw", ()), ("plumage_adamw8bit_per_layer", ()),
                                           ("plumage_adamw", (("projector", "plumage"),)),
                                           ("plumage_adamw", (("projector", "plumage"), ("resample_every", 0)))])
def test_state_per_shape_sums_to_the_real_optimizers_state(name, options):
    model = _model()
    optimizer = build_optimizer(name, model, rank=RANK, target_modules=("attn", "mlp"), **dict(options))
    for param in model.parameters():
        param.grad = torch.randn(param.shape)
    inner = inner_optimizer(optimizer)
    inner.step()
    real = state_bytes(inner.state)[0]
    predicted = sum(peak_memory.state_of_one(name, module, shape, RANK, torch.float32, options) * count
                    for module, shape, count in peak_memory.weight_shapes(LlamaConfig(**CONFIG)))
    assert predicted == real


def test_activations_are_a_head_plus_one_term_per_layer():
    config = LlamaConfig(**CONFIG)
    one, two, three = (peak_memory._saved_bytes(config, layers, 2, 32, torch.float32) for layers in (1, 2, 3))
    assert two > one > 0
    assert three == 2 * two - one
