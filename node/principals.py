"""Principals and API keys.

An API key resolves to a :class:`Principal` ``(tenant_id, agent_id, projects)``. Keys are
32 random bytes, shown once and stored only as a SHA-256 hash. A slow password hash
would add nothing here: with 256 bits of entropy a key cannot be guessed, and the
hash is looked up on every request, so it has to be cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import threading

__all__ = ["Principal", "PrincipalCache", "new_api_key", "hash_api_key", "KEY_PREFIX"]

KEY_PREFIX = "hy_"


@dataclasses.dataclass(frozen=True)
class Principal:
    """An authenticated agent: everything the facade needs to stamp and scope."""

    tenant_id: str
    agent_id: str
    name: str
    projects: tuple[str, ...] = ()

    def may_read_project(self, project: str | None) -> bool:
        """A key reads tenant-wide cells and those of its projects (all, if it has none)."""
        return project is None or not self.projects or project in self.projects


def new_api_key() -> str:
    """A fresh key: a recognisable prefix and 32 random bytes, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode("utf-8")).digest()


class PrincipalCache:
    """Key hashes already resolved to their principal, so a call skips the database read.

    Every call is authenticated, and the read costs more than the rest of authentication;
    yet while a node runs, a key's principal only ever changes one way: it is revoked.
    A revocation calls :meth:`invalidate` after it commits and before it is acknowledged,
    which empties the cache and bumps the generation. A lookup reads the generation
    before it reads the database and stores its answer only if the generation has not
    moved since, so an answer read before a revocation is never kept after it: the
    first call after a revocation is refused. Unknown keys are never cached, so the cache
    holds at most one entry per live agent.
    """

    def __init__(self) -> None:
        self._entries: dict[bytes, Principal] = {}
        self._lock = threading.Lock()  # revocations commit on the writer thread
        self.generation = 0

    def get(self, key_hash: bytes) -> Principal | None:
        return self._entries.get(key_hash)

    def put(self, key_hash: bytes, principal: Principal, generation: int) -> None:
        """Remember ``principal``, read from the database at ``generation``."""
        with self._lock:
            if generation == self.generation:
                self._entries[key_hash] = principal

    def invalidate(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()
