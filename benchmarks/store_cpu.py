"""CPU per durable store, split by thread (trio loop, writer, indexer). Run by hand.

    python benchmarks/store_cpu.py --cells 10000 --concurrency 128 [--no-indexer]

Wall time on a shared machine measures the other jobs; CPU time per store does not (much),
so A/B comparisons of the store path use this: run it on two commits in alternation. With
``--no-indexer`` the online indexer is not started and the figure is the store path alone
(validation, ids, the trio hops, the writer's group commit); otherwise the indexer's share
of the burst shows too, and the time to index the backlog afterwards is reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.store_bench import PoolEmbedder, clustered  # noqa: E402
from app.home import init_home, open_node  # noqa: E402
from node.layers import LayerSet  # noqa: E402


def cpu_by_thread() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    seconds: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat.rsplit(")", 1)[1].split()
        name = names.get(int(tid), "other")
        name = "trio-workers" if name.startswith("Trio") else name
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return seconds


def bytes_written() -> int:
    """Bytes this process has asked to write (write() calls: WAL frames, checkpoints, index files)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


async def run(args) -> None:
    rng = np.random.default_rng(args.seed)
    texts = [f"memory {i}: synthetic cell about topic {i % 200}" for i in range(args.cells)]
    embedder = PoolEmbedder(texts, clustered(args.cells, rng))
    home = Path(tempfile.mkdtemp(prefix="hyphae-cpu-"))
    if args.no_indexer:
        LayerSet.start_indexer = lambda self: None  # type: ignore[method-assign]
    try:
        init_home(home)
        async with open_node(home, embedder=embedder) as service:
            principal, _ = await service.add_agent("bench")
            queue = iter(texts)

            async def writer() -> None:
                for text in queue:
                    await service.store(principal, content=text, cell_type="Fact")

            load = os.getloadavg()[0]
            written = bytes_written()
            before, cpu_started, started = cpu_by_thread(), time.process_time(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(args.concurrency):
                    nursery.start_soon(writer)
            wall, cpu, after = time.perf_counter() - started, time.process_time() - cpu_started, cpu_by_thread()
            written = bytes_written() - written
            backlog = service.layers.backlog()
            per_thread = {
                name: round((after[name] - before.get(name, 0.0)) / args.cells * 1e6)
                for name in sorted(after)
                if after[name] - before.get(name, 0.0) > 0
            }
            print(
                f"{args.cells} stores: {args.cells / wall:,.0f}/s wall, {cpu / args.cells * 1e6:.0f} CPU-us per store "
                f"(by thread: {per_thread}), {service.db.batches} write batches, {written / args.cells / 1024:.1f} KB "
                f"written per store, load average {load:.2f}"
            )
            if args.no_indexer:
                for fresh in service.layers._fresh.values():  # nothing to index: closing must not wait
                    fresh.drop_front(len(fresh))
            else:
                cpu_started, started = time.process_time(), time.perf_counter()
                await trio.to_thread.run_sync(service.layers.flush)
                print(
                    f"index catch-up of {backlog} rows: {time.perf_counter() - started:.1f} s, "
                    f"{time.process_time() - cpu_started:.1f} CPU-s"
                )
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--no-indexer", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    trio.run(run, args)


if __name__ == "__main__":
    main()
