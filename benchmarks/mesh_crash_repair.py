"""How long a crashed node takes to get back what was stored for it while it was down, on
the virtual network (``mesh.testing``), with frames lost. Run by hand:

    python benchmarks/mesh_crash_repair.py [loss]        # loss: fraction of frames lost, default 0.1

Five engines (fast crypto); n2 places a beacon, then crashes; four origins store six cells
it wants, 100 ms apart; n2 restarts on a new address after ``delay`` ms (0 to 15 s, so the
origins have declared it dead or not yet), and the script measures the virtual time from the
restart until n2 holds all six, or reports it as not converged after 120 s. Frames are lost
only after the crash (the mesh forms on a clean network). Each delay runs 12 seeds; the
summary gives median, p90 and maximum over all runs. Default timers (repair every 30 s).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mesh.engine import MeshEngine  # noqa: E402
from mesh.events import BeaconPlaced, CellStored, PeerDiscovered  # noqa: E402
from mesh.team import Team  # noqa: E402
from mesh.testing import LinkConditions, VirtualNetwork, make_engine  # noqa: E402
from tests.mesh.test_engine import ENERGY, beacon, cell, near, unit  # noqa: E402

DELAYS_MS = (0, 500, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10_000, 15_000)
SEEDS = 12
DEADLINE_MS = 120_000
TEAM = Team.create()


def one_run(delay_ms: int, seed: int, loss: float) -> float | None:
    """Seconds from n2's restart until it holds every cell stored for it, or None."""
    net = VirtualNetwork(seed=seed, report_send_failures=True, send_failure_after_ms=5,
                         link=LinkConditions(latency_ms=(5, 200)))  # fmt: skip
    names = ["n0", "n1", "n2", "n3", "n4"]
    for name in names:
        net.add(make_engine(name, TEAM, ENERGY, seed=seed, fast=True))
    net.start()
    for host in net.hosts.values():
        host.engine.outbox.confirms_delivery = True  # as the HTTP runtime: resends wait for the transport
    for name in names[1:]:
        net.inject(name, PeerDiscovered("n0"))
    topic = unit(7)
    net.inject("n2", BeaconPlaced(beacon(topic)))
    net.run_for(10_000)
    old = net.hosts["n2"].engine
    net.partition(["n2"])  # crashed: nothing reaches it or leaves it
    net.link = LinkConditions(latency_ms=(5, 200), loss=loss)
    wanted = []
    for i, origin in enumerate(["n0", "n1", "n3", "n4", "n0", "n1"]):
        stored = cell(near(topic, 0.9, seed=i), at=net.now)
        wanted.append(stored.node_id)
        net.inject(origin, CellStored(stored))
        net.run_for(100)
    net.run_for(delay_ms)
    engine = MeshEngine(
        old.node_id, dataclasses.replace(old.config, address="n2-back"), old.store, energy=ENERGY, signer=old._sign,
        verifier=old._verify, public_key=old.public_key, key_agreement=old._agree, sealer=old._sealer,
        rng=random.Random(seed),
    )  # fmt: skip
    host = net.add(engine)
    engine.outbox.confirms_delivery = True
    back = net.now
    net.start("n2-back")
    if not net.run_until(net.now + DEADLINE_MS, lambda: all(c in host.cells for c in wanted)):
        return None
    return (net.now - back) / 1000



def main() -> None:
    loss = float(sys.argv[1]) if len(sys.argv) > 1 else 0.1
    times: list[float] = []
    for delay in DELAYS_MS:
        row = [one_run(delay, seed, loss) for seed in range(SEEDS)]
        print(f"restart after {delay / 1000:>4.1f} s:", " ".join("   -" if t is None else f"{t:4.1f}" for t in row))
        times += [DEADLINE_MS / 1000 if t is None else t for t in row]
    times.sort()
    late = sum(t >= DEADLINE_MS / 1000 for t in times)
    print(f"loss {loss}: {len(times)} runs, median {statistics.median(times):.1f} s, "
          f"p90 {times[int(0.9 * len(times))]:.1f} s, max {times[-1]:.1f} s, not converged in 120 s: {late}")  # fmt: skip


if __name__ == "__main__":
    main()
