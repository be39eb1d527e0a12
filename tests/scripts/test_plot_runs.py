"""scripts/plot_runs.py draws loss curves and projector heatmaps from metrics.jsonl, and refuses what it cannot plot."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from train_helpers import REPO

spec = importlib.util.spec_from_file_location("plot_runs", REPO / "scripts" / "plot_runs.py")
plot_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_runs)

PARAMS = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"]


def _write_run(folder, projector: bool):
    folder.mkdir()
    records = [{"type": "train", "step": s, "loss": 5.0 - 0.1 * s, "lr": 1e-3, "tokens": 64 * s} for s in range(1, 11)]
    records += [{"type": "eval", "step": s, "eval_loss": 5.0 - 0.1 * s, "eval_ppl": math.exp(5.0 - 0.1 * s)} for s in (5, 10)]
    if projector:
        records += [{"type": "projector", "step": s, "param": p, "r_star": i + s // 5, "tau": 5, "rho": None}
                    for s in (5, 10) for i, p in enumerate(PARAMS)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_loss_curves_and_heatmaps_are_written(tmp_path):
    runs = [_write_run(tmp_path / "adamw", projector=False), _write_run(tmp_path / "plumage", projector=True)]
    written = plot_runs.main([str(r) for r in runs] + ["--out", str(tmp_path / "out" / "cmp"), "--heatmaps", "r_star,tau"])
    assert [p.name for p in written] == ["cmp_loss.png", "cmp_r_star.png", "cmp_tau.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_stat_grid_places_each_value_by_layer_and_update(tmp_path):
    _, records = plot_runs.load_run(_write_run(tmp_path / "plumage", projector=True) / "metrics.jsonl")
    params, steps, grid = plot_runs.stat_grid(records, "r_star")
    assert params == PARAMS and steps == [5, 10]
    assert grid == [[1.0, 2.0], [2.0, 3.0]]
    _, _, rho = plot_runs.stat_grid(records, "rho")  # logged as null (no previous basis): left empty
    assert all(math.isnan(v) for row in rho for v in row)


def test_moving_average():
    assert plot_runs.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_what_cannot_be_plotted_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        plot_runs.main([str(tmp_path / "nowhere")])
    full_rank = _write_run(tmp_path / "adamw", projector=False)
    with pytest.raises(SystemExit, match="'r_star'"):
        plot_runs.main([str(full_rank), "--out", str(tmp_path / "x"), "--heatmaps", "r_star"])
    plumage = _write_run(tmp_path / "plumage", projector=True)
    with pytest.raises(SystemExit, match="'rho'"):
        plot_runs.main([str(plumage), "--out", str(tmp_path / "y"), "--heatmaps", "rho"])
