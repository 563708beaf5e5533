"""Before / after over HTTP, side by side: recall calls/s and daemon CPU per call, alternating.

On a shared machine the load moves between two runs made minutes apart, so a comparison of
checkouts is only fair when they take turns: one data dir is pre-filled once (hashed
embedder, ``--cells``), each ``--code`` checkout serves a copy of it (``PYTHONPATH``), and
every round loads each daemon in turn for ``--duration`` seconds with 8 clients (raw-socket
and httpx, as ``mcp_bench.py``), query vectors cached. Medians over ``--rounds`` rounds.

    python benchmarks/mcp_ab.py --code ../baseline-checkout --code .          # before / after
    python benchmarks/mcp_ab.py --code . --floor                    # beside the no-op app's floor
    python benchmarks/mcp_ab.py --code . --servers lean,hypercorn --floor   # our h11 server vs hypercorn

The instruction counts of ``mcp_instructions.py`` are the load-proof figure; these are the
CPU-time and rate figures that go beside them (quote the load average printed with them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mcp_bench as mb  # noqa: E402


class CopiedNode:
    """``hyphae up`` from ``code`` on a copy of ``template`` (quacks like ``mcp_bench.Node``)."""

    def __init__(self, code: Path, template: Path, key: str, root: Path, server: str | None = None) -> None:
        self.home, self.key = root / "home", key
        shutil.copytree(template, self.home)
        with open(root / "daemon.log", "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "app.cli", "--home", str(self.home), "up"],
                                            cwd=code, env={**mb.server_env(server), "PYTHONPATH": str(code)},
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.url = mb.wait_for_daemon(self.home, self.process, root / "daemon.log")["api_url"]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, action="append", default=[], help="a checkout to measure (repeatable)")
    parser.add_argument("--floor", action="store_true", help="also the no-op app on each server")
    parser.add_argument("--servers", default="", help="HTTP servers to run each checkout on, comma-separated "
                        "(lean, hypercorn; default: the checkout's default)")
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="hyphae-mcp-ab-"))
    servers: dict[str, object] = {}
    try:
        node = mb.Node(root, "hashed")
        try:
            mb.prefill(node, args.cells)
            mb.warm_hits(node)  # the 64 query vectors are cached in no copy: each daemon warms its own
        finally:
            node.stop()
        names = [name.strip() for name in args.servers.split(",") if name.strip()] or [None]
        for i, (code, name) in enumerate((code, name) for code in args.code for name in names):
            (root / f"run-{i}").mkdir()
            label = str(code) if name is None else f"{code} on {name}"
            servers[label] = server = CopiedNode(code.resolve(), node.home, node.key, root / f"run-{i}", name)
            mb.warm_hits(server)
        if args.floor:
            for name in names:
                servers[f"no-op app on {name or 'the default server'}"] = mb.NoopServer(name)
        runs: dict[tuple[str, str], list[dict[str, float]]] = {}
        for round_ in range(args.rounds):
            for client, raw in (("raw", True), ("httpx", False)):
                for name, server in servers.items():
                    load = partial(mb.http_load, server.url, server.key, 8, args.duration, mb.recall_hit, raw=raw,
                                   pid=server.process.pid)
                    run = trio.run(load)
                    runs.setdefault((name, client), []).append(run)
                    print(f"round {round_} {client:5} {name}: {run['rate']:.0f}/s, daemon {run['server_cpu_ms']:.3f} "
                          f"ms/call, load {os.getloadavg()[0]:.1f}", flush=True)
        print("median of", args.rounds, "rounds (8 clients, recall, query cached):")
        for (name, client), results in runs.items():
            rate = statistics.median(r["rate"] for r in results)
            cpu = statistics.median(r["server_cpu_ms"] for r in results)
            print(f"  {client:5} {name}: {rate:.0f}/s, daemon {cpu:.3f} ms/call", flush=True)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
