"""A beacon removed at runtime leaves every node's routing, and stays gone after a restart.

Two ``hyphae up`` daemons on 127.0.0.1, A and B. B's agent places two beacons on one
query, on projects ``gone`` and ``kept``. B removes the ``gone`` one; its ``unbeacon``
diff reaches A by anti-entropy, and A's next store into ``gone`` is not sent to B at all
(A's data diffs sent and B's cells received count only the ``kept`` store that follows
it, and B's inbox holds only that one). A is then restarted from its data dir: the
removal is in the control state it puts back, so a store into ``gone`` still goes nowhere.
"""

from __future__ import annotations

from .cluster import Lab, MeshNode, wait_beacons_known, wait_connected, wait_until

QUERY = "which message queue carries the billing events"
DEADLINE = 20.0  # s


def store(node: MeshNode, key: str, project: str, n: int) -> str:
    body = {"content": f"{QUERY}: decision {n}", "cell_type": "Decision", "project": project}
    return node.rest("POST", "/v1/cells", key, json=body, expect=201)["node_id"]


def inbox(node: MeshNode, key: str) -> list[str]:
    return [d["node_id"] for d in node.rest("GET", "/v1/inbox", key, params={"limit": 500})["diffs"]]


def test_a_removed_beacon_stops_deliveries_from_every_node_and_after_a_restart(lab: Lab) -> None:
    a, b = lab.team(["a", "b"], provider="hashed")
    lab.start_mesh([a, b])
    key_a, _ = a.add_agent("agent-a")
    key_b, _ = b.add_agent("agent-b")
    placed = {
        project: b.rest("POST", "/v1/beacons", key_b, json={"query": QUERY, "project": project}, expect=201)
        for project in ("gone", "kept")
    }
    wait_beacons_known(a, 2)
    first = store(a, key_a, "gone", 1)  # delivered while the beacon stands
    wait_until(lambda: first in inbox(b, key_b), DEADLINE, message="the first store at B")

    b.rest("DELETE", f"/v1/beacons/{placed['gone']['beacon_id']}", key_b)
    wait_until(lambda: a.peers()["beacons_known"] == 1, DEADLINE, message=lambda: f"A's beacons: {a.peers()}")
    assert a.peers()["remote_beacons"] == 1

    def unwanted_then_marker(n: int) -> str:
        sent, received = a.peers()["data_diffs_sent"], b.peers()["cells_received"]
        unwanted = store(a, key_a, "gone", n)
        marker = store(a, key_a, "kept", n + 1)  # queued behind the unwanted one, had that been routed to B
        wait_until(lambda: marker in inbox(b, key_b), DEADLINE, message=f"the marker store {n + 1} at B")
        assert unwanted not in inbox(b, key_b)
        assert a.peers()["data_diffs_sent"] - sent == 1, "A sent B a cell for a removed beacon"
        assert b.peers()["cells_received"] - received == 1
        return marker

    markers = [unwanted_then_marker(2)]

    # The removal is persisted: A restarted from its data dir still routes nothing to it.
    assert a.stop() == 0, a.log_tail()
    a.start(peers=[b.mesh_address])
    wait_connected([a, b])
    wait_beacons_known(a, 1)
    assert a.peers()["beacons_known"] == 1
    markers.append(unwanted_then_marker(4))
    assert sorted(inbox(b, key_b)) == sorted([first, *markers])  # nothing else, nothing twice
