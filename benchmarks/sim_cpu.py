"""CPU seconds of one simulation run (the Hyphae strategy by default), for A/B comparisons.

Wall time on a shared machine says little; the process's CPU time does. Compare two code
trees by running this once with each on the path, side by side::

    PYTHONPATH=/path/to/base python benchmarks/sim_cpu.py --nodes 1000 --stores 300 --view partial
    PYTHONPATH=/path/to/new  python benchmarks/sim_cpu.py --nodes 1000 --stores 300 --view partial

It prints one JSON line: CPU s, peak RSS, the load average, and the headline metrics (which
must be equal between the two trees: the summary is a function of the seed). ``--profile N``
prints the N most expensive functions by CPU self time instead (cProfile). ``--processes K``
splits the run (``python -m simulations run --processes``): CPU s then adds up every process,
and the wall time is the figure that falls.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sys
import time

from simulations.runner import RunConfig, run
from simulations.strategies import Step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--stores", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--view", choices=("full", "partial"), default="full")
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--store-interval-ms", type=int, default=50)
    p.add_argument("--warmup-max-ms", type=int, default=120_000)
    p.add_argument("--strategy", default="hyphae")
    p.add_argument("--crypto", choices=("sim", "real"), default="sim", help="the engines' crypto suite")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the N top functions (cProfile)")
    p.add_argument("--progress", action="store_true", help="a line per virtual second on stderr (long runs)")
    p.add_argument("--processes", type=int, default=1, help="processes the engines run on (0: one per core)")
    args = p.parse_args()
    cfg = RunConfig(
        nodes=args.nodes, stores=args.stores, seed=args.seed, view=args.view, loss=args.loss, dim=64,
        beacons_per_node=1, strategies=tuple(args.strategy.split(",")), store_interval_ms=args.store_interval_ms,
        warmup_max_ms=args.warmup_max_ms, crypto=args.crypto, processes=args.processes,
    )  # fmt: skip
    on_step = _print_step if args.progress else None
    load = os.getloadavg()[0]
    started, wall = _cpu_s(), time.perf_counter()
    if args.profile:
        profile = cProfile.Profile(time.process_time)
        result = profile.runcall(run, cfg, on_step=on_step)
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    else:
        result = run(cfg, on_step=on_step)
    cpu, wall = _cpu_s() - started, time.perf_counter() - wall
    keys = ("delivery_ratio", "precision", "messages_per_store", "control_messages_per_store",
            "warmup_control_messages")  # fmt: skip
    headline = {name: {k: s.get(k) for k in keys} for name, s in result.summary["strategies"].items()}
    print(json.dumps({
        "config": vars(args), "cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "load_at_start": load, "load_at_end": os.getloadavg()[0],
        "peak_rss_mb": _peak_rss_mb(), "summary": headline,
    }))  # fmt: skip


def _cpu_s() -> float:
    """User and system CPU of this process and of the run's processes it has waited for."""
    own, parts = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + parts.ru_utime + parts.ru_stime


def _peak_rss_mb() -> int:
    """This process's peak resident set, or the largest of a split run's processes."""
    own, parts = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return max(own.ru_maxrss, parts.ru_maxrss) // 1024


def _print_step(step: Step) -> None:
    """A JSON line per virtual second on stderr: phase, virtual time, CPU s, frames sent, RSS."""
    with open("/proc/self/statm") as fh:
        rss_mb = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
    print(json.dumps({
        "phase": step.phase, "virtual_s": round(step.at_ms / 1000, 1), "cpu_s": round(time.process_time(), 1),
        "frames": step.frames, "rss_mb": rss_mb, "load": os.getloadavg()[0],
    }), file=sys.stderr, flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
