"""How far the same optimizer lands on CUDA from the CPU: the figures behind tests/gpu/test_cuda_optimizers.py.

The GPU tests pass or fail against a tolerance (tests/device_helpers.py); this prints the relative difference of each
case's update, Δw after a few steps of a 256 × 128 weight, so a failure shows by how much, and each PLUMAGE case again
with every solver on both devices: the 8-bit states turn a change of refresh routine into a large one
(tests/optimizers/test_device_tolerance.py), so a case that fails with the SVD on both devices and passes with
float64's eigh on both says that two SVD routines (cuSOLVER's, LAPACK's), not the optimizer, moved it.

    python benchmarks/device_parity.py --out docs/device_parity_cuda.md     # on a GPU machine
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import device_helpers as gpu_cases  # noqa: E402 - tests/ holds the cases the GPU tests compare

SOLVERS = ("svd", "gram", "gram64")


def rows(device: str):
    """(case, solver, relative difference from the CPU, tolerance) for every case, each PLUMAGE case per solver."""
    # (class, options, updates, tolerance, how the CPU side rounds): the 8-bit cases round as CUDA does, as the tests do
    cases = [(cls, group, steps, gpu_cases.FP32_RTOL, contextlib.nullcontext)
             for cls, group, steps in gpu_cases.FP32_CASES]
    cases += [(cls8, group, 6, gpu_cases.EIGHT_BIT_RTOL, gpu_cases.cuda_rounding_on_cpu)
              for cls8, _, group in gpu_cases.EIGHT_BIT_CASES]
    for cls, group, steps, tolerance, cpu_rounding in cases:
        solvers = SOLVERS if group.get("projector") == "plumage" else (group.get("solver", "default"),)
        for solver in solvers:
            options = group if solver == "default" else {**group, "solver": solver}
            with cpu_rounding():
                on_cpu, _ = gpu_cases.update_after(cls, options, steps, "cpu")
            on_device, _ = gpu_cases.update_after(cls, options, steps, device)
            difference = gpu_cases.relative_difference(on_device, on_cpu)
            yield f"{cls.__name__}({gpu_cases.case_id(group)})", solver, difference, tolerance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="write the markdown table here too")
    args = parser.parse_args()
    lines = [f"Δw on {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else args.device}) "
             f"against the CPU, relative; torch {torch.__version__}", "",
             "| case | solver (both devices) | relative difference | tolerance | within |", "|---|---|---:|---:|---|"]
    for case, solver, difference, tolerance in rows(args.device):
        lines.append(f"| {case} | {solver} | {difference:.2e} | {tolerance:.0e} | {'yes' if difference < tolerance else 'NO'} |")
        print(lines[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
