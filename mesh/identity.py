"""A node's identity: an Ed25519 key pair, and the node id derived from it.

The node id is the first 16 bytes of SHA-256 over the raw public key, in hex: short
enough to read in logs, long enough that nobody can pick a key to collide with a peer.
The private key is stored raw (32 bytes) in a 0600 file created atomically.

The same key pair also agrees a secret with any other member (:meth:`NodeIdentity.agree`):
X25519 over the Montgomery forms of the two Ed25519 keys (the birational map libsodium's
``crypto_sign_ed25519_pk_to_curve25519`` uses), so a member's one published key both signs
its diffs and binds its frames (:mod:`mesh.frame_auth`), with no second key to publish.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = ["NodeIdentity", "node_id_for", "x25519_public_key"]

_P = 2**255 - 19  # the field of Curve25519 and Ed25519


# Every engine checks each member's key against its id: a simulator's thousands of engines in
# one process check the same few thousand keys.
@functools.lru_cache(maxsize=1 << 16)
def node_id_for(public_key: bytes) -> str:
    return hashlib.sha256(public_key).digest()[:16].hex()


@functools.lru_cache(maxsize=1 << 16)
def x25519_public_key(ed25519_public_key: bytes) -> bytes:
    """The Montgomery u-coordinate of an Ed25519 public key: u = (1 + y) / (1 - y) mod p.
    Raises ValueError for bytes that are no such key (wrong length, y out of range, or the
    neutral point)."""
    if len(ed25519_public_key) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    y = int.from_bytes(ed25519_public_key, "little") & ((1 << 255) - 1)  # the top bit is the sign of x
    if y >= _P or y == 1:
        raise ValueError("not an Ed25519 public key")
    return ((1 + y) * pow(1 - y, _P - 2, _P) % _P).to_bytes(32, "little")


class NodeIdentity:
    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.node_id = node_id_for(self.public_key)
        # The Ed25519 secret scalar (SHA-512 of the seed, its low half; X25519 clamps it) as an
        # X25519 key: its public key is x25519_public_key(public_key).
        seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        self._exchange = X25519PrivateKey.from_private_bytes(hashlib.sha512(seed).digest()[:32])

    @classmethod
    def generate(cls) -> "NodeIdentity":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> "NodeIdentity":
        raw = path.read_bytes()
        if len(raw) != 32:
            raise ValueError(f"{path} is not an Ed25519 node key (expected 32 bytes, found {len(raw)})")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def save(self, path: Path) -> None:
        """Write the private key to a new 0600 file; refuses to overwrite one."""
        raw = self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def agree(self, peer_public_key: bytes) -> bytes:
        """The X25519 secret shared with the member whose Ed25519 key is ``peer_public_key``
        (the same from both ends). Raises ValueError for a key no secret can be agreed with
        (not a curve point, or one of small order)."""
        return self._exchange.exchange(X25519PublicKey.from_public_bytes(x25519_public_key(peer_public_key)))

    @staticmethod
    def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
        except Exception:
            return False
        return True
