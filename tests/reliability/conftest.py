"""Reliability fixtures: a lean MCP client, an RSS sampler and the mixed load workload.

Every test here runs the product as a user's machine does: ``hyphae up`` on an ephemeral
loopback port and its own data dir (the e2e helpers start, find and stop it). Agents
speak MCP over HTTP with :class:`McpClient`: plain JSON-RPC 2.0 over ``POST /mcp`` on a
keep-alive ``httpx.AsyncClient`` per agent, with the headers an SDK client sends. It is
lean on purpose: 32 official-SDK sessions in one process would measure the SDK's
anyio/SSE machinery on our 2 cores instead of the node. The SDK itself is exercised
end to end in ``tests/e2e/test_mcp_sdk.py``.

:func:`run_load` is the workload of ``test_load.py`` and ``benchmarks/load_bench.py``:
each client is one agent with a standing beacon on one of a few topics, looping over a
weighted mix of ``store`` / ``recall`` / ``inbox`` / ``pull_inbox`` until a deadline,
while a sampler reads the daemon's resident set from ``/proc/PID/status``. Every store
carries an idempotency key and unique content; what the node acknowledged is kept, so
the caller can prove nothing was lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.e2e.conftest import DEADLINE

PROTOCOL_VERSION = "2025-11-25"
TOPICS = (
    "release train schedule and deploy freeze",
    "database backup retention policy",
    "oncall pager escalation rules",
    "feature flag cleanup process",
)
MIX = (("store", 40), ("recall", 30), ("inbox", 15), ("pull_inbox", 15))
BEACON_THRESHOLD = 0.3


class McpCallFailed(Exception):
    """A tools/call that did not return a successful result (or never returned)."""

    def __init__(self, tool: str, detail: Any) -> None:
        super().__init__(f"{tool}: {detail}")
        self.tool = tool
        self.detail = detail

    @property
    def reason(self) -> str | None:
        error = self.detail.get("error") if isinstance(self.detail, dict) else None
        return (error or {}).get("data", {}).get("reason")


class McpClient:
    """One agent's MCP-over-HTTP session: lean JSON-RPC on a keep-alive connection."""

    def __init__(self, url: str, key: str, *, timeout: float = DEADLINE) -> None:
        self.http = httpx.AsyncClient(
            base_url=url,
            timeout=timeout,
            headers={
                "x-hyphae-key": key,
                "MCP-Protocol-Version": PROTOCOL_VERSION,
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
            },
        )
        self._ids = itertools.count(1)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            message["params"] = params
        response = await self.http.post("/mcp", json=message)
        if response.status_code != 200:
            raise McpCallFailed(method, {"status": response.status_code, "body": response.text[:500]})
        return response.json()

    async def initialize(self) -> dict[str, Any]:
        answer = await self.rpc("initialize", {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "reliability", "version": "0"},
        })
        notified = await self.http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert notified.status_code == 202, notified.text
        return answer["result"]

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The tool's structuredContent; anything else raises :class:`McpCallFailed`."""
        answer = await self.rpc("tools/call", {"name": tool, "arguments": arguments or {}})
        if "error" in answer or answer.get("result", {}).get("isError"):
            raise McpCallFailed(tool, answer)
        return answer["result"]["structuredContent"]


# -- the daemon's memory ---------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (VmRSS), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


# -- the mixed workload ---------------------------------------------------------------


@dataclasses.dataclass
class LoadReport:
    clients: int
    duration: float
    warmup: float
    latencies: dict[str, list[float]]  # op -> seconds, every successful call
    errors: list[str]
    acked: dict[str, str]  # node_id -> content, every acknowledged store
    rss: list[tuple[float, int]]  # (seconds since start, KiB)
    stored_at: list[float]  # seconds since start of each acknowledged store
    inbox_items: int  # diffs returned by inbox and pull_inbox
    elapsed: float = 0.0

    def summary(self) -> dict[str, Any]:
        ops = {}
        everything: list[float] = []
        for op, values in sorted(self.latencies.items()):
            everything += values
            ops[op] = {"calls": len(values), **_percentiles(values)}
        after = [kib for t, kib in self.rss if t >= self.warmup]
        return {
            "clients": self.clients,
            "duration_s": round(self.elapsed, 1),
            "calls": len(everything),
            "calls_per_s": round(len(everything) / self.elapsed, 1) if self.elapsed else 0.0,
            "errors": len(self.errors),
            "stores_acknowledged": len(self.acked),
            "inbox_items_read": self.inbox_items,
            "all": _percentiles(everything),
            "ops": ops,
            "rss_mib": {
                "start": _mib(self.rss[0][1]) if self.rss else None,
                "after_warmup": _mib(after[0]) if after else None,
                "end": _mib(self.rss[-1][1]) if self.rss else None,
                "max": _mib(max(kib for _, kib in self.rss)) if self.rss else None,
            },
        }

    def rss_growth_after_warmup(self) -> tuple[float, int]:
        """(MiB gained from the first sample after warm-up to the last, stores made meanwhile)."""
        after = [(t, kib) for t, kib in self.rss if t >= self.warmup]
        if len(after) < 2:
            return 0.0, 0
        (t0, first), (t1, last) = after[0], after[-1]
        stores = sum(1 for t in self.stored_at if t0 <= t <= t1)
        return (last - first) / 1024, stores


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(1000 * ordered[-1], 2)}


async def run_load(
    url: str,
    keys: list[str],
    *,
    duration: float,
    pid: int | None = None,
    warmup: float = 0.0,
    seed: int = 7,
    rss_interval: float = 0.25,
) -> LoadReport:
    """Every key drives one client through the mixed workload for ``duration`` seconds."""
    report = LoadReport(
        clients=len(keys), duration=duration, warmup=warmup,
        latencies={op: [] for op, _ in MIX}, errors=[], acked={}, rss=[], stored_at=[], inbox_items=0,
    )
    ops, weights = zip(*MIX)
    ready = 0
    all_ready = trio.Event()
    started = stop_at = 0.0  # set once every client has initialised and placed its beacon

    async def client(index: int, key: str) -> None:
        nonlocal ready, started, stop_at
        rng = random.Random(seed * 1000 + index)
        topic = TOPICS[index % len(TOPICS)]
        mcp = McpClient(url, key)
        since = 0
        try:
            await mcp.initialize()
            await mcp.call("place_beacon", {"query": topic, "threshold": BEACON_THRESHOLD})
        except (McpCallFailed, httpx.HTTPError) as exc:
            report.errors.append(f"client {index} setup: {exc!r}"[:500])
        finally:
            ready += 1
            if ready == len(keys):
                started = time.monotonic()
                stop_at = started + duration
                all_ready.set()
        try:
            await all_ready.wait()
            n = 0
            while time.monotonic() < stop_at:
                op = rng.choices(ops, weights)[0]
                n += 1
                began = time.monotonic()
                try:
                    if op == "store":
                        other = TOPICS[rng.randrange(len(TOPICS))]
                        content = f"{other}: note {n} from client {index} ({uuid.uuid4().hex[:12]})"
                        answer = await mcp.call("store", {
                            "content": content, "cell_type": rng.choice(("Fact", "Decision", "Lesson")),
                            "salience": round(rng.random(), 2), "idempotency_key": uuid.uuid4().hex,
                        })
                        report.acked[answer["node_id"]] = content
                        report.stored_at.append(time.monotonic() - started)
                    elif op == "recall":
                        answer = await mcp.call("recall", {"query": TOPICS[rng.randrange(len(TOPICS))], "k": 10})
                        assert isinstance(answer["results"], list)
                    elif op == "inbox":
                        answer = await mcp.call("inbox", {"since": since, "limit": 50})
                        since = answer["next_since"] or since
                        report.inbox_items += len(answer["diffs"])
                    else:
                        answer = await mcp.call("pull_inbox", {"limit": 20})
                        report.inbox_items += len(answer["diffs"])
                except (McpCallFailed, httpx.HTTPError, AssertionError, KeyError) as exc:
                    report.errors.append(f"client {index} {op}: {exc!r}"[:500])
                    continue
                report.latencies[op].append(time.monotonic() - began)
        finally:
            await mcp.aclose()

    async def sample_rss() -> None:
        await all_ready.wait()
        while time.monotonic() < stop_at:
            kib = rss_kib(pid) if pid else None
            if kib is not None:
                report.rss.append((time.monotonic() - started, kib))
            await trio.sleep(rss_interval)

    with trio.fail_after(duration + 2 * DEADLINE):
        async with trio.open_nursery() as nursery:
            if pid:
                nursery.start_soon(sample_rss)
            for index, key in enumerate(keys):
                nursery.start_soon(client, index, key)
    report.elapsed = time.monotonic() - started
    if pid and (kib := rss_kib(pid)) is not None:
        report.rss.append((report.elapsed, kib))
    return report


def missing_from_database(db_path: Path, acked: dict[str, str]) -> list[str]:
    """Acknowledged node ids whose cell (with that exact content) is not in the database."""
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        stored = dict(db.execute("SELECT node_id, content FROM cells WHERE forgotten_at IS NULL"))
    return [node_id for node_id, content in acked.items() if stored.get(node_id) != content]
