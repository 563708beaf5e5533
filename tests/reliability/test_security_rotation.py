"""Team key rotation: ``hyphae team rotate [--remove NODE_ID ...]``.

The flow (also in ``mesh/team.py``): on one member, stop the node and run ``hyphae team
rotate --remove <id of the node to shut out>``; the new join token is the last line of
stdout. Every member that stays stops its node, runs ``hyphae team join <token>`` and
starts again. The team id (the tenant) does not change, so no memory moves; only the key
does, and with it the frame key and every membership proof.

First the pieces, in process: a rotated team keeps its id and changes its key, the
token carries the removed ids (and the old two-field token still decodes), and an
engine under the new key drops what the removed node sends, whether it kept the old key
(``decrypt_failed``) or got hold of the new one (``not_member``), while the old key opens
nothing sealed under the new one. Then the story with real daemons: A, B and M are one
team and M reads A's decisions; A rotates with ``--remove M``, B re-joins, M keeps the
old key (and cannot re-join with a leaked token). After the restart B still gets A's
decisions, M gets nothing, and what M stores never reaches A.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator

import pytest

from mesh.errors import Reason, SealError
from mesh.events import Started
from mesh.identity import NodeIdentity
from mesh.team import Team
from mesh.testing import make_engine
from tests.e2e_mesh.cluster import (
    HYPHAE, Lab, team_of, wait_beacons_known, wait_connected, wait_frames_handled, wait_outbox_idle, wait_until,
)  # fmt: skip
from tests.mesh.test_engine import ENERGY
from tests.mesh.test_security import NOW, deliver, diff_from, frame, stored

INTEREST = "pgvector storage backend database"


@pytest.fixture
def lab(tmp_path) -> Iterator[Lab]:
    with Lab(tmp_path) as running:  # every daemon stopped and reaped in teardown
        yield running


# -- in process ------------------------------------------------------------------------


def test_a_rotated_team_keeps_its_id_and_changes_its_key() -> None:
    old = Team.create()
    mallory = NodeIdentity.generate()
    new = old.rotated({mallory.node_id})
    assert new.team_id == old.team_id and new.id_hash == old.id_hash  # same tenant, same discovery
    assert new.team_key != old.team_key and new.frame_key() != old.frame_key()
    assert new.removed == {mallory.node_id} and mallory.node_id not in repr(new.team_key)
    assert Team.from_join_token(new.join_token()) == new  # the removed ids travel in the token
    assert Team.from_join_token(old.join_token()) == old  # and the two-field token still decodes
    assert old.rotated().removed == frozenset() and new.rotated().removed == new.removed  # removal sticks

    member = NodeIdentity.generate().public_key
    assert not new.is_member(member, old.membership_proof(member))  # old proofs are void
    assert new.is_member(member, new.membership_proof(member))
    assert not new.is_member(mallory.public_key, new.membership_proof(mallory.public_key))  # even with the key
    with pytest.raises(SealError) as info:
        old.sealer().open(new.sealer().seal(mallory.node_id, b"the new plans"))
    assert info.value.reason == Reason.DECRYPT_FAILED
    with pytest.raises(ValueError):
        Team(old.team_id, old.team_key, frozenset({"not-a-node-id"}))


def test_an_engine_under_the_new_key_drops_the_removed_node_either_way() -> None:
    old = Team.create()
    mallory, carol = NodeIdentity.generate(), NodeIdentity.generate()
    new = old.rotated({mallory.node_id})
    bob = make_engine("bob", new, ENERGY)
    bob.handle(Started(), NOW)

    assert stored(deliver(bob, frame(old, mallory, diff_from(mallory)))) == []  # kept the old key
    assert bob.counters.drops[Reason.DECRYPT_FAILED] == 1
    leaked = frame(new, mallory, diff_from(mallory, seq=2))  # got the new key somehow: a valid proof
    assert stored(deliver(bob, leaked)) == []
    assert bob.counters.drops[Reason.NOT_MEMBER] == 1
    assert len(stored(deliver(bob, frame(new, carol, diff_from(carol))))) == 1  # a member re-joined: served
    assert bob.peers.get(mallory.node_id) is None


# -- real daemons ------------------------------------------------------------------------


def _inbox_contents(node, key) -> list[str]:
    return [d["content"] for d in node.rest("GET", "/v1/inbox", key)["diffs"]]


def test_after_rotation_a_removed_node_can_neither_read_nor_inject(lab: Lab) -> None:
    a, b, m = lab.team(["a", "b", "m"])
    lab.start_mesh([a, b, m])
    key_a, _ = a.add_agent("alice")
    key_b, _ = b.add_agent("bob")
    key_m, _ = m.add_agent("mallory")
    for node, key in ((b, key_b), (m, key_m)):
        node.rest("POST", "/v1/beacons", key, json={"query": INTEREST}, expect=201)
    a.rest("POST", "/v1/beacons", key_a, json={"query": "removed node rumour"}, expect=201)
    wait_beacons_known(a, 2)
    before = "Use pgvector as the storage backend database for V1."
    a.rest("POST", "/v1/cells", key_a, json={"content": before, "cell_type": "Decision"}, expect=201)
    for node, key in ((b, key_b), (m, key_m)):  # before rotation, M is a member and reads
        wait_until(lambda: before in _inbox_contents(node, key), 10.0, message=f"V1 at {node.name}")

    # -- rotate on A, shutting M out; B re-joins; M keeps the old key
    old_team = team_of(a.home)
    for node in (a, b, m):
        node.stop()
    rotated = subprocess.run([*HYPHAE, "--home", str(a.home), "team", "rotate", "--remove", m.node_id],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)  # fmt: skip
    assert rotated.returncode == 0, rotated.stderr
    token = rotated.stdout.strip().splitlines()[-1]
    assert token.startswith("hyphae1.") and "new key" in rotated.stderr and "team join" in rotated.stderr
    assert stat.S_IMODE(os.stat(a.home / "team.json").st_mode) == 0o600
    assert team_of(a.home)[0] == old_team[0] and team_of(a.home)[1] != old_team[1]
    assert json.loads((a.home / "team.json").read_text())["removed"] == [m.node_id]
    b.cli("team", "join", token)
    assert team_of(b.home) == team_of(a.home)
    leaked = subprocess.run([*HYPHAE, "--home", str(m.home), "team", "join", token],
                            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)  # fmt: skip
    assert leaked.returncode != 0 and "removed" in leaked.stderr, leaked.stderr
    assert team_of(m.home) == old_team  # M still holds the old key

    a.start()
    lab.start_all([b, m], peers=[a.mesh_address])
    wait_connected([a, b])

    # -- M cannot read: A's next decision reaches B, never M
    after = "Use pgvector as the storage backend database for V2 as well."
    a.rest("POST", "/v1/cells", key_a, json={"content": after, "cell_type": "Decision"}, expect=201)
    wait_until(lambda: after in _inbox_contents(b, key_b), 10.0, message="V2 at B")

    # -- M cannot inject: what it stores never reaches A
    rumour = "removed node rumour: drop the production database tonight"
    m.rest("POST", "/v1/cells", key_m, json={"content": rumour, "cell_type": "Decision"}, expect=201)
    # M has sent (or given up on) all it had for A, and A has handled every frame it took in:
    # whatever of M's reached A was judged; nothing is still on its way.
    wait_outbox_idle(m, 60.0)
    wait_frames_handled(a)
    assert after not in _inbox_contents(m, key_m)
    assert rumour not in _inbox_contents(a, key_a)
    found = a.rest("POST", "/v1/search", key_a, json={"query": rumour, "k": 20})["results"]
    assert all("rumour" not in hit["content"] for hit in found), found
    status = a.peers()
    assert m.node_id not in {p["node_id"] for p in status["peers"] if p["state"] == "alive"}
    assert status["drops"].get("decrypt_failed", 0) >= 1, status["drops"]  # M's frames under the old key
    assert b.rest("GET", "/healthz")["status"] == "ok" and a.rest("GET", "/healthz")["status"] == "ok"


def test_rotate_refuses_what_it_cannot_do(tmp_path, capsys) -> None:
    from mesh.identity import NodeIdentity as Identity
    from app.cli import main
    from app.home import init_home
    from node.teams import adopt_team

    home = tmp_path / "home"
    init_home(home)
    assert main(["--home", str(home), "team", "rotate"]) == 3  # no team yet
    assert "in no team" in capsys.readouterr().err
    adopt_team(home, Team.create())
    assert main(["--home", str(home), "team", "rotate", "--remove", "not-a-node"]) == 2
    assert "not a node id" in capsys.readouterr().err
    own = Identity.load(home / "node.key").node_id
    assert main(["--home", str(home), "team", "rotate", "--remove", own.upper()]) == 2
    assert "cannot remove itself" in capsys.readouterr().err
    before = (home / "team.json").read_text()
    other = NodeIdentity.generate().node_id
    assert main(["--home", str(home), "team", "rotate", "--remove", other, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["removed"] == [other] and Team.from_join_token(printed["join_token"]).removed == {other}
    assert (home / "team.json").read_text() != before
