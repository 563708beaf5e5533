"""MCP surface figures: tools/call throughput over HTTP, and stdio round-trip latency.

Everything runs against real processes, as a user's machine does: ``hyphae up`` (the
daemon: our h11 server on trio, or hypercorn's trio worker) on an ephemeral loopback port,
and ``hyphae mcp`` (the stdio relay an editor launches) for the stdio figures.

    python benchmarks/mcp_bench.py                      # hashed + built-in model, 10k cells
    python benchmarks/mcp_bench.py --skip-model         # hashed embedder only (~1 min per server)
    python benchmarks/mcp_bench.py --profile recall     # py-spy the daemon under 8-client recall
    python benchmarks/mcp_bench.py --floor-only         # the servers' own floors, nothing else
    python benchmarks/mcp_bench.py --servers lean,hypercorn   # the hashed node under each (default: both)

What is measured:

- HTTP: ``POST /mcp`` ``tools/call`` for ``store`` and ``recall``, with 1 and with 8
  concurrent clients, each a keep-alive ``httpx.AsyncClient`` connection, as fast as they
  can go for ``--duration`` seconds after a warm-up; the median of ``--repeats`` runs.
  The clients run in a separate process (trio), so they share the machine's cores with
  the daemon, as a host's agents would.
- recall is reported twice: query-vector cache *hits* (a fixed set of 64 queries, asked
  once before timing) and *misses* (every query text unique, so each one is embedded).
- stdio: ``hyphae mcp`` subprocess, one recall at a time (write a line, read a line),
  p50/p99 over ``--stdio-calls`` calls after a warm-up; hits and misses again.
- each server's floor: a no-op ASGI app (reads the body, answers a fixed JSON body) on the
  server (``HYPHAE_HTTP_SERVER``: ``lean`` is ``web/server.py``, ``hypercorn``
  its trio worker), configured as the daemon configures it, loaded by the same 8 clients.
  What a request costs the server before any of Hyphae's code runs.
- the hashed node is measured once per server in ``--servers`` (a fresh node each), one
  after the other in the same run; the built-in model node runs on the first one only.

Two nodes: one with the hashed embedder (``[embedder] provider = "hashed"``), whose
pre-fill of 10k cells takes seconds and whose figures are the cost of the surface and
index alone; and one with the built-in MiniLM model, what a real user runs, where a cache
miss pays a model forward pass. The model node is pre-filled through the same MCP store
calls (about a minute: every cell is embedded).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.home import init_home  # noqa: E402

HYPHAE = (sys.executable, "-m", "app.cli")
HIT_QUERIES = [f"how do we handle {topic} in the {area}" for topic, area in itertools.product(
    ("retries", "schema migrations", "auth tokens", "caching", "rate limits", "logging", "feature flags", "backups"),
    ("billing service", "frontend", "data pipeline", "mobile app", "search cluster", "admin console", "CI", "gateway"),
)]  # 64

SUBJECTS = ("The billing service", "Our frontend", "The data pipeline", "The mobile app", "The search cluster",
            "The admin console", "CI", "The API gateway", "The auth service", "The nightly export")
VERBS = ("must retry", "should cache", "now logs", "rate-limits", "encrypts", "shards", "backs up", "validates",
         "streams", "batches")
OBJECTS = ("payment webhooks", "user sessions", "schema migrations", "feature flags", "search queries",
           "audit events", "invoice PDFs", "access tokens", "build artefacts", "metrics")


def cell_text(i: int) -> str:
    s, v, o = SUBJECTS[i % 10], VERBS[(i // 10) % 10], OBJECTS[(i // 100) % 10]
    return f"{s} {v} {o} (decision {i}, revision {i % 7})."


def machine() -> dict[str, Any]:
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


# -- processes --------------------------------------------------------------------------


def wait_for_daemon(home: Path, process: subprocess.Popen, log: Path) -> dict[str, Any]:
    """``daemon.json`` once ``process`` (a ``hyphae up`` on ``home``) has written it."""
    deadline = time.monotonic() + 120
    while True:
        try:
            info = json.loads((home / "daemon.json").read_text())
            if info["pid"] == process.pid:
                return info
        except (OSError, ValueError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start:\n{log.read_text()}")
        time.sleep(0.05)


class Node:
    """A ``hyphae up`` on a fresh data dir, with one agent key."""

    def __init__(self, root: Path, provider: str, server: str | None = None) -> None:
        self.home = root / f"home-{provider}" if server is None else root / f"home-{provider}-{server}"
        init_home(self.home)
        config = self.home / "config.toml"
        config.write_text(config.read_text()
                          .replace('listen = "127.0.0.1:7777"', 'listen = "127.0.0.1:0"')
                          .replace('provider = "builtin"', f'provider = "{provider}"'))
        self.log = self.home.with_suffix(".log")
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([*HYPHAE, "--home", str(self.home), "up"], stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=out, env=server_env(server))
        self.info = wait_for_daemon(self.home, self.process, self.log)
        self.url = self.info["api_url"]
        added = subprocess.run([*HYPHAE, "--home", str(self.home), "agent", "add", "bench"],
                               capture_output=True, text=True, timeout=120, check=True)
        self.key = added.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def server_env(server: str | None) -> dict[str, str]:
    """The environment that makes a daemon (or the no-op app) use ``server`` (None: the default)."""
    env = {key: value for key, value in os.environ.items() if key != "HYPHAE_HTTP_SERVER"}
    return env if server is None else {**env, "HYPHAE_HTTP_SERVER": server}


class NoopServer:
    """The floor: ``serve_noop`` in a subprocess (quacks like :class:`Node` for :func:`measure`)."""

    def __init__(self, server: str | None = None) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--serve-noop"], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env(server))
        self.url, self.key = f"http://127.0.0.1:{int(self.process.stdout.readline())}", "unused"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


NOOP_BODY = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{}"}],"isError":false}}'


def serve_noop() -> None:
    """Serve a no-op ASGI app until killed, on the server ``$HYPHAE_HTTP_SERVER`` names, set up
    as the daemon sets it up; print the port first."""
    import socket

    from web.server import HttpLimits, serve_asgi

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(NOOP_BODY))]})
        await send({"type": "http.response.body", "body": NOOP_BODY})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(sock.getsockname()[1], flush=True)
    limits = HttpLimits(keep_alive_timeout=75, graceful_timeout=5)  # as app/daemon.py sets it up
    trio.run(partial(serve_asgi, app, sock, limits=limits))


def server_floor(args: argparse.Namespace, name: str) -> dict[str, Any]:
    server = NoopServer(name)
    try:
        return {f"{name}_x8": measure(server, 8, recall_hit, args.duration, args.repeats, raw)
                for name, raw in (("raw_client", True), ("httpx", False))}
    finally:
        server.stop()


# -- HTTP load --------------------------------------------------------------------------


def _rpc(i: int, tool: str, arguments: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}}).encode()


def process_cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RawConnection:
    """A keep-alive HTTP/1.1 connection with next to no client-side cost: prebuilt request
    bytes out, Content-Length-framed response in. Used to show what the *server* can do
    once the client's own CPU (httpx: more than the server's, per request) is taken out."""

    def __init__(self, stream: trio.SocketStream, host: str, key: str, path: str = "/mcp") -> None:
        self.stream = stream
        self.head = (f"POST {path} HTTP/1.1\r\nhost: {host}\r\nx-hyphae-key: {key}\r\n"
                     "content-type: application/json\r\naccept: application/json\r\n").encode()
        self.buffer = bytearray()
        self.status = 0  # of the last response

    async def post(self, body: bytes) -> bytes:
        await self.stream.send_all(self.head + b"content-length: %d\r\n\r\n" % len(body) + body)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            await self._receive_more()
        head = bytes(self.buffer[:end]).lower()
        self.status = int(head[9:12])
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(self.buffer) < end + 4 + length:
            await self._receive_more()
        body = bytes(self.buffer[end + 4:end + 4 + length])
        del self.buffer[:end + 4 + length]
        return body

    async def _receive_more(self) -> None:
        if not (received := await self.stream.receive_some(65536)):
            raise ConnectionError("the server closed the connection")
        self.buffer += received


async def http_load(url: str, key: str, clients: int, duration: float, make_body, warmup: float = 1.0,
                    *, raw: bool = False, pid: int | None = None) -> dict[str, float]:
    """Calls per second over ``duration`` seconds with ``clients`` concurrent connections,
    and the CPU each call cost the daemon (``pid``) and this client process."""
    counter = itertools.count()
    done = [0]
    measuring = [False]
    headers = {"x-hyphae-key": key, "content-type": "application/json", "accept": "application/json"}
    host, port = url.removeprefix("http://").rsplit(":", 1)

    def check(body: bytes) -> None:
        if b'"error"' in body[:40] or b'"result"' not in body:
            raise RuntimeError(body[:300])

    async def httpx_client() -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=60) as http:
            while True:
                response = await http.post(f"{url}/mcp", content=make_body(next(counter)))
                check(response.content)
                if measuring[0]:
                    done[0] += 1

    async def raw_client() -> None:
        connection = RawConnection(await trio.open_tcp_stream(host, int(port)), f"{host}:{port}", key)
        async with connection.stream:
            while True:
                check(await connection.post(make_body(next(counter))))
                if measuring[0]:
                    done[0] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(raw_client if raw else httpx_client)
        await trio.sleep(warmup)
        measuring[0] = True
        started, server0, client0 = trio.current_time(), process_cpu_seconds(pid) if pid else 0.0, own_cpu_seconds()
        await trio.sleep(duration)
        calls, elapsed = done[0], trio.current_time() - started
        server1, client1 = process_cpu_seconds(pid) if pid else 0.0, own_cpu_seconds()
        nursery.cancel_scope.cancel()
    return {"rate": calls / elapsed, "server_cpu_ms": 1000 * (server1 - server0) / max(calls, 1),
            "client_cpu_ms": 1000 * (client1 - client0) / max(calls, 1)}


def prefill(node: Node, count: int, clients: int = 8) -> float:
    """Store ``count`` cells through MCP over HTTP; returns cells/s."""
    headers = {"x-hyphae-key": node.key, "content-type": "application/json"}
    counter = iter(range(count))

    async def client() -> None:
        async with httpx.AsyncClient(headers=headers, timeout=120) as http:
            for i in counter:
                body = _rpc(i, "store", {"content": cell_text(i), "cell_type": "Decision", "salience": 0.5})
                response = (await http.post(f"{node.url}/mcp", content=body)).json()
                if "error" in response:
                    raise RuntimeError(response["error"])

    async def run() -> float:
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)
        return count / (trio.current_time() - started)

    return trio.run(run)


def measure(node: Node, clients: int, make_body, duration: float, repeats: int, raw: bool = False) -> dict[str, Any]:
    """The median of ``repeats`` runs (by rate), with every run's rate."""
    runs = [trio.run(partial(http_load, node.url, node.key, clients, duration, make_body, raw=raw,
                             pid=node.process.pid)) for _ in range(repeats)]
    runs.sort(key=lambda run: run["rate"])
    middle = runs[len(runs) // 2]
    return {"per_s": round(middle["rate"], 1), "runs": [round(run["rate"], 1) for run in runs],
            "daemon_cpu_ms_per_call": round(middle["server_cpu_ms"], 2),
            "client_cpu_ms_per_call": round(middle["client_cpu_ms"], 2)}


def warm_hits(node: Node) -> None:
    with httpx.Client(headers={"x-hyphae-key": node.key}, timeout=60) as http:
        for i, query in enumerate(HIT_QUERIES):
            http.post(f"{node.url}/mcp", content=_rpc(i, "recall", {"query": query}),
                      headers={"content-type": "application/json"}).raise_for_status()


_unique = itertools.count()


def recall_hit(i: int) -> bytes:
    return _rpc(i, "recall", {"query": HIT_QUERIES[i % len(HIT_QUERIES)], "k": 10})


def recall_miss(i: int) -> bytes:
    n = next(_unique)
    return _rpc(i, "recall", {"query": f"what did we decide about {OBJECTS[n % 10]} for case {n}", "k": 10})


def store_call(i: int) -> bytes:
    n = next(_unique)
    return _rpc(i, "store", {"content": f"Benchmark note {n}: {cell_text(n)}", "cell_type": "Fact"})


# -- latency ------------------------------------------------------------------------------


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    samples_ms = sorted(samples_ms)
    return {"p50_ms": round(samples_ms[len(samples_ms) // 2], 3),
            "p99_ms": round(samples_ms[int(len(samples_ms) * 0.99)], 3),
            "mean_ms": round(statistics.fmean(samples_ms), 3), "calls": len(samples_ms)}


def http_latency(node: Node, calls: int, warmup: int = 200) -> dict[str, float]:
    """Sequential recall (cache hits) over one keep-alive httpx connection: the floor
    under the stdio figure, which adds the relay's own hop."""
    samples = []
    headers = {"x-hyphae-key": node.key, "content-type": "application/json"}
    with httpx.Client(headers=headers, timeout=60) as http:
        for i in range(warmup + calls):
            body = recall_hit(i)
            started = time.perf_counter()
            http.post(f"{node.url}/mcp", content=body).raise_for_status()
            if i >= warmup:
                samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)



def stdio_latency(node: Node, calls: int, hits: bool, warmup: int = 200) -> dict[str, float]:
    env = {**os.environ, "HYPHAE_API_KEY": node.key}
    process = subprocess.Popen([*HYPHAE, "--home", str(node.home), "mcp"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    timer = threading.Timer(600, process.kill)  # nothing in a benchmark may hang forever
    timer.start()
    try:
        samples = []
        cpu_at_start: tuple[float, float] = (0.0, 0.0)
        for i in range(warmup + calls):
            if i == warmup:
                cpu_at_start = (process_cpu_seconds(process.pid), process_cpu_seconds(node.process.pid))
            if hits:
                query = HIT_QUERIES[i % len(HIT_QUERIES)]
            else:
                n = next(_unique)
                query = f"which team owns {OBJECTS[n % 10]} in case {n}"
            line = _rpc(i, "recall", {"query": query, "k": 10}) + b"\n"
            started = time.perf_counter()
            process.stdin.write(line)
            process.stdin.flush()
            answer = process.stdout.readline()
            elapsed = time.perf_counter() - started
            if b'"result"' not in answer:
                raise RuntimeError(answer[:300])
            if i >= warmup:
                samples.append(elapsed * 1000)
        relay_cpu, daemon_cpu = process_cpu_seconds(process.pid), process_cpu_seconds(node.process.pid)
        return {**percentiles(samples),
                "relay_cpu_ms_per_call": round(1000 * (relay_cpu - cpu_at_start[0]) / calls, 2),
                "daemon_cpu_ms_per_call": round(1000 * (daemon_cpu - cpu_at_start[1]) / calls, 2)}
    finally:
        timer.cancel()
        process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        if process.poll() is None:
            process.kill()
            process.wait()


# -- profiling --------------------------------------------------------------------------


def profile_daemon(node: Node, out: Path, seconds: float, make_body, clients: int = 8) -> str:
    """py-spy the daemon while ``clients`` raw-socket clients load it; returns a summary of
    where its threads spend their time."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return "py-spy is not installed (pip install py-spy)"
    raw = out.with_suffix(".txt")
    recorder = subprocess.Popen([py_spy, "record", "--pid", str(node.process.pid), "--duration", str(int(seconds)),
                                 "--rate", "250", "--threads", "--idle", "--format", "raw", "--output", str(raw)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    trio.run(partial(http_load, node.url, node.key, clients, seconds - 1.5, make_body, 0.2, raw=True))
    recorder.wait(60)
    return summarise_folded(raw)


# Innermost package a sampled frame runs in -> what it is, in the order they are tried.
_OWNERS = (
    (("node/service.py", "node/agents.py", "node/sessions.py", "node/interests.py", "node/shaping.py",
      "node/ingest.py", "node/reinforcement.py", "node/layers.py", "node/index.py", "node/catalog.py",
      "node/principals.py", "node/store/"), "facade (service, index, auth, SQLite reads)"),
    (("mcp_bridge/dispatch.py", "mcp_bridge/tools.py", "mcp_bridge/schema.py", "mcp_bridge/jsonrpc.py", "json/"),
     "MCP dispatch + JSON"),
    (("mcp_bridge/http.py", "api/rest/", "app/daemon.py"), "MCP HTTP app + API router"),
    (("hypercorn", "h11", "web/server.py"), "HTTP server (hypercorn or ours) + h11"),
    (("trio",), "trio socket I/O + scheduling"),
)
_IDLE = ("epoll_wait", "_io_epoll.py:243", "_thread_cache.py", "worker.py:62", "database.py:194", "database.py:199", "queue.py",
         "threading.py")


def summarise_folded(path: Path) -> str:
    """Per thread: the share of samples spent in each part of the stack (innermost wins)."""
    shares: dict[tuple[str, str], int] = {}
    totals: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0].split(":", 1)[-1].strip()
        totals[thread] = totals.get(thread, 0) + int(count)
        if any(marker in frames[-1] for marker in _IDLE):
            owner = "idle / waiting"
        else:
            owner = next((name for frame in reversed(frames) for keys, name in _OWNERS
                          if any(key in frame for key in keys)), "other")
        shares[(thread, owner)] = shares.get((thread, owner), 0) + int(count)
    rows = sorted(shares.items(), key=lambda kv: (-totals[kv[0][0]], -kv[1]))
    return "\n".join(f"{thread[:28]:<28} {100 * n / totals[thread]:5.1f}%  {owner}" for (thread, owner), n in rows)


# -- main -------------------------------------------------------------------------------


def bench_node(node: Node, args: argparse.Namespace, *, store: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    started = time.monotonic()
    figures["prefill_cells_per_s_8_clients"] = round(prefill(node, args.cells), 1)
    figures["prefill_seconds"] = round(time.monotonic() - started, 1)
    print(f"  pre-filled {args.cells} cells: {figures['prefill_cells_per_s_8_clients']} cells/s", flush=True)
    warm_hits(node)
    runs: list[tuple[str, Any, bool]] = [("recall_hit", recall_hit, False), ("recall_miss", recall_miss, False)]
    if store:
        runs.append(("recall_hit_raw_client", recall_hit, True))
    for clients in (1, 8):
        for name, make_body, raw in runs:
            figures[f"{name}_x{clients}"] = result = measure(node, clients, make_body, args.duration, args.repeats, raw)
            print(f"  {name} x{clients}: {result}", flush=True)
    figures["http_sequential_recall_hit"] = http_latency(node, args.stdio_calls)
    print(f"  http_sequential_recall_hit: {figures['http_sequential_recall_hit']}", flush=True)
    for hits in (True, False):
        name = "stdio_recall_hit" if hits else "stdio_recall_miss"
        figures[name] = stdio_latency(node, args.stdio_calls, hits)
        print(f"  {name}: {figures[name]}", flush=True)
    if store:  # last: it grows the node past the pre-filled size
        for clients in (1, 8):
            figures[f"store_x{clients}"] = result = measure(node, clients, store_call, args.duration, args.repeats)
            print(f"  store x{clients}: {result}", flush=True)
    with httpx.Client(headers={"x-hyphae-key": node.key}, timeout=60) as http:
        figures["cells_at_end"] = http.get(f"{node.url}/v1/stats").json()["cells"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per throughput run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stdio-calls", type=int, default=2000)
    parser.add_argument("--skip-model", action="store_true", help="hashed embedder only")
    parser.add_argument("--profile", choices=("recall", "store"), help="py-spy the hashed daemon under 8 clients")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--floor-only", action="store_true", help="measure the servers' floors and stop")
    parser.add_argument("--servers", default="lean,hypercorn", help="HTTP servers to compare (comma-separated)")
    parser.add_argument("--serve-noop", action="store_true", help=argparse.SUPPRESS)  # the floor's server
    args = parser.parse_args()
    if args.serve_noop:
        serve_noop()
        return

    report: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv), "cells": args.cells}
    print(f"machine: {report['machine']}", flush=True)
    servers = [name.strip() for name in args.servers.split(",") if name.strip()]
    for name in servers:
        report[f"{name}_floor"] = floor = server_floor(args, name)
        print(f"{name} floor (no-op app): {floor}", flush=True)
    if args.floor_only:
        print(json.dumps(report, indent=2))
        return
    root = Path(tempfile.mkdtemp(prefix="hyphae-mcp-bench-"))
    try:
        for name in servers:
            print(f"hashed embedder node, {name} server:", flush=True)
            node = Node(root, "hashed", name)
            try:
                report[f"hashed_{name}"] = bench_node(node, args, store=True)
                if args.profile:
                    body = recall_hit if args.profile == "recall" else store_call
                    report[f"profile_{name}"] = profile_daemon(node, root / f"profile-{name}", 12.0, body)
                    print(report[f"profile_{name}"], flush=True)
            finally:
                node.stop()
        if not args.skip_model:
            print(f"built-in model node, {servers[0]} server:", flush=True)
            node = Node(root, "builtin", servers[0])
            try:
                report["builtin"] = bench_node(node, args, store=False)
            finally:
                node.stop()
        report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
