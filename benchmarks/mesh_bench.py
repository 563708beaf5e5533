"""Mesh figures with real daemons: a 5-node loopback mesh of ``hyphae up`` processes.

    python benchmarks/mesh_bench.py                      # full run (sustained part 60 s)
    python benchmarks/mesh_bench.py --seconds 10         # quick run

Every node is a real daemon (``python -m app.cli up``) on its own data dir, API and mesh
on ephemeral 127.0.0.1 ports, one team, static peers (all point at n0; peer diffs do the
rest), no zeroconf. The harness is ``tests/e2e_mesh/cluster.py``. Three parts:

1. **Latency** (``--latency-provider``, default the built-in MiniLM model, so interest is
   by meaning): n1's agent has a beacon "which database do we use for storage", n2-n4
   beacons on unrelated topics; n0 stores ``--stores`` (200) matching decisions over
   REST, one every ``--gap-ms`` (20) ms. A poller thread reads n1's ``GET /v1/inbox?since=``
   every 5 ms. Reported: (a) *polled*: from the store call returning to the item being
   seen in n1's inbox (includes up to one poll interval and the poll's own round trip);
   (b) *stamped*: ``received_at - created_at`` from the inbox items (same machine, same
   clock; ``created_at`` is stamped after embedding and before the origin's durable
   commit, ``received_at`` inside the receiver's ingest transaction).
2. **Messages per store vs interested nodes** (same mesh): the part-1 beacons are removed;
   receiver n_j (j = 1..4) places beacons on projects ``fan-k`` for k >= j, so a store in
   project ``fan-k`` interests exactly k nodes (the beacon query matches the text; the
   project filter decides). For each k, ``--fan-stores`` stores 100 ms apart; the
   ``frames_sent``/``data_diffs_sent`` counters of ``GET /v1/admin/peers`` on every node are
   read before and after. Data-plane = frames carrying cell diffs; control-plane =
   everything else (acks, gossip, pings, repair), with the idle control rate measured
   over an equal window for comparison.
3. **Sustained load** (``--load-provider``, default ``hashed``: the built-in model embeds
   ~8.5 ms per text on one core, so 200 stores/s would need 1.7 cores for embedding
   alone on a 2-core machine that also runs 5 daemons and the load generator): a fresh
   5-node mesh per rate; ``--rate`` (200; several comma-separated) stores/s for
   ``--seconds`` (60), scheduled at t0 + i/rate with at most ``--max-inflight`` (64)
   outstanding (beyond that the generator waits, so a saturated mesh shows as a lower
   achieved rate rather than as an unbounded queue), round-robin over origins, projects
   ``load-m`` (m = 0..4) drawn at random; project ``load-m`` interests m nodes. Afterwards
   every inbox is counted against the expected number (origin excluded). The generator posts
   over raw keep-alive HTTP/1.1 connections (``mcp_bench.RawConnection``), idle ones pooled per
   origin, so that its own CPU (reported apart) leaves the cores to the daemons. CPU is read from
   ``/proc`` per daemon thread (roles from ``py-spy dump`` when it is installed), and the
   data diffs sent are split into first sends, resends and repair replies.

Prints a markdown report and writes JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.mcp_bench import RawConnection  # noqa: E402
from tests.e2e_mesh.cluster import Lab, MeshNode, wait_beacons_known, wait_until  # noqa: E402

NODES = 5


# -- small helpers ------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values), "p50": pct(values, 50), "p90": pct(values, 90), "p99": pct(values, 99),
        "max": max(values) if values else float("nan"), "mean": statistics.fmean(values) if values else float("nan"),
    }  # fmt: skip


def machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
        "platform": platform.platform(), "loadavg": os.getloadavg(),
    }  # fmt: skip


def start_mesh(lab: Lab, prefix: str, provider: str) -> list[MeshNode]:
    began = time.monotonic()
    nodes = lab.team([f"{prefix}{i}" for i in range(NODES)], provider=provider)
    lab.start_mesh(nodes)
    print(f"# {NODES}-node mesh ({provider}) up and connected in {time.monotonic() - began:.1f} s", file=sys.stderr)
    return nodes


def inbox_all(node: MeshNode, key: str, since: int = 0) -> list[dict[str, Any]]:
    """Every inbox item after ``since`` (pages of 500)."""
    items: list[dict[str, Any]] = []
    while True:
        page = node.rest("GET", "/v1/inbox", key, params={"since": since, "limit": 500})
        items.extend(page["diffs"])
        if len(page["diffs"]) < 500:
            return items
        since = page["next_since"]


def counters(nodes: list[MeshNode]) -> dict[str, dict[str, Any]]:
    out = {}
    for node in nodes:
        s = node.peers()
        out[node.name] = {
            "data_frames": s["frames_sent"].get("data", 0), "control_frames": s["frames_sent"].get("control", 0),
            "data_bytes": s["bytes_sent"].get("data", 0), "control_bytes": s["bytes_sent"].get("control", 0),
            "data_diffs": s["data_diffs_sent"], "resent_diffs": s.get("data_diffs_resent", 0),
            "repair_diffs": s.get("repair_diffs_sent", 0), "drops": dict(s["drops"]),
            "posts": s["transport"]["sent"], "replies": s["runtime"].get("replies_in_response", 0),
            "data_replies": s["runtime"].get("data_frames_in_response", 0),
            "runtime": {k: v for k, v in s["runtime"].items() if isinstance(v, int)},
        }  # fmt: skip
    return out


def cpu_seconds(nodes: list[MeshNode]) -> float:
    """User + system CPU seconds the daemons have used so far (all their threads)."""
    return sum(_process_cpu(node.process.pid) for node in nodes)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds per live thread of ``pid`` (utime + stime from /proc/PID/task/TID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_roles(pid: int) -> dict[int, str]:
    """Thread id -> role (main, writer, indexer, embed, worker), from the Python thread names
    ``py-spy dump`` reports; without py-spy only the main thread is told apart."""
    roles = {pid: "main"}
    try:
        dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return roles
    for tid, name in re.findall(r'^Thread (\d+) \([^)]*\)(?:: "([^"]*)")?', dump, re.M):
        role = {"MainThread": "main", "hyphae-writer": "writer", "hyphae-indexer": "indexer"}.get(name)
        roles[int(tid)] = role or ("embed" if name.startswith("hyphae-embed") else "worker")
    return roles


class CpuByRole:
    """The daemons' CPU by thread role over a window (threads that ended count as ``ended``)."""

    def __init__(self, nodes: list[MeshNode]) -> None:
        self.pids = [node.process.pid for node in nodes]
        self.threads = {pid: thread_cpu(pid) for pid in self.pids}
        self.process = {pid: _process_cpu(pid) for pid in self.pids}

    def since(self) -> dict[str, float]:
        out: collections.Counter[str] = collections.Counter()
        for pid in self.pids:
            roles = thread_roles(pid)
            before, after = self.threads[pid], thread_cpu(pid)
            listed = 0.0
            for tid, seconds in after.items():
                used = seconds - before.get(tid, 0.0)
                out[roles.get(tid, "worker")] += used
                listed += used
            out["ended"] += max(0.0, _process_cpu(pid) - self.process[pid] - listed)
        return dict(out)


def _process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def delta(after: dict, before: dict, field: str) -> int:
    return sum(after[name][field] - before[name][field] for name in after)


def remove_beacons(node: MeshNode, key: str) -> None:
    for beacon in node.rest("GET", "/v1/beacons", key)["beacons"]:
        node.rest("DELETE", f"/v1/beacons/{beacon['beacon_id']}", key)


# -- part 1: latency ----------------------------------------------------------------------

LATENCY_BEACONS = (
    "which database do we use for storage",
    "frontend styling conventions",
    "flaky tests in the CI pipeline",
    "hiring plan for the next quarter",
)


def latency_text(i: int) -> str:
    return f"Storage decision {i}: the database we use for storage of service {i} is PostgreSQL with pgvector."


def part_latency(nodes: list[MeshNode], keys: list[str], stores: int, gap_ms: float) -> dict[str, Any]:
    origin, receiver = nodes[0], nodes[1]
    for node, key, query in zip(nodes[1:], keys[1:], LATENCY_BEACONS):
        node.rest("POST", "/v1/beacons", key, json={"query": query}, expect=201)
    wait_beacons_known(origin, len(LATENCY_BEACONS))

    seen: dict[str, float] = {}
    items: dict[str, dict[str, Any]] = {}
    done = threading.Event()

    def poll() -> None:
        since = 0
        with httpx.Client(base_url=receiver.api_url, headers={"x-hyphae-key": keys[1]}, timeout=10.0,
                          trust_env=False) as http:  # fmt: skip
            while not done.is_set():
                page = http.get("/v1/inbox", params={"since": since, "limit": 500}).json()
                now = time.monotonic()
                for diff in page["diffs"]:
                    seen.setdefault(diff["node_id"], now)
                    items[diff["node_id"]] = diff
                since = page["next_since"]
                time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    returned: dict[str, float] = {}
    call_ms: list[float] = []
    try:
        with httpx.Client(base_url=origin.api_url, headers={"x-hyphae-key": keys[0]}, timeout=10.0,
                          trust_env=False) as http:  # fmt: skip
            t0 = time.monotonic()
            for i in range(stores):
                delay = t0 + i * gap_ms / 1000 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                began = time.monotonic()
                response = http.post("/v1/cells", json={"content": latency_text(i), "cell_type": "Decision"})
                ended = time.monotonic()
                assert response.status_code == 201, response.text
                returned[response.json()["node_id"]] = ended
                call_ms.append((ended - began) * 1000)
        wait_until(lambda: set(returned) <= set(seen), 60.0, interval=0.05,
                   message=lambda: f"{len(set(returned) - set(seen))} of {stores} stores missing at n1")  # fmt: skip
    finally:
        done.set()
        poller.join(5)
    polled = [(seen[i] - returned[i]) * 1000 for i in returned]
    stamped = [float(items[i]["received_at"] - items[i]["created_at"]) for i in returned]
    others = {n.name: len(inbox_all(n, k)) for n, k in zip(nodes[2:], keys[2:])}
    hops = sorted({items[i]["hops"] for i in returned})
    return {
        "stores": stores, "gap_ms": gap_ms, "store_call_ms": summary(call_ms), "polled_ms": summary(polled),
        "stamped_ms": summary(stamped), "delivered": len(set(returned) & set(seen)), "hops": hops,
        "uninterested_inbox_items": others,
    }  # fmt: skip


# -- part 2: messages per store -----------------------------------------------------------

FAN_QUERY = "mesh fan-out benchmark memory"


def part_fanout(nodes: list[MeshNode], keys: list[str], per_level: int) -> dict[str, Any]:
    origin = nodes[0]
    for node, key in zip(nodes, keys):
        remove_beacons(node, key)
    for j in range(1, NODES):
        for k in range(j, NODES):
            nodes[j].rest("POST", "/v1/beacons", keys[j], json={"query": FAN_QUERY, "project": f"fan-{k}"}, expect=201)
    expected_beacons = sum(range(1, NODES))
    wait_until(lambda: origin.peers()["beacons_known"] == expected_beacons, 30.0,
               message=lambda: f"n0 knows {origin.peers()['beacons_known']} beacons")  # fmt: skip
    time.sleep(1.0)

    spacing = 0.1
    window = per_level * spacing + 0.5
    before = counters(nodes)
    time.sleep(window)
    after = counters(nodes)
    idle_control = delta(after, before, "control_frames")
    rows = []
    with httpx.Client(base_url=origin.api_url, headers={"x-hyphae-key": keys[0]}, timeout=10.0,
                      trust_env=False) as http:  # fmt: skip
        for k in range(NODES):
            project = f"fan-{k}"
            before = counters(nodes)
            t0 = time.monotonic()
            ids = []
            for i in range(per_level):
                delay = t0 + i * spacing - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                response = http.post("/v1/cells", json={"content": f"{FAN_QUERY} {k}-{i}", "cell_type": "Fact",
                                                        "project": project})  # fmt: skip
                assert response.status_code == 201, response.text
                ids.append(response.json()["node_id"])

            def arrived() -> bool:
                for j in range(1, k + 1):
                    got = {d["node_id"] for d in inbox_all(nodes[j], keys[j]) if d["project"] == project}
                    if not set(ids) <= got:
                        return False
                return True

            wait_until(arrived, 30.0, interval=0.05, message=f"fan-{k} deliveries")
            remaining = t0 + window - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)  # the same window as the idle measurement: acks land
            after = counters(nodes)
            wrong = sum(
                1 for j in range(k + 1, NODES)
                for d in inbox_all(nodes[j], keys[j]) if d["project"] == project
            )  # fmt: skip
            rows.append({
                "interested": k, "stores": per_level,
                "data_frames_per_store": delta(after, before, "data_frames") / per_level,
                "data_diffs_per_store": delta(after, before, "data_diffs") / per_level,
                "data_bytes_per_store": delta(after, before, "data_bytes") / per_level,
                "control_frames_per_store": delta(after, before, "control_frames") / per_level,
                "control_frames_idle_per_store": idle_control / per_level,
                "uninterested_deliveries": wrong,
            })  # fmt: skip
    return {"window_s": window, "idle_control_frames": idle_control, "rows": rows}


# -- part 3: sustained load ---------------------------------------------------------------

LOAD_QUERY = "sustained mesh load memory"


def interested_in(m: int) -> set[int]:
    """Project load-m interests m nodes."""
    return {(m + 1 + t) % NODES for t in range(m)}


def part_sustained(nodes: list[MeshNode], keys: list[str], rate: float, seconds: float, seed: int,
                   max_inflight: int) -> dict[str, Any]:  # fmt: skip
    import trio

    for j in range(NODES):
        for m in range(NODES):
            if j in interested_in(m):
                nodes[j].rest("POST", "/v1/beacons", keys[j], json={"query": LOAD_QUERY, "project": f"load-{m}"},
                              expect=201)  # fmt: skip
    total_beacons = sum(len(interested_in(m)) for m in range(NODES))
    for j, node in enumerate(nodes):
        mine = sum(1 for m in range(NODES) if j in interested_in(m))
        wait_until(lambda: node.peers()["beacons_known"] == total_beacons - mine, 30.0,
                   message=lambda: f"{node.name} knows {node.peers()['beacons_known']} beacons")  # fmt: skip
    time.sleep(1.0)

    rng = random.Random(seed)
    count = int(rate * seconds)
    plan = [(i % NODES, rng.randrange(NODES)) for i in range(count)]
    expected = [0] * NODES
    for origin, m in plan:
        for j in interested_in(m) - {origin}:
            expected[j] += 1
    idle_began, idle_cpu = time.monotonic(), cpu_seconds(nodes)
    time.sleep(5.0)
    idle_cores = (cpu_seconds(nodes) - idle_cpu) / (time.monotonic() - idle_began)
    before = counters(nodes)
    cpu_before = cpu_seconds(nodes)
    by_role = CpuByRole(nodes)
    self_before = os.times()
    late: list[float] = []
    call_ms: list[float] = []
    failures: list[str] = []

    async def run() -> float:
        # Raw keep-alive connections, idle ones pooled per origin: the generator is not under
        # test, and httpx cost more CPU per store than a daemon's whole REST side.
        idle: list[list[RawConnection]] = [[] for _ in nodes]

        async def connection(origin: int) -> RawConnection:
            if idle[origin]:
                return idle[origin].pop()
            host, port = nodes[origin].api_url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            return RawConnection(stream, f"{host}:{port}", keys[origin], path="/v1/cells")

        slots = trio.Semaphore(max_inflight)

        async def one(i: int, origin: int, m: int) -> None:
            began = trio.current_time()
            body = json.dumps({"content": f"{LOAD_QUERY} {i} from n{origin}", "cell_type": "Fact",
                               "project": f"load-{m}"}).encode()  # fmt: skip
            conn = None
            try:
                with trio.fail_after(30.0):
                    conn = await connection(origin)
                    answer = await conn.post(body)
                if conn.status != 201:
                    failures.append(f"{conn.status} {answer[:200]!r}")
                idle[origin].append(conn)
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError) as exc:
                failures.append(repr(exc))
                if conn is not None:
                    await conn.stream.aclose()
            finally:
                slots.release()
            call_ms.append((trio.current_time() - began) * 1000)

        t0 = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                for i, (origin, m) in enumerate(plan):
                    at = t0 + i / rate
                    await trio.sleep_until(at)
                    await slots.acquire()  # at most max_inflight stores outstanding
                    now = trio.current_time()
                    if now - at > 0.001:
                        late.append((now - at) * 1000)
                    nursery.start_soon(one, i, origin, m)
            return trio.current_time() - t0
        finally:
            for conn in (c for pool in idle for c in pool):
                await conn.stream.aclose()

    wall_began = time.monotonic()
    elapsed = trio.run(run)
    print(f"# sustained: {count} stores in {elapsed:.1f} s; draining", file=sys.stderr)
    drain_began = time.monotonic()

    def counts() -> list[int]:
        return [len(inbox_all(n, k)) for n, k in zip(nodes, keys)]

    got = counts()
    deadline = time.monotonic() + max(60.0, seconds)
    while got != expected and time.monotonic() < deadline:
        time.sleep(1.0)
        got = counts()
    drained = time.monotonic() - drain_began
    after = counters(nodes)
    cpu = cpu_seconds(nodes) - cpu_before
    cpu_roles = by_role.since()
    self_after = os.times()
    generator_cpu = (self_after.user + self_after.system) - (self_before.user + self_before.system)
    lags = []
    for n, k in zip(nodes, keys):
        lags.extend(float(d["received_at"] - d["created_at"]) for d in inbox_all(n, k))
    drops = {n: after[n]["drops"] for n in after}
    return {
        "rate_target": rate, "seconds_target": seconds, "max_inflight": max_inflight, "stores": count, "store_failures": len(failures),
        "failure_samples": failures[:5], "elapsed_s": elapsed, "achieved_rate": (count - len(failures)) / elapsed,
        "scheduled_late_ms": summary(late) if late else None, "late_count": len(late),
        "store_call_ms": summary(call_ms), "expected": expected, "got": got,
        "complete": got == expected, "drain_s": drained, "total_s": time.monotonic() - wall_began,
        "delivery_lag_ms": summary(lags), "deliveries": sum(got),
        "data_frames": delta(after, before, "data_frames"), "data_diffs": delta(after, before, "data_diffs"),
        "resent_diffs": delta(after, before, "resent_diffs"), "repair_diffs": delta(after, before, "repair_diffs"),
        "control_frames": delta(after, before, "control_frames"), "drops": drops,
        "posts": delta(after, before, "posts"), "replies_in_response": delta(after, before, "replies"),
        "data_frames_in_response": delta(after, before, "data_replies"),
        "daemon_cpu_s": cpu, "daemon_cpu_s_by_thread": cpu_roles, "generator_cpu_s": generator_cpu,
        "idle_cores": idle_cores,
    }  # fmt: skip


# -- the report ---------------------------------------------------------------------------


def fmt(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def report(result: dict[str, Any]) -> str:
    out = []
    m = result["machine"]
    out.append(f"Machine: {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}; load average at start "
               f"{', '.join(f'{x:.1f}' for x in m['loadavg'])}, at end {', '.join(f'{x:.1f}' for x in result['loadavg_end'])}.")  # fmt: skip
    out.append(f"Command: `{result['command']}`")
    if "latency" in result:
        lat = result["latency"]
        out.append("")
        out.append(f"## 1. Store -> remote inbox latency ({result['args']['latency_provider']} embedder, "
                   f"{lat['stores']} stores, one every {lat['gap_ms']:g} ms, 1 interested node of 4)")  # fmt: skip
        out.append("")
        out.append("| measure | n | p50 ms | p90 ms | p99 ms | max ms |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        for label, key in (("polled: store returned -> seen in n1's inbox", "polled_ms"),
                           ("stamped: received_at - created_at", "stamped_ms"),
                           ("the store call itself (n0)", "store_call_ms")):  # fmt: skip
            s = lat[key]
            out.append(f"| {label} | {s['n']} | {fmt(s['p50'])} | {fmt(s['p90'])} | {fmt(s['p99'])} | {fmt(s['max'])} |")
        out.append("")
        out.append(f"Delivered {lat['delivered']}/{lat['stores']}; hops {lat['hops']}; items in the uninterested "
                   f"inboxes: {lat['uninterested_inbox_items']}.")  # fmt: skip
    if "fanout" in result:
        fan = result["fanout"]
        out.append("")
        out.append(f"## 2. Messages per store vs interested nodes ({fan['rows'][0]['stores']} stores per row, "
                   f"100 ms apart; counters summed over all 5 nodes)")  # fmt: skip
        out.append("")
        out.append("| interested | data frames / store | data diffs / store | data bytes / store | control frames / store "
                   "| idle control frames / same window / store | target (<= interested + 1) | wrong deliveries |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for row in fan["rows"]:
            ok = "met" if row["data_frames_per_store"] <= row["interested"] + 1 else "MISSED"
            out.append(f"| {row['interested']} | {fmt(row['data_frames_per_store'], 2)} | {fmt(row['data_diffs_per_store'], 2)} "
                       f"| {fmt(row['data_bytes_per_store'], 0)} | {fmt(row['control_frames_per_store'], 2)} "
                       f"| {fmt(row['control_frames_idle_per_store'], 2)} | {ok} | {row['uninterested_deliveries']} |")  # fmt: skip
    for s in result.get("sustained", []):
        out.append("")
        out.append(f"## 3. Sustained load ({result['args']['load_provider']} embedder): target {s['rate_target']:g} "
                   f"stores/s for {s['seconds_target']:g} s, at most {s['max_inflight']} stores outstanding")  # fmt: skip
        out.append("")
        out.append(f"- stores: {s['stores']} ({s['store_failures']} failed) in {fmt(s['elapsed_s'])} s: "
                   f"**{fmt(s['achieved_rate'])} stores/s achieved**")  # fmt: skip
        if s["scheduled_late_ms"]:
            late = s["scheduled_late_ms"]
            out.append(f"- {s['late_count']} stores started late (the generator waited for a free slot or for CPU; "
                       f"p50 {fmt(late['p50'])} ms, max {fmt(late['max'])} ms)")  # fmt: skip
        c = s["store_call_ms"]
        out.append(f"- store call under load: p50 {fmt(c['p50'])} ms, p99 {fmt(c['p99'])} ms, max {fmt(c['max'])} ms")
        lag = s["delivery_lag_ms"]
        out.append(f"- delivery lag (received_at - created_at) over {lag['n']} deliveries: p50 {fmt(lag['p50'])} ms, "
                   f"p99 {fmt(lag['p99'])} ms, max {fmt(lag['max'])} ms")  # fmt: skip
        out.append(f"- completeness: expected per node {s['expected']}, got {s['got']}: "
                   f"**{'complete' if s['complete'] else 'INCOMPLETE'}** (drained {fmt(s['drain_s'])} s after the last store)")  # fmt: skip
        out.append(f"- data frames {s['data_frames']}, data diffs {s['data_diffs']} "
                   f"({fmt(s['data_diffs'] / max(1, s['deliveries']), 3)} per delivery; resent {s.get('resent_diffs', '?')}, "
                   f"in repair replies {s.get('repair_diffs', '?')}), control frames {s['control_frames']}")  # fmt: skip
        if "posts" in s:
            out.append(f"- mesh HTTP requests {s['posts']} ({fmt(s['posts'] / max(1, s['deliveries']), 3)} per delivery); "
                       f"frames answered inside the response to the frame they answer: {s['replies_in_response']}"
                       f" (data frames among them: {s.get('data_frames_in_response', '?')})")  # fmt: skip
        out.append(f"- CPU: the 5 daemons used {fmt(s['daemon_cpu_s'])} CPU-s over {fmt(s['total_s'])} s "
                   f"({fmt(s['daemon_cpu_s'] / s['total_s'], 2)} cores; {fmt(1000 * s['daemon_cpu_s'] / max(1, s['stores']), 1)} "
                   f"CPU-ms per store with its {fmt(s['deliveries'] / max(1, s['stores']), 2)} deliveries); "
                   f"the load generator {fmt(s['generator_cpu_s'])} CPU-s; the idle mesh (gossip, pings, timers) "
                   f"{fmt(s['idle_cores'], 3)} cores")  # fmt: skip
        if "daemon_cpu_s_by_thread" in s:
            roles = sorted(s["daemon_cpu_s_by_thread"].items(), key=lambda kv: -kv[1])
            out.append("- the daemons' CPU-ms per store by thread: " + ", ".join(
                f"{role} {fmt(1000 * seconds / max(1, s['stores']), 2)}" for role, seconds in roles
            ) + f"; the load generator {fmt(1000 * s['generator_cpu_s'] / max(1, s['stores']), 2)}")  # fmt: skip
        out.append(f"- drops: {s['drops']}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", type=int, default=200, help="latency part: stores (default 200)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="latency part: ms between stores (default 20)")
    parser.add_argument("--fan-stores", type=int, default=20, help="messages part: stores per row (default 20)")
    parser.add_argument("--rate", default="200", help="sustained part: stores/s, or several comma-separated, "
                        "each on a fresh mesh (default 200)")
    parser.add_argument("--max-inflight", type=int, default=64,
                        help="sustained part: stores outstanding at most; beyond it the generator waits (default 64)")
    parser.add_argument("--seconds", type=float, default=60.0, help="sustained part: duration (default 60)")
    parser.add_argument("--latency-provider", default="builtin", help="embedder for parts 1-2 (default builtin)")
    parser.add_argument("--load-provider", default="hashed", help="embedder for part 3 (default hashed)")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run (default 1,2,3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs (logs) and print where")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}

    result: dict[str, Any] = {
        "machine": machine(), "args": vars(args) | {"json": str(args.json) if args.json else None},
        "command": "python benchmarks/mesh_bench.py " + " ".join(sys.argv[1:]),
    }  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="hyphae-mesh-bench-"))
    try:
        with Lab(root) as lab:
            if parts & {1, 2}:
                nodes = start_mesh(lab, "lat", args.latency_provider)
                keys = [n.add_agent(f"agent-{n.name}")[0] for n in nodes]
                if 1 in parts:
                    result["latency"] = part_latency(nodes, keys, args.stores, args.gap_ms)
                    print(f"# latency: {result['latency']['polled_ms']}", file=sys.stderr)
                if 2 in parts:
                    result["fanout"] = part_fanout(nodes, keys, args.fan_stores)
                    print(f"# fan-out: {result['fanout']['rows']}", file=sys.stderr)
                for node in nodes:
                    node.stop()
            if 3 in parts:
                result["sustained"] = []
                for index, rate in enumerate(float(r) for r in args.rate.split(",")):
                    nodes = start_mesh(lab, f"load{index}-", args.load_provider)
                    keys = [n.add_agent(f"agent-{n.name}")[0] for n in nodes]
                    print(f"# load pids: { {n.name: n.process.pid for n in nodes} }", file=sys.stderr)
                    run = part_sustained(nodes, keys, rate, args.seconds, args.seed, args.max_inflight)
                    result["sustained"].append(run)
                    print(f"# sustained at {rate:g}/s: {run['achieved_rate']:.1f}/s achieved, complete={run['complete']}",
                          file=sys.stderr)  # fmt: skip
                    for node in nodes:
                        node.stop()
    finally:
        if args.keep:
            print(f"# data dirs and daemon logs kept in {root}", file=sys.stderr)
        else:
            subprocess.run(["rm", "-rf", str(root)], check=False)
    result["loadavg_end"] = os.getloadavg()
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
