"""compile_update: the arithmetic of the low-rank updates as a few fused kernels, built by torch.compile.

Eager, one AdamW update of a weight's moments is about ten elementwise kernels (the v_floor bound and its maximum, M's
two, V's two, √V, + ε, M / ·), each a pass over the r-row moments and a launch. Compiled (Inductor: C++ on a CPU,
Triton on a GPU) it is one pass that reads M, V and G and writes M, V and the direction. On a CPU that is about 1 ms
of a 130M layer's 37 ms steady step (benchmarks/step_time.py's "+ compile_update" row); on a GPU, where launches cost,
it is the point.

With foreach, the weights a step takes together (multi_tensor.py) are compiled as a group instead: their moments'
_foreach calls (adamw.adam_directions_together; Adafactor's adafactor.factored_directions_together; 8-bit's none, its
update is bitsandbytes' kernel) and the complement's arithmetic on all their columns with its pass over each weight
(multi_tensor.mixed_together: the norms of each G's columns, φ, its limiter, the mixing, W += β φ ⊙ G). Where every
weight moves the complement and the moments are a function of tensors (AdamW's: Backend.pending_together) the two are
one compiled call with the projections' matmuls (multi_tensor.projected_and_mixed), otherwise two and the matmuls
eager. The add-backs stay eager: compiled, each weight's addmm would write a new buffer to be copied back. A call's
cost on the host (guards, Inductor's wrapper) is what a GPU's launch-bound step pays for it: on an H200 one compiled
call a weight made the default's steady step slower than eager (docs/step_time_cuda.md), so a group makes one.

The arithmetic is eager's (tests/optimizers/test_compiled_update.py: the same weights and moments to float32
rounding; a fused kernel may round a product and a sum once instead of twice; a bfloat16 intermediate is rounded as
eager rounds it, emulate_precision_casts). The first update of each kind
(with and without the floor, each dtype and device, then one shape-generic version when a second shape arrives)
compiles, a few seconds each; later updates do not, whatever their lr or step: floats are not specialized.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


def moments_and_direction(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, grad: torch.Tensor, beta1: float,
                          beta2: float, eps: float, floor_scale: float | None) -> torch.Tensor:
    """V ← max(V, floor_scale · M²) when floor_scale is given (v_floor), then M ← β1 M + (1 − β1) G and
    V ← β2 V + (1 − β2) G², written back in place; returns M / (√V + ε). The function torch.compile fuses."""
    floored = exp_avg_sq if floor_scale is None else torch.maximum(exp_avg_sq, exp_avg.square() * floor_scale)
    new_avg = exp_avg * beta1 + grad * (1.0 - beta1)
    new_avg_sq = floored * beta2 + grad * grad * (1.0 - beta2)
    exp_avg.copy_(new_avg)
    exp_avg_sq.copy_(new_avg_sq)
    return new_avg / (new_avg_sq.sqrt() + eps)


def require_foreach(group: dict, backend: str, compiled: str) -> None:
    """compile_update on a backend whose one-weight update is not compiled (8-bit's is bitsandbytes' kernel,
    Adafactor's is not written as one function) compiles only what the weights a step takes together do: refused
    without foreach=True, which would leave it nothing to compile."""
    if group.get("compile_update") and group.get("foreach") is not True:
        raise ValueError(f"compile_update=True on {backend} compiles {compiled} of the weights a step takes together: "
                         f"it needs foreach=True, not foreach={group.get('foreach')!r}; set it, or drop compile_update")


# size_asserts: Inductor checks each input's sizes and strides on every call of the code it generated, after
# torch.compile's guards have checked them to choose that code: with a group's dozens of tensors, ~7 % of a launch-
# bound step on one CPU thread (docs/results.md §1, session 47). emulate_precision_casts: a bfloat16 intermediate (β φ
# for a bfloat16 G) rounded as eager rounds it, not kept in float32: without it bfloat16 weights drift from eager's
# by a few roundings in ten steps (tests/optimizers/test_compiled_together.py)
INDUCTOR_OPTIONS = {"size_asserts": False, "emulate_precision_casts": True}


class Compiled:
    """`function` through torch.compile(fullgraph=True), built on its first call; a failure to compile is raised as a
    RuntimeError that says what compile_update needs. `what` names the function in that message.

    A compiled graph is specialized on its arguments' layout (how many tensors, their shapes): a group's functions
    get one per set of weights a step takes together, two compilations each (the second makes its floats general).
    Past torch's recompile limit (torch._dynamo.config.recompile_limit, 8 a function: staggered refreshes or resting
    weights make many sets) a new layout runs `function` eager, the same arithmetic, with a warning the first time."""

    def __init__(self, function: Callable, what: str):
        self.function, self.what = function, what
        self._compiled: Callable | None = None
        self._warned = False

    def __call__(self, *args):
        if self._compiled is None:
            self._compiled = torch.compile(self.function, fullgraph=True, options=INDUCTOR_OPTIONS)
        try:
            return self._compiled(*args)
        except Exception as error:  # Inductor's errors have many types; each is re-raised with the option named
            # torch._dynamo's FailOnRecompileLimitHit (no public name) comes before a graph runs: nothing written yet
            if type(error).__name__ != "FailOnRecompileLimitHit":
                raise self._explained(error, args) from error
        if not self._warned:
            self._warned = True
            warnings.warn(f"compile_update: {self.what} met more layouts than torch's recompile limit "
                          "(torch._dynamo.config.recompile_limit, 8 by default); those past it run eager (the same "
                          "numbers, more kernels)", stacklevel=2)
        return self.function(*args)

    def _explained(self, error: Exception, args) -> RuntimeError:
        first_line = next(iter(str(error).strip().splitlines()), "")
        tensor = next(_tensors(args), None)
        where = "" if tensor is None else f" for {tensor.dtype} tensors on {tensor.device}"
        return RuntimeError(
            f"compile_update=True: torch.compile could not build {self.what}{where} ({type(error).__name__}: "
            f"{first_line}). It needs a C++ compiler for CPU tensors and Triton for CUDA ones: install that, or "
            "drop compile_update (the same update, eager)")


def _tensors(args):
    """The tensors among `args`, and in the lists among them."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            yield arg
        elif isinstance(arg, (list, tuple)):
            yield from _tensors(arg)


compiled_moments_and_direction = Compiled(moments_and_direction, "AdamW's fused update")
