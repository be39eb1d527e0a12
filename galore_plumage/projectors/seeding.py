"""The only source of a projector's randomness: a generator that is a pure function of (seed, parameter, refresh,
draw)."""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def refresh_generator(seed: int, index: int, count: int, draw: int = 0,
                      device: torch.device | str = "cpu") -> torch.Generator:
    """The generator for refresh number `count` of parameter `index`: a pure function of the three.

    `draw` > 0 numbers the resamples inside that refresh interval (PLUMAGE's κ); draw 0 is the refresh itself
    and gives the same generator as before resampling existed, so older runs repeat exactly.

    Data-parallel ranks therefore draw the same bases without communicating, a resumed run repeats
    the uninterrupted one, and nothing depends on (or disturbs) the global RNG. A CPU generator (the default) draws
    the same values on every machine; a CUDA one (`device`, for FLORA's Gaussians drawn where they are used) draws
    the same values on every GPU of a run (Philox, counter-based).
    """
    state = 0
    for value in (seed, index, count, *((draw,) if draw else ())):
        state = _splitmix64(state ^ (int(value) & _MASK64))
    generator = torch.Generator(device=device)
    generator.manual_seed(state >> 1)  # manual_seed takes 63 bits
    return generator


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)
