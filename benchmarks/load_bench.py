"""Load figures: 32 MCP clients against one real daemon for 60 s, and its memory over time.

    python benchmarks/load_bench.py                       # 32 clients, 60 s, 15 s warm-up
    python benchmarks/load_bench.py --clients 8 --duration 20

The workload is the one ``tests/reliability/test_load.py`` runs (``run_load`` in
``tests/reliability/conftest.py``): each client is its own agent on its own keep-alive
connection speaking JSON-RPC over ``POST /mcp``, with a standing beacon, looping over
store 40% / recall 30% / inbox 15% / pull_inbox 15% as fast as the node answers. The
daemon (``hyphae up``, hashed embedder so the figures are the node's, not the model's)
runs in its own process; the clients share the machine's cores with it.

Writes ``load.json`` (p50/p99 per tool, errors, stores acknowledged and found afterwards,
RSS at start / after warm-up / end, load average) and ``load_rss.png`` (the daemon's
resident set over time, with the cells it holds) into ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import make_home, prepare_agents, start_daemon  # noqa: E402
from tests.reliability.conftest import LoadReport, missing_from_database, run_load  # noqa: E402


def measure(clients: int, duration: float, warmup: float) -> tuple[LoadReport, dict]:
    with tempfile.TemporaryDirectory(prefix="hyphae-load-") as tmp:
        home = make_home(Path(tmp) / "home")
        keys = prepare_agents(home, *(f"agent{i}" for i in range(clients)))
        daemon = start_daemon(home)
        load_before = os.getloadavg()
        try:
            report = trio.run(functools.partial(
                run_load, daemon.url, list(keys.values()), duration=duration, pid=daemon.process.pid, warmup=warmup,
            ))
            load_after = os.getloadavg()
        finally:
            exit_code = daemon.stop()
        missing = missing_from_database(home / "hyphae.db", report.acked)
    grown_mib, stores_after_warmup = report.rss_growth_after_warmup()
    figures = {
        **report.summary(),
        "acknowledged_but_missing": len(missing),
        "daemon_exit_code": exit_code,
        "rss_growth_after_warmup_mib": round(grown_mib, 1),
        "stores_after_warmup": stores_after_warmup,
        "rss_kib_per_store_after_warmup": round(grown_mib * 1024 / stores_after_warmup, 2) if stores_after_warmup else None,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }
    return report, figures


def plot(report: LoadReport, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [t for t, _ in report.rss]
    rss = [kib / 1024 for _, kib in report.rss]
    stored = sorted(report.stored_at)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(times, rss, color="tab:blue", label="daemon RSS (MiB)")
    ax.set_xlabel("seconds since the clients started")
    ax.set_ylabel("resident set (MiB)", color="tab:blue")
    ax.set_ylim(0, max(rss) * 1.25 if rss else 1)
    if report.warmup:
        ax.axvline(report.warmup, color="grey", linestyle="--", linewidth=1)
        ax.text(report.warmup, ax.get_ylim()[1] * 0.03, " end of warm-up", color="grey", fontsize=8)
    cells = ax.twinx()
    cells.plot(stored, range(1, len(stored) + 1), color="tab:orange", label="cells stored")
    cells.set_ylabel("cells stored (acknowledged)", color="tab:orange")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    report, figures = measure(args.clients, args.duration, args.warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load.json").write_text(json.dumps(figures, indent=1) + "\n")
    plot(report, args.out / "load_rss.png",
         f"{args.clients} MCP clients, {figures['duration_s']:.0f} s: {figures['calls']} calls, "
         f"{figures['errors']} errors, p99 {figures['all']['p99_ms']} ms")
    print(json.dumps(figures, indent=1))
    return 0 if figures["errors"] == 0 and figures["acknowledged_but_missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
