"""WatchInbox across a team: an agent on node B watches its inbox over gRPC, and a cell
another agent stores on node A (over gRPC too) is pushed to it once the mesh delivers it."""

from __future__ import annotations

import grpc

from tests.api.grpc_helpers import DEADLINE, key, pb, stub

from .cluster import Lab, wait_beacons_known

QUERY = "which region hosts the search cluster"


def test_watch_inbox_receives_a_cell_stored_on_another_node(lab: Lab) -> None:
    a, b = lab.team(["a", "b"], provider="hashed")
    lab.start_mesh([a, b])
    key_a, _ = a.add_agent("writer")
    key_b, _ = b.add_agent("watcher")
    with stub(b.info["grpc_address"]) as at_b, stub(a.info["grpc_address"]) as at_a:
        at_b.PlaceBeacon(pb.PlaceBeaconRequest(query=QUERY, threshold=0.1), metadata=key(key_b), timeout=DEADLINE)
        wait_beacons_known(a, 1)
        # since=0: the whole inbox, so the order of the watch's start and the store does not matter
        stream = at_b.WatchInbox(pb.WatchInboxRequest(since="0"), metadata=key(key_b), timeout=60)
        try:
            stored = at_a.Store(pb.StoreRequest(content=f"{QUERY}: eu-west-1, decided in March", cell_type="Decision"),
                                metadata=key(key_a), timeout=DEADLINE)  # fmt: skip
            entry = next(stream)
        finally:
            stream.cancel()
    assert entry.node_id == stored.node_id and entry.kind == "match"
    assert entry.origin_node == a.node_id and entry.hops >= 1
    assert entry.content.startswith(QUERY)
    assert stream.code() == grpc.StatusCode.CANCELLED
