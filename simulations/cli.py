"""``python -m simulations run|sweep``: the command line of the harness."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from node.config import DEFAULT_BEACON_THRESHOLD

from .network import CRYPTO_SUITES
from .runner import ALL_STRATEGIES, RunConfig, run, write
from .strategies import Step

__all__ = ["main", "build_parser", "config_from"]


PROGRESS_EVERY_S = 5.0  # wall seconds between two progress lines of a long run


class _ProgressLines:
    """A line on stderr at most every ``PROGRESS_EVERY_S`` while a strategy runs (a run of
    10,000 nodes takes a quarter of an hour): its phase, virtual time, frames, peak RSS. Short runs
    print none."""

    def __init__(self) -> None:
        self._started = self._last = time.monotonic()

    def __call__(self, step: Step) -> None:
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        rss_mb = (step.peak_rss_kb or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) // 1024
        minutes, seconds = divmod(int(now - self._started), 60)
        print(f"  {step.strategy}: {step.phase} {step.at_ms / 1000:.1f}/{step.of_ms / 1000:.1f} virtual s, "
              f"{step.frames:,} frames, peak RSS {rss_mb:,} MB, {minutes}:{seconds:02d} elapsed",
              file=sys.stderr, flush=True)  # fmt: skip


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _mesh_overrides(items: list[str]) -> tuple[tuple[str, int | float], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        try:
            number = float(value) if "." in value else int(value)
        except ValueError:
            number = None
        if not sep or not key.strip() or number is None:
            raise ValueError(f"expected KEY=NUMBER, got {item!r}")
        out.append((key.strip(), number))
    return tuple(sorted(out))


def _add_common(p: argparse.ArgumentParser, *, grid: bool) -> None:
    p.add_argument("--nodes", type=_ints if grid else int, default=[20] if grid else 20,
                   help="node count" + (" (comma list)" if grid else ""))  # fmt: skip
    p.add_argument("--stores", type=int, help="cells stored, one every --store-interval-ms (default 20; "
                   "team-stream: its first this many memories, default all)")
    p.add_argument("--workload", default="synthetic", metavar="synthetic|team-stream[:PATH]",
                   help="synthetic topic clusters (default), or a labelled team stream (default file "
                        "benchmarks/data/team_stream.json) whose summary adds semantic precision/recall")
    p.add_argument("--beacon-threshold", type=float, default=DEFAULT_BEACON_THRESHOLD,
                   help="team-stream: every beacon's threshold (the node's default, %(default)s)")
    p.add_argument("--embed-cache", metavar="DIR",
                   help="team-stream: where its vectors are kept between runs (default: the user's cache "
                        "directory, hyphae/simulations/embeddings)")
    p.add_argument("--team-peers", action="store_true",
                   help="team-stream: each teammate's node is told of the others' at boot, beside its random "
                        "seeds (a team whose members joined through each other)")
    p.add_argument("--admission", metavar="MODULE:NAME",
                   help="team-stream: admit(beacon_payload, cell_payload) -> bool deciding which routed cells "
                        "enter an inbox (default: every one routing delivered)")
    p.add_argument("--seed", type=_ints if grid else int, default=[0] if grid else 0)
    p.add_argument("--view", choices=("full", "partial"), default="full")
    p.add_argument("--loss", type=_floats if grid else float, default=[0.0] if grid else 0.0,
                   help="frame loss probability" + (" (comma list)" if grid else ""))  # fmt: skip
    p.add_argument("--duplicate", type=float, default=0.0, help="frame duplication probability")
    p.add_argument("--latency", default="uniform:5:25", help="uniform:LO:HI | lognormal:MEDIAN:SIGMA | constant:MS")
    p.add_argument("--partition", help='e.g. "at=5000,heal=20000,split=0.5" (ms from the first store)')
    p.add_argument("--churn", help='e.g. "rate=0.5,down_ms=10000,mode=rejoin" (departures per node per minute); '
                   "mode rejoin (crash, restart with data), crash (for good) or leave (graceful, grace_ms=2000)")
    p.add_argument("--strategy", default=",".join(ALL_STRATEGIES), help="comma list of " + ",".join(ALL_STRATEGIES))
    p.add_argument("--dim", type=int, default=384, help="vector dimension (lower runs faster)")
    p.add_argument("--topics", type=int, default=50)
    p.add_argument("--beacons-per-node", type=int, default=2)
    p.add_argument("--zipf", type=float, default=1.0, help="topic popularity skew")
    p.add_argument("--store-interval-ms", type=int, default=50)
    p.add_argument("--supersede", type=float, default=0.0, metavar="SHARE",
                   help="share of the stores that supersede an earlier cell of their origin (stale exposure)")
    p.add_argument("--forget", type=float, default=0.0, metavar="SHARE",
                   help="share of the cells their origin forgets, 2 s after storing them")
    p.add_argument("--drain-ms", type=int, help="virtual time after the last store (default: until no data frame for 2 s, "
                        "at most 10 s; 75 s with loss, partitions or churn)")
    p.add_argument("--warmup-max-ms", type=int, default=120_000,
                   help="virtual time the control plane may take to settle before the first store (it ends "
                        "sooner once settled: a full view when every node knows every member and beacon, "
                        "a partial view when at most 1 %% of nodes change neighbours for 2 s running)")
    p.add_argument("--degree", type=int, default=8, help="flood overlay mean degree")
    p.add_argument("--fanout", type=int, default=4, help="random_push fanout")
    p.add_argument("--ttl", type=int, default=6, help="random_push hops")
    p.add_argument("--mesh", action="append", default=[], metavar="KEY=VALUE", help="MeshConfig override")
    p.add_argument("--energy", action="append", default=[], metavar="KEY=VALUE",
                   help="energy model override (node/energy.py), e.g. max_hops=12 or match_slack=0.1")
    p.add_argument("--crypto", choices=CRYPTO_SUITES, default="sim",
                   help="engines' crypto: sim (keyed-hash signatures and frame tags of the real sizes; "
                   "default) or real (Ed25519 + ChaCha20-Poly1305, as deployed; several times slower)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--no-plots", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="one run, every strategy side by side")
    _add_common(run_parser, grid=False)
    run_parser.add_argument("--processes", type=int, default=1,
                            help="processes the hyphae engines run on, side by side (0: one per core); "
                                 "the results are the same on any number")  # fmt: skip
    sweep = sub.add_parser("sweep", help="a grid of runs over local processes")
    _add_common(sweep, grid=True)
    sweep.add_argument("--workers", type=int, default=2)
    sweep.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on a Dask cluster (tcp://host:8786; pip install 'hyphae[dask]') instead of local processes")
    return parser


def config_from(args: argparse.Namespace, **overrides: object) -> RunConfig:
    labelled = not args.workload.startswith("synthetic")
    stores = args.stores if args.stores is not None else (None if labelled else 20)
    values: dict[str, object] = dict(
        nodes=args.nodes, stores=stores, seed=args.seed, view=args.view, loss=args.loss,
        duplicate=args.duplicate, latency=args.latency, partition=args.partition, churn=args.churn,
        strategies=tuple(s.strip() for s in args.strategy.split(",") if s.strip()), dim=args.dim,
        topics=args.topics, beacons_per_node=args.beacons_per_node, zipf=args.zipf,
        store_interval_ms=args.store_interval_ms, drain_ms=args.drain_ms, degree=args.degree, fanout=args.fanout,
        ttl=args.ttl, mesh=_mesh_overrides(args.mesh), warmup_max_ms=args.warmup_max_ms,
        energy=_mesh_overrides(args.energy), crypto=args.crypto, processes=getattr(args, "processes", 1),
        workload=args.workload, beacon_threshold=args.beacon_threshold, embed_cache=args.embed_cache,
        admission=args.admission, team_peers=args.team_peers, supersede=args.supersede, forget=args.forget,
    )  # fmt: skip
    values.update(overrides)
    return RunConfig(**values)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            cfg = config_from(args)
            started = time.perf_counter()
            result = run(cfg, progress=lambda name, s: print(f"  {name}: {s:.1f} s", file=sys.stderr),
                         on_step=_ProgressLines())  # fmt: skip
            write(result, args.out)
            if not args.no_plots:
                from .plots import plot_run

                made = plot_run(result, args.out)
                if made is None:
                    print("plots skipped: matplotlib is not installed (pip install 'hyphae[sim]')", file=sys.stderr)
            print(f"wrote {args.out}/summary.json in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            return 0
        from .sweep import run_sweep

        return run_sweep(args)
    except (ValueError, NotImplementedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
