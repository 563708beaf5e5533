"""Plots are optional; sweeps fan out and combine."""

from __future__ import annotations

import json

import pytest

from simulations import plots
from simulations.cli import main
from simulations.runner import RunConfig, run


def test_plots_are_skipped_cleanly_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    result = run(RunConfig(nodes=4, stores=2, dim=16, drain_ms=2000))
    assert plots.plot_run(result, tmp_path) is None and list(tmp_path.iterdir()) == []
    assert main(["run", "--nodes", "4", "--stores", "2", "--dim", "16", "--drain-ms", "2000", "--out",
                 str(tmp_path)]) == 0  # fmt: skip
    assert (tmp_path / "summary.json").exists()


def test_run_plots(tmp_path):
    result = run(RunConfig(nodes=5, stores=4, dim=16, drain_ms=2000))
    made = plots.plot_run(result, tmp_path)
    assert made and all(p.stat().st_size > 1000 for p in made)


def test_sweep_runs_a_grid_over_processes(tmp_path):
    args = ["sweep", "--nodes", "4,6", "--loss", "0,0.2", "--stores", "2", "--dim", "16", "--drain-ms", "3000",
            "--strategy", "hyphae,oracle", "--workers", "2", "--out", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    points = json.loads((tmp_path / "sweep.json").read_text())
    assert [(p["config"]["nodes"], p["config"]["loss"]) for p in points] == [(4, 0), (4, 0.2), (6, 0), (6, 0.2)]
    assert (tmp_path / "N6-loss0.2-seed0" / "summary.json").exists()
    if plots.available():
        assert (tmp_path / "sweep_messages_per_store.png").exists()


def test_sweep_runs_on_a_dask_cluster(tmp_path):
    """``--scheduler``: the same grid on a local Dask cluster gives the same summaries as local processes."""
    from distributed import LocalCluster

    common = ["--nodes", "4,5", "--stores", "2", "--dim", "16", "--drain-ms", "2000", "--strategy", "hyphae,oracle",
              "--no-plots"]  # fmt: skip
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        assert main(["sweep", *common, "--scheduler", cluster.scheduler_address, "--out", str(tmp_path / "dask")]) == 0
        computed = cluster.scheduler.task_prefixes["run_point"].state_counts["memory"]
    assert computed == 2  # both grid points were computed by the cluster's workers
    assert main(["sweep", *common, "--workers", "1", "--out", str(tmp_path / "local")]) == 0
    for point in ("N4-loss0-seed0", "N5-loss0-seed0"):
        for name in ("summary.json", "cells.csv"):
            assert (tmp_path / "dask" / point / name).read_bytes() == (tmp_path / "local" / point / name).read_bytes()


def test_unreachable_scheduler_is_a_clear_error(tmp_path, capsys):
    assert main(["sweep", "--nodes", "4", "--stores", "1", "--scheduler", "tcp://127.0.0.1:9", "--out",
                 str(tmp_path)]) == 2  # fmt: skip
    assert "Dask scheduler" in capsys.readouterr().err
