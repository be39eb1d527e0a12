"""benchmarks/step_time.py's row for plumage_adamw's default steps exactly as PlumageAdamW with no options does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import step_time  # noqa: E402

from galore_plumage import PlumageAdamW, PlumageAdamW8bit  # noqa: E402


def train(build, shapes=((48, 32), (32, 64))) -> list[torch.Tensor]:
    """Five steps of the optimizer `build(params)` makes, on seeded gradients; the trained weights."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    optimizer = build(params)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    return params


@pytest.mark.parametrize(("backend", "cls"), [("adamw", PlumageAdamW), ("adamw8bit", PlumageAdamW8bit)])
def test_the_default_row_is_the_optimizers_default(backend, cls):
    row = train(lambda params: step_time.plumage_adam_default_build(backend)(params, 8, 2))
    default = train(lambda params: cls([{"params": params, "rank": 8, "update_proj_gap": 2, "proj_type": "std"}],
                                       **step_time.OPTIONS[backend]))
    for a, b in zip(row, default, strict=True):
        assert torch.equal(a, b)


def test_the_foreach_row_steps_as_the_default_row_and_takes_its_steady_updates_together(monkeypatch):
    from galore_plumage.optimizers import base

    calls = []
    real = base.step_together
    monkeypatch.setattr(base, "step_together", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))

    three = ((48, 32),) * 3
    together = train(lambda params: step_time.plumage_adam_default_build("adamw", foreach=True)(params, 8, 3), three)
    one_by_one = train(lambda params: step_time.plumage_adam_default_build("adamw", foreach=False)(params, 8, 3), three)
    for a, b in zip(together, one_by_one, strict=True):
        assert torch.equal(a, b)
    assert len(calls) == 3  # the steady updates of the foreach row (steps 2, 3 and 5; refreshes at 1 and 4)


def test_the_compile_update_row_steps_as_the_default_row_through_the_compiled_update(monkeypatch):
    from galore_plumage.optimizers import adamw

    calls = []
    real = adamw.compiled_moments_and_direction
    monkeypatch.setattr(adamw, "compiled_moments_and_direction", lambda *args: calls.append(1) or real(*args))
    compiled = train(lambda params: step_time.plumage_adam_default_build("adamw", compile_update=True)(params, 8, 3))
    eager = train(lambda params: step_time.plumage_adam_default_build("adamw")(params, 8, 3))
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert len(calls) == 2 * 5  # both weights, every step


def test_only_keeps_the_named_rows_and_every_galore_torch_reference():
    rows = step_time.selected(step_time.candidates(), ["plumage_adamw default ("])
    names = {c.name for c in rows}
    assert set(step_time.REFERENCE.values()) <= names
    ours = names - set(step_time.REFERENCE.values())
    assert ours and all("plumage_adamw default (" in name for name in ours)
    assert {c.name for c in step_time.selected(step_time.candidates(), None)} == {c.name for c in step_time.candidates()}


def test_skip_leaves_out_the_rows_named_and_keeps_the_references():
    """scripts/gpu_check.sh times the compiled rows in a call of their own: --skip takes them out of the others."""
    kept = {c.name for c in step_time.selected(step_time.candidates(), ["large-batch pretraining default"],
                                               ["compile_update"])}
    every = {c.name for c in step_time.selected(step_time.candidates(), ["large-batch pretraining default"])}
    assert set(step_time.REFERENCE.values()) <= kept
    assert {name for name in every - kept} == {name for name in every if "compile_update" in name} != set()


@pytest.mark.parametrize("optimizer_class", [PlumageAdamW, PlumageAdamW8bit], ids=["adamw", "adamw8bit"])
def test_the_large_batch_row_is_what_torchrun_main_pretrains_with_from_4096_tokens(optimizer_class):
    """The rows' options are those training/config derives for plumage_adamw(8bit) at 16 x 256 tokens an update."""
    from galore_plumage.training.config import parse_config

    backend = optimizer_class.backend.name
    derived = parse_config(["--optimizer", f"plumage_{backend}", "--batch_size", "16", "--max_length", "256"]).low_rank
    assert derived["v_floor"] == "none" and derived["residual"] == "norm_matched"
    pretraining = train(lambda params: optimizer_class([{"params": params, "rank": 8, "update_proj_gap": 2,
                                                         "proj_type": "std", **derived}], **step_time.OPTIONS[backend]))
    rows = [c for c in step_time.candidates() if "large-batch" in c.name and c.family == backend]
    # foreach auto (the row) and one by one: the same numbers on a CPU, bit for bit; + foreach (and + foreach +
    # compile_update) to float32 rounding (the complement's norms over the weights' columns side by side,
    # tests/optimizers/test_multi_tensor.py; a fused kernel's rounding, tests/optimizers/test_compiled_together.py)
    assert len(rows) == 4
    for candidate in rows:
        row = train(lambda params, candidate=candidate: candidate.build(params, 8, 2))
        for a, b in zip(row, pretraining, strict=True):
            if "+ foreach" in candidate.name:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=candidate.name)
            else:
                assert torch.equal(a, b), candidate.name


def test_the_kernel_column_counts_a_steady_step_so_that_foreach_takes_fewer_as_layers_are_added():
    """The kernels of one steady step: one by one they grow with the weights by dozens a weight, with foreach (the
    large-batch default's complement included) by the three that read a whole weight's G one at a time (its two
    matmuls, the norms of G's columns; β φ ⊙ G is one _foreach call for all, session 47); a compiled row is not counted
    (torch.compile does not trace under the mode)."""
    rows = {c.name: c for c in step_time.candidates() if "large-batch" in c.name or "compile_update" in c.name}
    together = next(c for name, c in rows.items() if "large-batch" in name and "+ foreach" in name)
    alone = next(c for name, c in rows.items() if "large-batch" in name and "one by one" in name)
    compiled = next(c for name, c in rows.items() if "compile_update" in name)

    def kernels(candidate, layers):
        grads = step_time.random_tensors(list(step_time.layer_shapes(8, 20).values()) * layers, torch.device("cpu"), 0)
        return step_time.kernels_of(candidate, grads, 4, torch.device("cpu"))

    one, two = kernels(together, 1), kernels(together, 2)
    one_alone, two_alone = kernels(alone, 1), kernels(alone, 2)
    assert two - one == 7 * 3
    assert two_alone - one_alone > 10 * (two - one) and one < one_alone
    assert kernels(compiled, 1) is None
