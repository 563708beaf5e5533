"""Two nodes that find each other by zeroconf alone, then gossip a memory.

No ``--peer`` and no static peers in config: each daemon listens on 127.0.0.1 (mesh
port ephemeral), so it advertises 127.0.0.1 in ``_hyphae._tcp.local.`` and runs
multicast DNS on the loopback interface only. A third node of *another* team
advertises on the same link and must be ignored (its TXT record carries a different
team hash). The hashed embedder suffices: the beacon and the memory share words.
"""

from __future__ import annotations

import socket
import time

import pytest

from .cluster import Lab, wait_beacons_known, wait_connected, wait_until

# Hang guards, not figures: mDNS probing takes ~1.5 s per name, plus browse and resolve; a
# delivery takes milliseconds. Both are printed; neither is asserted.
FIND_DEADLINE = 60.0  # s
DELIVERY_DEADLINE = 30.0  # s


def test_two_nodes_find_each_other_by_zeroconf_and_deliver(lab: Lab) -> None:
    a, b = lab.team(["a", "b"])
    (stranger,) = lab.team(["stranger"])  # a team of its own, on the same link
    lab.start_all([a, b, stranger], discovery=True)
    began = time.monotonic()
    wait_connected([a, b], timeout=FIND_DEADLINE)
    print(f"\nfound each other by zeroconf in {time.monotonic() - began:.2f} s")
    for node in (a, b):
        peers = node.peers()["peers"]
        assert [p["node_id"] for p in peers] == [(b if node is a else a).node_id], peers
        assert peers[0]["address"].startswith("127.0.0.1:")
    assert stranger.peers()["peers"] == []

    key_a, agent_a = a.add_agent("alice")
    key_b, _ = b.add_agent("bob")
    beacon = b.rest("POST", "/v1/beacons", key_b, json={"query": "zeroconf discovery loopback mesh"}, expect=201)
    wait_beacons_known(a, 1)
    stored = a.rest("POST", "/v1/cells", key_a, expect=201, json={
        "content": "Mesh discovery uses zeroconf; on loopback it advertises 127.0.0.1.", "cell_type": "Fact",
    })  # fmt: skip
    stored_at = time.monotonic()
    diffs = wait_until(lambda: b.rest("GET", "/v1/inbox", key_b)["diffs"], DELIVERY_DEADLINE, interval=0.005,
                       message="the fact in B's inbox")  # fmt: skip
    print(f"store -> B's inbox: {(time.monotonic() - stored_at) * 1000:.0f} ms (polled)")
    (diff,) = diffs
    assert diff["node_id"] == stored["node_id"] and diff["beacon_id"] == beacon["beacon_id"]
    assert diff["origin_node"] == a.node_id and diff["source_agent"] == agent_a and diff["hops"] >= 1
    assert stranger.peers()["peers"] == []
    assert a.peers()["drops"].get("decrypt_failed", 0) == 0  # the stranger was never even contacted


def _lan_address() -> str | None:
    """This host's non-loopback IPv4 address, if it has one (nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("224.0.0.251", 5353))
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_wildcard_mesh_bind_advertises_a_reachable_lan_address(lab: Lab) -> None:
    """With the default ``0.0.0.0`` mesh bind, the node advertises its LAN address, not
    whatever /etc/hosts maps the host name to (often 127.0.0.1 or 127.0.1.1), and a
    teammate reaches it there."""
    lan = _lan_address()
    if lan is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    a, b = lab.team(["a", "b"])
    a.start(extra=["--mesh", "0.0.0.0:0"])
    host, _, port = a.mesh_address.rpartition(":")
    assert host == lan, f"advertised {a.mesh_address}, but this host is {lan}"
    b.start(peers=[a.mesh_address])
    wait_connected([a, b])
    assert {p["address"] for p in b.peers()["peers"]} == {a.mesh_address}
