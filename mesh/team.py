"""Team membership and frame sealing.

A team is an id and a 32-byte secret key, shared through a join token
(``hyphae1.`` + base64url(msgpack([team_id, team_key]))). The key does these jobs:

* membership proof: ``HMAC-SHA256(team_key, "hyphae-member-v1" || node public key)``;
  a diff whose origin cannot show one is dropped as ``not_member``;
* frame key: ChaCha20-Poly1305 under ``HKDF-SHA256(team_key, salt=team_id)``, so
  outsiders can neither read nor inject mesh traffic;
* pair-key salt: the key each two members agree between themselves (:mod:`mesh.frame_auth`)
  is derived under :meth:`Team.pair_key_salt`, so a rotation renews those keys too;
* the zeroconf TXT record carries only :attr:`Team.id_hash`, never the key.

Rotation (``hyphae team rotate [--remove NODE_ID ...]``): :meth:`Team.rotated` keeps the
team id (the tenant, so memories stay where they are) and draws a fresh key. A node
that keeps the old key opens no frame sealed under the new one and shows no valid
proof, so it can neither read nor inject. The ids named with ``--remove`` also travel in
the new join token (``[team_id, team_key, [removed ids]]``; the two-element form stays
valid) and are refused as members even with a valid proof, so a removed node stays out
if the new token leaks to it.

A sealed frame (protocol 2) is::

    version(1) || sender node id(16) || nonce(12) || auth(1) || ciphertext+tag(16) || sender tag

The header (the first 30 bytes) is the AEAD's associated data. The team key keeps
outsiders out, but every member holds it: it cannot say *which* member sealed a frame.
The sender tag does: per ``auth``, a 16-byte MAC under the key only the sender and the
recipient hold (:data:`AUTH_PAIR`), or the sender's 64-byte Ed25519 signature
(:data:`AUTH_SIGNED`, for a recipient whose key the sender does not know yet), over
everything before it. :class:`FrameSealer` only lays the tag out; who checks it with which
key is :mod:`mesh.frame_auth`'s. A frame of protocol 1 (no sender tag) is refused as
``old_version``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import JoinTokenError, Reason, SealError
from .identity import node_id_for

__all__ = [
    "Team", "FrameSealer", "FrameAuth", "Unsealed", "TOKEN_PREFIX", "FRAME_VERSION", "FRAME_OVERHEAD",
    "AUTH_NONE", "AUTH_PAIR", "AUTH_SIGNED", "SENDER_TAG_BYTES",
]  # fmt: skip

TOKEN_PREFIX = "hyphae1."
FRAME_VERSION = 2  # 2: frames carry a sender tag (1: the team key alone)
AUTH_NONE, AUTH_PAIR, AUTH_SIGNED = 0, 1, 2  # what vouches for the sender: nothing, a pair MAC, a signature
SENDER_TAG_BYTES = {AUTH_NONE: 0, AUTH_PAIR: 16, AUTH_SIGNED: 64}
_NODE_ID_BYTES = 16
_NONCE_BYTES = 12
_HEADER_BYTES = 2 + _NODE_ID_BYTES + _NONCE_BYTES
# header + Poly1305 tag + a pair tag (the usual frame; a signed one is 48 bytes longer)
FRAME_OVERHEAD = _HEADER_BYTES + 16 + SENDER_TAG_BYTES[AUTH_PAIR]
_MEMBER_LABEL = b"hyphae-member-v1"
_FRAME_KEY_INFO = b"hyphae mesh frame key v1"
_PAIR_SALT_INFO = b"hyphae mesh pair key v1"


class FrameAuth(NamedTuple):
    """How a sender vouches for a frame: ``kind`` (:data:`AUTH_PAIR` or :data:`AUTH_SIGNED`),
    and ``tag`` over the frame's bytes before the tag (of ``SENDER_TAG_BYTES[kind]`` bytes).
    :meth:`FrameSealer.seal` takes anything with these two (mesh.frame_auth's pair tags)."""

    kind: int
    tag: Callable[[bytes], bytes]


class Unsealed(NamedTuple):
    """A frame opened under the team key; nothing yet says who sealed it (see :mod:`mesh.frame_auth`)."""

    sender_id: str
    nonce: bytes
    plaintext: bytes
    auth: int  # AUTH_NONE, AUTH_PAIR or AUTH_SIGNED
    covered: bytes | memoryview  # what the sender tag covers: everything before it
    tag: bytes


@dataclasses.dataclass(frozen=True)
class Team:
    """A team: its id and 32-byte key. ``repr`` never shows the key."""

    team_id: str
    team_key: bytes = dataclasses.field(repr=False)
    removed: frozenset[str] = frozenset()  # node ids refused as members (``team rotate --remove``)

    def __post_init__(self) -> None:
        if not self.team_id or len(self.team_id) > 128:
            raise ValueError("team_id must be 1 to 128 characters")
        if len(self.team_key) != 32:
            raise ValueError(f"team_key must be 32 bytes, not {len(self.team_key)}")
        object.__setattr__(self, "removed", frozenset(self.removed))
        for node_id in self.removed:
            if not _is_node_id(node_id):
                raise ValueError(f"a removed node id must be 32 hex digits, not {node_id!r}")

    @classmethod
    def create(cls) -> "Team":
        return cls(team_id=secrets.token_hex(8), team_key=secrets.token_bytes(32))

    def rotated(self, remove: frozenset[str] | set[str] | tuple[str, ...] = ()) -> "Team":
        """The same team under a fresh key, with ``remove`` added to the removed nodes."""
        return Team(self.team_id, secrets.token_bytes(32), self.removed | frozenset(remove))

    # -- join tokens ---------------------------------------------------------

    def join_token(self) -> str:
        fields: list = [self.team_id, self.team_key]
        if self.removed:
            fields.append([bytes.fromhex(node_id) for node_id in sorted(self.removed)])
        packed = msgpack.packb(fields, use_bin_type=True)
        return TOKEN_PREFIX + base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")

    @classmethod
    def from_join_token(cls, token: str) -> "Team":
        """Decode a join token; raises :class:`JoinTokenError` saying what is wrong."""
        if not isinstance(token, str):
            raise JoinTokenError(Reason.TOKEN_FORMAT, "a join token is a string")
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX):
            raise JoinTokenError(
                Reason.TOKEN_PREFIX, f"not a Hyphae join token: it must start with {TOKEN_PREFIX!r}"
            )
        body = token[len(TOKEN_PREFIX) :]
        try:
            raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise JoinTokenError(Reason.TOKEN_ENCODING, "join token is damaged: not valid base64url") from None
        try:
            team_id, team_key, *rest = msgpack.unpackb(raw, raw=False)
        except Exception:
            raise JoinTokenError(Reason.TOKEN_FORMAT, "join token is damaged: unreadable contents") from None
        removed = rest[0] if len(rest) == 1 else []
        if (
            not isinstance(team_id, str) or not isinstance(team_key, bytes) or len(rest) > 1
            or not isinstance(removed, list) or not all(isinstance(r, bytes) and len(r) == 16 for r in removed)
        ):  # fmt: skip
            raise JoinTokenError(Reason.TOKEN_FORMAT, "join token is damaged: wrong field types")
        try:
            return cls(team_id, team_key, frozenset(r.hex() for r in removed))
        except ValueError as exc:
            raise JoinTokenError(Reason.TOKEN_FORMAT, f"join token is damaged: {exc}") from None

    # -- derived values ------------------------------------------------------

    @property
    def id_hash(self) -> str:
        """What discovery may publish: a hash of the team id, never the key."""
        return hashlib.sha256(b"hyphae-team-id" + self.team_id.encode()).hexdigest()[:16]

    def membership_proof(self, public_key: bytes) -> bytes:
        return _membership_proof(self.team_key, public_key)

    def is_member(self, public_key: bytes, proof: bytes) -> bool:
        if self.removed and node_id_for(public_key) in self.removed:
            return False
        return hmac.compare_digest(self.membership_proof(public_key), proof)

    def frame_key(self) -> bytes:
        return HKDF(
            algorithm=hashes.SHA256(), length=32, salt=self.team_id.encode(), info=_FRAME_KEY_INFO
        ).derive(self.team_key)

    def sealer(self) -> "FrameSealer":
        return FrameSealer(self.frame_key())

    def pair_key_salt(self) -> bytes:
        """What every pair key of this team is derived under (:mod:`mesh.frame_auth`)."""
        return HKDF(
            algorithm=hashes.SHA256(), length=32, salt=self.team_id.encode(), info=_PAIR_SALT_INFO
        ).derive(self.team_key)


def _is_node_id(text: object) -> bool:
    return isinstance(text, str) and len(text) == 2 * _NODE_ID_BYTES and all(c in "0123456789abcdef" for c in text)


class FrameSealer:
    """Seals and opens frames with ChaCha20-Poly1305 and a random 12-byte nonce."""

    def __init__(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)

    def seal(self, sender_id: str, plaintext: bytes, auth: FrameAuth | Any = None) -> bytes:
        """A frame from ``sender_id``, its sender tag made by ``auth`` (None: no tag, a frame
        no engine lets in; tests use it to reach the checks before that one)."""
        kind = AUTH_NONE if auth is None else auth.kind
        nonce = os.urandom(_NONCE_BYTES)
        header = bytes([FRAME_VERSION]) + bytes.fromhex(sender_id) + nonce + bytes([kind])
        body = header + self._aead.encrypt(nonce, plaintext, header)
        return body if auth is None else body + auth.tag(body)

    def unseal(self, frame: bytes) -> Unsealed:
        """Open a frame under the team key; raises :class:`SealError`."""
        version, kind, tag_bytes = _layout(frame)
        header = frame[:_HEADER_BYTES]
        nonce = header[1 + _NODE_ID_BYTES : 1 + _NODE_ID_BYTES + _NONCE_BYTES]
        end = len(frame) - tag_bytes
        try:
            plaintext = self._aead.decrypt(nonce, frame[_HEADER_BYTES:end], header)
        except InvalidTag:
            raise SealError(Reason.DECRYPT_FAILED, "frame does not open under the team key") from None
        covered = memoryview(frame)[:end] if tag_bytes else frame
        return Unsealed(header[1 : 1 + _NODE_ID_BYTES].hex(), nonce, plaintext, kind, covered, frame[end:])

    def protocol_1_sender(self, frame: bytes) -> str | None:
        """The sender id of a protocol-1 frame that opens under this team's key, else None.

        Protocol 1 sealed ``version(1) || sender id(16) || nonce(12) || ciphertext+tag`` under the
        same frame key, the header as associated data. Opening one says that a holder of the team
        key sent it (so an outsider cannot make a node log "upgrade X"); it still does not say
        which member, and nothing in it is let in: the frame stays dropped as ``old_version``."""
        header_bytes = 1 + _NODE_ID_BYTES + _NONCE_BYTES
        if len(frame) < header_bytes + 16 or frame[0] != 1:
            return None
        header = frame[:header_bytes]
        try:
            self._aead.decrypt(header[-_NONCE_BYTES:], frame[header_bytes:], header)
        except InvalidTag:
            return None
        return header[1 : 1 + _NODE_ID_BYTES].hex()

    def open(self, frame: bytes) -> tuple[str, bytes, bytes]:
        """``(sender_id, nonce, plaintext)`` (for a reader of frames); raises :class:`SealError`."""
        opened = self.unseal(frame)
        return opened.sender_id, opened.nonce, opened.plaintext


def _layout(frame: bytes) -> tuple[int, int, int]:
    """``(version, auth, sender tag bytes)`` of a frame, if it can be one of ours; else SealError."""
    if len(frame) < _HEADER_BYTES + 16:
        raise SealError(Reason.MALFORMED, "frame shorter than its header")
    version = frame[0]
    if version != FRAME_VERSION:
        if 0 < version < FRAME_VERSION:
            raise SealError(Reason.OLD_VERSION, f"frame of protocol {version}: its sender needs upgrading")
        raise SealError(Reason.BAD_VERSION, f"frame version {version}")
    kind = frame[_HEADER_BYTES - 1]
    tag_bytes = SENDER_TAG_BYTES.get(kind)
    if tag_bytes is None or len(frame) < _HEADER_BYTES + 16 + tag_bytes:
        raise SealError(Reason.MALFORMED, "an unknown sender tag, or a frame too short for it")
    return version, kind, tag_bytes


@functools.lru_cache(maxsize=1 << 15)
def _membership_proof(team_key: bytes, public_key: bytes) -> bytes:
    # Every node checks each member's proof once; a simulator's thousands of engines in one
    # process check the same few thousand, so the HMAC is computed once per key.
    return hmac.new(team_key, _MEMBER_LABEL + public_key, hashlib.sha256).digest()
