"""8-bit moments carried into another number of FSDP2 processes (adamw8bit.reblock_codes).

Each rank quantizes its own rows in blocks of 256 values, so a checkpoint's block scales belong to its ranks' row
boundaries. Here the saved state is built independently, one bitsandbytes quantization per saved rank, and every new
rank's re-blocked state is checked against it: blocks that were saved blocks whole keep their codes and scale bit for
bit; every other value is re-rounded once, to a code adjacent to what it was, under its new block's largest value.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("bitsandbytes")

from galore_plumage.optimizers.adamw8bit import BLOCKSIZE, _functional, quantile_map, reblock_codes  # noqa: E402


def split(rows: int, world: int) -> list[tuple[int, int]]:
    """torch.chunk's row ranges (FSDP2's dim-0 shards); trailing ranks may hold none."""
    size = math.ceil(rows / world)
    return [(min(k * size, rows), min((k + 1) * size, rows)) for k in range(world)]


def blocks(rows: int, per_row: int, world: int) -> list[list[tuple[int, int]]]:
    """Each rank's blocks as [start, end) ranges of the flattened whole tensor."""
    out = []
    for first, last in split(rows, world):
        start, end = first * per_row, last * per_row
        out.append([(b, min(b + BLOCKSIZE, end)) for b in range(start, end, BLOCKSIZE)])
    return out


def saved_checkpoint(values: torch.Tensor, world: int, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What `world` ranks write: the codes of all rows (DCP's global tensor) and each rank's scales padded to the
    longest rank's count, concatenated (sharded.py's layout)."""
    code, per_row = quantile_map(values.device, signed), math.prod(values.shape[1:])
    length = math.ceil(math.ceil(values.shape[0] / world) * per_row / BLOCKSIZE)
    codes, absmax = torch.zeros(values.shape, dtype=torch.uint8), torch.zeros(length * world)
    for k, (first, last) in enumerate(split(values.shape[0], world)):
        if last > first:
            quantized, state = _functional().quantize_blockwise(values[first:last].reshape(-1), code=code,
                                                                blocksize=BLOCKSIZE)
            codes[first:last] = quantized.view_as(values[first:last])
            absmax[k * length: k * length + state.absmax.numel()] = state.absmax
    return codes, absmax


def dequantized(codes: torch.Tensor, scales: list[float], ranges: list[tuple[int, int]], signed: bool) -> torch.Tensor:
    code = quantile_map(codes.device, signed)[codes.reshape(-1).long()]
    return torch.cat([code[s - ranges[0][0]: e - ranges[0][0]] * scale for (s, e), scale in zip(ranges, scales, strict=True)])


SHAPES = [(64, 8), (37, 8), (8, 64), (100, 3), (2, 300), (24,)]
# bitsandbytes' CPU build quantizes values below ~1e-4 of their block's largest through a coarse table, up to 2.5e-5
# of it from the value (measured: values from 1e-8 to 1 in blocks of 256), not to an adjacent code
CPU_TABLE = 3e-5


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("signed", [True, False], ids=["M", "V"])
def test_reblocked_moments_keep_whole_blocks_and_reround_the_rest_once(shape, signed):
    generator = torch.Generator().manual_seed(len(shape) * 1000 + shape[0])
    values = torch.randn(shape, generator=generator)
    values = values if signed else values.square() * torch.logspace(-6, 0, shape[0])[(...,) + (None,) * (len(shape) - 1)]
    rows, per_row = shape[0], math.prod(shape[1:])
    code = quantile_map(values.device, signed)
    ordered = code.sort().values
    requantized_any = False
    for saved_world in (1, 2, 3):
        codes, saved_absmax = saved_checkpoint(values, saved_world, signed)
        length = saved_absmax.numel() // saved_world
        saved_blocks = {}  # [start, end) of the flattened tensor -> (scale, codes)
        for k, ranges in enumerate(blocks(rows, per_row, saved_world)):
            for b, (s, e) in enumerate(ranges):
                saved_blocks[(s, e)] = saved_absmax[k * length + b].item()
        old = torch.zeros(rows * per_row)
        for (s, e), scale in saved_blocks.items():
            old[s:e] = code[codes.reshape(-1)[s:e].long()] * scale
        for world in (1, 2, 3, 4):
            for (first, last), ranges in zip(split(rows, world), blocks(rows, per_row, world), strict=True):
                new_codes, new_absmax = reblock_codes(codes[first:last], saved_absmax, signed, first, rows, saved_world)
                assert new_codes.shape == codes[first:last].shape and new_absmax.numel() == len(ranges)
                if not ranges:
                    continue
                new = dequantized(new_codes, new_absmax.tolist(), ranges, signed)
                for b, (s, e) in enumerate(ranges):
                    here = slice(s - ranges[0][0], e - ranges[0][0])
                    if (s, e) in saved_blocks:  # a saved block whole: the same bytes
                        assert new_absmax[b].item() == saved_blocks[(s, e)]
                        assert torch.equal(new_codes.reshape(-1)[here], codes.reshape(-1)[s:e])
                        continue
                    requantized_any = True
                    scale = new_absmax[b].item()
                    assert scale == pytest.approx(old[s:e].abs().max().item(), rel=1e-6)
                    # each value lands on a code next to it: between the codes just below and just above old / scale
                    ratio = (old[s:e] / scale).clamp(code.min().item(), 1.0)
                    above = torch.searchsorted(ordered, ratio).clamp(max=code.numel() - 1)
                    low, high = ordered[(above - 1).clamp(min=0)], ordered[above]
                    landed = new[here] / scale
                    adjacent = (landed >= low - 1e-6) & (landed <= high + 1e-6)
                    assert bool((adjacent | ((landed - ratio).abs() <= CPU_TABLE) & (ratio < 1e-4)).all()), (
                        saved_world, world, b)
    assert requantized_any  # every shape has some layout whose blocks straddle the saved ones


def test_a_whole_checkpoint_loads_bit_for_bit_where_every_block_lines_up():
    """64 x 8 on 2 ranks is one block each; on 1 process, two blocks that are exactly those: nothing is re-rounded,
    including a block whose largest value is negative (the signed map's lowest code is -0.993, so requantizing it
    would shrink its scale)."""
    values = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    values[:32] -= 10 * values[:32].abs().max()  # rank 0's block: every value negative, its largest magnitude too
    codes, absmax = saved_checkpoint(values, 2, signed=True)
    new_codes, new_absmax = reblock_codes(codes, absmax, True, 0, 64, 2)
    assert torch.equal(new_codes, codes) and torch.equal(new_absmax, absmax)
    requantized, state = _functional().quantize_blockwise(
        dequantized(codes, absmax.tolist(), [(0, 256), (256, 512)], True), code=quantile_map(values.device, True),
        blocksize=BLOCKSIZE)
    assert state.absmax[0] < absmax[0]  # what keeping whole blocks avoids
