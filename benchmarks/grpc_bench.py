"""gRPC unary Recall calls/s beside MCP-over-HTTP recall, on one node, in one run.

    python benchmarks/grpc_bench.py                  # hashed embedder, 10k cells, 8 clients
    python benchmarks/grpc_bench.py --cells 2000 --duration 2 --repeats 1   # a quick look

A ``hyphae up`` on a fresh data dir (the hashed embedder: the figures are the surface's and
the index's cost, not a model's), pre-filled through MCP as ``mcp_bench.py`` does. Then, in
turn and ``--repeats`` times each, as fast as ``--clients`` concurrent clients go for
``--duration`` seconds after a warm-up, all asking the 64 warmed queries (query-vector
cache hits, k=10):

- MCP over HTTP ``tools/call recall``: raw keep-alive sockets (``mcp_bench``'s cheapest
  client) and httpx, each client its own connection;
- gRPC ``hyphae.v1.Memory/Recall``: ``grpc.aio`` clients, each on its own channel. gRPC's
  Recall hydrates: it answers the 10 full cells (content and provenance), MCP's answers ids
  and distances.

The clients run in this process and share the machine's cores with the daemon. The median
run is reported, with the daemon's and the clients' CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mcp_bench import (
    HIT_QUERIES,
    Node,
    machine,
    measure,
    own_cpu_seconds,
    prefill,
    process_cpu_seconds,
    recall_hit,
    warm_hits,
)  # fmt: skip

from api.grpc.hyphae.v1 import memory_pb2 as pb
from api.grpc.hyphae.v1 import memory_pb2_grpc as pb_grpc


async def grpc_load(address: str, key: str, clients: int, duration: float, pid: int, warmup: float = 1.0) -> dict[str, float]:
    counter = itertools.count()
    done = [0]
    measuring = [False]
    metadata = (("x-hyphae-key", key),)
    requests = [pb.RecallRequest(query=query, k=10) for query in HIT_QUERIES]

    async def client() -> None:
        async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            recall = pb_grpc.MemoryStub(channel).Recall
            while True:
                reply = await recall(requests[next(counter) % len(requests)], metadata=metadata, timeout=60)
                if len(reply.results) != 10:
                    raise RuntimeError(f"{len(reply.results)} results")
                if measuring[0]:
                    done[0] += 1

    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    try:
        await asyncio.sleep(warmup)
        measuring[0] = True
        started, server0, client0 = time.monotonic(), process_cpu_seconds(pid), own_cpu_seconds()
        await asyncio.sleep(duration)
        calls, elapsed = done[0], time.monotonic() - started
        server1, client1 = process_cpu_seconds(pid), own_cpu_seconds()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    return {"rate": calls / elapsed, "server_cpu_ms": 1000 * (server1 - server0) / max(calls, 1),
            "client_cpu_ms": 1000 * (client1 - client0) / max(calls, 1)}  # fmt: skip


def measure_grpc(node: Node, clients: int, duration: float, repeats: int) -> dict[str, Any]:
    runs = [asyncio.run(grpc_load(node.info["grpc_address"], node.key, clients, duration, node.process.pid))
            for _ in range(repeats)]  # fmt: skip
    runs.sort(key=lambda run: run["rate"])
    middle = runs[len(runs) // 2]
    return {"per_s": round(middle["rate"], 1), "runs": [round(run["rate"], 1) for run in runs],
            "daemon_cpu_ms_per_call": round(middle["server_cpu_ms"], 2),
            "client_cpu_ms_per_call": round(middle["client_cpu_ms"], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv), "cells": args.cells,
                              "clients": args.clients}  # fmt: skip
    print(f"machine: {report['machine']}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="hyphae-grpc-bench-"))
    node = Node(root, "hashed")
    try:
        report["prefill_cells_per_s"] = round(prefill(node, args.cells), 1)
        warm_hits(node)
        # Interleaved, so a change in the machine's load falls on both surfaces alike.
        report["mcp_raw"], report["mcp_httpx"], report["grpc"] = [], [], []
        for _ in range(args.repeats):
            report["mcp_raw"].append(measure(node, args.clients, recall_hit, args.duration, 1, raw=True))
            report["mcp_httpx"].append(measure(node, args.clients, recall_hit, args.duration, 1))
            report["grpc"].append(measure_grpc(node, args.clients, args.duration, 1))
            print({name: report[name][-1]["per_s"] for name in ("mcp_raw", "mcp_httpx", "grpc")}, flush=True)
        for name in ("mcp_raw", "mcp_httpx", "grpc"):
            runs = sorted(report[name], key=lambda run: run["per_s"])
            report[name] = {**runs[len(runs) // 2], "runs": [run["per_s"] for run in runs]}
        report["load_average_after"] = machine()["load_average"]
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
