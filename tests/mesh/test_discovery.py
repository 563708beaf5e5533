"""Zeroconf discovery on 127.0.0.1: team mates find each other, strangers are ignored, and two
runtimes that only discovery introduced deliver a cell."""

from __future__ import annotations

import socket
import uuid

import trio
from zeroconf import ServiceInfo

from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
from mesh.runtime import SERVICE_TYPE, Discovery
from mesh.team import Team

from .test_runtime import beacon, cell, eventually, make_nodes, unit, wall_ms  # noqa: F401 (make_nodes: a fixture)

LOOPBACK = ["127.0.0.1"]


class Found:
    """An ``on_peer`` that remembers its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, address: str, node_id: str) -> None:
        self.calls.append((address, node_id))

    def node_ids(self) -> set[str]:
        return {node_id for _, node_id in self.calls}


def discovery(team_hash: str, port: int, on_peer, **kwargs) -> Discovery:
    return Discovery(
        node_id=uuid.uuid4().hex, team_hash=team_hash, port=port, on_peer=on_peer, interfaces=LOOPBACK, **kwargs
    )


async def start_all(nursery: trio.Nursery, *discoveries: Discovery) -> dict[Discovery, trio.CancelScope]:
    """Start them side by side (each spends ~1.5 s probing its name); one cancel scope each."""
    scopes: dict[Discovery, trio.CancelScope] = {}

    async def run_with_scope(d: Discovery, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scopes[d]:
            await d.run(task_status=task_status)

    async with trio.open_nursery() as starting:
        for d in discoveries:
            starting.start_soon(nursery.start, run_with_scope, d)
    return scopes


def test_the_record_names_the_node_a_team_hash_the_protocol_and_the_port_never_the_key():
    team = Team.create()
    d = Discovery(node_id="ab" * 16, team_hash=team.id_hash, port=7979, addresses=["10.0.0.5"], on_peer=print)
    info = d.service_info()
    assert info.type == SERVICE_TYPE and info.name == f"hyphae-{'ab' * 16}.{SERVICE_TYPE}"
    assert info.properties == {b"node": b"ab" * 16, b"team": team.id_hash.encode(), b"proto": b"2", b"port": b"7979"}
    assert info.parsed_addresses() == ["10.0.0.5"] and info.port == 7979
    assert team.team_key.hex().encode() not in b"".join(info.properties.values())
    assert team.team_id.encode() not in b"".join(info.properties.values())


def test_records_of_strangers_other_protocols_and_ourselves_are_not_proposed():
    d = Discovery(node_id="aa" * 16, team_hash="team-1", port=1, on_peer=print)

    def record(node: str, team: str = "team-1", proto: str = "2", port: int = 7979) -> ServiceInfo:
        props = {"node": node, "team": team, "proto": proto}
        return ServiceInfo(SERVICE_TYPE, f"x.{SERVICE_TYPE}", addresses=[socket.inet_aton("10.0.0.9")], port=port,
                           properties=props, server="x.local.")  # fmt: skip

    assert d._read(record("bb" * 16)) == ("10.0.0.9:7979", "bb" * 16)
    assert d._read(record("bb" * 16, team="team-2")) is None
    assert d._read(record("bb" * 16, proto="1")) is None  # protocol 1: frames not bound to their sender
    assert d._read(record("aa" * 16)) is None  # ourselves
    assert d._read(record("")) is None


def test_a_team_mate_on_another_protocol_is_not_proposed_but_logged_once(caplog):
    d = Discovery(node_id="aa" * 16, team_hash="team-1", port=1, on_peer=print)
    old = ServiceInfo(SERVICE_TYPE, f"x.{SERVICE_TYPE}", addresses=[socket.inet_aton("10.0.0.9")], port=7979,
                      properties={"node": "bb" * 16, "team": "team-1", "proto": "1"}, server="x.local.")  # fmt: skip
    stranger = ServiceInfo(SERVICE_TYPE, f"y.{SERVICE_TYPE}", addresses=[socket.inet_aton("10.0.0.8")], port=7979,
                           properties={"node": "cc" * 16, "team": "team-2", "proto": "1"}, server="y.local.")  # fmt: skip
    with caplog.at_level("WARNING", logger="hyphae.mesh.discovery"):
        for _ in range(3):  # zeroconf reports a service again and again
            assert d._read(old) is None and d._read(stranger) is None
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"team mate {'bb' * 16} at 10.0.0.9 speaks mesh protocol 1, this node 2: upgrade it"
    )
    assert list(d.outdated) == ["bb" * 16]  # a stranger's record names no one


async def test_team_mates_find_each_other_strangers_are_ignored_and_leaving_unregisters():
    team, stranger_team = Team.create(), Team.create()
    found = [Found(), Found(), Found()]
    alice = discovery(team.id_hash, 7001, found[0])
    bob = discovery(team.id_hash, 7002, found[1])
    mallory = discovery(stranger_team.id_hash, 7003, found[2])
    with trio.fail_after(60):  # a hang guard only
        async with trio.open_nursery() as nursery:
            scopes = await start_all(nursery, alice, bob, mallory)
            await eventually(lambda: bob.node_id in found[0].node_ids() and alice.node_id in found[1].node_ids())
            assert ("127.0.0.1:7002", bob.node_id) in found[0].calls
            assert ("127.0.0.1:7001", alice.node_id) in found[1].calls
            await eventually(lambda: mallory.ignored >= 2 and alice.ignored >= 1)
            assert mallory.node_id not in found[0].node_ids() | found[1].node_ids() and found[2].calls == []

            scopes[bob].cancel()  # bob leaves: his goodbye removes him from alice's view
            await eventually(lambda: bob.node_id not in alice.peers)
            assert alice.peers == {}
            nursery.cancel_scope.cancel()


async def test_two_runtimes_introduced_by_zeroconf_alone_deliver_a_cell(make_nodes):
    a, b = make_nodes("alice", "bob")
    team_hash = a.engine.config.team.id_hash
    topic = beacon(unit(9))
    with trio.fail_after(60):  # a hang guard only
        async with trio.open_nursery() as nursery:
            for node in (a, b):
                await node.start(nursery)

            def proposer(node):
                return lambda address, node_id: node.submit(PeerDiscovered(address, node_id))

            await start_all(nursery, *(
                Discovery(node_id=n.node_id, team_hash=team_hash, port=n.port, on_peer=proposer(n), interfaces=LOOPBACK)
                for n in (a, b)
            ))  # fmt: skip
            await eventually(lambda: len(a.engine.peers) == 1 and len(b.engine.peers) == 1)
            b.submit(BeaconPlaced(topic))
            await eventually(lambda: a.sink.knows_beacon(topic.beacon_id))
            stored = cell(unit(9), created_at=wall_ms())
            a.submit(CellStored(stored))
            await eventually(lambda: stored.node_id in b.sink.cells())
            assert b.sink.cells()[stored.node_id].origin_node == a.node_id
            nursery.cancel_scope.cancel()
