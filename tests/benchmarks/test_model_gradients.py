"""benchmarks/model_gradients.py: a Llama layer's seven gradients, in step_time's order, the same on every call."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model_gradients  # noqa: E402
import step_time  # noqa: E402
from device_helpers import relative_difference  # noqa: E402
from finetune_helpers import write_plays  # noqa: E402


def test_the_layers_gradients_come_in_step_times_shapes_and_are_seeded(tmp_path):
    write_plays(tmp_path)
    h, i = 64, 160
    grads = model_gradients.layer_gradients(h, i, torch.device("cpu"), seed=0, data_dir=tmp_path)
    assert [tuple(g.shape) for g in grads] == list(step_time.layer_shapes(h, i).values())
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    # Seeded: the same gradients again, to the float rounding of the BLAS (MKL's GEMM may round differently with its
    # buffers' memory alignment, so bit-equality failed once in many runs), and other ones from another seed.
    again = model_gradients.layer_gradients(h, i, torch.device("cpu"), seed=0, data_dir=tmp_path)
    assert max(relative_difference(repeat, first) for first, repeat in zip(grads, again, strict=True)) < 1e-3
    other = model_gradients.layer_gradients(h, i, torch.device("cpu"), seed=1, data_dir=tmp_path)
    assert min(relative_difference(seed1, seed0) for seed0, seed1 in zip(grads, other, strict=True)) > 0.1


def test_without_the_corpus_it_says_how_to_fetch_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="make data"):
        model_gradients.layer_gradients(64, 160, torch.device("cpu"), data_dir=tmp_path)
