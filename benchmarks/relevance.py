"""Relevance on a labelled team stream: do beacons deliver what their owners would want? Run by hand:

    python benchmarks/relevance.py [--json FILE] [--quick] [--deadline SECONDS]

Data: benchmarks/data/team_stream.json (one fictional team's agent memories over 8 weeks, beacons of
8 developers, judgements by meaning, paraphrased recall questions; see benchmarks/data/TEAM_STREAM.md).

Three parts, each printed as a markdown table (and all of it as JSON with ``--json``):

1. **Mesh delivery, through real nodes as a user would run them.** Two data dirs on loopback:
   ``hyphae init`` each, ``team create`` on the storing node and ``team join TOKEN`` on the
   receiving node, then both daemons ``hyphae up --no-discovery --peer OTHER`` with their own
   127.0.0.1 ports. Every beacon owner gets an agent key on the receiving node (``hyphae agent
   add``) and places their beacons there over REST (``POST /v1/beacons``, default threshold).
   Every author gets an agent key on the storing node, and the memories are stored there by their
   authors over REST (``POST /v1/cells``) in timestamp order. When the receiving node's inboxes have
   stopped growing for 4 s and the storing node's outbox to its peer is empty, each owner's inbox
   is read (``GET /v1/inbox``) and scored against the union of the judgements of that owner's
   beacons: precision, recall, F1 per agent and their macro average. The owner's *own* memories
   are left out on both sides: the judgements never list them, and the product never delivers a
   cell to the agent that stored it (on this two-node set-up the author's agent and the owner's
   agent are different keys, so such items are dropped when scoring). Precision of an empty delivery counts as 0.
2. **Recall questions** on the storing node, which holds every memory: ``POST /v1/recall`` (k=10)
   for each paraphrased question; hit@1, hit@5 and MRR@10 of its one target.
3. **Offline, in-process** with the node's own embedder: the cosine between every beacon query and
   every memory. The curve of macro P/R/F1 of the raw rule ``cos >= t`` for t = 0.20..0.45 (per
   beacon and per agent), the same at the mesh's rule ``cos >= t - 0.05 * E0`` (E0 = salience x
   type weight, the README's energy model), per-beacon average precision (MAP) overall and by beacon
   kind, how many deliberate near-misses clear the default threshold, exact-cosine hit@k for the
   questions, and a cross-check that the offline rule at today's defaults predicts the mesh's inboxes.

Bounded: every wait has a deadline and the whole run stops at ``--deadline`` seconds (default 600);
daemons are stopped (SIGTERM, then SIGKILL) whatever happens, and the data dirs live in a temporary
directory that is removed at the end. Typical run on a 2-core machine: 2-4 minutes (``--quick``:
about 1 minute). No network but 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

import relevance_judge  # beside this file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The one place that names the product's modules (the package layout is moving).
CLI_MODULE = "app.cli"  # run as ``python -m CLI_MODULE``, the same entry point as the ``hyphae`` script
EMBEDDING_MODULE = "node.embedding"  # provides load_embedder(), the daemon's built-in embedder
THREADS_MODULE = "app"  # imported first, as the daemon does (one BLAS thread per operation)

DATA = Path(__file__).resolve().parent / "data" / "team_stream.json"
DEFAULT_THRESHOLD = 0.28  # [beacons] default_threshold
SLACK = 0.05  # [energy] match_slack
ROUTE_MARGIN = 0.04  # [energy] route_margin: routing reaches this much below a beacon's threshold
JUDGE_DEFAULTS = (4.0, 3.0)  # [beacons] lexical_weight, z_floor: the calibrated judge's defaults
TYPE_WEIGHT = {  # the energy model's w(type), README "The energy model"
    "Decision": 1.0, "Constraint": 1.0, "Risk": 0.9, "Lesson": 0.8, "Pattern": 0.7,
    "Fact": 0.6, "Preference": 0.6, "Task": 0.5, "Context": 0.4,
}  # fmt: skip
CURVE = [round(0.20 + 0.01 * i, 2) for i in range(26)]  # 0.20 .. 0.45
QUICK_MEMORIES = 150  # --quick: the first 150 memories (about three weeks), every beacon, their questions
START_DEADLINE = 90.0
QUIET_SECONDS = 4.0  # the receiving node's inboxes unchanged this long = the mesh is quiet


class Deadline(Exception):
    pass


class Clock:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.end = self.start + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise Deadline(f"run deadline reached while {what}")

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


# -- the data -------------------------------------------------------------------------------


def load(quick: bool) -> dict[str, Any]:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    memories = sorted(data["memories"], key=lambda m: m["timestamp_ms"])
    if quick:
        memories = memories[:QUICK_MEMORIES]
    kept = {m["id"] for m in memories}
    author = {m["id"]: m["author"] for m in memories}
    beacons = data["beacons"]
    judged = {b["id"]: sorted(set(data["judgements"][b["id"]]) & kept) for b in beacons}
    for b in beacons:  # the data's own promise; checked, not assumed
        assert all(author[i] != b["owner"] for i in judged[b["id"]]), f"{b['id']} lists its owner's memory"
    return {
        "memories": memories,
        "beacons": beacons,
        "judged": judged,
        "near_misses": {b["id"]: sorted(set(data["near_misses"][b["id"]]) & kept) for b in beacons},
        "questions": [q for q in data["questions"] if q["target"] in kept],
        "project": data.get("project"),
    }


def owners(data: dict[str, Any]) -> dict[str, list[dict]]:
    by_owner: dict[str, list[dict]] = {}
    for beacon in data["beacons"]:
        by_owner.setdefault(beacon["owner"], []).append(beacon)
    return by_owner


def prf(delivered: set[str], relevant: set[str]) -> dict[str, float]:
    hit = len(delivered & relevant)
    p = hit / len(delivered) if delivered else 0.0
    r = hit / len(relevant) if relevant else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f, "delivered": len(delivered), "relevant": len(relevant), "hits": hit}


def macro(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k in ("precision", "recall", "f1")}


def agent_relevant(data: dict[str, Any]) -> dict[str, set[str]]:
    return {o: set().union(*(data["judged"][b["id"]] for b in bs)) for o, bs in owners(data).items()}


# -- real nodes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A data dir and its ``hyphae up`` daemon, driven through the CLI and REST."""

    def __init__(self, name: str, root: Path, processes: list[subprocess.Popen]) -> None:
        self.name = name
        self.home = root / name
        self.log = root / f"{name}-daemon.log"
        self.api = f"127.0.0.1:{free_port()}"
        self.mesh = f"127.0.0.1:{free_port()}"
        self.processes = processes
        self.process: subprocess.Popen | None = None
        self.http: httpx.Client | None = None

    def cli(self, *args: str, timeout: float = 60.0) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("HYPHAE_API_KEY", "HYPHAE_HOME")}
        result = subprocess.run(
            [sys.executable, "-m", CLI_MODULE, "--home", str(self.home), *args],
            env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"hyphae {' '.join(args[:2])} on {self.name} exited {result.returncode}:\n{result.stderr}")
        return result.stdout

    def up(self, peer: str) -> None:
        args = ["up", "--api", self.api, "--mesh", self.mesh, "--no-discovery", "--peer", peer]
        env = {k: v for k, v in os.environ.items() if k not in ("HYPHAE_API_KEY", "HYPHAE_HOME")}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", CLI_MODULE, "--home", str(self.home), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env={**env, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        self.processes.append(self.process)

    def wait_serving(self, clock: Clock) -> None:
        deadline = time.monotonic() + min(START_DEADLINE, max(1.0, clock.left()))
        url = f"http://{self.api}/healthz"
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name}'s daemon exited {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url, timeout=2.0, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise Deadline(f"{self.name} not serving on {self.api}\n{self.log_tail()}")
            time.sleep(0.1)
        self.http = httpx.Client(base_url=f"http://{self.api}", timeout=60.0, trust_env=False)

    def rest(self, method: str, path: str, key: str | None = None, *, admin: bool = False, **kwargs: Any) -> Any:
        headers = {}
        if key is not None:
            headers["x-hyphae-key"] = key
        if admin:
            headers["x-hyphae-admin"] = (self.home / "admin.token").read_text().strip()
        assert self.http is not None
        response = self.http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{self.name}: {method} {path}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None


def stop(processes: list[subprocess.Popen], grace: float = 5.0) -> None:
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)


def agent_key(node: Node, name: str) -> str:
    return node.cli("agent", "add", name).strip().splitlines()[-1].strip()


def read_inbox(node: Node, key: str) -> list[dict[str, Any]]:
    """Every item of one agent's inbox (pages of 500; ``since`` steps back 1 ms to never skip ties)."""
    seen: dict[int, dict[str, Any]] = {}
    since = 0
    while True:
        page = node.rest("GET", "/v1/inbox", key, params={"since": since, "limit": 500})["diffs"]
        fresh = [d for d in page if d["inbox_id"] not in seen]
        for item in fresh:
            seen[item["inbox_id"]] = item
        if len(page) < 500 or not fresh:
            return list(seen.values())
        since = page[-1]["received_at"] - 1


def run_mesh(data: dict[str, Any], clock: Clock) -> dict[str, Any]:
    processes: list[subprocess.Popen] = []
    root = Path(tempfile.mkdtemp(prefix="hyphae-relevance-"))
    nodes: list[Node] = []
    timings: dict[str, float] = {}
    try:
        storing, receiving = Node("storing", root, processes), Node("receiving", root, processes)
        nodes = [storing, receiving]
        began = time.monotonic()
        for node in nodes:
            node.cli("init")
        token = storing.cli("team", "create").strip().splitlines()[-1].strip()
        receiving.cli("team", "join", token)
        storing.up(receiving.mesh)
        receiving.up(storing.mesh)
        for node in nodes:
            node.wait_serving(clock)
        timings["set_up_s"] = time.monotonic() - began
        log(f"two daemons up in {timings['set_up_s']:.1f} s (storing {storing.api}, receiving {receiving.api})")

        began = time.monotonic()
        by_owner = owners(data)
        owner_key = {o: agent_key(receiving, o) for o in by_owner}
        authors = sorted({m["author"] for m in data["memories"]})
        author_key = {a: agent_key(storing, a) for a in authors}
        beacon_of: dict[str, str] = {}  # node's beacon id -> data's beacon id
        for beacon in data["beacons"]:
            placed = receiving.rest("POST", "/v1/beacons", owner_key[beacon["owner"]], json={"query": beacon["query"]})
            beacon_of[placed["beacon_id"]] = beacon["id"]
        timings["agents_and_beacons_s"] = time.monotonic() - began

        # The storing node should know the receiving node's beacons before the first store.
        wanted = len(data["beacons"])
        known = 0
        end = time.monotonic() + 60
        while time.monotonic() < end:
            clock.check("waiting for the beacons to reach the storing node")
            known = storing.rest("GET", "/v1/admin/peers", admin=True).get("beacons_known", 0)
            if known >= wanted:
                break
            time.sleep(0.2)
        log(f"storing node knows {known} of {wanted} remote beacons")

        began = time.monotonic()
        stream_of: dict[str, str] = {}  # node id -> memory id
        for i, memory in enumerate(data["memories"]):
            clock.check("storing memories")
            body = {
                "content": memory["content"], "cell_type": memory["cell_type"], "salience": memory["salience"],
                "project": data["project"], "idempotency_key": memory["id"],
                "metadata": {"stream_id": memory["id"], "timestamp_ms": memory["timestamp_ms"]},
            }  # fmt: skip
            stored = storing.rest("POST", "/v1/cells", author_key[memory["author"]], json=body)
            stream_of[stored["node_id"]] = memory["id"]
            if (i + 1) % 100 == 0:
                log(f"stored {i + 1}/{len(data['memories'])}")
        timings["store_s"] = time.monotonic() - began

        began = time.monotonic()
        last, still_since = -1, time.monotonic()
        while True:
            clock.check("waiting for the mesh to go quiet")
            count = sum(len(read_inbox(receiving, k)) for k in owner_key.values())
            peers = storing.rest("GET", "/v1/admin/peers", admin=True).get("peers", [])
            busy = any(p.get("queue_depth") or p.get("inflight_batches") for p in peers)
            if count != last or busy:
                last, still_since = count, time.monotonic()
            elif time.monotonic() - still_since >= QUIET_SECONDS:
                break
            time.sleep(0.5)
        timings["quiet_wait_s"] = time.monotonic() - began
        log(f"mesh quiet: {last} inbox items after {timings['quiet_wait_s']:.1f} s")

        author = {m["id"]: m["author"] for m in data["memories"]}
        relevant = agent_relevant(data)
        per_agent, delivered_ids, own_dropped, unknown = {}, {}, 0, 0
        for owner, key in owner_key.items():
            got = set()
            for item in read_inbox(receiving, key):
                memory_id = (item.get("metadata") or {}).get("stream_id") or stream_of.get(item["node_id"])
                if memory_id is None:
                    unknown += 1
                    continue
                if author[memory_id] == owner:  # one developer's own memory: the product skips its author
                    own_dropped += 1
                    continue
                got.add(memory_id)
            delivered_ids[owner] = sorted(got)
            per_agent[owner] = {"beacons": len(by_owner[owner]), **prf(got, relevant[owner])}

        began = time.monotonic()
        reader = author_key[authors[0]]
        ranks = []
        for question in data["questions"]:
            clock.check("asking the recall questions")
            found = storing.rest("POST", "/v1/recall", reader, json={"query": question["question"], "k": 10})["results"]
            ranked = [stream_of.get(r["node_id"]) for r in found]
            ranks.append(ranked.index(question["target"]) + 1 if question["target"] in ranked else None)
        timings["recall_s"] = time.monotonic() - began
        return {
            "per_agent": per_agent,
            "macro": macro(list(per_agent.values())),
            "delivered": delivered_ids,
            "own_items_dropped": own_dropped,
            "unmapped_items": unknown,
            "recall": rank_metrics(ranks, data["questions"]),
            "timings": timings,
        }
    except BaseException:
        for node in nodes:
            tail = node.log_tail(15)
            if tail:
                log(f"{node.name} daemon log tail:\n{tail}")
        raise
    finally:
        for node in nodes:
            node.close()
        stop(processes)
        shutil.rmtree(root, ignore_errors=True)


def rank_metrics(ranks: list[int | None], questions: list[dict]) -> dict[str, Any]:
    n = len(ranks) or 1
    return {
        "questions": len(ranks),
        "hit@1": sum(r == 1 for r in ranks) / n,
        "hit@5": sum(r is not None and r <= 5 for r in ranks) / n,
        "mrr@10": sum(1 / r for r in ranks if r is not None) / n,
        "missed_at_5": [q["id"] for q, r in zip(questions, ranks) if r is None or r > 5],
    }


# -- offline --------------------------------------------------------------------------------


def average_precision(scores: np.ndarray, relevant: np.ndarray) -> float:
    order = np.argsort(-scores, kind="stable")
    hits = relevant[order]
    if not hits.any():
        return 0.0
    precision_at = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(precision_at[hits].sum() / hits.sum())


def run_offline(data: dict[str, Any]) -> dict[str, Any]:
    importlib.import_module(THREADS_MODULE)
    embedder = importlib.import_module(EMBEDDING_MODULE).load_embedder()
    memories, beacons = data["memories"], data["beacons"]
    ids = [m["id"] for m in memories]
    index = {m: i for i, m in enumerate(ids)}
    began = time.monotonic()
    memory_vectors = embedder.embed([m["content"] for m in memories])
    beacon_vectors = embedder.embed([b["query"] for b in beacons])
    cos = beacon_vectors @ memory_vectors.T  # (beacons, memories)
    embed_s = time.monotonic() - began
    e0 = np.array([min(1.0, m["salience"] * TYPE_WEIGHT[m["cell_type"]]) for m in memories])
    author = np.array([m["author"] for m in memories])

    relevant = np.zeros(cos.shape, dtype=bool)
    eligible = np.ones(cos.shape, dtype=bool)  # a beacon never sees its owner's own memories
    for b, beacon in enumerate(beacons):
        relevant[b, [index[i] for i in data["judged"][beacon["id"]]]] = True
        eligible[b] = author != beacon["owner"]
    by_owner = owners(data)
    rows_of = {o: [beacons.index(b) for b in bs] for o, bs in by_owner.items()}
    agent_rel = agent_relevant(data)

    def match(threshold: float, slack: bool) -> np.ndarray:
        bar = threshold - SLACK * e0[None, :] if slack else np.full(cos.shape, threshold)
        return (cos >= bar) & eligible

    def score(matched: np.ndarray) -> dict[str, Any]:
        per_beacon = [prf({ids[j] for j in np.flatnonzero(matched[b])}, set(data["judged"][beacon["id"]]))
                      for b, beacon in enumerate(beacons)]  # fmt: skip
        per_agent = {o: prf({ids[j] for j in np.flatnonzero(matched[rows].any(axis=0))}, agent_rel[o])
                     for o, rows in rows_of.items()}  # fmt: skip
        return {"beacon_macro": macro(per_beacon), "agent_macro": macro(list(per_agent.values())),
                "per_beacon": per_beacon, "per_agent": per_agent}  # fmt: skip

    curve = []
    for t in CURVE:
        plain, slack = score(match(t, False)), score(match(t, True))
        curve.append({"threshold": t, "plain": {k: plain[k] for k in ("beacon_macro", "agent_macro")},
                      "with_slack": {k: slack[k] for k in ("beacon_macro", "agent_macro")}})  # fmt: skip
    today = score(match(DEFAULT_THRESHOLD, True))

    aps = []
    for b, beacon in enumerate(beacons):
        mask = eligible[b]
        aps.append(average_precision(cos[b, mask], relevant[b, mask]))
    kinds = sorted({b["kind"] for b in beacons})
    by_kind = {}
    for kind in kinds:
        rows = [b for b, beacon in enumerate(beacons) if beacon["kind"] == kind]
        by_kind[kind] = {
            "beacons": len(rows),
            "map": float(np.mean([aps[b] for b in rows])),
            "today": macro([today["per_beacon"][b] for b in rows]),
        }

    near_total = near_caught = 0
    for b, beacon in enumerate(beacons):
        for memory_id in data["near_misses"][beacon["id"]]:
            j = index[memory_id]
            near_total += 1
            near_caught += bool(cos[b, j] >= DEFAULT_THRESHOLD - SLACK * e0[j])
    positive = cos[relevant & eligible]
    negative = cos[~relevant & eligible]

    questions = data["questions"]
    asked = embedder.embed([q["question"] for q in questions]) @ memory_vectors.T
    ranks = []
    for q, row in zip(questions, asked):
        order = [ids[j] for j in np.argsort(-row)[:10]]
        ranks.append(order.index(q["target"]) + 1 if q["target"] in order else None)

    per_beacon_table = [
        {"beacon": beacon["id"], "slug": beacon["slug"], "owner": beacon["owner"], "kind": beacon["kind"],
         "query": beacon["query"], "ap": aps[b], **today["per_beacon"][b]}
        for b, beacon in enumerate(beacons)
    ]  # fmt: skip
    return {
        "space": embedder.space,
        "embed_s": embed_s,
        "curve": curve,
        "today": {"beacon_macro": today["beacon_macro"], "agent_macro": today["agent_macro"],
                  "per_agent": today["per_agent"]},  # fmt: skip
        "map": float(np.mean(aps)),
        "by_kind": by_kind,
        "per_beacon": per_beacon_table,
        "near_misses": {"judged": near_total, "caught_today": near_caught},
        "cosine": {
            "relevant_median": float(np.median(positive)), "relevant_p10": float(np.percentile(positive, 10)),
            "not_relevant_median": float(np.median(negative)), "not_relevant_p99": float(np.percentile(negative, 99)),
        },  # fmt: skip
        "recall_exact": rank_metrics(ranks, questions),
        "judge": relevance_judge.replay(data, memory_vectors, beacon_vectors, prf, macro, JUDGE_DEFAULTS),
    }


# -- report ---------------------------------------------------------------------------------


def f2(x: float) -> str:
    return f"{x:.2f}"


def report(result: dict[str, Any]) -> str:
    out = []
    s = result["dataset"]
    out.append(f"Data: {s['memories']} memories, {s['beacons']} beacons of {s['owners']} owners, "
               f"{s['judged_pairs']} relevant (beacon, memory) pairs, {s['questions']} questions"
               f"{' (--quick subset)' if result['args']['quick'] else ''}.")  # fmt: skip
    mesh = result.get("mesh")
    if mesh:
        out.append("\n### Inbox delivery through two real nodes (defaults: threshold 0.28, route margin 0.04, calibrated judge)\n")
        out.append("| agent | beacons | relevant | delivered | hits | P | R | F1 |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
        for owner, r in sorted(mesh["per_agent"].items()):
            out.append(f"| {owner} | {r['beacons']} | {r['relevant']} | {r['delivered']} | {r['hits']} "
                       f"| {f2(r['precision'])} | {f2(r['recall'])} | {f2(r['f1'])} |")  # fmt: skip
        m = mesh["macro"]
        out.append(f"| **macro** | | | | | **{f2(m['precision'])}** | **{f2(m['recall'])}** | **{f2(m['f1'])}** |")
        out.append(f"\nOwn memories dropped from inboxes (different keys on two nodes): {mesh['own_items_dropped']}; "
                   f"the offline replay of the judge agrees with the mesh on {result['agreement']['same']}/{result['agreement']['agents']} inboxes "
                   f"({result['agreement']['differences']} items differ).")  # fmt: skip
        rec = mesh["recall"]
        out.append("\n### Recall questions (`POST /v1/recall`, k=10, storing node)\n")
        out.append("| questions | hit@1 | hit@5 | MRR@10 |\n| --- | --- | --- | --- |")
        out.append(f"| {rec['questions']} | {f2(rec['hit@1'])} | {f2(rec['hit@5'])} | {f2(rec['mrr@10'])} |")
    off = result["offline"]
    ex = off["recall_exact"]
    out.append(f"\nExact cosine, in-process: hit@1 {f2(ex['hit@1'])}, hit@5 {f2(ex['hit@5'])}, MRR@10 {f2(ex['mrr@10'])}.")
    out.append("\n### Offline: the cosine rule at thresholds 0.20..0.45 (macro over agents, and over beacons)\n")
    out.append("| t | agents P | agents R | agents F1 | beacons P | beacons R | beacons F1 | agents F1 with slack |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for row in off["curve"]:
        a, b, s2 = row["plain"]["agent_macro"], row["plain"]["beacon_macro"], row["with_slack"]["agent_macro"]
        mark = " (today)" if abs(row["threshold"] - DEFAULT_THRESHOLD) < 1e-9 else ""
        out.append(f"| {row['threshold']:.2f}{mark} | {f2(a['precision'])} | {f2(a['recall'])} | {f2(a['f1'])} "
                   f"| {f2(b['precision'])} | {f2(b['recall'])} | {f2(b['f1'])} | {f2(s2['f1'])} |")  # fmt: skip
    out.append(f"\nMAP over {len(off['per_beacon'])} beacons (owner's own memories excluded from the ranking): "
               f"**{off['map']:.3f}**. Near-misses caught at today's rule: {off['near_misses']['caught_today']}"
               f"/{off['near_misses']['judged']}. Cosine of relevant pairs: median {f2(off['cosine']['relevant_median'])}, "
               f"p10 {f2(off['cosine']['relevant_p10'])}; of the rest: median {f2(off['cosine']['not_relevant_median'])}, "
               f"p99 {f2(off['cosine']['not_relevant_p99'])}.")  # fmt: skip
    out.append("\n| beacon kind | beacons | MAP | P today | R today | F1 today |\n| --- | --- | --- | --- | --- | --- |")
    for kind, r in off["by_kind"].items():
        t = r["today"]
        out.append(f"| {kind} | {r['beacons']} | {r['map']:.3f} | {f2(t['precision'])} | {f2(t['recall'])} | {f2(t['f1'])} |")
    out.append("\n| beacon | owner | kind | query | AP | relevant | delivered today | P | R |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for r in off["per_beacon"]:
        out.append(f"| {r['beacon']} | {r['owner']} | {r['kind']} | {r['query']} | {r['ap']:.2f} | {r['relevant']} "
                   f"| {r['delivered']} | {f2(r['precision'])} | {f2(r['recall'])} |")  # fmt: skip
    out.extend(report_judge(off["judge"]))
    out.append(f"\nRun time {result['run_seconds']:.0f} s on {result['machine']['nproc']} cores.")
    return "\n".join(out)


def report_judge(judge: dict[str, Any]) -> list[str]:
    out = ["\n### Offline: the admission judge replayed as the receiving node runs it (macro over agents)\n"]
    d, r = judge["defaults"], judge["routing_agent_macro"]
    m = d["macro"]
    out.append(f"Routing alone (cosine >= 0.28 - 0.05 x E0 - {ROUTE_MARGIN}): P {f2(r['precision'])}, R {f2(r['recall'])}, "
               f"F1 {f2(r['f1'])}; {judge['routed_memories']} memories reach the node. At the judge's defaults "
               f"(lexical weight {d['lexical_weight']:g}, z floor {d['z_floor']:g}): **P {f2(m['precision'])}, "
               f"R {f2(m['recall'])}, F1 {f2(m['f1'])}**.")  # fmt: skip
    out.append(f"The judge's own CPU: {judge['judge_cpu_us_per_pair']:.0f} µs per routed (beacon, cell) pair "
               f"({judge['judged_pairs']} pairs, one thread; routing and the embedding are not in it).")  # fmt: skip
    lo = judge["leave_one_agent_out"]["macro"]
    out.append(f"Leave one agent out (constants chosen on the other seven): P {f2(lo['precision'])}, "
               f"R {f2(lo['recall'])}, F1 {f2(lo['f1'])}.")  # fmt: skip
    weights = sorted({row["lexical_weight"] for row in judge["curve"]})
    out.append("\n| z floor | " + " | ".join(f"w={w:g} P / R / F1" for w in weights) + " |")
    out.append("| --- |" + " --- |" * len(weights))
    for z in sorted({row["z_floor"] for row in judge["curve"]}):
        cells = []
        for w in weights:
            row = next(x for x in judge["curve"] if x["lexical_weight"] == w and x["z_floor"] == z)
            cells.append(f"{f2(row['precision'])} / {f2(row['recall'])} / {f2(row['f1'])}")
        out.append(f"| {z:.2f} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the full result here")
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_MEMORIES} memories only")
    parser.add_argument("--offline-only", action="store_true", help="skip the nodes (part 3 only)")
    parser.add_argument("--deadline", type=float, default=600.0, help="stop the whole run after this many seconds")
    args = parser.parse_args()
    clock = Clock(args.deadline)
    data = load(args.quick)
    result: dict[str, Any] = {
        "args": {"quick": args.quick, "offline_only": args.offline_only, "deadline": args.deadline},
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "dataset": {
            "memories": len(data["memories"]), "beacons": len(data["beacons"]), "owners": len(owners(data)),
            "judged_pairs": sum(len(v) for v in data["judged"].values()), "questions": len(data["questions"]),
        },  # fmt: skip
    }
    result["offline"] = run_offline(data)
    log(f"offline part done at {clock.elapsed():.0f} s")
    if not args.offline_only:
        result["mesh"] = run_mesh(data, clock)
        predicted = result["offline"]["judge"]["predicted"]
        diffs = {o: sorted(set(predicted[o]) ^ set(result["mesh"]["delivered"][o])) for o in predicted}
        result["agreement"] = {
            "agents": len(diffs), "same": sum(not d for d in diffs.values()),
            "differences": sum(len(d) for d in diffs.values()), "differing_items": diffs,
        }  # fmt: skip
    result["run_seconds"] = clock.elapsed()
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
