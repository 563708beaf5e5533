"""The wire format: canonical signed diffs, envelopes, and a strict decoder."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.errors import Reason, WireError
from mesh.haves import MAX_HAVE_BYTES, MAX_HAVE_ORIGINS, HaveSet
from mesh.identity import NodeIdentity
from mesh.told import MAX_TOLD, TOLD_ID_BYTES
from mesh.wire import (
    BeaconPayload, CellPayload, DiffKind, Envelope, MsgType, PeerPayload, ScenePayload, TombstonePayload,
    UnbeaconPayload, WireLimits, encode_envelope, sign_diff,
)  # fmt: skip

from .shared_decoding import decode_envelope, decode_signed, share_data_payloads

ME = NodeIdentity.generate()
VEC = np.linspace(-1, 1, 8, dtype=np.float32)


def cell(**changes) -> CellPayload:
    fields = dict(
        node_id="c1", tenant_id="t", source_agent="a", content="use pgvector", cell_type="Decision",
        salience=0.8, created_at=1000, project="p", scene_id="s", source_ref={"kind": "file", "locator": "x.py"},
        metadata={"b": 1, "a": [1, 2]}, embedding=VEC, embedding_space="space",
    )  # fmt: skip
    fields.update(changes)
    return CellPayload(**fields)


PAYLOADS = [
    cell(),
    cell(project=None, scene_id=None, source_ref=None, metadata={}),
    TombstonePayload("c1", "t", 2000, ME.node_id, 3),
    BeaconPayload("b1", "t", "a", "which db", 0.4, ("Decision",), "p", 0.2, 99, VEC, "space", ("p",)),
    BeaconPayload("b2", "t", "a", "anything", 0.4, embedding=VEC, embedding_space="space"),
    UnbeaconPayload("b1", "t"),
    ScenePayload("s1", "t", {"title": "x", "nested": {"z": 1, "y": None}}),
    PeerPayload("127.0.0.1:7979"),
]


def signed(payload, seq=1, ts=1000, hops=0, ttl=0):
    return sign_diff(payload, origin=ME.node_id, seq=seq, ts=ts, sign=ME.sign, hops=hops, ttl=ttl)


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_every_kind_round_trips_through_an_envelope(payload):
    diff = signed(payload, hops=2, ttl=3)
    env = Envelope(MsgType.DATA, 5, "me", {ME.node_id: (ME.public_key, bytes(32))}, (diff,), batch_id=9)
    back = decode_envelope(encode_envelope(env))
    (got,) = back.diffs
    assert got.payload == payload
    assert (got.kind, got.origin, got.seq, got.ts, got.hops, got.ttl) == (diff.kind, ME.node_id, 1, 1000, 2, 3)
    assert got.signed == diff.signed and NodeIdentity.verify(ME.public_key, got.signature, got.signed)
    assert back.keys == env.keys and back.batch_id == 9


def test_routing_fields_are_outside_the_signature():
    diff = signed(cell(), hops=1, ttl=5)
    moved = diff.routed(hops=2, ttl=4)
    assert moved.signed == diff.signed and moved.signature == diff.signature


def test_encoding_is_canonical():
    a = signed(cell(metadata={"x": 1, "y": {"b": 2, "a": 1}}))
    b = signed(cell(metadata={"y": {"a": 1, "b": 2}, "x": 1}))
    assert a.signed == b.signed


@pytest.mark.parametrize(
    "env",
    [
        Envelope(MsgType.ACK, 1, "a", acks=(1, 2, 3)),
        Envelope(MsgType.DATA, 1, "a", batch_id=9),
        Envelope(MsgType.DATA, 1, "a", batch_id=9, acks=(4, 5)),  # acks riding on a data frame
        Envelope(MsgType.GOSSIP, 1, "a", digest={ME.node_id: 7}, reply_wanted=True),
        Envelope(MsgType.GOSSIP, 1, "a", digest=None),
        Envelope(MsgType.REPAIR_REQUEST, 1, "a", request_id=4, since=10, limit=100, version=3),
        Envelope(
            MsgType.REPAIR_REQUEST, 1, "a", request_id=4, since=10, limit=100, version=3,
            haves=HaveSet.of([(ME.node_id, 3), (ME.node_id, 40), ("ab" * 16, 1)]),
        ),  # fmt: skip
        Envelope(MsgType.REPAIR_REPLY, 1, "a", request_id=4, upto=20, more=True, ready=False),
        Envelope(MsgType.PING, 1, "a", nonce=42),
        Envelope(MsgType.PONG, 1, "a", nonce=42),
    ],
    ids=lambda e: e.type.name,
)
def test_every_message_type_round_trips(env):
    assert decode_envelope(encode_envelope(env)) == env


def _raw(diff_list, extra=(1,), mtype=1, version=1):
    return msgpack.packb([version, mtype, 1, "a", {}, diff_list, list(extra)], use_bin_type=True)


def _reason(data, limits=WireLimits()) -> str:
    with pytest.raises(WireError) as caught:
        decode_envelope(data, limits)
    return caught.value.reason


def test_limits_are_enforced():
    diff = signed(cell())
    item = [diff.signed, diff.signature, 0, 0]
    assert _reason(_raw([item] * 3), WireLimits(max_diffs=2)) == Reason.TOO_MANY_DIFFS
    assert _reason(_raw([item]), WireLimits(max_frame_bytes=100)) == Reason.OVERSIZED
    big = signed(cell(content="x" * 70_000))
    assert _reason(_raw([[big.signed, big.signature, 0, 0]])) == Reason.CONTENT_TOO_LARGE
    fat = signed(cell(metadata={"k": "v" * 20_000}))
    assert _reason(_raw([[fat.signed, fat.signature, 0, 0]])) == Reason.CONTENT_TOO_LARGE
    wide = signed(cell(embedding=np.ones(5000, np.float32)))
    assert _reason(_raw([[wide.signed, wide.signature, 0, 0]])) == Reason.CONTENT_TOO_LARGE


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", Reason.MALFORMED),
        (b"\xc1", Reason.MALFORMED),
        (msgpack.packb({"a": 1}), Reason.MALFORMED),
        (_raw([], version=2), Reason.BAD_VERSION),
        (_raw([], mtype=99), Reason.MALFORMED),
        (_raw([], extra=()), Reason.MALFORMED),
        (_raw([], extra=(1, [2], 3)), Reason.MALFORMED),
        (_raw([], extra=(1, ["2"])), Reason.MALFORMED),
        (_raw([], extra=(1, list(range(300)))), Reason.TOO_MANY_DIFFS),
        (_raw([["x", b"", 0, 0]]), Reason.MALFORMED),
        (_raw([[b"\x93\x01\x02\x03", bytes(64), 0, 0]]), Reason.MALFORMED),
    ],
)
def test_malformed_input_is_one_error_type(data, reason):
    assert _reason(data) == reason


def test_a_have_set_is_bounded_and_well_formed():
    def request(haves):
        return _raw([], extra=(1, 0, 10, 0, haves), mtype=int(MsgType.REPAIR_REQUEST))

    origin = bytes.fromhex(ME.node_id)
    assert decode_envelope(request([[origin, 5, b"\x01"]])).haves == HaveSet({ME.node_id: (5, b"\x01")})
    assert _reason(request([[origin, 0, bytes(MAX_HAVE_BYTES + 1)]])) == Reason.OVERSIZED
    assert _reason(request([[origin, -1, b"\x01"]])) == Reason.OVERSIZED
    assert _reason(request([[origin, 0, b"\x01"]] * (MAX_HAVE_ORIGINS + 1))) in (Reason.OVERSIZED, Reason.MALFORMED)
    assert _reason(request([[b"short", 0, b"\x01"]])) == Reason.MALFORMED
    assert _reason(request(b"\x00" * 12)) == Reason.MALFORMED  # the old list of keys


def test_bad_fields_inside_a_signed_diff():
    def body_with(**changes):
        p = cell()
        b = [p.node_id, p.tenant_id, p.source_agent, p.content, p.cell_type, p.salience, p.created_at,
             p.project, p.scene_id, None, {}, VEC.tobytes(), "space"]  # fmt: skip
        for index, value in changes.items():
            b[int(index[1:])] = value
        return msgpack.packb([1, 1, bytes(16), 1, 1, b], use_bin_type=True)

    for bad in ({"i5": 1.5}, {"i5": float("nan")}, {"i11": b"abc"}, {"i3": 7}, {"i6": "soon"},
                {"i11": np.array([np.inf], np.float32).tobytes()}):  # fmt: skip
        with pytest.raises(WireError):
            decode_signed(body_with(**bad), bytes(64), 0, 0)
    with pytest.raises(WireError):
        decode_signed(body_with(), bytes(10), 0, 0)  # signature length
    with pytest.raises(WireError):
        decode_signed(msgpack.packb([1, 1, bytes(16), 0, 1, []]), bytes(64), 0, 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_wire_errors(data):
    try:
        decode_envelope(data)
    except WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_envelopes_raise_only_wire_errors(data):
    diff = signed(PAYLOADS[data.draw(st.integers(0, len(PAYLOADS) - 1))])
    raw = bytearray(encode_envelope(Envelope(MsgType.DATA, 1, "a", {}, (diff,), batch_id=1)))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_envelope(bytes(raw))
    except WireError:
        pass


def test_kinds_are_stable():
    assert [k.name for k in DiffKind] == ["CELL", "TOMBSTONE", "BEACON", "UNBEACON", "SCENE", "PEER"]


def test_cell_decodings_are_shared_only_inside_the_simulators_context():
    diff = signed(cell(content="shared between simulated engines"), seq=7)
    again = lambda hops: decode_signed(diff.signed, diff.signature, hops, 0)  # noqa: E731
    assert again(1).payload is not again(1).payload  # a node's store may edit what it is handed
    with share_data_payloads():
        first, relayed = again(1), again(2)
        assert relayed.payload is first.payload and relayed.payload == diff.payload
        assert (relayed.hops, first.hops) == (2, 1)  # the routing fields are still read per frame
    assert again(1).payload is not first.payload  # forgotten when the context ends


def test_overlapping_sharing_contexts_share_until_the_last_one_ends():
    # A sweep may run two simulations at once on one worker's threads: the first to end
    # must not stop the other's sharing, nor clear the cache under it.
    diff = signed(cell(content="two runs at once"), seq=8)
    again = lambda: decode_signed(diff.signed, diff.signature, 1, 0)  # noqa: E731
    first = share_data_payloads()
    second = share_data_payloads()
    first.__enter__()
    second.__enter__()
    shared = again()
    first.__exit__(None, None, None)
    assert again().payload is shared.payload
    second.__exit__(None, None, None)
    assert again().payload is not shared.payload


# -- decode_signed at its edges: the told list, the header, and a control diff decoded again ------

TOLD = TOLD_ID_BYTES


def _header(fmt=1, kind=int(DiffKind.PEER), seq=1, body=None) -> bytes:
    # An address no other test signs: these bytes must not be remembered from an earlier decode.
    return msgpack.packb([fmt, kind, bytes.fromhex(ME.node_id), seq, 1000, body or ["10.98.76.54:1", ""]],
                         use_bin_type=True)  # fmt: skip


def test_a_diffs_told_list_is_kept_and_checked():
    diff = signed(cell(node_id="told-cell"))
    two = bytes(range(2 * TOLD))
    assert decode_signed(diff.signed, diff.signature, 1, 2, told=two).told == two
    assert decode_signed(diff.signed, diff.signature, 1, 2, told=bytes(MAX_TOLD * TOLD)).told == bytes(MAX_TOLD * TOLD)
    for bad in (bytes(TOLD - 1), bytes(TOLD + 1), bytes((MAX_TOLD + 1) * TOLD), "x" * TOLD, [1, 2]):
        with pytest.raises(WireError) as caught:
            decode_signed(diff.signed, diff.signature, 1, 2, told=bad)
        assert caught.value.reason == Reason.MALFORMED, bad


@pytest.mark.parametrize("signed_bytes, hops, ttl, reason", [
    (_header(fmt=2), 0, 0, Reason.BAD_VERSION),
    (_header(seq=0), 0, 0, Reason.MALFORMED),
    (_header(), -1, 0, Reason.MALFORMED),
    (_header(), 0, -1, Reason.MALFORMED),
    (_header(kind=int(DiffKind.SCENE), body=["s1", "t", {1: "an integer key"}]), 0, 0, Reason.MALFORMED),
])  # fmt: skip
def test_a_header_out_of_bounds_is_refused_with_its_reason(signed_bytes, hops, ttl, reason):
    with pytest.raises(WireError) as caught:
        decode_signed(signed_bytes, bytes(64), hops, ttl)
    assert caught.value.reason == reason


def test_a_control_diff_decoded_again_is_decoded_as_given_not_as_remembered():
    """Control diffs (peer, beacon, unbeacon) are remembered by their signed bytes so repeated
    gossip decodes once; the second decode still takes its own routing fields and signature,
    checks them, and honours the limits it is given."""
    diff = signed(BeaconPayload("b-cached", "t", "a", "which database", 0.4, embedding=VEC, embedding_space="space"))
    first = decode_signed(diff.signed, diff.signature, 1, 2)
    again = decode_signed(diff.signed, diff.signature, 1, 5, told=bytes(TOLD))
    fields = ("kind", "origin", "seq", "ts", "payload", "signed", "signature")
    assert [getattr(again, f) for f in fields] == [getattr(first, f) for f in fields]
    assert (again.hops, again.ttl, again.told) == (1, 5, bytes(TOLD))
    assert decode_signed(diff.signed, diff.signature, 1, 5, told=bytes(TOLD)) is again  # the last one, shared
    assert decode_signed(diff.signed, diff.signature, 0, 0).hops == 0
    flipped = bytes([diff.signature[0] ^ 1]) + diff.signature[1:]
    assert decode_signed(diff.signed, flipped, 1, 5).signature == flipped  # never swapped for the good one
    for hops, ttl, signature in ((-1, 0, diff.signature), (0, -1, diff.signature), (True, 5, diff.signature),
                                 (1, 5, diff.signature[:10])):  # fmt: skip
        with pytest.raises(WireError):
            decode_signed(diff.signed, signature, hops, ttl)
    with pytest.raises(WireError) as caught:  # the same bytes under stricter limits
        decode_signed(diff.signed, diff.signature, 1, 2, WireLimits(max_text_chars=5))
    assert caught.value.reason == Reason.MALFORMED


def test_a_forged_signature_on_a_known_control_diff_is_refused_by_the_engine():
    from mesh.events import FrameReceived, Started
    from mesh.team import AUTH_SIGNED, FrameAuth, Team
    from mesh.testing import make_engine
    from node.energy import EnergyModel

    team = Team.create()
    first_contact = FrameAuth(AUTH_SIGNED, ME.sign)  # frames carry their sender's own tag
    bob = make_engine("bob", team, EnergyModel())
    bob.handle(Started(), 1_780_000_000_000)
    keys = {ME.node_id: (ME.public_key, team.membership_proof(ME.public_key))}
    good = sign_diff(PeerPayload("127.0.0.1:7979"), origin=ME.node_id, seq=1, ts=1_780_000_000_000, sign=ME.sign)
    forged = sign_diff(PeerPayload("127.0.0.1:6666"), origin=ME.node_id, seq=2, ts=1_780_000_000_000, sign=ME.sign)
    decode_signed(forged.signed, forged.signature, 0, 0)  # known bytes, as after an earlier gossip round
    forged = type(forged)(forged.kind, forged.origin, forged.seq, forged.ts, forged.payload, forged.signed,
                          bytes(64), forged.hops, forged.ttl)  # fmt: skip
    for nonce, diff in enumerate((good, forged), 1):
        env = Envelope(MsgType.GOSSIP, 1_780_000_000_000, "127.0.0.1:7979", keys, (diff,))
        frame = team.sealer().seal(ME.node_id, encode_envelope(env), first_contact)
        bob.handle(FrameReceived("x", frame), 1_780_000_000_000 + nonce)
    assert dict(bob.counters.drops) == {Reason.BAD_SIGNATURE: 1}
