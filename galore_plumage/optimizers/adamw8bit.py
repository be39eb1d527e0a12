"""8-bit AdamW: bitsandbytes' blockwise-quantized moments through its functional API, on CPU and CUDA.

The low-rank update is computed by bitsandbytes' own kernel into a zeroed low-rank scratch tensor (so
neither p.data is swapped, as galore-torch does, nor a full-size copy of the weight made); tensors with
fewer than `min_8bit_size` elements keep fp32 moments, as in bitsandbytes. Realignment dequantizes,
transports and requantizes.

On a CPU, bitsandbytes' 8-bit kernel is itself torch code: dequantize both moments, Adam in float32, requantize.
Ours (`_dense_step`) is that sequence, op for op (the parity test against galore-torch's GaLoreAdamW8bit is exact),
with v_floor applied to the dequantized moments in between: the floor then costs no pass of its own. On CUDA the
kernel is fused, so the floor dequantizes, raises and requantizes V before it (`_floor`).
"""

from __future__ import annotations

import math

import torch

from .base import PLUMAGE_ADAM_RECIPE, PLUMAGE_DEFAULTS, Backend, LowRankOptimizer, Update, check_betas, check_non_negative
from .compiled_update import require_foreach
from .moment_floor import floor_second_moment
from .realign import realign_dense

BLOCKSIZE = 256  # bitsandbytes' block for 8-bit optimizer states
_QMAPS: dict[tuple[str, bool], torch.Tensor] = {}


def _functional():
    try:
        import bitsandbytes.functional as functional
    except ImportError as error:  # an optional backend: say how to get it
        raise ImportError("the adamw8bit backend needs bitsandbytes: pip install 'bitsandbytes>=0.45'") from error
    return functional


def quantile_map(device: torch.device, signed: bool) -> torch.Tensor:
    """bitsandbytes' dynamic 8-bit code (signed for M, unsigned for V); a constant, so never checkpointed."""
    key = (str(device), signed)
    if key not in _QMAPS:
        _QMAPS[key] = _functional().create_dynamic_map(signed=signed).to(device)
    return _QMAPS[key]


def dequantize(state: dict, which: int) -> torch.Tensor:
    code = quantile_map(state[f"state{which}"].device, signed=which == 1)
    return _functional().dequantize_blockwise(
        state[f"state{which}"], absmax=state[f"absmax{which}"], code=code, blocksize=BLOCKSIZE
    )


def dense_moments(state: dict) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """Whether the moments are 8-bit, and M and V as float32 tensors (dequantized copies, or the fp32 states
    themselves for a tensor below min_8bit_size)."""
    if state["state1"].dtype != torch.uint8:
        return False, state["state1"], state["state2"]
    return True, dequantize(state, 1), dequantize(state, 2)


def kernel_is_fused(device: torch.device) -> bool:
    """Whether bitsandbytes' 8-bit Adam step on `device` is one fused kernel (CUDA) rather than torch code that
    dequantizes, steps in float32 and requantizes (CPU), which `_dense_step` reproduces with the floor inside."""
    return device.type != "cpu"


def quantize_into(state: dict, which: int, values: torch.Tensor) -> None:
    code = quantile_map(values.device, signed=which == 1)
    quantized, quant_state = _functional().quantize_blockwise(values.contiguous(), code=code, blocksize=BLOCKSIZE)
    state[f"state{which}"].copy_(quantized.view_as(state[f"state{which}"]))
    state[f"absmax{which}"].copy_(quant_state.absmax)


def reblock_codes(codes: torch.Tensor, saved_absmax: torch.Tensor, signed: bool, first_row: int, rows: int,
                  saved_world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One 8-bit moment of a row-sharded weight (`rows` rows in all) carried into another number of processes.

    `codes` are this rank's rows of it, from `first_row` on, as torch.distributed.checkpoint resharded them (codes are
    per value, so they move intact); `saved_absmax` is every saved rank's list of block scales, each padded to the same
    length, concatenated, of the `saved_world` ranks that wrote them (torch.chunk's split: saved rank k held rows
    [k·s, (k+1)·s), s = ⌈rows / saved_world⌉). Returns
    this rank's codes and block scales in its own blocks of BLOCKSIZE values: a block that was a saved block whole keeps
    its codes and scale; any other is dequantized with the scales its values were written under and quantized anew
    (one more rounding). Requantizing a whole block would not be the identity: the signed map's lowest code is −0.993,
    so a block whose largest value is negative would come back with a smaller scale."""
    count = codes.numel()
    if count == 0:
        return codes, saved_absmax.new_zeros(0)
    device, per_row = codes.device, math.prod(codes.shape[1:])
    saved_rows, saved_length = math.ceil(rows / saved_world), saved_absmax.numel() // saved_world
    row = torch.arange(first_row, first_row + codes.shape[0], device=device)
    saved_rank = row // saved_rows
    within = ((row - saved_rank * saved_rows) * per_row)[:, None] + torch.arange(per_row, device=device)
    scale_index = (saved_rank[:, None] * saved_length + within // BLOCKSIZE).reshape(-1)
    code = quantile_map(device, signed)
    flat = codes.reshape(-1)
    values = code[flat.long()] * saved_absmax[scale_index]
    requantized, quant_state = _functional().quantize_blockwise(values, code=code, blocksize=BLOCKSIZE)

    block = torch.arange(count, device=device) // BLOCKSIZE
    blocks = quant_state.absmax.numel()
    first = torch.full((blocks,), saved_absmax.numel(), device=device).scatter_reduce(0, block, scale_index, "amin")
    last = torch.full((blocks,), -1, device=device).scatter_reduce(0, block, scale_index, "amax")
    # how many values each saved block held: saved rank k wrote its rows·per_row values in blocks of BLOCKSIZE
    held = (rows - torch.arange(saved_world, device=device) * saved_rows).clamp(0, saved_rows) * per_row
    saved_size = (held[:, None] - torch.arange(saved_length, device=device) * BLOCKSIZE).clamp(0, BLOCKSIZE).reshape(-1)
    whole = (first == last) & (torch.bincount(block, minlength=blocks) == saved_size[first])
    absmax = torch.where(whole, saved_absmax[first], quant_state.absmax)
    return torch.where(whole[block], flat, requantized.reshape(-1)).view_as(codes), absmax


class AdamW8bitBackend(Backend):
    name = "adamw8bit"
    defaults = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2, "min_8bit_size": 4096}
    row_keys = ("state1", "state2")
    moments_key = "state1"
    per_rank_keys = ("absmax1", "absmax2")  # one scale per block of a rank's own rows

    def per_rank_length(self, state, rows):
        return math.ceil(rows * math.prod(state["state1"].shape[1:]) / BLOCKSIZE)

    def reblocked(self, state, first_row, rows, saved_world):
        out = {}
        for which in (1, 2):
            if f"absmax{which}" in state:  # 8-bit (a tensor below min_8bit_size keeps fp32 row keys: nothing to do)
                out[f"state{which}"], out[f"absmax{which}"] = reblock_codes(
                    state[f"state{which}"], state[f"absmax{which}"], which == 1, first_row, rows, saved_world)
        return out

    def group_for_numel(self, group, numel):
        """Whether a state is 8-bit is decided on the whole tensor, so every rank keeps the same layout."""
        return {**group, "min_8bit_size": 0 if numel >= group["min_8bit_size"] else math.inf}

    def validate(self, group):
        check_non_negative(group, "lr", "eps", "weight_decay")
        check_betas(group["betas"])
        require_foreach(group, "adamw8bit", "the complement's arithmetic (bitsandbytes' kernel updates each weight's "
                        "moments)")

    @staticmethod
    def _init(state: dict, like: torch.Tensor, group: dict) -> None:
        if like.numel() < group["min_8bit_size"]:
            state["state1"] = torch.zeros_like(like, dtype=torch.float32)
            state["state2"] = torch.zeros_like(like, dtype=torch.float32)
            return
        blocks = (like.numel() + BLOCKSIZE - 1) // BLOCKSIZE
        for which in (1, 2):
            state[f"state{which}"] = torch.zeros_like(like, dtype=torch.uint8)
            state[f"absmax{which}"] = torch.zeros(blocks, dtype=torch.float32, device=like.device)

    @staticmethod
    def _kernel(state: dict, grad: torch.Tensor, target: torch.Tensor, group: dict, weight_decay: float) -> None:
        """One bitsandbytes Adam step on `target` (the weight, or a zero scratch that receives the update)."""
        functional = _functional()
        beta1, beta2 = group["betas"]
        common = {"g": grad, "p": target, "beta1": beta1, "eps": group["eps"], "step": state["step"], "lr": group["lr"]}
        if state["state1"].dtype == torch.uint8:
            functional.optimizer_update_8bit_blockwise(
                optimizer_name="adam", state1=state["state1"], state2=state["state2"], beta2=beta2, beta3=0.0,
                alpha=0.0, qmap1=quantile_map(grad.device, True), qmap2=quantile_map(grad.device, False),
                absmax1=state["absmax1"], absmax2=state["absmax2"], weight_decay=weight_decay, gnorm_scale=1.0,
                **common,
            )
        else:
            functional.optimizer_update_32bit(
                optimizer_name="adam", state1=state["state1"], state2=state["state2"], beta2=beta2,
                weight_decay=weight_decay, **common,
            )

    def update(self, state, grad, group, param, rows=None):
        grad = grad.float().contiguous()
        decay = group["lr"] * group["weight_decay"]
        # At lr 0 (a linear warm-up's first update) the finished step −lr·m̂/(√v̂+ε) is zero, and so would be every size
        # read from it: Fira's φ, and the limiter's reference, which float32's M/√V takes from that update. A zero
        # reference limits nothing: the complement then moved at 3-6 times the basis's step where float32's moved at
        # 0.5-2 (session 41, docs/results.md §3). So step at lr 1 and move the weight by none of it; the moments advance
        # alike (lr does not enter them).
        moving = group["lr"] > 0
        if not moving:
            group = {**group, "lr": 1.0}
        floor = group.get("v_floor", "none") if rows is not None else "none"  # a low-rank weight's (moment_floor.py)
        if "state1" not in state:  # no update in the moments yet: nothing to floor
            self._init(state, grad, group)
            floor = "none"
        if state["state1"].dtype == torch.uint8 and not kernel_is_fused(grad.device):
            direction = self._dense_step(state, grad, group, floor)
        else:
            if floor != "none":
                self._floor(state, floor, group["betas"], group.get("v_floor_horizon"))
            direction = torch.zeros_like(grad)
            self._kernel(state, grad, direction, group, weight_decay=0.0)
        # direction now holds −lr·m̂/(√v̂+ε): the weight moves by +project_back(direction); per unit of AdamW's M/√V
        # it carries lr times the bias correction √(1 − β2^t)/(1 − β1^t)
        beta1, beta2 = group["betas"]
        step = state["step"]
        unit = group["lr"] * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        return Update(direction, -1.0 if moving else 0.0, decay, unit=unit)

    def full_step(self, param, grad, group, state):
        """Regular (full-rank) weights: the kernel updates the weight in place, decay included."""
        if "state1" not in state:
            self._init(state, param, group)
        self._kernel(state, grad.contiguous(), param, group, weight_decay=group["weight_decay"])

    @staticmethod
    def _dense_step(state: dict, grad: torch.Tensor, group: dict, floor: str) -> torch.Tensor:
        """bitsandbytes' CPU 8-bit Adam step, without weight decay, on 8-bit moments: −lr·m̂/(√v̂+ε), the moments
        dequantized once, floored (`floor`), advanced and requantized. The same ops in the same order as its kernel
        on a zero scratch (whose addcdiv_ forms (value·M)/denom), so without a floor the same bits."""
        beta1, beta2 = group["betas"]
        step = state["step"]
        _, exp_avg, exp_avg_sq = dense_moments(state)
        # the floor's M² buffer, free once V is floored, takes the denominator (as in AdamW's update)
        scratch = floor_second_moment({"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, floor, beta1, beta2,
                                      group.get("v_floor_horizon"))
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        denom = exp_avg_sq.sqrt() if scratch is None else torch.sqrt(exp_avg_sq, out=scratch)
        denom.div_(math.sqrt(1.0 - beta2**step)).add_(group["eps"])  # in place: the same bits
        direction = exp_avg.mul(-group["lr"] / (1.0 - beta1**step)).div_(denom)
        quantize_into(state, 1, exp_avg)
        quantize_into(state, 2, exp_avg_sq)
        return direction

    @staticmethod
    def _floor(state: dict, floor: str, betas: tuple[float, float], horizon: int | None) -> None:
        """v_floor before a fused (CUDA) kernel: dequantize, raise V, requantize V (M is read only)."""
        quantized, m, v = dense_moments(state)
        moments = {"step": state["step"], "exp_avg": m, "exp_avg_sq": v}
        floor_second_moment(moments, floor, *betas, horizon)
        if quantized:
            quantize_into(state, 2, moments["exp_avg_sq"])

    def realign(self, state, projector, rule):
        if "state1" not in state or rule == "none":
            return
        quantized, m, v = dense_moments(state)
        m, v = realign_dense(m, v, projector, rule)
        if quantized:
            quantize_into(state, 1, m)
            quantize_into(state, 2, v)
        else:
            state["state1"], state["state2"] = m, v


class GaLoreAdamW8bit(LowRankOptimizer):
    """Drop-in for galore_torch.GaLoreAdamW8bit, without its CUDA-only synchronize: runs on CPU too."""

    backend = AdamW8bitBackend()


class PlumageAdamW8bit(LowRankOptimizer):
    """8-bit AdamW with PlumageAdamW's defaults (GaLore's basis with v_floor, the floor applied to the dequantized
    moments); with projector="plumage", PLUMAGE's draws, the moments dequantized, realigned and requantized at each."""

    backend = AdamW8bitBackend()
    class_defaults = {**PLUMAGE_DEFAULTS, **PLUMAGE_ADAM_RECIPE}
