"""Outsiders can neither read nor inject; bad frames are counted drops and the node keeps serving.

Real processes: A and B are one team; O is a node of *another* team pointed at A with
``--peer``. B and O place the same beacon; a matching decision stored on A reaches B
and never O. What O stores never appears on A, A never lists O as a peer, and A
counts O's frames as ``decrypt_failed``.

Then A's mesh port is abused directly: garbage bytes, a body over the frame limit
(413), truncated frames, a well-sealed but undecodable envelope. Last, the insider
attacks (unit-tested in tests/mesh/test_security.py, here against the running
daemon): with the team key read from a data dir's ``team.json`` the test forges
frames as a member would (:mod:`mesh.wire`, :mod:`mesh.team`) and posts them to A: a
valid one is accepted, the same bytes again are a ``replay``, the same diff in a new
frame a ``duplicate``, a flipped signature ``bad_signature``, a diff stamped 10 minutes
ahead ``future``, a key without the team's membership proof ``not_member``. Through
all of it A answers ``/healthz``, MCP ``recall``, and still gossips to B.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import httpx
import pytest

from mesh.identity import NodeIdentity
from mesh.team import AUTH_NONE, AUTH_SIGNED, FRAME_VERSION, FrameAuth, Team
from mesh.wire import CellPayload, Envelope, MsgType, decode_envelope, encode_envelope, sign_diff
from node.embedding.hashed import HashedEmbedder

from .cluster import (
    Lab, MeshNode, team_of, wait_beacons_known, wait_connected, wait_frames_handled, wait_outbox_idle, wait_until,
)  # fmt: skip


FRAMES = "/mesh/v1/frames"
INTEREST = "pgvector storage backend database"
DECISION = "Use pgvector as the storage backend database for V1."


def post_frame(node: MeshNode, body: bytes, **kwargs) -> httpx.Response:
    return httpx.post(f"http://{node.mesh_address}{FRAMES}", content=body, timeout=30.0, trust_env=False,
                      headers={"content-type": "application/octet-stream"}, **kwargs)  # fmt: skip


def drops(node: MeshNode) -> dict[str, int]:
    return node.peers()["drops"]


def wait_drop(node: MeshNode, reason: str, before: dict[str, int], count: int = 1) -> None:
    """The engine handles frames asynchronously after the 202: wait for the counter."""
    wait_until(lambda: drops(node).get(reason, 0) >= before.get(reason, 0) + count, 5.0,
               message=lambda: f"{reason} +{count} on {node.name}: before {before}, now {drops(node)}")  # fmt: skip


class Insider:
    """Frames as a member would make them: the team key, a fresh node identity."""

    def __init__(self, team: Team, sender_address: str = "127.0.0.1:1") -> None:
        self.team = team
        self.identity = NodeIdentity.generate()
        self.proof = team.membership_proof(self.identity.public_key)
        self.address = sender_address  # nothing listens: A's acks to it fail, harmlessly
        self.seq = 0

    def cell_diff(self, content: str, *, ts: int | None = None):
        self.seq += 1
        now = int(time.time() * 1000)
        embedder = HashedEmbedder()
        payload = CellPayload(
            node_id=str(uuid.uuid4()), tenant_id=self.team.team_id, source_agent="insider-agent", content=content,
            cell_type="Fact", salience=0.5, created_at=now, embedding=embedder.embed([content])[0],
            embedding_space=embedder.space,
        )  # fmt: skip
        return sign_diff(payload, origin=self.identity.node_id, seq=self.seq, ts=ts or now,
                         sign=self.identity.sign, hops=1, ttl=2)  # fmt: skip

    def frame(self, *diffs, sent_at: int | None = None, proof: bytes | None = None) -> bytes:
        keys = {self.identity.node_id: (self.identity.public_key, proof or self.proof)}
        env = Envelope(MsgType.DATA, sent_at or int(time.time() * 1000), self.address, keys, tuple(diffs),
                       batch_id=self.seq)  # fmt: skip
        signed = FrameAuth(AUTH_SIGNED, self.identity.sign)  # its own key vouches for the sender id
        return self.team.sealer().seal(self.identity.node_id, encode_envelope(env), signed)


@pytest.fixture
def nodes(lab: Lab):
    a, b = lab.team(["a", "b"])
    (outsider,) = lab.team(["outsider"])
    a.start()
    lab.start_all([b, outsider], peers=[a.mesh_address])
    wait_connected([a, b])
    return a, b, outsider


def test_outsider_can_neither_read_nor_inject_and_garbage_is_counted(nodes) -> None:
    a, b, outsider = nodes
    key_a, _ = a.add_agent("alice")
    key_b, _ = b.add_agent("bob")
    key_o, _ = outsider.add_agent("mallory")

    # -- the outsider: no reading --------------------------------------------------------
    for node, key in ((b, key_b), (outsider, key_o)):
        node.rest("POST", "/v1/beacons", key, json={"query": INTEREST}, expect=201)
    a.rest("POST", "/v1/beacons", key_a, json={"query": "outsider injected rumour"}, expect=201)
    wait_beacons_known(a, 1)  # B's; never the outsider's
    stored = a.rest("POST", "/v1/cells", key_a, json={"content": DECISION, "cell_type": "Decision"}, expect=201)
    wait_until(lambda: b.rest("GET", "/v1/inbox", key_b)["diffs"], 5.0, message="the decision at B")

    # -- the outsider: no injecting ------------------------------------------------------
    outsider.rest("POST", "/v1/cells", key_o, expect=201,
                  json={"content": "outsider injected rumour: drop the database", "cell_type": "Fact"})  # fmt: skip
    # Nothing to wait for: the outsider knows no beacon of ours, so the rumour is sent nowhere,
    # and what it does send A cannot open.
    assert wait_outbox_idle(outsider)["data_diffs_sent"] == 0
    wait_outbox_idle(a)  # and the decision went to B alone, acknowledged
    wait_until(lambda: drops(a).get("decrypt_failed", 0) >= 1, 30.0, message="the outsider's frames refused at A")
    wait_frames_handled(a)
    assert outsider.rest("GET", "/v1/inbox", key_o)["diffs"] == []
    assert a.rest("GET", "/v1/inbox", key_a)["diffs"] == []
    found = a.rest("POST", "/v1/search", key_a, json={"query": "outsider injected rumour drop the database"})
    assert all("outsider" not in hit["content"] for hit in found["results"]), found
    status = json.loads(a.cli("peers", "--json"))  # what `hyphae peers --json` shows
    assert outsider.node_id not in {p["node_id"] for p in status["peers"]}, status["peers"]
    assert status["drops"].get("decrypt_failed", 0) >= 1, status["drops"]
    as_agent = a.rest("GET", "/v1/peers", key_a)  # the same counters, for any agent of the node
    assert as_agent["drops"].get("decrypt_failed", 0) >= 1
    assert outsider.node_id not in {p["node_id"] for p in as_agent["peers"]}
    assert a.peers()["beacons_known"] == 1
    o_status = outsider.peers()
    assert o_status["peers"] == [] and o_status["cells_delivered"] == 0 and o_status["beacons_known"] == 0
    assert o_status["frames_received"] == 0  # A never answered it
    print(f"\nA's drops after the outsider: {drops(a)}")

    # -- garbage on the mesh port --------------------------------------------------------
    rng = os.urandom
    before = drops(a)
    assert post_frame(a, rng(10)).status_code == 202  # shorter than a frame header
    wait_drop(a, "malformed", before)
    before = drops(a)
    assert post_frame(a, b"\x07" + rng(999)).status_code == 202  # a frame version we do not speak
    wait_drop(a, "bad_version", before)
    before = drops(a)
    assert post_frame(a, b"\x01" + rng(999)).status_code == 202  # protocol 1: its sender needs upgrading
    wait_drop(a, "old_version", before)
    before = drops(a)
    not_sealed = bytes([FRAME_VERSION]) + rng(28) + bytes([AUTH_NONE]) + rng(970)  # our version, not the team's
    assert post_frame(a, not_sealed).status_code == 202
    wait_drop(a, "decrypt_failed", before)

    team = Team(*team_of(a.home))
    insider = Insider(team)
    valid = insider.frame(insider.cell_diff("insider fact one"))
    before = drops(a)
    assert post_frame(a, valid[: len(valid) // 2]).status_code == 202  # truncated in flight
    assert post_frame(a, valid[:-1]).status_code == 202
    wait_drop(a, "decrypt_failed", before, 2)
    before = drops(a)
    junk = team.sealer().seal(insider.identity.node_id, b"\x93\xc1\xff not msgpack")  # sealed, undecodable
    assert post_frame(a, junk).status_code == 202
    wait_drop(a, "malformed", before)

    runtime_before = a.peers()["runtime"].get("http_oversized", 0)
    huge = rng(4 * 1024 * 1024 + 1)  # one byte over max_frame_bytes
    response = post_frame(a, huge)
    assert response.status_code == 413, response.text

    def chunks():
        for _ in range(5):
            yield rng(1024 * 1024)

    response = post_frame(a, chunks())  # no Content-Length: refused while streaming in
    assert response.status_code == 413
    assert a.peers()["runtime"]["http_oversized"] == runtime_before + 2
    assert httpx.get(f"http://{a.mesh_address}/mesh/v1/nope", trust_env=False).status_code == 404
    assert httpx.get(f"http://{a.mesh_address}{FRAMES}", trust_env=False).status_code == 405

    # -- insider forgeries -----------------------------------------------------------------
    accepted = a.peers()["cells_delivered"]
    assert post_frame(a, valid).status_code in (200, 202)  # a member's valid frame: accepted (200 carries its ack)
    wait_until(lambda: a.peers()["cells_delivered"] == accepted + 1, 5.0, message="the insider's valid frame")
    before = drops(a)
    assert post_frame(a, valid).status_code == 202  # the same bytes again
    wait_drop(a, "replay", before)

    # the same diff in a fresh frame (new nonce): a duplicate, not a second cell
    (valid_diff,) = decode_diffs(team, valid)
    before = drops(a)
    assert post_frame(a, insider.frame(valid_diff)).status_code in (200, 202)
    wait_drop(a, "duplicate", before)

    diff = insider.cell_diff("insider fact with a forged signature")
    forged = type(diff)(diff.kind, diff.origin, diff.seq, diff.ts, diff.payload, diff.signed,
                        bytes([diff.signature[0] ^ 0x01]) + diff.signature[1:], diff.hops, diff.ttl)  # fmt: skip
    before = drops(a)
    assert post_frame(a, insider.frame(forged)).status_code in (200, 202)
    wait_drop(a, "bad_signature", before)

    future = insider.cell_diff("insider fact from the future", ts=int(time.time() * 1000) + 20 * 60_000)
    before = drops(a)
    assert post_frame(a, insider.frame(future)).status_code in (200, 202)
    wait_drop(a, "future", before)
    before = drops(a)  # a whole frame stamped ahead
    ahead = insider.frame(insider.cell_diff("late"), sent_at=int(time.time() * 1000) + 20 * 60_000)
    assert post_frame(a, ahead).status_code == 202
    wait_drop(a, "future", before)

    stranger = Insider(team)  # holds the frame key, but its membership proof is not the team's
    before = drops(a)
    bad_proof = Team.create().membership_proof(stranger.identity.public_key)
    assert post_frame(a, stranger.frame(stranger.cell_diff("not vouched for"), proof=bad_proof)).status_code == 202
    wait_drop(a, "not_member", before)
    assert a.peers()["cells_delivered"] == accepted + 1  # only the one valid frame got through
    print(f"A's drops after the abuse: {drops(a)}; runtime {a.peers()['runtime']}")

    # -- A keeps serving -----------------------------------------------------------------
    assert httpx.get(f"{a.api_url}/healthz", trust_env=False).status_code == 200
    hits = a.mcp(key_a).call("recall", {"query": DECISION, "k": 1})["results"]
    assert hits[0]["node_id"] == stored["node_id"]
    again = a.rest("POST", "/v1/cells", key_a, expect=201,
                   json={"content": "Keep pgvector as the storage backend database after the audit.",
                         "cell_type": "Decision"})  # fmt: skip
    wait_until(lambda: again["node_id"] in {d["node_id"] for d in b.rest("GET", "/v1/inbox", key_b)["diffs"]}, 5.0,
               message="A still gossips to B")  # fmt: skip
    assert outsider.rest("GET", "/v1/inbox", key_o)["diffs"] == []
    assert a.running and b.running and outsider.running


def decode_diffs(team: Team, frame: bytes):
    _, _, plaintext = team.sealer().open(frame)
    return decode_envelope(plaintext).diffs
