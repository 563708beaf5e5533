"""Mesh faults with real processes (issue 7, item 4): five ``hyphae up`` daemons on 127.0.0.1.

Every daemon runs with the two test hooks of ``app/mesh_node.py``: its mesh transport
follows a fault file the test rewrites (``HYPHAE_MESH_FAULTS``), and n3's clock runs 5
minutes ahead of the wall clock, n4's 5 minutes behind (``HYPHAE_CLOCK_OFFSET_MS``), for
the whole run. One agent per node; each places a beacon on the project ``all`` and one
on its own project ``only-<name>``; a store in ``all`` interests the four other nodes,
a store in ``only-nK`` interests nK alone. The ground truth of every inbox is computed
from those beacons, and after each fault heals the test waits until every inbox holds
exactly its ground truth (no loss, no duplicate), reporting the time it took:

1. **partition**: {n0, n1} | {n2, n3, n4} (each side's daemons refuse to send to the
   other's), stores on both sides, held until the sides declare each other dead; heal.
2. **crash**: SIGKILL n2; stores that interest it made while it is down, first while the
   others still count it alive (pushed, resent, then dropped), then more once they have all
   declared it dead (dropped at once: each origin alone holds them and owes them to n2);
   restart (same data dir, new ports, no ``--peer``: it finds the others from the control
   state it kept, and they learn its new address from it), and stores it makes right
   after the restart.
3. **slow peer**: every frame to or from n1 waits 300 ms; stores that interest n1.

The short version (CI) stores a few cells in each phase, with the skewed clocks;
``@pytest.mark.slow`` repeats all three with more stores and longer faults. Times to converge are printed as
``converged <phase> <seconds>`` lines (``pytest -s`` shows them).
"""

from __future__ import annotations

import itertools
import time
import pytest

from .cluster import Lab, MeshNode, wait_beacons_known, wait_connected, wait_until

QUERY = "mesh fault tolerance drill"
SKEW_MS = {"n3": 5 * 60_000, "n4": -5 * 60_000}
CONVERGE_DEADLINE = 60.0  # s after a heal; what the test measures is printed, this only bounds it
_texts = itertools.count()


class Drill:
    """The five nodes, their agents, and the ground truth of every inbox."""

    def __init__(self, lab: Lab) -> None:
        self.nodes = lab.team([f"n{i}" for i in range(5)], provider="hashed")
        for node in self.nodes:
            node.hook_faults()
            if node.name in SKEW_MS:
                node.skew_clock(SKEW_MS[node.name])
        lab.start_mesh(self.nodes)
        self.keys = {n.name: n.add_agent(f"agent-{n.name}")[0] for n in self.nodes}
        for node in self.nodes:
            for project in ("all", f"only-{node.name}"):
                node.rest("POST", "/v1/beacons", self.keys[node.name], json={"query": QUERY, "project": project},
                          expect=201)  # fmt: skip
        for node in self.nodes:
            wait_beacons_known(node, 2 * (len(self.nodes) - 1))
        self.expected: dict[str, set[str]] = {n.name: set() for n in self.nodes}
        self.timings: dict[str, list[float]] = {}
        for name, skew in SKEW_MS.items():  # the clock hook took: the node stamps by its own clock
            node = self.node(name)
            body = {"content": "what time is it here", "cell_type": "Fact", "project": "nobody"}
            probe = node.rest("POST", "/v1/cells", self.keys[name], json=body, expect=201)["node_id"]
            stamped = node.rest("GET", f"/v1/cells/{probe}", self.keys[name])["created_at"]
            assert abs(stamped - time.time() * 1000 - skew) < 60_000, (name, stamped)

    def node(self, name: str) -> MeshNode:
        return next(n for n in self.nodes if n.name == name)

    def store(self, origin: MeshNode, project: str) -> str:
        body = {"content": f"{QUERY}: entry {next(_texts)} from {origin.name}", "cell_type": "Decision",
                "project": project}  # fmt: skip
        cell_id = origin.rest("POST", "/v1/cells", self.keys[origin.name], json=body, expect=201)["node_id"]
        for node in self.nodes:  # the ground truth, from the beacons placed above
            if node is not origin and project in ("all", f"only-{node.name}"):
                self.expected[node.name].add(cell_id)
        return cell_id

    def inbox(self, node: MeshNode) -> list[str]:
        items: list[str] = []
        since = 0
        while True:
            page = node.rest("GET", "/v1/inbox", self.keys[node.name], params={"since": since, "limit": 500})
            items.extend(d["node_id"] for d in page["diffs"])
            if len(page["diffs"]) < 500:
                return items
            since = page["next_since"]

    def missing(self) -> dict[str, int]:
        gaps = {}
        for node in self.nodes:
            got = self.inbox(node)
            assert len(got) == len(set(got)), f"{node.name} has a duplicate in its inbox"
            assert set(got) <= self.expected[node.name], f"{node.name} got a cell no beacon of its asked for"
            if len(got) != len(self.expected[node.name]):
                gaps[node.name] = len(self.expected[node.name]) - len(got)
        return gaps

    def converge(self, phase: str, since: float) -> float:
        """Wait until every inbox equals its ground truth; record and return the seconds since ``since``."""
        wait_until(lambda: not self.missing(), CONVERGE_DEADLINE, interval=0.2,
                   message=lambda: f"{phase}: missing {self.missing()}\n" + self.states())  # fmt: skip
        took = time.monotonic() - since
        self.timings.setdefault(phase, []).append(took)
        print(f"converged {phase} {took:.2f}")
        return took

    def states(self) -> str:
        lines = []
        for node in self.nodes:
            if node.running:
                status = node.peers()
                peers = {p["address"]: p["state"] for p in status["peers"]}
                lines.append(f"{node.name} {node.mesh_address}: {peers} drops={status['drops']}")
        return "\n".join(lines)

    def set_faults(self, changes: dict[str, dict]) -> None:
        """Rewrite the fault files (``{name: spec}``; nodes not named get none) and wait until
        every running daemon follows its new plan."""
        for node in self.nodes:
            node.set_faults(**changes.get(node.name, {}))
        for node in self.nodes:
            if node.running:
                want = sorted(changes.get(node.name, {}).get("partition", ()))
                wait_until(lambda: node.peers()["transport"]["fault_plan"]["partition"] == want, 10.0,
                           message=f"{node.name} following its fault file")  # fmt: skip

    def no_clock_drops(self) -> None:
        for node in self.nodes:
            drops = node.peers()["drops"]
            assert drops.get("future", 0) == 0 and drops.get("replay", 0) == 0, (node.name, drops)


def partition_phase(drill: Drill, stores: int, hold: float) -> None:
    left, right = drill.nodes[:2], drill.nodes[2:]
    block = {n.name: {"partition": [m.mesh_address for m in (right if n in left else left)]} for n in drill.nodes}
    drill.set_faults(block)
    for i in range(stores):
        drill.store(left[i % 2], "all")
        drill.store(right[i % 3], "all")
        drill.store(left[i % 2], "only-n3")  # n3 is on the other side, and 5 min ahead
        drill.store(right[i % 3], "only-n1")
    # Each side still serves itself while cut off.
    wait_until(lambda: all(len(set(drill.inbox(n)) & drill.expected[n.name]) > 0 for n in drill.nodes), 30.0,
               message="deliveries within each side")  # fmt: skip
    wait_until(lambda: all(
        {p["state"] for p in n.peers()["peers"] if p["address"] in block[n.name]["partition"]} <= {"dead"}
        for n in drill.nodes), hold, interval=0.2, message=lambda: "both sides declaring the other dead\n" + drill.states())  # fmt: skip
    assert drill.missing(), "the partition let everything through"
    drill.set_faults({})
    drill.converge("partition", time.monotonic())


def crash_phase(drill: Drill, stores: int, hold: float) -> None:
    victim = drill.node("n2")
    victim.kill()
    others = [n for n in drill.nodes if n is not victim]
    for i in range(stores):
        origin = others[i % len(others)]
        drill.store(origin, "only-n2")
        drill.store(origin, "all")
    wait_until(lambda: all(
        {p["state"] for p in n.peers()["peers"] if p["node_id"] == victim.node_id} == {"dead"} for n in others),
        hold, interval=0.2, message=lambda: "the others declaring n2 dead\n" + drill.states())  # fmt: skip
    for i in range(stores):  # stored for a node known dead, seconds before it is back
        drill.store(others[(i + 1) % len(others)], "only-n2")
    victim.start()  # new ports and no --peer: it finds the others from the control state it kept
    back = time.monotonic()
    for i in range(max(1, stores // 2)):  # stored right after the restart, by the node that crashed
        drill.store(victim, "all")
    drill.converge("crash", back)


def slow_phase(drill: Drill, stores: int, delay: float) -> None:
    slow = drill.node("n1")
    changes = {n.name: {"delay": {slow.mesh_address: delay}} for n in drill.nodes if n is not slow}
    changes[slow.name] = {"delay": {"*": delay}}
    drill.set_faults(changes)
    began = time.monotonic()
    others = [n for n in drill.nodes if n is not slow]
    for i in range(stores):
        drill.store(others[i % len(others)], "only-n1")
        drill.store(slow, "all")
    drill.converge("slow peer", began)
    drill.set_faults({})


def run_drill(lab: Lab, *, stores: int, rounds: int = 1, hold: float = 30.0) -> dict[str, list[float]]:
    drill = Drill(lab)
    for _ in range(rounds):
        partition_phase(drill, stores, hold)
        crash_phase(drill, stores, hold)
        slow_phase(drill, stores, 0.3)
        wait_connected(drill.nodes)
    drill.no_clock_drops()
    total = sum(len(v) for v in drill.expected.values())
    print(f"deliveries checked {total}; timings {drill.timings}")
    return drill.timings


def test_partition_crash_skew_and_a_slow_peer_all_converge(lab: Lab) -> None:
    timings = run_drill(lab, stores=3)
    assert {phase: len(times) for phase, times in timings.items()} == {"partition": 1, "crash": 1, "slow peer": 1}


@pytest.mark.slow
def test_the_long_drill(lab: Lab) -> None:
    timings = run_drill(lab, stores=20, rounds=3, hold=45.0)
    assert {phase: len(times) for phase, times in timings.items()} == {"partition": 3, "crash": 3, "slow peer": 3}

