"""Federation: a memory stored on node A, readable on node B, and who else gets it.

**Hyphae.** Three real daemons (A, B, C) on 127.0.0.1, one team made as a user would (``hyphae
team create`` on A, ``hyphae team join TOKEN`` on B and C), static peers, no zeroconf; the
harness is ``tests/e2e_mesh/cluster.py``. Each node's agent talks MCP over stdio (``hyphae
mcp``, the SDK as client). B's agent places a beacon "which database do we use for storage",
C's agent one about the mobile release train. A's agent stores ``deliveries`` matching
decisions, ``gap`` seconds apart, while B's agent polls its ``inbox`` as fast as the calls come
back. Latency is from A's ``store`` returning to B's poll first showing the cell (includes up
to one poll round trip), and the node-stamped ``received_at - created_at`` beside it.
Afterwards C's inbox is read, and C is asked for each cell by id (REST): an uninterested node
should have neither.

**agent-memory-os.** Its federation is peer sync: ``agent-memory peers add URL --peer-token T``
then ``agent-memory sync auto`` (pull the peer's bundle, push ours), run by hand, from the web
console, or a cron/timer entry; nothing pushes on a write. A serves its web API
(``agent-memory-web``, the sync routes); B and C register A as a peer (policy ``shared``, the
default) and run ``sync_all_peers`` in a tight loop (the best case: a timer firing
continuously). A's agent stores through its MCP server (``memory_add``, share ``team:apollo``:
only B's agent is in team apollo). Latency is from A's store returning to B's loop seeing the
memory in its own SQLite store. Whether it reaches C too: A's export route serves every
non-private memory to any peer holding the sync token; nothing looks at interest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servers import AgentMemoryOS, Hyphae, payload, run
from workload import latency_summary

__all__ = ["hyphae_federation", "amo_federation", "federation_table"]

BEACON_B = "which database do we use for storage"
BEACON_C = "the mobile app ships every second Thursday"
GAP = 0.3  # seconds between A's stores
DEADLINE = 60.0


def _matching(i: int) -> str:
    return f"Decision {i}: keep the V1 storage backend on Postgres with the pgvector extension."


def _client(params: Any):
    from mcp import Client

    return Client(params, mode="legacy", read_timeout_seconds=DEADLINE)


# -- Hyphae -------------------------------------------------------------------------------------


def hyphae_federation(root: Path, deliveries: int, gap: float = GAP) -> dict[str, Any]:
    from tests.e2e_mesh.cluster import Lab, wait_beacons_known  # from the Hyphae under test (Hyphae.use)

    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"nodes": 3, "deliveries": deliveries, "gap_s": gap}
    with Lab(root) as lab:
        began = time.monotonic()
        a, b, c = lab.team(["a", "b", "c"], provider="builtin", via_cli=True)
        lab.start_mesh([a, b, c])
        out["mesh_up_s"] = round(time.monotonic() - began, 1)
        keys = {node.name: node.cli("agent", "add", f"agent-{node.name}").strip().splitlines()[-1] for node in (a, b, c)}
        out.update(asyncio.run(_hyphae_sessions(a, b, c, keys, deliveries, gap, wait_beacons_known)))
    return out


def _hyphae_params(node: Any, key: str):
    from mcp import StdioServerParameters

    env = {"HYPHAE_HOME": str(node.home), "HYPHAE_API_KEY": key, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp"], env=env, cwd=os.getcwd())


async def _hyphae_sessions(a, b, c, keys, deliveries, gap, wait_beacons_known) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        alice = await stack.enter_async_context(_client(_hyphae_params(a, keys["a"])))
        bob = await stack.enter_async_context(_client(_hyphae_params(b, keys["b"])))
        carol = await stack.enter_async_context(_client(_hyphae_params(c, keys["c"])))
        payload(await bob.call_tool("place_beacon", {"query": BEACON_B}))
        payload(await carol.call_tool("place_beacon", {"query": BEACON_C}))
        out["beacons_known_s"] = await asyncio.to_thread(wait_beacons_known, a, 2)

        acked: dict[str, float] = {}
        seen: dict[str, float] = {}
        stamped: list[float] = []
        done = asyncio.Event()

        async def poll() -> None:
            since = 0
            while not done.is_set():
                page = payload(await bob.call_tool("inbox", {"since": since, "limit": 100}))
                now = time.perf_counter()
                for diff in page["diffs"]:
                    seen.setdefault(diff["node_id"], now)
                    if "created_at" in diff and "received_at" in diff:
                        stamped.append((diff["received_at"] - diff["created_at"]) / 1e3)
                since = page.get("next_since") or since
                await asyncio.sleep(0.002)

        poller = asyncio.create_task(poll())
        for i in range(deliveries):
            stored = payload(await alice.call_tool("store", {"content": _matching(i), "cell_type": "Decision"}))
            acked[stored["node_id"]] = time.perf_counter()
            await asyncio.sleep(gap)
        deadline = time.monotonic() + DEADLINE
        while set(acked) - set(seen) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # let anything stray reach C
        done.set()
        await poller
        c_inbox = payload(await carol.call_tool("inbox", {"since": 0, "limit": 100}))["diffs"]
    latencies = [seen[i] - acked[i] for i in acked if i in seen]
    c_holds = sum(c.http.get(f"/v1/cells/{node_id}", headers={"x-hyphae-key": keys["c"]}).status_code == 200
                  for node_id in acked)  # fmt: skip
    out.update({
        "delivered": sum(i in seen for i in acked), "latency": latency_summary(latencies),
        "stamped": latency_summary(stamped), "uninterested_inbox": len(c_inbox), "uninterested_holds": c_holds,
    })  # fmt: skip
    return out


# -- agent-memory-os ----------------------------------------------------------------------------

_SYNC_LOOP = r"""
import json, os, sys, time
from agent_memory_os import MemoryClient
from agent_memory_os.sync import sync_all_peers
home, stop = sys.argv[1], sys.argv[2]
client = MemoryClient(home=home)
known = set()
while not os.path.exists(stop):
    began = time.time()
    results = sync_all_peers(client)
    ended = time.time()
    rows = client.store.conn.execute("SELECT content, visibility FROM memories").fetchall()
    for content, visibility in rows:
        if content not in known:
            known.add(content)
            print(json.dumps({"content": content, "visibility": visibility, "seen": ended}), flush=True)
    print(json.dumps({"round": ended - began, "ok": all(r.get("ok") for r in results)}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def amo_federation(peer: AgentMemoryOS, root: Path, deliveries: int, gap: float = GAP) -> dict[str, Any]:
    import httpx

    root.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(peer.python()).parent
    cli = str(bin_dir / "agent-memory")
    homes = {name: root / name for name in "abc"}
    for home in homes.values():
        home.mkdir()
    run([cli, "--home", str(homes["a"]), "team", "create", "apollo"])
    run([cli, "--home", str(homes["a"]), "team", "add-member", "apollo", "alice"])
    run([cli, "--home", str(homes["a"]), "token", "create", "--sync"])
    token = run([cli, "--home", str(homes["a"]), "token", "show", "--sync"]).strip().splitlines()[-1]
    port = _free_port()
    processes: list[subprocess.Popen] = []
    out: dict[str, Any] = {"nodes": 3, "deliveries": deliveries, "gap_s": gap, "policy": "shared"}
    stop = root / "stop"
    try:
        log = open(root / "web-a.log", "wb")
        processes.append(subprocess.Popen([str(bin_dir / "agent-memory-web"), "--host", "127.0.0.1", "--port", str(port),
                                           "--home", str(homes["a"]), "--strict-port"], stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL))  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + DEADLINE
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/api/node", headers={"authorization": f"Bearer {token}"}, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or processes[0].poll() is not None:
                raise RuntimeError(f"agent-memory-web did not serve: {(root / 'web-a.log').read_text()[-2000:]}")
            time.sleep(0.2)
        for name in "bc":
            run([cli, "--home", str(homes[name]), "peers", "add", url, "--peer-token", token])
        began = time.monotonic()
        run([cli, "--home", str(homes["b"]), "sync", "auto"])
        out["cli_sync_round_s"] = round(time.monotonic() - began, 2)
        loops = {name: subprocess.Popen([peer.python(), "-c", _SYNC_LOOP, str(homes[name]), str(stop)],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                 for name in "bc"}  # fmt: skip
        processes.extend(loops.values())
        acked = asyncio.run(_amo_stores(peer, homes["a"], deliveries, gap))
        wanted = set(acked)
        time.sleep(3.0)  # a few more rounds, so slow ones still land
        stop.write_text("")
        reports = {name: _read_loop(loop) for name, loop in loops.items()}
    finally:
        stop.write_text("")
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
    seen_b = {r["content"]: r["seen"] for r in reports["b"]["items"] if r["content"] in wanted}
    seen_c = {r["content"] for r in reports["c"]["items"] if r["content"] in wanted}
    out.update({
        "delivered": len(seen_b), "latency": latency_summary([seen_b[t] - acked[t] for t in seen_b]),
        "sync_round": latency_summary(reports["b"]["rounds"]), "uninterested_holds": len(seen_c),
        "uninterested_inbox": None,
    })  # fmt: skip
    return out


async def _amo_stores(peer: AgentMemoryOS, home: Path, deliveries: int, gap: float) -> dict[str, float]:
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=peer.python(), args=["-m", "agent_memory_os.mcp_server"],
                                   env={"AGENT_MEMORY_HOME": str(home), "AGENT_MEMORY_AGENT_ID": "alice"})  # fmt: skip
    acked: dict[str, float] = {}
    async with _client(params) as alice:
        for i in range(deliveries):
            text = _matching(i)
            result = payload(await alice.call_tool("memory_add", {"content": text, "type": "decision", "share": "team"}))
            if "error" in result:
                raise RuntimeError(f"memory_add: {result['error']}")
            acked[text] = time.time()
            await asyncio.sleep(gap)
    return acked


def _read_loop(process: subprocess.Popen) -> dict[str, Any]:
    try:
        stdout, _ = process.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, _ = process.communicate()
    items, rounds = [], []
    for line in stdout.splitlines():
        record = json.loads(line)
        (rounds.append(record["round"]) if "round" in record else items.append(record))
    return {"items": items, "rounds": rounds}


# -- report -------------------------------------------------------------------------------------


def federation_table(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| system | how it travels | delivered | store -> readable on B p50 / p99 ms | node-stamped p50 ms "
            "| uninterested node: inbox / holds the cells |", "|" + " --- |" * 6]  # fmt: skip
    how = {"hyphae": "push to nodes whose beacons match", "amo": "pull/push sync of every non-private memory, looped"}
    for name, r in results.items():
        if "error" in r:
            rows.append(f"| {name} | failed: {r['error'][:160]} | | | | |")
            continue
        lat = r["latency"]
        stamped = r.get("stamped", {}).get("p50_ms")
        inbox = "-" if r.get("uninterested_inbox") is None else r["uninterested_inbox"]
        rows.append(f"| {name} | {how.get(name, '')} | {r['delivered']}/{r['deliveries']} "
                    f"| {lat['p50_ms']:.1f} / {lat['p99_ms']:.1f} | {'-' if stamped is None else f'{stamped:.1f}'} "
                    f"| {inbox} / {r['uninterested_holds']} of {r['deliveries']} |")  # fmt: skip
    return "\n".join(rows)


if __name__ == "__main__":  # a quick look: python federation.py hyphae|amo WORK
    which, work = sys.argv[1], Path(sys.argv[2]).resolve()
    if which == "hyphae":
        hyphae = Hyphae(work, sys.argv[3] if len(sys.argv) > 3 else "HEAD")
        hyphae.install()
        hyphae.use()
        print(json.dumps(hyphae_federation(work / "fed-hyphae", 5), indent=1))
    else:
        print(json.dumps(amo_federation(AgentMemoryOS(work), work / "fed-amo", 5), indent=1))
    os._exit(0)
