"""Where one MCP store and one new-query recall spend their CPU, in milliseconds per call, by stage.

    python benchmarks/profile_call.py [--hyphae-rev HEAD|worktree|COMMIT] [--memories 241] [--hashed]

Runs ``peers/profile_hyphae.py``'s session (SDK client -> ``hyphae mcp`` relay -> daemon, a fresh
data dir, every memory stored then every query recalled once, each phase under ``py-spy record``
of both processes), then splits each process's CPU per call (from ``/proc``) across stages by the
share of on-CPU py-spy samples whose stack passes through that stage's code (samples of a thread
blocked in a wait, which a loaded machine shows as runnable, are dropped first: see ``WAITS``). A sample counts for
the first stage it matches, in the order below, from the innermost frame out; what matches none is
"other". Wall time per call is the client's; wall minus the daemon's and the relay's CPU is time
spent waiting (pipes, the other core, the scheduler of a shared machine).

py-spy costs the sampled processes a little CPU itself, so the absolute figures read a few percent
high; the split is what this is for. Instruction counts of the forward pass alone, which do not
move with the load, come from ``--callgrind`` (valgrind, one lone text, ~1 min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))

import psutil
from profile_hyphae import profile
from servers import Hyphae, HyphaeHashed

# (stage, substrings of a frame "function (path)"): the first stage any frame matches, innermost first.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("embedding: tokenizer", ("tokenizer.py",)),
    ("embedding: forward pass", ("minilm.py", "hashed.py", "numpy/")),
    ("embedding: queue, partner, waking", ("embedding/worker.py", "pairing.py")),
    ("SQLite: writes and commits", ("store/database.py", "store/diff_log.py", "sqlite3")),
    ("SQLite: reads", ("store/cells.py", "store/lexical.py", "store/beacons.py", "store/store.py")),
    ("HNSW index and layers", ("hnswlib", "node/layers.py", "node/index")),
    ("beacons, admission, judges", ("beacon", "judge", "admission")),
    ("node core (service, ingest, recall)", ("node/service.py", "node/ingest.py", "node/recall", "node/writes")),
    ("MCP dispatch, tools, JSON", ("mcp_bridge/dispatch", "mcp_bridge/tools", "mcp_bridge/jsonrpc", "json/")),
    ("local socket and stdio framing", ("mcp_bridge/local.py", "mcp_bridge/stdio.py", "mcp_bridge/relay.py")),
    ("waking trio from threads", ("waking.py", "_wakeup_socketpair.py", "run_sync_soon")),
    ("trio loop and I/O", ("trio/", "selectors")),
]


# Innermost frames of a thread blocked in a wait (a queue's get called from a thread's loop, a
# Condition, an Event, epoll). py-spy leaves out threads it sees sleeping, but on a loaded machine a
# thread just woken is runnable, not running, for a while and is sampled as busy; those samples are
# no CPU, so they are dropped before the shares are taken.
WAITS = ("Condition.wait", "Event.wait", "get_events", "_epoll_wait", "Partner._run", "EmbeddingWorker._run",
         "Database._run", "SimpleQueue.get", "Queue.get")  # fmt: skip


def _waiting(frames: list[str]) -> bool:
    name = frames[-1].split(" (")[0]
    return any(name == wait or name.endswith("." + wait) for wait in WAITS)


def _stage(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, markers in STAGES:
            if any(marker in frame for marker in markers):
                return stage
    return "other"


def stages(path: Path) -> dict[str, float]:
    """Share of on-CPU samples per stage (0..1) in one py-spy raw file."""
    counts: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")[1:]  # the first is the thread
            if frames and not _waiting(frames):
                counts[_stage(frames)] += int(n)
    total = sum(counts.values()) or 1
    return {stage: n / total for stage, n in counts.items()}


def breakdown(result: dict[str, Any], root: Path) -> dict[str, Any]:
    out = {}
    for phase in ("store", "recall"):
        r = result[phase]
        rows: dict[str, dict[str, float]] = {}
        for who in ("daemon", "relay"):
            cpu = r[f"{who}_cpu_ms_per_call"]
            for stage, share in stages(root / f"{phase}-{who}.txt").items():
                rows.setdefault(stage, {"daemon": 0.0, "relay": 0.0})[who] = share * cpu
        cpu_total = r["daemon_cpu_ms_per_call"] + r["relay_cpu_ms_per_call"]
        out[phase] = {"wall_ms": r["wall_ms_per_call"], "cpu_ms": cpu_total,
                      "waiting_ms": max(0.0, r["wall_ms_per_call"] - cpu_total), "stages": rows}  # fmt: skip
    return out


def table(split: dict[str, Any]) -> str:
    names = [s for s, _ in STAGES] + ["other"]
    lines = ["| stage | store: daemon ms | store: relay ms | recall: daemon ms | recall: relay ms |",
             "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name in names:
        cells = [split[p]["stages"].get(name, {}).get(w, 0.0) for p in ("store", "recall") for w in ("daemon", "relay")]
        if any(c >= 0.05 for c in cells):
            lines.append(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    for label, key in (("CPU, both processes", "cpu_ms"), ("wall per call (client)", "wall_ms"),
                       ("waiting (wall - CPU)", "waiting_ms")):  # fmt: skip
        lines.append(f"| **{label}** | {split['store'][key]:.1f} | | {split['recall'][key]:.1f} | |")
    return "\n".join(lines)


def callgrind_forward() -> dict[str, Any]:
    """Instructions of one lone-text embedding (the forward pass alone), under valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {"error": "valgrind not found"}
    counts = []  # one embedding and three: the difference over two is one embedding, start-up excluded
    for runs in (1, 3):
        script = ("import app; from node.embedding import load_embedder; e = load_embedder(); "
                  f"[e.embed(['which database do we use for storage']) for _ in range({runs})]")  # fmt: skip
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}/cg.out",
                                   sys.executable, "-c", script], capture_output=True, text=True, check=False)  # fmt: skip
            total = next((line.split()[-1] for line in done.stderr.splitlines() if "Collected" in line), None)
            counts.append(int(total.replace(",", "")) if total else None)
    if None in counts:
        return {"error": "callgrind gave no count"}
    return {"instructions_per_embedding": (counts[1] - counts[0]) // 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hyphae-peers")
    parser.add_argument("--hyphae-rev", default="HEAD")
    parser.add_argument("--memories", type=int, default=241)
    parser.add_argument("--hashed", action="store_true", help="the hashed embedder: the plumbing alone")
    parser.add_argument("--callgrind", action="store_true", help="also count one embedding's instructions")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    work = args.work.resolve()
    hyphae = (HyphaeHashed if args.hashed else Hyphae)(work, args.hyphae_rev)
    hyphae.install()
    hyphae.use()
    root = work / "profile" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True)
    load_before = psutil.getloadavg()
    result = asyncio.run(profile(hyphae, root, args.memories))
    split = breakdown(result, root)
    report = {"version": hyphae.version(), "load": [load_before, psutil.getloadavg()], "breakdown": split}
    if args.callgrind:
        report["callgrind"] = callgrind_forward()
    (args.json or root / "breakdown.json").write_text(json.dumps(report, indent=1))
    print(f"Hyphae {report['version']}, {args.memories} stores then {result['recall']['calls']} new-query recalls; "
          f"load {report['load'][0][0]:.1f} -> {report['load'][1][0]:.1f}\n")  # fmt: skip
    print(table(split))
    if "callgrind" in report:
        print(f"\ncallgrind: {report['callgrind']}")
    print(f"\nraw samples in {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
