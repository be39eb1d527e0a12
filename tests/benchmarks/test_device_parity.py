"""benchmarks/device_parity.py: every case of tests/gpu once, each PLUMAGE case once per solver, its difference taken
between the two devices' updates (the updates replaced by a recorder: no optimizer runs here)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import device_parity  # noqa: E402


def test_each_case_once_and_plumage_per_solver(monkeypatch):
    calls = []

    def fake_update(cls, group, steps, device="cpu", **_):
        calls.append((cls.__name__, group.get("solver"), device))
        return torch.ones(4) * (1.01 if device == "fake" else 1.0), None  # 1 % apart on "fake"

    monkeypatch.setattr(device_parity.gpu_cases, "update_after", fake_update)
    rows = list(device_parity.rows("fake"))
    groups = ([group for _, group, _ in device_parity.gpu_cases.FP32_CASES]
              + [group for _, _, group in device_parity.gpu_cases.EIGHT_BIT_CASES])
    plumage = sum(group.get("projector") == "plumage" for group in groups)
    assert plumage >= 4 and len(rows) == len(groups) + 2 * plumage
    assert {solver for _, solver, _, _ in rows} == {"svd", "gram", "gram64", "default"}
    assert all(abs(difference - 0.01) < 1e-6 for _, _, difference, _ in rows)
    assert len(calls) == 2 * len(rows) and {device for *_, device in calls} == {"cpu", "fake"}
