"""Where a Hyphae store and recall over stdio spend their time: CPU per call and py-spy samples.

    python benchmarks/peers/profile_hyphae.py [--work DIR] [--hyphae-rev HEAD] [--memories 241]

The same path as the peers benchmark (SDK client -> ``hyphae mcp`` relay -> daemon, built-in
MiniLM), on a fresh data dir: the stores, then the searches, each phase under ``py-spy record``
of the daemon and of the relay (``--idle`` off, so only on-CPU samples count). Reports, per
phase: wall time per call from the client, CPU per call of the daemon and of the relay (from
``/proc``), and the functions holding the most samples (self and inclusive, this repository's
code and its libraries), so the hot path is visible without opening a flame graph.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import _session_start  # noqa: E402
from servers import Hyphae, HyphaeHashed  # noqa: E402
from workload import load_workload  # noqa: E402


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _record(pid: int, out: Path) -> subprocess.Popen | None:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return None
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--rate", "200", "--threads", "--format", "raw",
                             "--output", str(out), "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _stop(recorder: subprocess.Popen | None) -> None:
    if recorder is not None and recorder.poll() is None:
        recorder.send_signal(2)  # SIGINT: py-spy writes its output and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            recorder.wait(30)


def _short(frame: str) -> str:
    """``function (path:line)`` -> ``function (path)`` with the path cut to its package."""
    name, _, where = frame.partition(" (")
    path = where.split(":")[0]
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        parts = Path(path).parts
        path = "/".join(parts[-2:])
    return f"{name} ({path})"


def summarise(path: Path, top: int = 12) -> dict[str, Any]:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {"samples": 0}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [_short(f) for f in stack.split(";")[1:]]  # first is the thread
        if not frames:
            continue
        total += n
        self_time[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    pick = lambda c: [(f, round(100 * n / total, 1)) for f, n in c.most_common(top)]  # noqa: E731
    interesting = Counter({f: n for f, n in inclusive.items()
                           if any(k in f for k in ("node/", "mcp_bridge/", "mesh/", "embedding", "hnswlib",
                                                   "sqlite", "hypercorn", "h11", "httpx", "json"))})  # fmt: skip
    return {"samples": total, "self": pick(self_time), "inclusive": pick(interesting)}


async def profile(hyphae: Hyphae, root: Path, memories: int) -> dict[str, Any]:
    workload = load_workload()
    items = workload.memories[:memories]
    store = hyphae.new_store(root)
    out: dict[str, Any] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            client, out["startup_s"], spawned = await _session_start(stack, hyphae, store)
            daemon = hyphae.extra_pids(store)[0]
            relay = spawned[0]
            await hyphae.store(client, "warm-up: the model and the index are loaded", "fact", "w")
            await hyphae.search(client, "warm-up query", 10)
            for phase in ("store", "recall"):
                recorders = {who: _record(pid, root / f"{phase}-{who}.txt") for who, pid in
                             (("daemon", daemon), ("relay", relay))}  # fmt: skip
                await asyncio.sleep(1.0)  # py-spy attaches
                cpu0 = {"daemon": _cpu(daemon), "relay": _cpu(relay)}
                began = time.perf_counter()
                if phase == "store":
                    for i, memory in enumerate(items):
                        await hyphae.store(client, memory.text, memory.type, f"m{i}")
                    calls = len(items)
                else:
                    for query in workload.queries:
                        await hyphae.search(client, query.text, 10)
                    calls = len(workload.queries)
                wall = time.perf_counter() - began
                cpu = {who: (_cpu(pid) - cpu0[who]) / calls * 1e3 for who, pid in (("daemon", daemon), ("relay", relay))}
                for recorder in recorders.values():
                    _stop(recorder)
                out[phase] = {
                    "calls": calls, "wall_ms_per_call": wall / calls * 1e3,
                    "daemon_cpu_ms_per_call": cpu["daemon"], "relay_cpu_ms_per_call": cpu["relay"],
                    "daemon_profile": summarise(root / f"{phase}-daemon.txt"),
                    "relay_profile": summarise(root / f"{phase}-relay.txt"),
                }  # fmt: skip
    finally:
        hyphae.stop(store)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hyphae-peers")
    parser.add_argument("--hyphae-rev", default="HEAD")
    parser.add_argument("--memories", type=int, default=241)
    parser.add_argument("--hashed", action="store_true", help="the hashed embedder instead of MiniLM: the plumbing alone")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = args.work.resolve()
    hyphae = (HyphaeHashed if args.hashed else Hyphae)(work, args.hyphae_rev)
    hyphae.install()
    hyphae.use()
    root = work / "profile" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True)
    result = asyncio.run(profile(hyphae, root, args.memories))
    result["loadavg"] = psutil.getloadavg()
    result["version"] = hyphae.version()
    text = json.dumps(result, indent=1)
    (args.json or root / "profile.json").write_text(text)
    for phase in ("store", "recall"):
        r = result[phase]
        print(f"\n## {phase}: {r['calls']} calls, {r['wall_ms_per_call']:.1f} ms wall per call, daemon CPU "
              f"{r['daemon_cpu_ms_per_call']:.1f} ms, relay CPU {r['relay_cpu_ms_per_call']:.1f} ms per call")  # fmt: skip
        for who in ("daemon", "relay"):
            p = r[f"{who}_profile"]
            print(f"\n{who}: {p['samples']} on-CPU samples")
            print("  self:      " + "\n             ".join(f"{share:5.1f}%  {f}" for f, share in p.get("self", [])))
            print("  inclusive: " + "\n             ".join(f"{share:5.1f}%  {f}" for f, share in p.get("inclusive", [])))
    print(f"\nload average {result['loadavg']}; raw samples and JSON in {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
