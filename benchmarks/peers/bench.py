"""The measurements, one server at a time, through the MCP SDK's stdio client.

``measure`` runs the workload against a fresh store: start-up (spawn to ``tools/list``
answered), every memory stored one call at a time, every query searched one call at a time
(``passes`` times; quality is scored on the first pass), then the resident memory of every
process serving it, and a second session's start-up on the now-filled store.

``two_writers`` starts two server processes on one fresh store, lets both connect, then has
each write 50 distinct memories at the same time, and counts what the store holds afterwards.

Latency figures leave out each session's first store and first search (reported apart as
``first_store_ms``/``first_search_ms``): that call pays one-off costs (a model loaded lazily, a
file or index created) which the start-up figure or the first-call figure shows instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import psutil

from servers import Peer, Store
from workload import Workload, latency_summary, score

__all__ = ["measure", "two_writers", "scale", "CALL_TIMEOUT"]

CALL_TIMEOUT = 120.0  # seconds; a busy 2-core machine loading a model
SEARCH_K = 10


def _client(peer: Peer, store: Store):
    from mcp import Client

    return Client(peer.params(store), mode="legacy", read_timeout_seconds=CALL_TIMEOUT)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` and their descendants."""
    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                if process.pid in seen:
                    continue
                seen.add(process.pid)
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = process.cpu_times()
                    total += times.user + times.system
    return total


def _memory(pids: list[int]) -> dict[str, float]:
    """RSS now and peak RSS (VmHWM) summed over ``pids`` and their descendants, in MB."""
    seen: set[int] = set()
    rss = peak = 0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for process in family:
            if process.pid in seen:
                continue
            seen.add(process.pid)
            with contextlib.suppress(psutil.NoSuchProcess, OSError):
                rss += process.memory_info().rss
                for line in open(f"/proc/{process.pid}/status"):
                    if line.startswith("VmHWM:"):
                        peak += int(line.split()[1]) * 1024
    return {"rss_mb": rss / 2**20, "peak_rss_mb": peak / 2**20, "processes": len(seen)}


async def _session_start(stack: contextlib.AsyncExitStack, peer: Peer, store: Store) -> tuple[Any, float, list[int]]:
    before = _children()
    began = time.perf_counter()
    client = await stack.enter_async_context(_client(peer, store))
    await client.list_tools()
    startup = time.perf_counter() - began
    return client, startup, sorted(_children() - before)


async def measure(peer: Peer, root: Path, workload: Workload, passes: int = 1) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    store = peer.new_store(root)
    out: dict[str, Any] = {"peer": peer.name}
    try:
        async with contextlib.AsyncExitStack() as stack:
            client, out["startup_s"], spawned = await _session_start(stack, peer, store)
            servers = spawned + peer.extra_pids(store)
            cpu_before = _cpu_seconds(servers)
            key_to_id: dict[str, str] = {}
            store_times: list[float] = []
            for i, memory in enumerate(workload.memories):
                began = time.perf_counter()
                key = await peer.store(client, memory.text, memory.type, f"m{i:06d}")
                store_times.append(time.perf_counter() - began)
                key_to_id[key] = memory.id
            servers = spawned + peer.extra_pids(store)  # Hyphae's daemon exists by now
            cpu_stored = _cpu_seconds(servers)
            search_times: list[float] = []
            first_pass: list[list[str]] = []
            for attempt in range(passes):
                for query in workload.queries:
                    began = time.perf_counter()
                    keys = await peer.search(client, query.text, SEARCH_K)
                    search_times.append(time.perf_counter() - began)
                    if attempt == 0:
                        first_pass.append([key_to_id.get(key, f"?{key}") for key in keys])
                if attempt == 0:
                    cpu_searched = _cpu_seconds(servers)
            out["memory"] = _memory(servers)
            # Server-side CPU per call, summed over every process serving the session.
            out["cpu_ms_per_store"] = (cpu_stored - cpu_before) / len(workload.memories) * 1e3
            out["cpu_ms_per_new_search"] = (cpu_searched - cpu_stored) / len(workload.queries) * 1e3
        out["first_store_ms"] = store_times[0] * 1e3
        out["first_search_ms"] = search_times[0] * 1e3
        out["store"] = latency_summary(store_times[1:])
        out["search"] = latency_summary(search_times[1:])
        out["search_first_pass"] = latency_summary(search_times[1 : len(workload.queries)])
        out["search_repeat"] = latency_summary(search_times[len(workload.queries) :])  # asked before: caches help
        out["quality"] = score(first_pass, workload.queries)
        out["unmapped_keys"] = sum(key.startswith("?") for ranked in first_pass for key in ranked)
        # A second agent session on the filled store (Hyphae: its daemon is still up).
        async with contextlib.AsyncExitStack() as stack:
            _, out["restart_s"], _ = await _session_start(stack, peer, store)
    finally:
        peer.stop(store)
    out["stored"] = len(workload.memories)
    return out


async def two_writers(peer: Peer, root: Path, writes: int = 50) -> dict[str, Any]:
    """Two server processes on one store, ``writes`` distinct stores each, at the same time."""
    root.mkdir(parents=True, exist_ok=True)
    store = peer.new_store(root)
    texts = {label: [f"Writer {label} note {i}: the {label}{i:03d}qx build flag stays on." for i in range(writes)]
             for label in ("a", "b")}  # fmt: skip
    ready = {label: asyncio.Event() for label in texts}
    go = asyncio.Event()

    async def writer(label: str) -> dict[str, Any]:
        report: dict[str, Any] = {"acked": 0, "errors": []}
        try:
            async with contextlib.AsyncExitStack() as stack:
                client, report["startup_s"], _ = await _session_start(stack, peer, store)
                ready[label].set()
                await go.wait()
                began = time.perf_counter()
                for i, text in enumerate(texts[label]):
                    try:
                        await peer.store(client, text, "fact", f"{label}{i:03d}")
                        report["acked"] += 1
                    except Exception as error:  # noqa: BLE001 - counted, not fatal
                        report["errors"].append(str(error)[:300])
                report["seconds"] = time.perf_counter() - began
        except Exception as error:  # noqa: BLE001 - a server that cannot start beside another
            report["errors"].append(f"session: {type(error).__name__}: {_leaf(error)[:300]}")
        finally:
            ready[label].set()
        return report

    async def starter() -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(event.wait() for event in ready.values())), CALL_TIMEOUT)
        go.set()

    try:
        reports = await asyncio.gather(writer("a"), writer("b"), starter())
    finally:
        peer.stop(store)
    held = set(peer.contents(store))
    wanted = [text for label in texts for text in texts[label]]
    out = {
        "peer": peer.name, "attempted": len(wanted), "acked": sum(r["acked"] for r in reports[:2]),
        "survived": sum(text in held for text in wanted), "writers": dict(zip(texts, reports[:2])),
    }  # fmt: skip
    for report in out["writers"].values():
        report["error_count"] = len(report["errors"])
        report["errors"] = sorted(set(report["errors"]))[:3]
    return out


def _leaf(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"


async def scale(peer: Peer, root: Path, workload: Workload, sizes: list[int], calls: int = 50) -> dict[str, Any]:
    """Stores/s and searches/s with ``size`` memories already in the store (put there by the
    server's own local path, ``Peer.prefill``): ``calls`` stores then ``calls`` searches."""
    from workload import filler

    out: dict[str, Any] = {}
    for size in sizes:
        (root / f"n{size}").mkdir(parents=True, exist_ok=True)
        store = peer.new_store(root / f"n{size}")
        began = time.perf_counter()
        peer.prefill(store, [m.text for m in filler(size, seed=2)])
        prefill_s = time.perf_counter() - began
        try:
            async with contextlib.AsyncExitStack() as stack:
                client, startup, spawned = await _session_start(stack, peer, store)
                store_times, search_times = [], []
                for i, memory in enumerate(workload.memories[:calls]):
                    began = time.perf_counter()
                    await peer.store(client, memory.text, memory.type, f"s{i:06d}")
                    store_times.append(time.perf_counter() - began)
                for query in workload.queries[:calls]:
                    began = time.perf_counter()
                    await peer.search(client, query.text, SEARCH_K)
                    search_times.append(time.perf_counter() - began)
                memory = _memory(spawned + peer.extra_pids(store))
        finally:
            peer.stop(store)
        out[str(size)] = {"prefill_s": prefill_s, "startup_s": startup, "store": latency_summary(store_times[1:]),
                          "search": latency_summary(search_times[1:]), "memory": memory}  # fmt: skip
    return out
