"""A mixed-version team: the previous release's engine beside this one, on one wire.

The previous release (``c4ab4d7``) speaks mesh protocol 1: frames sealed under the team key
alone. This one speaks protocol 2 (frames bound to their sender, :mod:`mesh.frame_auth`),
and cannot let a protocol-1 frame in: it cannot tell which member sent it. The rule for a
mixed team: the wire works between the two releases, or each refuses the other by a named
version; never a silent drop. So here both engines, the old one vendored, exchange every
frame they send for a while of virtual time, each placing a beacon and storing cells on the
other's topic, and:

* an old frame at the new node is dropped as ``old_version``, and the new node names the
  member once (a ``PeerOutdated`` effect, which the daemon logs: "peer X speaks mesh
  protocol 1, this node 2: upgrade it"; ``status()`` lists it for ``hyphae peers``/``doctor``);
* a new frame at the old node is dropped as ``bad_version`` (that release's name for a
  version it does not know), and nothing is stored on either side;
* an outsider's protocol-1 frame is counted, but names no one: only a frame that opens under
  the team key does (so a stranger cannot make a node log "upgrade X").

The old engine is the previous release's own ``mesh/`` package (its sans-IO core, without
``mesh/runtime``), vendored as ``data/mesh_c4ab4d7.zip`` under the module name
``mesh_c4ab4d7`` so it loads beside today's ``mesh`` without git history. Made with:

    git archive --format=zip -9 --prefix=mesh_c4ab4d7/ -o tests/mesh/data/mesh_c4ab4d7.zip \\
        c4ab4d7:mesh -- ':(exclude)runtime'

(the package uses relative imports only, so the new name is all it takes).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import mesh
from mesh.errors import Reason
from mesh.events import PeerOutdated
from mesh.team import FRAME_VERSION, Team
from mesh.testing import make_engine

from .test_engine import ENERGY, beacon, cell, unit

OLD_RELEASE_ZIP = Path(__file__).parent / "data" / "mesh_c4ab4d7.zip"
NOW = 1_780_000_000_000
RUN_MS = 30_000
STEP_MS = 50


@pytest.fixture(scope="module")
def old_mesh():
    """The previous release's ``mesh`` package, imported from the vendored zip."""
    sys.path.insert(0, str(OLD_RELEASE_ZIP))
    try:
        module = importlib.import_module("mesh_c4ab4d7")
        importlib.import_module("mesh_c4ab4d7.testing")
    finally:
        sys.path.remove(str(OLD_RELEASE_ZIP))
    assert module.team.FRAME_VERSION == 1 < FRAME_VERSION
    return module


class Wire:
    """Two engines of possibly different releases, addressed by name; each one's ``SendFrame``
    becomes the other's ``FrameReceived`` (its own release's class), and timers fire in
    virtual time. Everything each engine emits is kept, by name."""

    def __init__(self, engines: dict, event_modules: dict) -> None:
        self.engines = engines
        self.events = event_modules
        self.effects = {name: [] for name in engines}
        self.timers = {name: {} for name in engines}
        self.queue: list[tuple[str, str, bytes]] = []  # (to, from, frame)
        self.now = NOW

    def do(self, name: str, event) -> None:
        for effect in self.engines[name].handle(event, self.now):
            self.effects[name].append(effect)
            kind = type(effect).__name__
            if kind == "SendFrame":
                self.queue.append((effect.address, name, effect.frame))
            elif kind == "SetTimer":
                self.timers[name][effect.name] = effect.at_ms

    def run(self, ms: int) -> None:
        end = self.now + ms
        while self.now < end:
            while self.queue:
                to, sender, frame = self.queue.pop(0)
                if to in self.engines:
                    self.do(to, self.events[to].FrameReceived(sender, frame))
            for name, timers in self.timers.items():
                for timer, at in list(timers.items()):
                    if at <= self.now:
                        del timers[timer]
                        self.do(name, self.events[name].TimerFired(timer))
            self.now += STEP_MS

    def of_kind(self, name: str, kind: str) -> list:
        return [e for e in self.effects[name] if type(e).__name__ == kind]


def mixed_team(old_mesh, team: Team | None = None) -> tuple[Wire, object, object]:
    team = team or Team.create()
    old_team = old_mesh.team.Team.from_join_token(team.join_token())  # the join token reads across releases
    assert (old_team.team_id, old_team.frame_key()) == (team.team_id, team.frame_key())
    old = old_mesh.testing.make_engine("old", old_team, ENERGY)  # the energy model is the node's, duck-typed
    new = make_engine("new", team, ENERGY)
    wire = Wire({"old": old, "new": new}, {"old": old_mesh.events, "new": mesh.events})
    for name in ("old", "new"):
        wire.do(name, wire.events[name].Started())
    return wire, old, new


def test_old_and_new_engines_refuse_each_other_by_a_named_version_and_the_new_one_names_the_old_member(old_mesh):
    wire, old, new = mixed_team(old_mesh)
    old_topic, new_topic = unit(1), unit(2)
    wire.do("old", old_mesh.events.BeaconPlaced(
        old_mesh.wire.BeaconPayload("old-beacon", "t", "old-reader", "query", 0.8, embedding=old_topic,
                                    embedding_space="space")))  # fmt: skip
    wire.do("new", mesh.events.BeaconPlaced(beacon(new_topic)))
    wire.do("old", old_mesh.events.PeerDiscovered("new"))
    wire.do("new", mesh.events.PeerDiscovered("old"))
    wire.run(RUN_MS)
    wire.do("old", old_mesh.events.CellStored(old_mesh.wire.CellPayload(
        "from-old", "t", "writer", "content", "Decision", 0.9, wire.now, embedding=new_topic, embedding_space="space")))
    wire.do("new", mesh.events.CellStored(cell(old_topic, at=wire.now, cid="from-new")))
    wire.run(RUN_MS)

    # Frames did cross both ways, and neither side let anything in.
    new_drops, old_drops = new.counters.drops, old.counters.drops
    assert new_drops[Reason.OLD_VERSION] >= 2 and old_drops["bad_version"] >= 2
    assert set(new_drops) == {Reason.OLD_VERSION}, new_drops  # refused by name, nothing else
    assert set(old_drops) == {"bad_version"}, old_drops
    assert wire.of_kind("new", "StoreRemoteCell") == [] == wire.of_kind("old", "StoreRemoteCell")

    # The new node named the old member once, however many of its frames came.
    (outdated,) = wire.of_kind("new", "PeerOutdated")
    assert (outdated.node_id, outdated.address, outdated.protocol, outdated.ours) == (old.node_id, "old", 1, 2)
    assert outdated.message().startswith(f"peer {old.node_id} at old speaks mesh protocol 1, this node 2: upgrade it")
    (listed,) = new.status()["outdated_peers"]
    assert listed["node_id"] == old.node_id and listed["frames"] == new_drops[Reason.OLD_VERSION]
    assert listed["message"] == outdated.message()


def test_a_protocol_1_frame_that_does_not_open_under_the_team_key_is_counted_but_names_no_one(old_mesh):
    stranger_team = old_mesh.team.Team.create()
    stranger = old_mesh.identity.NodeIdentity.generate()
    wire, _, new = mixed_team(old_mesh)
    for _ in range(3):
        wire.do("new", mesh.events.FrameReceived("stranger", stranger_team.sealer().seal(stranger.node_id, b"hello")))
    assert new.counters.drops == {Reason.OLD_VERSION: 3}
    assert wire.of_kind("new", "PeerOutdated") == [] and new.status()["outdated_peers"] == []


def test_the_outdated_table_is_bounded(old_mesh):
    """A protocol-1 header names its sender without proof: a member naming many ids fills no memory."""
    from mesh.outdated import MAX_RECORDS

    team = Team.create()
    wire, _, new = mixed_team(old_mesh, team)
    old_team = old_mesh.team.Team.from_join_token(team.join_token())
    for i in range(MAX_RECORDS + 10):
        forged_id = f"{i:032x}"
        wire.do("new", mesh.events.FrameReceived("old", old_team.sealer().seal(forged_id, b"x")))
    assert new.counters.drops == {Reason.OLD_VERSION: MAX_RECORDS + 10}
    assert len(new.status()["outdated_peers"]) == MAX_RECORDS == len(wire.of_kind("new", "PeerOutdated"))
    assert all(isinstance(e, PeerOutdated) for e in wire.of_kind("new", "PeerOutdated"))
