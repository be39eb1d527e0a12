"""What tests/gpu/test_cuda_optimizers.py compares between CPU and CUDA, and the tolerances it uses, shared with
the CPU test that justifies them (tests/optimizers/test_device_tolerance.py).

Two devices differ in float rounding (SVD routine, matmul order), so a comparison between them is defined only
where rounding cannot change the result by more than it does in a CPU run perturbed at that level:
- the gradients have a separated spectrum (σ_k = 10 · 0.93^k): with the dense spectrum of a Gaussian matrix, a
  rounding-level difference rotates neighbouring singular vectors into each other, and either basis is right;
- the update Δw = w − w₀ is compared, relative to its own size (an rtol on w itself compares the weights' scale);
- GaLore's default keeps moments across a refresh while a singular vector's sign is arbitrary: it is compared
  within one refresh interval, and over several with align_signs (tests/projectors/test_align_signs.py);
- 8-bit states: bitsandbytes rounds each state to the nearest code on CUDA, while its CPU build (0.50) looks the
  code up in a table too coarse for the small values of its dynamic code: a second moment below ~1e-5 of its
  block's largest is stored as 1.6e-5 of it. That, not the GPU, moved PLUMAGE's 8-bit run by 5e-4 on the H100
  (the small second moments are the sampled rows'). The CPU reference therefore runs with bitsandbytes'
  quantizer swapped for the nearest-code rounding CUDA does (cuda_rounding_on_cpu); what is left is a state
  element moving to the neighbouring code when rounding puts it near a midpoint.
- PLUMAGE's projector (PLUMAGE_SAMPLED, the plumage_adamw default of sessions 14-16) stores its pool in bfloat16
  (pool_bf16): a rounding-level change of a gradient moves a stored vector entry across a bfloat16 rounding boundary
  now and then, and that moves these updates by up to 1.2 %, as much as a 1 % lr error (measured on the CPU with the
  perturbations of test_device_tolerance.py). It is therefore compared with its pool in float32, the same
  computation but for that cast (the cast itself is checked on the CPU: tests/projectors/test_resample.py, a
  bfloat16 pool draws the same vectors).
- plumage_adamw's default since session 17 is GaLore's basis with v_floor: compared as GaLore is, with aligned signs.
"""

from __future__ import annotations

import contextlib

import torch

from galore_plumage import GaLoreAdamW, GaLoreAdamW8bit, PlumageAdafactor, PlumageAdamW, PlumageAdamW8bit
from galore_plumage.optimizers import PLUMAGE_ADAFACTOR_DRAWS, PLUMAGE_SAMPLED, adamw8bit

SHAPE, RANK, GAP = (256, 128), 32, 3
FP32_RTOL = 1e-3  # CPU: a 1e-5 relative perturbation of every gradient moves these updates by at most 4e-4
EIGHT_BIT_RTOL = 5e-3  # CPU, nearest-code rounding: a 1e-5 perturbation moves these updates by at most 2e-3

# PLUMAGE's draws, the pool in float32 (see above), refreshed through float64's Gram/eigh on both devices. Solver
# "auto" takes float32's Gram for the pool, whose eigenvectors at the pool's tail (λ 1e-4 of λ₁, 14 % apart) each eigh
# routine rounds its own way by ~5e-3: 1.9 % apart between an H200 and the CPU (session 35). The SVD, pinned next,
# still differed by cuSOLVER's routine against LAPACK's: 2e-4 in float32 but 0.52 % and 0.76 % with 8-bit states, which
# turn a small change in the tail's p into a large one (session 37, benchmarks/device_parity.py on an H200). float64's
# eigh agrees across devices to 1.6e-5 (float32) and 1.4e-4 (8-bit): docs/device_parity_cuda.md. Each solver's accuracy
# is checked against float64's SVD on the CPU (tests/projectors/test_solver_accuracy.py); here devices are compared.
SAMPLED = {**PLUMAGE_SAMPLED, "pool_bf16": False, "solver": "gram64"}
DRAWS = {**PLUMAGE_ADAFACTOR_DRAWS, "pool_bf16": False}  # PlumageAdafactor's draws (sessions 42-80), the pool in float32
PAPER_P = {**SAMPLED, "max_inv_p": None, "resample_every": 0}  # the paper's 1/p, SAMPLED's solver
FP32_CASES = [  # (class, group options, updates): what both devices compute the same way
    (PlumageAdamW, SAMPLED, 6),
    (PlumageAdamW, PAPER_P, 6),  # the paper's 1/p
    (PlumageAdamW, {"align_signs": True}, 6),  # the default: GaLore's basis with the floor
    (PlumageAdafactor, DRAWS, 6),
    (PlumageAdafactor, {}, 6),  # its default since session 81: GaLore's basis through the Gram
    (GaLoreAdamW, {"align_signs": True}, 6),
    (GaLoreAdamW, {}, GAP),  # galore-torch's bases: one interval, before any moment crosses a refresh
]
EIGHT_BIT_CASES = [  # (8-bit class, its fp32 twin, group options)
    (PlumageAdamW8bit, PlumageAdamW, SAMPLED),
    (PlumageAdamW8bit, PlumageAdamW, PAPER_P),
    (GaLoreAdamW8bit, GaLoreAdamW, {"align_signs": True}),
    (PlumageAdamW8bit, PlumageAdamW, {"align_signs": True}),  # the default: GaLore's basis with the floor
]


def separated_gradients(generator: torch.Generator, steps: int):
    """Gradients with singular values 10 · 0.93^k (7 % apart) and fresh random singular vectors each step."""
    m, n = SHAPE
    sigma = 10 * 0.93 ** torch.arange(n, dtype=torch.float32)
    for _ in range(steps):
        u = torch.linalg.qr(torch.randn(m, n, generator=generator))[0]
        v = torch.linalg.qr(torch.randn(n, n, generator=generator))[0]
        yield (u * sigma) @ v.T


def update_after(cls, group: dict, steps: int, device: str = "cpu", dtype=torch.float32,
                 perturbation: float = 0.0) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    """Δw after `steps` updates of a 256 × 128 weight (rank 32, refresh every 3), as float32 on the CPU.

    perturbation: every gradient is multiplied by (1 + perturbation · N(0, 1)), a stand-in for another device's
    rounding. Gradients are drawn on the CPU from one seed, so every device sees the same ones."""
    generator, noise = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    start = torch.randn(SHAPE, generator=generator)
    weight = torch.nn.Parameter(start.to(device, dtype, copy=True))
    options = {"relative_step": False} if cls is PlumageAdafactor else {}
    optimizer = cls([{"params": [weight], "rank": RANK, "update_proj_gap": GAP, **group}], lr=1e-3,
                    weight_decay=0.01, **options)
    for grad in separated_gradients(generator, steps):
        if perturbation:
            grad = grad * (1 + perturbation * torch.randn(SHAPE, generator=noise))
        weight.grad = grad.to(device, dtype)
        optimizer.step()
    return weight.detach().float().cpu() - start, optimizer


def case_id(case) -> str:
    """pytest id of a parameter of FP32_CASES / EIGHT_BIT_CASES: a class name, the group options, or the value."""
    if isinstance(case, dict):
        return ",".join(f"{k}={v}" for k, v in case.items()) or "default"
    return getattr(case, "__name__", str(case))


def relative_difference(update: torch.Tensor, reference: torch.Tensor) -> float:
    return (update - reference).norm().item() / reference.norm().item()


def nearest_code_quantize(A: torch.Tensor, code: torch.Tensor, blocksize: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bitsandbytes' blockwise quantization as its CUDA kernels do it: each value / its block's absmax to the
    nearest code (the code is sorted). Same signature as torch.ops.bitsandbytes.quantize_blockwise."""
    flat = A.reshape(-1).float()
    pad = -flat.numel() % blocksize
    absmax = torch.nn.functional.pad(flat.abs(), (0, pad)).view(-1, blocksize).amax(1)
    scaled = flat / absmax.clamp_min(1e-38).repeat_interleave(blocksize)[: flat.numel()]
    above = torch.bucketize(scaled, code).clamp(max=len(code) - 1)
    below = (above - 1).clamp(min=0)
    nearest = torch.where((code[above] - scaled).abs() < (scaled - code[below]).abs(), above, below)
    return nearest.to(torch.uint8).view(A.shape), absmax


class _NearestCodeOp:
    """Stands in for torch.ops.bitsandbytes.quantize_blockwise (called directly and through `.default`)."""

    def __call__(self, A, code, blocksize):
        return nearest_code_quantize(A, code, blocksize)

    @property
    def default(self):
        return self


@contextlib.contextmanager
def cuda_rounding_on_cpu():
    """bitsandbytes on the CPU, rounding its 8-bit states as its CUDA kernels do (both the optimizer step's
    requantization and quantize_blockwise go through this one op), and stepping as on CUDA: v_floor a pass of its own
    before bitsandbytes' kernel (on a CPU the floor otherwise acts inside the step, one rounding of V fewer)."""
    import bitsandbytes  # noqa: F401 - registers torch.ops.bitsandbytes

    namespace = torch.ops.bitsandbytes
    real, real_fused = namespace.quantize_blockwise, adamw8bit.kernel_is_fused
    namespace.quantize_blockwise = _NearestCodeOp()
    adamw8bit.kernel_is_fused = lambda device: True
    try:
        yield
    finally:
        namespace.quantize_blockwise = real
        adamw8bit.kernel_is_fused = real_fused
