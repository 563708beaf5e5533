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

__all__ = ["Principal", "new_api_key", "hash_api_key", "KEY_PREFIX"]

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
