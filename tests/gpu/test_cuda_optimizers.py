"""CUDA checks: the same optimizer on CUDA and CPU follows the same path (skipped without a GPU).

Run on a GPU machine with `python -m pytest tests/gpu -q`. Bases are drawn on the CPU from the same generator, so
both devices sample the same directions. What is compared, and why each tolerance holds when the devices differ
only in rounding, is in tests/device_helpers.py; tests/optimizers/test_device_tolerance.py checks those tolerances on the CPU.
Before session 8 this compared weights with rtol 1e-3 on Gaussian gradients: GaLoreAdamW failed on SVD signs
(tests/projectors/test_align_signs.py) and PlumageAdamW8bit on bitsandbytes' CPU rounding, neither a GPU fault.
"""

import sys
from pathlib import Path

import pytest
import torch

from galore_plumage.optimizers import FIRA_COMPLEMENT, PLUMAGE_ADAFACTOR_DRAWS, PLUMAGE_SAMPLED

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from device_helpers import (  # noqa: E402
    EIGHT_BIT_CASES,
    EIGHT_BIT_RTOL,
    FP32_CASES,
    FP32_RTOL,
    case_id,
    cuda_rounding_on_cpu,
    relative_difference,
    update_after,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")



@pytest.mark.parametrize("cls, group, steps", FP32_CASES, ids=case_id)
def test_cuda_matches_cpu(cls, group, steps):
    on_cpu, _ = update_after(cls, group, steps, "cpu")
    on_cuda, _ = update_after(cls, group, steps, "cuda")
    assert relative_difference(on_cuda, on_cpu) < FP32_RTOL


@pytest.mark.parametrize("cls8, cls32, group", EIGHT_BIT_CASES, ids=case_id)
def test_cuda_8bit_matches_cpu_rounded_as_cuda_rounds(cls8, cls32, group):
    with cuda_rounding_on_cpu():
        on_cpu, _ = update_after(cls8, group, 6, "cpu")
    on_cuda, _ = update_after(cls8, group, 6, "cuda")
    assert relative_difference(on_cuda, on_cpu) < EIGHT_BIT_RTOL


@pytest.mark.parametrize("cls, group, steps", FP32_CASES[:3] + [(case[0], case[2], 6) for case in EIGHT_BIT_CASES[:1]],
                         ids=case_id)
def test_bf16_weights_keep_fp32_low_rank_state(cls, group, steps):
    update, optimizer = update_after(cls, group, steps, "cuda", dtype=torch.bfloat16)
    assert torch.isfinite(update).all()
    state = next(iter(optimizer.state.values()))
    for factor in state["projector"]["factors"].values():
        assert factor.dtype == torch.float32
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            assert state[key].dtype == torch.float32
    if "state1" in state:
        assert state["state1"].dtype in (torch.uint8, torch.float32)


@pytest.mark.parametrize("options", [{}, PLUMAGE_SAMPLED, {**PLUMAGE_SAMPLED, "residual_horizon": None}],
                         ids=["default", "sampled", "sampled, complement every update"])
def test_a_steady_step_of_the_default_does_not_synchronise_with_the_host(options):
    """Issue 15: between refreshes, PlumageAdamW's step queues its work without waiting on the GPU: torch's sync debug
    mode raises on any synchronising call. The default (GaLore's basis, v_floor) and PLUMAGE's draws (a draw from the
    pool before every update, PLUMAGE_SAMPLED), with the complement on every update too. Three weights of one shape,
    so that foreach (on by default on a GPU) takes their updates together and their draws are made together
    (plumage.resample_together, since session 44)."""
    from galore_plumage import PlumageAdamW

    weights = [torch.nn.Parameter(torch.randn(96, 64, device="cuda")) for _ in range(3)]
    optimizer = PlumageAdamW([{"params": weights, "rank": 8, "update_proj_gap": 1000, **options}])
    for weight in weights:
        weight.grad = torch.randn(96, 64, device="cuda")
    optimizer.step()  # the refresh: one synchronisation a weight is allowed there
    optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if options:
        assert all(optimizer._projectors[weight].stats["resamples"] >= 3 for weight in weights)


def _synchronisations(step) -> int:
    """How many times `step()` synchronised the GPU with the host (torch's sync debug mode warns once each)."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_a_refresh_of_the_default_synchronises_at_most_twice():
    """Issue 15: the refresh of GaLore's basis reads its check, energy and ρ in one transfer; torch.linalg.svd's own
    error check (documented to synchronise on CUDA) is the other."""
    from galore_plumage import PlumageAdamW

    weight = torch.nn.Parameter(torch.randn(96, 64, device="cuda"))
    optimizer = PlumageAdamW([{"params": [weight], "rank": 8, "update_proj_gap": 2}])
    weight.grad = torch.randn(96, 64, device="cuda")
    optimizer.step()  # the first refresh (workspaces allocated)
    optimizer.step()
    assert _synchronisations(optimizer.step) <= 2  # update 2: a refresh


def test_batched_refreshes_on_cuda_match_one_by_one():
    """refresh_batch on CUDA: the batch may run another cuSOLVER algorithm than one matrix does, so the bases agree to
    float32 rounding (bit-identical on CPU: tests/optimizers/test_batched_refresh.py)."""
    from galore_plumage import PlumageAdamW

    def run(refresh_batch):
        torch.manual_seed(0)
        weights = [torch.nn.Parameter(torch.randn(96, 64, device="cuda")) for _ in range(4)]
        start = torch.cat([w.detach().flatten() for w in weights])
        optimizer = PlumageAdamW([{"params": weights, "rank": 8, "update_proj_gap": 2, "refresh_batch": refresh_batch,
                                   "align_signs": True}])
        generator = torch.Generator(device="cuda").manual_seed(1)
        for _ in range(5):
            for weight in weights:
                weight.grad = torch.randn(96, 64, device="cuda", generator=generator)
            optimizer.step()
        return torch.cat([w.detach().flatten() for w in weights]) - start  # the updates, not the weights

    assert relative_difference(run(4), run(1)) < FP32_RTOL


@pytest.mark.parametrize("option, extra", [("foreach", {}), ("compile_update", {}),
                                           ("foreach", {**FIRA_COMPLEMENT, "v_floor": "none"}),
                                           ("compile_update", {"foreach": True, **FIRA_COMPLEMENT, "v_floor": "none"})],
                         ids=["foreach", "compile_update", "foreach, Fira's complement",
                              "compile_update with foreach, Fira's complement"])
def test_a_fused_path_on_cuda_matches_the_eager_one_without_synchronising(option, extra):
    """foreach (the group's moments in _foreach kernels) and compile_update (each weight's moments in one Triton
    kernel) on CUDA: their kernels may round as the one-tensor kernels do not (foreach is bit-identical on CPU,
    tests/optimizers/test_multi_tensor.py; compile_update agrees to float32 rounding there,
    tests/optimizers/test_compiled_update.py), so the updates agree to float32 rounding; a steady update waits on the
    GPU no more than eager one by one (not at all). With Fira's complement (torchrun's large-batch default) foreach
    also computes the complement's weights together (residual.complement_weights_together); with compile_update too,
    the group's projections, moments and the complement's arithmetic, β φ ⊙ G included, are one compiled call
    (sessions 46-48), against foreach eager."""
    from galore_plumage import PlumageAdamW

    def run(fused, sync_check=False):
        torch.manual_seed(0)
        weights = [torch.nn.Parameter(torch.randn(96, 64, device="cuda")) for _ in range(4)]
        start = torch.cat([w.detach().flatten() for w in weights])
        # foreach off unless it is the option tested: left unset it is on on a GPU, and the eager path is the reference
        optimizer = PlumageAdamW([{"params": weights, "rank": 8, "update_proj_gap": 3, "foreach": False, option: fused,
                                   "align_signs": True, **extra}], weight_decay=0.1)
        generator = torch.Generator(device="cuda").manual_seed(1)
        for step in range(7):
            for weight in weights:
                weight.grad = torch.randn(96, 64, device="cuda", generator=generator)
            if sync_check and step == 5:  # a steady update (refreshes at 0, 3, 6), compiled by then (a group's
                # functions compile at its second update taken together and again, floats general, at its third)
                assert _synchronisations(optimizer.step) == 0
            else:
                optimizer.step()
        return torch.cat([w.detach().flatten() for w in weights]) - start

    assert relative_difference(run(True, sync_check=True), run(False)) < FP32_RTOL


def _four_weights_update(name: str, group: dict, hyper: dict) -> torch.Tensor:
    """How far optimizers.<name> moves four 96 × 64 weights on CUDA in 7 steps of seeded Gaussian gradients (refreshes
    at 0, 3 and 6): rank 8, τ = 3, weight decay 0.1, with `group`'s options and the optimizer's `hyper`."""
    import galore_plumage.optimizers as optimizers

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(96, 64, device="cuda")) for _ in range(4)]
    start = torch.cat([w.detach().flatten() for w in weights])
    optimizer = getattr(optimizers, name)([{"params": weights, "rank": 8, "update_proj_gap": 3, **group}],
                                          weight_decay=0.1, **hyper)
    generator = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(7):
        for weight in weights:
            weight.grad = torch.randn(96, 64, device="cuda", generator=generator)
        optimizer.step()
    return torch.cat([w.detach().flatten() for w in weights]) - start


@pytest.mark.parametrize("name, extra", [("PlumageAdamW8bit", {**FIRA_COMPLEMENT, "v_floor": "none"}),
                                         ("PlumageAdafactor", PLUMAGE_ADAFACTOR_DRAWS), ("PlumageSGDM", FIRA_COMPLEMENT)],
                         ids=["8-bit, Fira's complement", "Adafactor's draws", "SGD momentum, Fira's complement"])
def test_every_backend_takes_its_updates_together_on_cuda_as_one_by_one(name, extra):
    """foreach on the other backends (session 45; on by default on a GPU): the complement and the decay taken together,
    SGD momentum's buffers in _foreach calls, 8-bit's and Adafactor's moments each weight's own; the same updates as one
    by one to float32 rounding (on a CPU: tests/optimizers/test_multi_tensor.py)."""
    hyper = {"PlumageAdamW8bit": {"lr": 1e-2}, "PlumageAdafactor": {"beta1": 0.9},
             "PlumageSGDM": {"lr": 1e-2, "momentum": 0.9}}[name]
    together = _four_weights_update(name, {"foreach": True, **extra}, hyper)
    assert relative_difference(together, _four_weights_update(name, {"foreach": False, **extra}, hyper)) < FP32_RTOL


@pytest.mark.parametrize("name, extra, hyper, tolerance", [
    ("PlumageAdamW8bit", {**FIRA_COMPLEMENT, "v_floor": "none"}, {"lr": 1e-2}, EIGHT_BIT_RTOL),
    ("PlumageAdafactor", {**PLUMAGE_ADAFACTOR_DRAWS, "residual_horizon": None},
     {"lr": 1e-2, "relative_step": False, "scale_parameter": False, "beta1": 0.9}, FP32_RTOL)],
    ids=["8-bit, Fira's complement", "Adafactor's draws, the complement at every update"])
def test_the_compiled_group_of_8bit_and_adafactor_on_cuda_matches_foreach_eager(name, extra, hyper, tolerance):
    """compile_update with foreach on the backends whose moments stay outside the complement's compiled call (8-bit's
    are bitsandbytes' kernel, Adafactor's factored step its own compiled function): Triton's kernels against foreach
    eager on CUDA, to float32 rounding (on a CPU: tests/optimizers/test_compiled_together.py). The complement moves at
    every update, so every steady step runs the compiled complement; 8-bit's tolerance allows a state code rounded the
    other way."""
    compiled = _four_weights_update(name, {"foreach": True, "compile_update": True, **extra}, hyper)
    eager = _four_weights_update(name, {"foreach": True, "compile_update": False, **extra}, hyper)
    assert relative_difference(compiled, eager) < tolerance


def test_8bit_moments_reblock_on_cuda():
    """adamw8bit.reblock_codes on CUDA (an FSDP2 8-bit checkpoint resumed on another number of processes): blocks that
    line up keep their bytes; a split block is requantized within one code step (tests/optimizers/test_eightbit_reblock.py
    checks it code by code on the CPU)."""
    _reblock_checks("cuda")


def _reblock_checks(device: str) -> None:
    import bitsandbytes.functional as functional

    from galore_plumage.optimizers.adamw8bit import BLOCKSIZE, quantile_map, reblock_codes

    values = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)).to(device)
    code = quantile_map(values.device, signed=True)
    halves = [functional.quantize_blockwise(values[k * 32:(k + 1) * 32].reshape(-1), code=code, blocksize=BLOCKSIZE)
              for k in range(2)]  # what 2 ranks write: one 256-block each
    codes = torch.cat([q.view(32, 8) for q, _ in halves])
    absmax = torch.cat([state.absmax for _, state in halves])
    whole_codes, whole_absmax = reblock_codes(codes, absmax, True, 0, 64, 2)  # 1 process: the same two blocks
    assert torch.equal(whole_codes, codes) and torch.equal(whole_absmax, absmax)
    old = torch.cat([code[q.long()] * state.absmax for q, state in halves])
    for rank, first in enumerate((0, 22, 44)):  # 3 processes: 22 + 22 + 20 rows, blocks straddling the saved ones
        mine, scales = reblock_codes(codes[first:first + 22], absmax, True, first, 64, 2)
        new = code[mine.reshape(-1).long()] * scales.repeat_interleave(BLOCKSIZE)[:mine.numel()]
        assert (new - old[first * 8:first * 8 + mine.numel()]).abs().max() <= 0.02 * scales.max(), rank
