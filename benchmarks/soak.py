"""Soak: one node under a steady 20 stores/s + 20 recalls/s for an hour, beside a peer. Run by hand:

    nice -n 10 python benchmarks/soak.py                  # 60 minutes, the default
    python benchmarks/soak.py --minutes 2 --sample-seconds 10 --out /some/dir   # a quick try

Two data dirs on loopback, set up as a user would: ``hyphae init`` each, ``team create`` on the
loaded node and ``team join TOKEN`` on the peer, then both daemons ``hyphae up --no-discovery
--peer OTHER`` on their own 127.0.0.1 ports, with the built-in embedder (the default). An agent on
the peer places one beacon, so the part of the stream on its topic (one store in four) crosses
the mesh and lands in its inbox; the rest stays on the loaded node.

The load is an open-loop schedule on the loaded node's REST API: store number i starts at
``i / rate`` seconds, and so does recall number i, whatever the node's answer times were. A
call's latency is counted from its scheduled start, so a node that falls behind shows it in
the latency instead of quietly lowering the rate (no coordinated omission). A call that cannot
be sent within 5 s of its slot (the node, or on a busy machine this very process, is behind), or
while 64 are unanswered, is skipped and counted, so the backlog and the latency stay bounded and
the skipped count says how much of the load was not served. Every memory is a
new text (a new embedding); the recalls draw from 400 questions, so most are new to the node's
query cache for the first few minutes and cached after.

Every ``--sample-seconds`` (default 30) the script reads, for each daemon, from ``/proc``: its
resident set, open file descriptors, threads and CPU time (user + system), plus its ``/v1/stats``
cell count and the size of its database files; and, for the window since the last sample, the
p50/p99 of store and recall latency and the calls made and failed. At the end it checks that
growth is explained by stored data (see ``judge``) and writes ``soak.json`` (every sample) and
``soak.md`` (a table) to ``--out`` (default benchmarks/results).

Bounded: every wait has a deadline, each call a timeout, and the daemons are stopped (SIGTERM,
then SIGKILL) whatever happens; the data dirs live in a temporary directory removed at the end.
No network but 127.0.0.1. A benchmark, not a test: it imports no test helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
CLI_MODULE = "app.cli"  # run as ``python -m CLI_MODULE``, the same entry point as the ``hyphae`` script

START_TIMEOUT = 120.0  # a daemon loads MiniLM before it serves
CLI_TIMEOUT = 60.0
CALL_TIMEOUT = 30.0
MAX_IN_FLIGHT = 64  # this many calls unanswered (1.6 s of load): the next ones are skipped and counted, not queued
CONNECTIONS = 64
LATE_LIMIT = 5.0  # seconds: a call the load could not send this soon after its slot is skipped, not sent late
WARMUP_FRACTION = 0.1  # samples in the first tenth of the run (at least one) are the warm-up
TOPIC_SHARE = 4  # one store in TOPIC_SHARE is on the peer's beacon topic

# Judging growth (see ``judge``).
KIB_PER_ROW = 4.0  # in memory per cell held: a 384-d float32 vector (1.5 KiB), its HNSW links, ids and caches
RSS_SLACK_MIB = 48.0  # allocator arenas, SQLite's page cache filling up, the query cache reaching its size
FD_SLACK = 8
SOCKET_SLACK = CONNECTIONS + 8  # the load's keep-alive connections come and go with the node's answer times
THREAD_SLACK = 4


def log(message: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class Deadline(Exception):
    pass


# -- the text stream ----------------------------------------------------------------------------

SUBJECTS = ["the billing service", "the auth gateway", "the search indexer", "the mobile client", "the CI pipeline",
            "the ingest worker", "the admin dashboard", "the payments queue", "the export job", "the metrics exporter"]
ACTIONS = ["retries timeouts with jitter", "caches sessions for ten minutes", "needs a schema migration",
           "leaks a file handle on reconnect", "pins its TLS certificates", "batches writes every 200 ms",
           "drops events when the queue is full", "logs request ids at info level", "reads config at start only",
           "uses a read replica for reports"]
REASONS = ["after the outage in March", "because the vendor changed limits", "to keep p99 under 50 ms",
           "since the last security review", "for the EU data residency rule", "as the on-call rota asked",
           "until the rewrite lands", "to halve the cloud bill", "because tests flaked on CI", "per the design doc"]
TYPES = ["Decision", "Fact", "Lesson", "Risk", "Pattern", "Constraint", "Task", "Context", "Preference"]
# The peer's beacon topic, and the stores on it.
TOPIC_QUERY = "database connection pool exhaustion in the order service"
TOPIC_LINES = ["The order service exhausted its database connection pool", "Order service DB pool ran out of connections",
               "Connection pool exhaustion in the order service database", "The order service's database pool was exhausted"]


def memory_text(i: int, rng: random.Random) -> tuple[str, str]:
    if i % TOPIC_SHARE == 0:
        return f"{rng.choice(TOPIC_LINES)} (incident {i}, {rng.choice(REASONS)}).", "Lesson"
    return (f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(ACTIONS)} {rng.choice(REASONS)}; note {i}.",
            rng.choice(TYPES))


def questions(rng: random.Random, count: int = 400) -> list[str]:
    asked = [f"why does {rng.choice(SUBJECTS)} {rng.choice(ACTIONS).split(' ', 1)[0]} {rng.choice(REASONS)}"
             for _ in range(count)]
    return list(dict.fromkeys(asked))


# -- real nodes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPHAE_API_KEY", "HYPHAE_HOME")}
    return {**env, "PYTHONUNBUFFERED": "1"}


class Node:
    """A data dir and its ``hyphae up`` daemon, driven through the CLI and REST."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.home = root / name
        self.log = root / f"{name}-daemon.log"
        self.api = f"127.0.0.1:{free_port()}"
        self.mesh = f"127.0.0.1:{free_port()}"
        self.process: subprocess.Popen | None = None

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", CLI_MODULE, "--home", str(self.home), *args], cwd=ROOT,
            env=clean_env(), capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"hyphae {' '.join(args[:2])} on {self.name} exited {result.returncode}:\n{result.stderr}")
        return result.stdout

    def up(self, peer: str) -> None:
        args = ["up", "--api", self.api, "--mesh", self.mesh, "--no-discovery", "--peer", peer]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", CLI_MODULE, "--home", str(self.home), *args], cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=clean_env(),
            )  # fmt: skip

    def wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self.check_alive()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://{self.api}/healthz", timeout=2.0, trust_env=False).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise Deadline(f"{self.name} not serving on {self.api} after {START_TIMEOUT:.0f} s\n{self.log_tail()}")
            time.sleep(0.2)

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name}'s daemon exited {self.process.returncode}:\n{self.log_tail()}")

    def rest(self, method: str, path: str, key: str | None = None, *, admin: bool = False, **kwargs: Any) -> Any:
        headers = {}
        if key is not None:
            headers["x-hyphae-key"] = key
        if admin:
            headers["x-hyphae-admin"] = (self.home / "admin.token").read_text().strip()
        response = httpx.request(method, f"http://{self.api}{path}", headers=headers, timeout=CALL_TIMEOUT,
                                 trust_env=False, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{self.name}: {method} {path}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    def agent_key(self, name: str) -> str:
        return self.cli("agent", "add", name).strip().splitlines()[-1].strip()

    def db_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.home.glob("hyphae.db*") if p.is_file())

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, grace: float = 15.0) -> int | None:
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        try:
            return process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)
            return None


# -- /proc --------------------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def process_figures(pid: int) -> dict[str, float]:
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; utime and stime are fields 14 and 15
    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    sockets = sum(target.startswith("socket:") for target in fds)
    return {
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
        "open_files": len(fds) - sockets,
        "sockets": sockets,
        "cpu_s": (int(fields[11]) + int(fields[12])) / TICKS,
    }


# -- the load -----------------------------------------------------------------------------------


@dataclass
class Window:
    """Calls finished since the last sample."""

    store_ms: list[float] = field(default_factory=list)
    recall_ms: list[float] = field(default_factory=list)
    store_errors: int = 0
    recall_errors: int = 0
    skipped: int = 0  # calls not made: MAX_IN_FLIGHT were unanswered, or the slot was LATE_LIMIT behind
    first_errors: list[str] = field(default_factory=list)

    def error(self, kind: str, message: str) -> None:
        setattr(self, f"{kind}_errors", getattr(self, f"{kind}_errors") + 1)
        if len(self.first_errors) < 3:
            self.first_errors.append(f"{kind}: {message[:200]}")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class Load:
    def __init__(self, node: Node, key: str, rate: float, seed: int) -> None:
        self.node = node
        self.key = key
        self.rate = rate
        self.rng = random.Random(seed)
        self.questions = questions(random.Random(seed + 1))
        self.window = Window()
        self.in_flight = 0
        self.stored = 0
        self.topic_stored = 0

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window

    async def run(self, client: httpx.AsyncClient, seconds: float, stop_at: float) -> None:
        start = trio.current_time()
        end = start + seconds
        async with trio.open_nursery() as nursery:
            for kind in ("store", "recall"):
                nursery.start_soon(self._schedule, client, kind, start, end, stop_at)

    async def _schedule(self, client: httpx.AsyncClient, kind: str, start: float, end: float, stop_at: float) -> None:
        async with trio.open_nursery() as calls:
            i = 0
            while True:
                due = start + i / self.rate
                if due >= end:
                    break
                await trio.sleep_until(due)
                if time.monotonic() > stop_at:
                    raise Deadline("run deadline reached")
                if self.in_flight >= MAX_IN_FLIGHT or trio.current_time() - due > LATE_LIMIT:
                    self.window.skipped += 1
                else:
                    calls.start_soon(self._call, client, kind, i, due)
                i += 1

    async def _call(self, client: httpx.AsyncClient, kind: str, i: int, due: float) -> None:
        if kind == "store":
            content, cell_type = memory_text(i, self.rng)
            path, body = "/v1/cells", {"content": content, "cell_type": cell_type, "project": "soak",
                                       "idempotency_key": f"soak-{i}"}
        else:
            path, body = "/v1/recall", {"query": self.rng.choice(self.questions), "k": 10}
        self.in_flight += 1
        try:
            response = await client.post(path, json=body, headers={"x-hyphae-key": self.key})
            took_ms = (trio.current_time() - due) * 1000
            if response.status_code >= 400:
                self.window.error(kind, f"{response.status_code} {response.text}")
                return
            getattr(self.window, f"{kind}_ms").append(took_ms)
            if kind == "store":
                self.stored += 1
                self.topic_stored += i % TOPIC_SHARE == 0
        except httpx.HTTPError as exc:
            self.window.error(kind, f"{type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1


async def sampler(nodes: list[Node], load: Load, peer_key: str, every: float, samples: list[dict],
                  stop_event: trio.Event) -> None:
    began = time.monotonic()
    previous = {"at": began, **{node.name: process_figures(node.process.pid)["cpu_s"] for node in nodes}}
    while not stop_event.is_set():
        with trio.move_on_after(every):
            await stop_event.wait()
        samples.append(await trio.to_thread.run_sync(take_sample, nodes, load, peer_key, began, previous))
        s = samples[-1]
        loaded, peer = s["nodes"][nodes[0].name], s["nodes"][nodes[1].name]
        log(f"t={s['t_s']:.0f}s stored {s['stored']} | {nodes[0].name}: rss {loaded['rss_mib']:.0f} MiB, "
            f"fds {loaded['open_files']}, threads {loaded['threads']}, cpu {loaded['cpu_pct']:.0f}% | "
            f"{nodes[1].name}: rss {peer['rss_mib']:.0f} MiB, cells {peer['cells']}, outbox {s['outbox']} | "
            f"store p50/p99 {s['store_p50_ms']}/{s['store_p99_ms']} ms, recall {s['recall_p50_ms']}/{s['recall_p99_ms']} ms, "
            f"errors {s['store_errors'] + s['recall_errors']}, skipped {s['skipped']}")


def take_sample(nodes: list[Node], load: Load, peer_key: str, began: float, previous: dict[str, float]) -> dict:
    """One row: each daemon's figures, and the load's window since the last row (``previous`` is updated)."""
    now = time.monotonic()
    window = load.take_window()
    per_node = {}
    for node in nodes:
        node.check_alive()
        figures = process_figures(node.process.pid)
        stats = node.rest("GET", "/v1/stats", load.key if node is nodes[0] else peer_key)
        per_node[node.name] = {
            **figures,
            "cpu_pct": None,
            "cells": stats.get("cells"),
            "index_backlog": stats.get("index_backlog"),
            "db_mib": node.db_bytes() / 2**20,
        }
    elapsed = max(now - previous["at"], 1e-6)
    for node in nodes:
        cpu = per_node[node.name]["cpu_s"]
        per_node[node.name]["cpu_pct"] = 100 * (cpu - previous[node.name]) / elapsed
        previous[node.name] = cpu
    previous["at"] = now
    peers = nodes[0].rest("GET", "/v1/admin/peers", admin=True).get("peers", [])

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "t_s": round(now - began, 1),
        "stored": load.stored,
        "topic_stored": load.topic_stored,
        "stores": len(window.store_ms) + window.store_errors,
        "recalls": len(window.recall_ms) + window.recall_errors,
        "store_errors": window.store_errors,
        "recall_errors": window.recall_errors,
        "skipped": window.skipped,
        "first_errors": window.first_errors,
        "store_p50_ms": ms(percentile(window.store_ms, 50)),
        "store_p99_ms": ms(percentile(window.store_ms, 99)),
        "recall_p50_ms": ms(percentile(window.recall_ms, 50)),
        "recall_p99_ms": ms(percentile(window.recall_ms, 99)),
        "outbox": sum(int(p.get("queue_depth") or 0) for p in peers),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "nodes": per_node,
    }


def peer_inbox_count(node: Node, key: str) -> int:
    """Items in the peer agent's inbox (pages of 500; ``since`` steps back 1 ms to never skip ties)."""
    seen: set[int] = set()
    since = 0
    while True:
        page = node.rest("GET", "/v1/inbox", key, params={"since": since, "limit": 500})["diffs"]
        fresh = [d for d in page if d["inbox_id"] not in seen]
        seen.update(d["inbox_id"] for d in fresh)
        if len(page) < 500 or not fresh:
            return len(seen)
        since = page[-1]["received_at"] - 1


# -- judging growth -----------------------------------------------------------------------------


def judge(samples: list[dict], names: list[str]) -> list[dict]:
    """Growth after the warm-up that stored data does not explain.

    Per daemon, from the last warm-up sample to the end: resident set growth beyond
    ``KIB_PER_ROW`` per cell it gained plus ``RSS_SLACK_MIB``; open files or threads above the
    warm-up's highest by more than ``FD_SLACK`` / ``THREAD_SLACK``; and, on the loaded node, CPU
    per call in the last quarter more than 1.5 times the first quarter after the warm-up (the work
    per call should not grow with the hour). Each check is listed with its figures, flagged or not.
    """
    if len(samples) < 2:
        return []
    warm = max(1, int(len(samples) * WARMUP_FRACTION))
    base, last = samples[warm - 1], samples[-1]
    checks = []
    for name in names:
        b, e = base["nodes"][name], last["nodes"][name]
        rows = (e["cells"] or 0) - (b["cells"] or 0)
        allowed = rows * KIB_PER_ROW / 1024 + RSS_SLACK_MIB
        grown = e["rss_mib"] - b["rss_mib"]
        checks.append({"node": name, "what": "rss", "grown_mib": round(grown, 1), "rows_gained": rows,
                       "allowed_mib": round(allowed, 1), "kib_per_row": round(grown * 1024 / rows, 2) if rows else None,
                       "flagged": grown > allowed})
        for what, slack in (("open_files", FD_SLACK), ("sockets", SOCKET_SLACK), ("threads", THREAD_SLACK)):
            ceiling = max(s["nodes"][name][what] for s in samples[:warm]) + slack
            peak = max(s["nodes"][name][what] for s in samples[warm:])
            checks.append({"node": name, "what": what, "warmup_max": ceiling - slack, "after_max": peak,
                           "flagged": peak > ceiling})
    after = [s for s in samples[warm:] if s["stores"] + s["recalls"]]  # not the drain's last row
    if len(after) >= 4:
        quarter = max(1, len(after) // 4)

        def cpu_per_call(window: list[dict]) -> float:
            calls = sum(s["stores"] + s["recalls"] for s in window)
            cpu = sum(s["nodes"][names[0]]["cpu_pct"] / 100 * (s["t_s"] - samples[samples.index(s) - 1]["t_s"])
                      for s in window)
            return 1000 * cpu / calls if calls else float("nan")

        first, final = cpu_per_call(after[:quarter]), cpu_per_call(after[-quarter:])
        checks.append({"node": names[0], "what": "cpu_ms_per_call", "first_quarter": round(first, 2),
                       "last_quarter": round(final, 2), "flagged": final > 1.5 * first})
    return checks


# -- the report ---------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def report_md(result: dict) -> str:
    names = result["node_names"]
    lines = [
        "# Soak",
        "",
        f"`{result['command']}` at {result['started_utc']} UTC; {result['minutes']} min planned, "
        f"{result['elapsed_s'] / 60:.1f} min run; {result['rate']:g} stores/s + {result['rate']:g} recalls/s "
        f"on `{names[0]}`, `{names[1]}` its peer (one beacon; one store in {TOPIC_SHARE} on its topic). "
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}, Python "
        f"{result['machine']['python']}, shared with other work: load average "
        f"{result['loadavg_start'][0]:.1f} at the start, {result['loadavg_end'][0]:.1f} at the end.",
        "",
        f"Stored {result['stored']:,} cells ({result['store_errors']} failed), {result['recalls']:,} recalls "
        f"({result['recall_errors']} failed), {result['skipped']:,} calls skipped (not sent: {MAX_IN_FLIGHT} "
        f"unanswered, or {LATE_LIMIT:g} s past their slot); {result['topic_stored']:,} stores were on the peer's topic and its "
        f"agent's inbox holds {fmt(result['peer_inbox'])} items (the beacon also takes near matches). "
        f"Daemons exited {result['exit_codes']}.",
        "",
        f"| t (min) | stored | {names[0]} RSS MiB | files / sockets | threads | CPU % | {names[1]} RSS MiB "
        "| files / sockets | threads | CPU % | peer cells | store p50 / p99 ms | recall p50 / p99 ms | skipped | load |",
        "| " + " | ".join(["---"] * 15) + " |",
    ]
    for s in result["samples"]:
        a, b = s["nodes"][names[0]], s["nodes"][names[1]]
        lines.append(
            f"| {s['t_s'] / 60:.1f} | {s['stored']:,} | {a['rss_mib']:.0f} | {a['open_files']} / {a['sockets']} "
            f"| {a['threads']} | {a['cpu_pct']:.0f} | {b['rss_mib']:.0f} | {b['open_files']} / {b['sockets']} "
            f"| {b['threads']} | {b['cpu_pct']:.0f} | {fmt(b['cells'])} | {fmt(s['store_p50_ms'], 1)} / "
            f"{fmt(s['store_p99_ms'], 1)} | {fmt(s['recall_p50_ms'], 1)} / {fmt(s['recall_p99_ms'], 1)} "
            f"| {s['skipped']} | {s['loadavg'][0]:.1f} |")
    lines += ["", "Growth after the warm-up (first tenth of the samples):", ""]
    for c in result["checks"]:
        detail = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("node", "what", "flagged"))
        lines.append(f"- {'**FLAGGED**' if c['flagged'] else 'ok'}: `{c['node']}` {c['what']}: {detail}")
    if result.get("error"):
        lines += ["", f"The run stopped early: {result['error']}"]
    return "\n".join(lines) + "\n"


# -- the run ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="hyphae-soak-"))
    loaded, peer = Node("loaded", root), Node("peer", root)
    nodes = [loaded, peer]
    samples: list[dict] = []
    result: dict[str, Any] = {
        "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]),
        "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "minutes": args.minutes, "rate": args.rate, "sample_seconds": args.sample_seconds,
        "node_names": [n.name for n in nodes], "samples": samples,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "loadavg_start": list(os.getloadavg()), "peer_inbox": None,
    }  # fmt: skip
    began = time.monotonic()
    stop_at = began + args.minutes * 60 + 600  # the set-up and the end's reads get ten minutes beside the load
    load = None
    try:
        for node in nodes:
            node.cli("init")
        token = loaded.cli("team", "create").strip().splitlines()[-1].strip()
        peer.cli("team", "join", token)
        loaded.up(peer.mesh)
        peer.up(loaded.mesh)
        for node in nodes:
            node.wait_serving()
        log(f"two daemons up (loaded {loaded.api}, peer {peer.api}) in {time.monotonic() - began:.0f} s")
        writer, reader = loaded.agent_key("writer"), peer.agent_key("reader")
        peer.rest("POST", "/v1/beacons", reader, json={"query": TOPIC_QUERY})
        end = time.monotonic() + 60
        while loaded.rest("GET", "/v1/admin/peers", admin=True).get("beacons_known", 0) < 1:
            if time.monotonic() > end:
                raise Deadline("the peer's beacon did not reach the loaded node in 60 s")
            time.sleep(0.2)
        load = Load(loaded, writer, args.rate, args.seed)
        for i in range(5):  # the first calls load the model's code paths; not part of the schedule
            loaded.rest("POST", "/v1/cells", writer, json={"content": f"warm-up note {i}", "cell_type": "Context", "project": "warm-up"})
            loaded.rest("POST", "/v1/recall", writer, json={"query": f"warm-up question {i}", "k": 10})
        result["load_began_utc"] = time.strftime("%H:%M:%S", time.gmtime())
        trio.run(drive, nodes, load, reader, args, stop_at, samples)
        result["peer_inbox"] = peer_inbox_count(peer, reader)
    except BaseException as exc:  # KeyboardInterrupt too: the samples so far are still written
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]  # the first cause; the rest follow from it
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"stopped: {result['error']}")
        for node in nodes:
            log(f"{node.name} daemon log tail:\n{node.log_tail(15)}")
    finally:
        result["exit_codes"] = [node.stop() for node in nodes]
        shutil.rmtree(root, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    result["loadavg_end"] = list(os.getloadavg())
    result["stored"] = load.stored if load else 0
    result["topic_stored"] = load.topic_stored if load else 0
    result["store_errors"] = sum(s["store_errors"] for s in samples)
    result["recalls"] = sum(s["recalls"] for s in samples)
    result["recall_errors"] = sum(s["recall_errors"] for s in samples)
    result["skipped"] = sum(s["skipped"] for s in samples)
    result["checks"] = judge(samples, result["node_names"])
    return result


async def drive(nodes: list[Node], load: Load, peer_key: str, args: argparse.Namespace, stop_at: float,
                samples: list[dict]) -> None:
    stop_event = trio.Event()
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    async with httpx.AsyncClient(base_url=f"http://{nodes[0].api}", timeout=CALL_TIMEOUT, limits=limits,
                                 trust_env=False) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler, nodes, load, peer_key, args.sample_seconds, samples, stop_event)
            await load.run(client, args.minutes * 60, stop_at)
            # Let the last calls' window close and the mesh drain a little before the final sample.
            with trio.move_on_after(min(args.sample_seconds, 10)):
                await trio.sleep_forever()
            stop_event.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=20.0, help="stores per second, and as many recalls")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    # SIGTERM, and SIGINT even when started in the background (where a shell ignores it), stop the
    # run the way Ctrl-C does: daemons stopped, samples so far written.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.default_int_handler)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "soak.md").write_text(report_md(result))
    print(report_md(result))
    flagged = [c for c in result["checks"] if c["flagged"]]
    failed = result["store_errors"] or result["recall_errors"] or result["skipped"]
    return 1 if result.get("error") or flagged or failed else 0


if __name__ == "__main__":
    sys.exit(main())
