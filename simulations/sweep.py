"""A grid of runs (nodes × loss × seed) fanned out over local processes or a Dask cluster.

Each point is an independent :func:`runner.run`; results land in
``OUT/N{nodes}-loss{loss}-seed{seed}/`` and combined in ``OUT/sweep.json`` plus one
plot per metric. Where runs execute is an *existing* engine, never our own job
distribution: a ``concurrent.futures.ProcessPoolExecutor`` by default, or a
``dask.distributed.Client`` connected to ``--scheduler ADDRESS`` (``pip install
'hyphae[dask]'``). Workers only compute and return the result; this process writes
every file, so a remote cluster needs no shared filesystem.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from .runner import RunConfig, RunResult, run, write

__all__ = ["grid", "run_sweep", "run_point", "executor_for", "SWEEP_METRICS"]

SWEEP_METRICS = (
    "delivery_ratio", "precision", "messages_per_store", "bytes_per_store", "latency_ms_p50", "latency_ms_p99",
    "duplicates_per_delivery", "max_node_load",
)  # fmt: skip


def grid(args: argparse.Namespace) -> list[RunConfig]:
    from .cli import config_from

    return [
        config_from(args, nodes=n, loss=loss, seed=seed)
        for n, loss, seed in itertools.product(args.nodes, args.loss, args.seed)
    ]


def point_dir(out: Path, cfg: RunConfig) -> Path:
    return out / f"N{cfg.nodes}-loss{cfg.loss:g}-seed{cfg.seed}"


def run_point(cfg: RunConfig) -> tuple[RunResult, float]:
    """One grid point, on whichever worker runs it: the result and its wall time."""
    started = time.perf_counter()
    result = run(cfg)
    return result, time.perf_counter() - started


def executor_for(scheduler: str | None, workers: int) -> Any:
    """A local process pool, or a Dask client for ``scheduler`` (``tcp://host:8786``)."""
    if scheduler:
        try:
            from distributed import Client
        except ImportError as exc:
            raise ValueError("--scheduler needs Dask: pip install 'hyphae[dask]'") from exc
        try:
            return Client(scheduler, timeout="10s")
        except OSError as exc:
            raise ValueError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
    return cf.ProcessPoolExecutor(max_workers=max(1, workers))


def _as_completed(executor: Any, futures: list[Any]) -> Any:
    if isinstance(executor, cf.Executor):
        return cf.as_completed(futures)
    from distributed import as_completed

    return as_completed(futures)


def run_sweep(args: argparse.Namespace) -> int:
    configs = grid(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    executor = executor_for(args.scheduler, args.workers)
    points: list[dict[str, Any]] = []
    started = time.perf_counter()
    with executor:
        extra = {} if isinstance(executor, cf.Executor) else {"pure": False}
        futures = {executor.submit(run_point, cfg, **extra): cfg for cfg in configs}
        _progress(0, len(configs), started)
        for done, future in enumerate(_as_completed(executor, list(futures)), 1):
            result, wall_s = future.result()
            write(result, point_dir(out, futures[future]))
            points.append({"config": result.summary["config"], "summary": result.summary, "wall_s": wall_s})
            _progress(done, len(configs), started)
    print(file=sys.stderr)
    points.sort(key=lambda p: (p["config"]["nodes"], p["config"]["loss"], p["config"]["seed"]))
    combined = [{"config": p["config"], "strategies": p["summary"]["strategies"]} for p in points]
    (out / "sweep.json").write_text(json.dumps(combined, indent=2, sort_keys=True) + "\n")
    (out / "timing.json").write_text(json.dumps(
        [{"nodes": p["config"]["nodes"], "loss": p["config"]["loss"], "seed": p["config"]["seed"],
          "wall_s": round(p["wall_s"], 2)} for p in points], indent=2) + "\n")  # fmt: skip
    if not args.no_plots:
        from .plots import plot_sweep

        if plot_sweep(points, out, SWEEP_METRICS) is None:
            print("plots skipped: matplotlib is not installed (pip install 'hyphae[sim]')", file=sys.stderr)
    print(f"wrote {out}/sweep.json ({len(points)} runs, {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return 0


def _progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = width * done // max(1, total)
    elapsed = time.perf_counter() - started
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs, {elapsed:.0f} s", end="", file=sys.stderr)
