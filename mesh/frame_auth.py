"""Sender binding: every frame proves which member sealed it, with a key only that member holds.

Why
---
Every member holds the team key. Its AEAD (:mod:`mesh.team`) keeps outsiders out but cannot
tell members apart, so under protocol 1 any member could seal a frame in another's name: one
forged PING "from B", stamped minutes ahead, moved A's estimate of B's clock so far that all of
B's real frames were dropped as replays. Since protocol 2 each frame ends in a *sender tag*
made with a key of its sender's, checked (:meth:`SenderBinding.vouches`) before the frame may
touch anything: the replay window and clock estimate, liveness, the peer's address.

The design: a key per pair of members, a signature for first contact
-------------------------------------------------------------------
Members A and B share a pair key that nobody else can compute::

    K_AB = BLAKE2b-256(key = team pair salt, X25519(a, B) || min(id_A, id_B) || max(id_A, id_B))

from their Ed25519 node keys, taken to X25519 (:meth:`mesh.identity.NodeIdentity.agree`): no
second key to publish, and the key and membership proof that already ride in every envelope
are all a receiver needs. (One key pair for both signing and agreement is what libsodium's
``crypto_sign_ed25519_*_to_curve25519`` offers; Thormarker, 2021, analyses Ed25519 beside an
X25519 key agreement on the same key as jointly secure.) Derived once per peer and kept. A frame from A to B is tagged with
BLAKE2b-128 keyed by K_AB over everything before the tag (the header, which names the sender,
the nonce and the ciphertext); B's frames to A use the same key but name B, and an engine
ignores frames naming itself. A frame to an address whose member we do not know yet (an
address from discovery or a seed: the first gossip round to it) carries the sender's Ed25519
signature instead, checked with the key its envelope carries.

Why not an Ed25519 signature on every frame? Measured on the shared 2-vCPU test machine
(``benchmarks/frame_auth_cost.py``, a 300-byte frame; figures move with the machine's load, their
ratios hold): sealing and opening under the team key take about 3 and 2.5 µs; the pair tag adds
0.9 µs to make and 1.0 µs to check; a signature would add 26 µs to every frame sent and its check
85 µs to every frame received, ten to thirty times the rest of sealing and opening. The pair key
costs one X25519 per peer, once (32 µs). Through the engine, a PING sent costs 9.8 µs instead of
7.7, and one admitted and answered with a PONG 28 µs instead of 19 (the tags, and the clock
median of :class:`~mesh.admission.ReplayWindow`). A pair tag also binds the recipient: a frame from A to B does not check out
at C, so a member that captures one cannot replay it elsewhere (a signed one could be, within the
replay window; only first-contact frames are signed).

The simulator's ``sim`` crypto (:func:`mesh.testing.fast_crypto`) swaps X25519 for a hash of
the two public keys and the signature for a keyed hash: the same sizes and checks, no secrecy.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from .team import AUTH_PAIR, AUTH_SIGNED, FrameAuth, Unsealed

__all__ = ["SenderBinding", "KeyAgreement"]

KeyAgreement = Callable[[bytes], bytes]  # a peer's Ed25519 public key -> the secret we share (ValueError: none)

_PAIRS_KEPT = 1 << 16  # pair keys kept (a member that mints identities cannot grow this without bound)
_PERSON = b"hyphae-pair-v2"


class _PairTag:
    """A pair key, as the :class:`~mesh.team.FrameAuth` a frame to that peer is sealed with (one
    small object per peer: a simulator's engines hold one for each of thousands of peers)."""

    __slots__ = ("_key",)
    kind = AUTH_PAIR

    def __init__(self, key: bytes) -> None:
        self._key = key

    def tag(self, covered: bytes | memoryview) -> bytes:
        return hashlib.blake2b(covered, key=self._key, digest_size=16).digest()


class SenderBinding:
    """One node's side of sender binding: the tag its frames carry to each peer, and whether a
    frame's tag is its sender's. See the module docstring."""

    def __init__(
        self, node_id: str, *, sign: Callable[[bytes], bytes], verify: Callable[[bytes, bytes, bytes], bool],
        agree: KeyAgreement, salt: bytes,
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self._own = bytes.fromhex(node_id)
        self._verify = verify
        self._agree = agree
        self._salt = salt
        self.signed = FrameAuth(AUTH_SIGNED, sign)  # a frame to a member we do not know yet
        self._auths: dict[str, _PairTag | None] = {}  # peer -> its pair tag (None: no key agreed)

    def auth_for(self, peer_id: str | None, public_key: bytes | None) -> FrameAuth | _PairTag:
        """How a frame to ``peer_id`` (its key ``public_key``) is tagged: with our pair key,
        or signed if we know no key of the recipient's or none can be agreed with it."""
        if peer_id is None or public_key is None:
            return self.signed
        auth = self._auths.get(peer_id, self)
        if auth is self:
            auth = self._pair(peer_id, public_key)
        return auth or self.signed  # type: ignore[return-value]

    def vouches(self, opened: Unsealed, public_key: bytes) -> bool:
        """Is ``opened`` tagged by the member whose key is ``public_key`` (its sender's, as the
        keyring holds it or its envelope brought it, checked against the team's proof)?"""
        if opened.auth == AUTH_PAIR:
            pair = self._auths.get(opened.sender_id, self)
            if pair is self:
                pair = self._pair(opened.sender_id, public_key)
            if pair is None:
                return False
            return hmac.compare_digest(pair.tag(opened.covered), opened.tag)  # type: ignore[union-attr]
        if opened.auth == AUTH_SIGNED:
            return self._verify(public_key, opened.tag, bytes(opened.covered))
        return False

    def _pair(self, peer_id: str, public_key: bytes) -> _PairTag | None:
        """Derive, keep and return the pair tag for ``peer_id`` (None if no key can be agreed)."""
        try:
            shared = self._agree(public_key)
        except ValueError:
            auth = None
        else:
            theirs = bytes.fromhex(peer_id)
            ids = self._own + theirs if self._own < theirs else theirs + self._own
            key = hashlib.blake2b(shared + ids, key=self._salt, person=_PERSON, digest_size=32).digest()
            auth = _PairTag(key)
        if len(self._auths) >= _PAIRS_KEPT:
            del self._auths[next(iter(self._auths))]
        self._auths[peer_id] = auth
        return auth
