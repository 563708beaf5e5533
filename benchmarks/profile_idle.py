"""An idle node's footprint with a peer connected: RSS and CPU of a daemon doing nothing.

    python benchmarks/profile_idle.py [--seconds 60] [--provider builtin]

Two daemons on 127.0.0.1 in one team (``tests/e2e_mesh/cluster.py``, the way a user makes one),
the built-in MiniLM embedder loaded; one agent stores one memory on node A and recalls it (so the
model has run once, as on any node in use), then both sit idle with their mesh link up. Reports,
for node A: RSS and USS (private pages) after the settle, and CPU % over ``--seconds`` of idling
(user + system from ``/proc``; 100 % is one core).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil

from tests.e2e_mesh.cluster import Lab


def measure(root: Path, seconds: float, provider: str) -> dict[str, object]:
    with Lab(root) as lab:
        a, b = lab.team(["a", "b"], provider=provider, via_cli=True)
        lab.start_mesh([a, b])
        key, _ = a.add_agent("idle-check")
        a.rest("POST", "/v1/cells", key, json={"content": "the idle check stores one memory", "cell_type": "Fact"})
        a.rest("POST", "/v1/recall", key, json={"query": "idle check"})
        daemon = psutil.Process(a.process.pid)
        time.sleep(10)  # first-minute work (index save, peer exchange) settles
        memory = daemon.memory_full_info()
        cpu0, began = daemon.cpu_times(), time.monotonic()
        time.sleep(seconds)
        cpu1, elapsed = daemon.cpu_times(), time.monotonic() - began
        peers = a.alive_peers()
        return {
            "rss_mb": round(memory.rss / 1e6, 1),
            "uss_mb": round(memory.uss / 1e6, 1),
            "idle_cpu_percent": round(100 * ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / elapsed, 3),
            "seconds": round(elapsed, 1),
            "peers_connected": len(peers),
            "threads": daemon.num_threads(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--provider", default="builtin")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hyphae-idle-") as root:
        result = measure(Path(root), args.seconds, args.provider)
    result["loadavg"] = psutil.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
