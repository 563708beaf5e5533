"""Teams: join tokens, membership proofs, sealed frames."""

from __future__ import annotations

import pytest

from mesh.errors import JoinTokenError, Reason, SealError
from mesh.identity import NodeIdentity
from mesh.team import AUTH_PAIR, FRAME_OVERHEAD, TOKEN_PREFIX, FrameAuth, Team


@pytest.fixture
def team() -> Team:
    return Team.create()


def test_join_token_round_trips(team):
    token = team.join_token()
    assert token.startswith(TOKEN_PREFIX)
    assert Team.from_join_token(token) == team
    assert Team.from_join_token(f"  {token}\n") == team


def test_repr_never_shows_the_key(team):
    assert team.team_key.hex() not in repr(team)
    assert team.team_key.hex() not in team.id_hash


@pytest.mark.parametrize(
    "token, reason",
    [
        ("hello", Reason.TOKEN_PREFIX),
        ("hyphae2.abc", Reason.TOKEN_PREFIX),
        ("hyphae1.!!!!", Reason.TOKEN_ENCODING),
        ("hyphae1.aGVsbG8", Reason.TOKEN_FORMAT),
        (TOKEN_PREFIX, Reason.TOKEN_FORMAT),
        (12, Reason.TOKEN_FORMAT),
    ],
)
def test_bad_join_tokens_say_what_is_wrong(token, reason):
    with pytest.raises(JoinTokenError) as caught:
        Team.from_join_token(token)
    assert caught.value.reason == reason


def test_a_token_with_a_short_key_is_refused():
    import base64

    import msgpack

    body = base64.urlsafe_b64encode(msgpack.packb(["t", b"short"])).decode().rstrip("=")
    with pytest.raises(JoinTokenError, match="32 bytes"):
        Team.from_join_token(TOKEN_PREFIX + body)


def test_membership_proof_holds_only_under_its_team(team):
    key = NodeIdentity.generate().public_key
    proof = team.membership_proof(key)
    assert team.is_member(key, proof)
    assert not Team.create().is_member(key, proof)
    assert not team.is_member(NodeIdentity.generate().public_key, proof)


def test_frames_open_under_the_same_team_only(team):
    node = NodeIdentity.generate()
    frame = team.sealer().seal(node.node_id, b"secret plans", FrameAuth(AUTH_PAIR, lambda covered: bytes(16)))
    assert b"secret plans" not in frame
    assert len(frame) == len(b"secret plans") + FRAME_OVERHEAD  # with the usual sender tag
    sender, nonce, plaintext = team.sealer().open(frame)
    assert (sender, plaintext, len(nonce)) == (node.node_id, b"secret plans", 12)
    with pytest.raises(SealError) as caught:
        Team.create().sealer().open(frame)
    assert caught.value.reason == Reason.DECRYPT_FAILED


def test_the_sender_id_is_bound_to_the_frame(team):
    frame = bytearray(team.sealer().seal(NodeIdentity.generate().node_id, b"x"))
    frame[3] ^= 1  # inside the sender id
    with pytest.raises(SealError, match="does not open"):
        team.sealer().open(bytes(frame))


def test_nonces_are_fresh(team):
    sealer = team.sealer()
    node_id = NodeIdentity.generate().node_id
    assert sealer.seal(node_id, b"x") != sealer.seal(node_id, b"x")


@pytest.mark.parametrize("frame, reason", [(b"", Reason.MALFORMED), (b"\x09" + bytes(60), Reason.BAD_VERSION)])
def test_short_or_foreign_frames(team, frame, reason):
    with pytest.raises(SealError) as caught:
        team.sealer().open(frame)
    assert caught.value.reason == reason
