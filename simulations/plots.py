"""PNG figures. matplotlib is optional (``pip install 'hyphae[sim]'``): without it, nothing is drawn."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_run", "plot_sweep", "available"]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def available() -> bool:
    return _pyplot() is not None


def plot_run(result: Any, out: Path) -> list[Path] | None:
    """Delivery over time, latency CDF, delivery and precision against salience."""
    plt = _pyplot()
    if plt is None:
        return None
    strategies: dict[str, dict[str, Any]] = result.summary["strategies"]
    made: list[Path] = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in strategies.items():
        curve = s["delivery_curve"]
        ax.plot([t / 1000 for t in curve["t_ms"]], curve["reached"], label=name)
    ax.set(xlabel="virtual time since first store (s)", ylabel="interested (cell, node) pairs reached",
           title="Delivery over time", ylim=(0, 1.02))  # fmt: skip
    ax.legend()
    made.append(_save(fig, out / "delivery_over_time.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in strategies.items():
        qs = s["latency_ms_quantiles"]
        if qs and qs[0] is not None:
            ax.plot(qs, [q / 100 for q in range(0, 101, 5)], label=name)
    ax.set(xlabel="latency (virtual ms)", ylabel="fraction of interested deliveries", title="Latency CDF")
    ax.set_xscale("symlog")
    ax.legend()
    made.append(_save(fig, out / "latency_cdf.png", plt))

    edges = [0.2, 0.4, 0.6, 0.8, 1.0001]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in strategies:
        rows = [r for r in result.rows if r["strategy"] == name]
        mids, delivery, precision = [], [], []
        for lo, hi in zip(edges, edges[1:]):
            band = [r for r in rows if lo <= r["salience"] < hi]
            reached = sum(r["reached"] for r in band)
            interested = sum(r["interested"] for r in band)
            deliveries = sum(r["deliveries"] for r in band)
            mids.append((lo + min(hi, 1.0)) / 2)
            delivery.append(reached / interested if interested else float("nan"))
            precision.append(reached / deliveries if deliveries else float("nan"))
        left.plot(mids, delivery, marker="o", label=name)
        right.plot(mids, precision, marker="o", label=name)
    left.set(xlabel="salience", ylabel="delivery ratio", title="Delivery against salience", ylim=(0, 1.02))
    right.set(xlabel="salience", ylabel="precision", title="Precision against salience", ylim=(0, 1.02))
    right.legend()
    made.append(_save(fig, out / "salience.png", plt))
    return made


def plot_sweep(points: Sequence[dict[str, Any]], out: Path, metrics: Sequence[str]) -> list[Path] | None:
    """One figure per metric: the metric against N, one line per (strategy, loss)."""
    plt = _pyplot()
    if plt is None:
        return None
    made = []
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(6, 4))
        lines: dict[tuple[str, float], list[tuple[int, float]]] = {}
        for p in points:
            for name, s in p["summary"]["strategies"].items():
                if s.get(metric) is not None:
                    lines.setdefault((name, p["config"]["loss"]), []).append((p["config"]["nodes"], s[metric]))
        for (name, loss), xy in sorted(lines.items()):
            xy.sort()
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=f"{name}, loss {loss:g}")
        ax.set(xlabel="nodes (N)", ylabel=metric.replace("_", " "), title=f"{metric} against N")
        ax.set_xscale("log")
        if metric in ("messages_per_store", "bytes_per_store", "max_node_load"):
            ax.set_yscale("log")
        ax.legend(fontsize="small")
        made.append(_save(fig, out / f"sweep_{metric}.png", plt))
    return made


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
