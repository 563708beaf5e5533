"""A node's identity: an Ed25519 key pair, and the node id derived from it.

The node id is the first 16 bytes of SHA-256 over the raw public key, in hex: short
enough to read in logs, long enough that nobody can pick a key to collide with a peer.
The private key is stored raw (32 bytes) in a 0600 file created atomically.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = ["NodeIdentity", "node_id_for"]


# Every engine checks each member's key against its id: a simulator's thousands of engines in
# one process check the same few thousand keys.
@functools.lru_cache(maxsize=1 << 16)
def node_id_for(public_key: bytes) -> str:
    return hashlib.sha256(public_key).digest()[:16].hex()


class NodeIdentity:
    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.node_id = node_id_for(self.public_key)

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

    @staticmethod
    def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
        except Exception:
            return False
        return True
