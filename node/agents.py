"""The agents' admin: keys to principals, and adding, listing and revoking agents.

Only the data dir's owner adds and revokes agents (the CLI, and the REST admin routes
behind the admin token); every other call only resolves its key here. A key's principal
is cached until any revocation commits (:class:`~node.principals.PrincipalCache`), so
authenticating a call costs no database read.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

from . import cells as v
from .errors import Conflict, InvalidArgument, NotFound, Unauthenticated
from .ids import new_id
from .principals import Principal, PrincipalCache, hash_api_key, new_api_key
from .shaping import agent_dict
from .store import Store, Transaction

__all__ = ["AgentAdmin", "check_agent_name"]

_NAME_PUNCTUATION = frozenset("._-")
_NAME_RULE = "agent name must be 1-64 letters (of any script), digits, '.', '_' or '-'"


def check_agent_name(name: Any) -> str:
    """An agent's name, NFC-normalised (so ``tomás`` typed either way is one agent): letters of
    any script with their combining marks, digits, ``.``, ``_``, ``-``. Never whitespace, control
    characters or slashes: a name is shown in logs and inbox lines and used in URL paths."""
    if not isinstance(name, str):
        raise InvalidArgument(_NAME_RULE, field="name")
    name = unicodedata.normalize("NFC", name)
    if not 1 <= len(name) <= 64:
        raise InvalidArgument(_NAME_RULE, field="name")
    for position, char in enumerate(name):
        kind = unicodedata.category(char)
        mark = kind[0] == "M" and position > 0  # a combining mark belongs to the letter before it
        if not (kind[0] == "L" or kind == "Nd" or mark or char in _NAME_PUNCTUATION):
            raise InvalidArgument(f"{_NAME_RULE}; {char!r} (U+{ord(char):04X}) is not allowed", field="name")
    return name


class AgentAdmin:
    """``revoked(agent_id)`` runs after a revocation commits and before it is answered
    (on the writer thread), for whatever else must let go of the agent."""

    def __init__(
        self, store: Store, tenant_id: str, clock: Callable[[], int], revoked: Callable[[str], None]
    ) -> None:
        self._store = store
        self._agents = store.agents
        self._tenant_id = tenant_id
        self._clock = clock
        self._revoked = revoked
        self._principals = PrincipalCache()  # emptied by every revocation

    def principal(self, api_key: str) -> Principal:
        """The principal of a key; :class:`Unauthenticated` for one unknown or revoked."""
        key_hash = hash_api_key(api_key)
        principal = self._principals.get(key_hash)
        if principal is None:
            generation = self._principals.generation
            principal = self._agents.by_key(key_hash)
            if principal is None:
                raise Unauthenticated("the API key is not valid (unknown or revoked)")
            self._principals.put(key_hash, principal, generation)
        return principal

    async def add(self, name: str, projects: list[str] | None = None) -> tuple[Principal, str]:
        """Create an agent and its key; the key is returned once and stored only hashed."""
        name = check_agent_name(name)
        projects = sorted({v.check_text(p, "project") for p in projects or ()})
        api_key = new_api_key()
        principal = Principal(self._tenant_id, new_id(), name, tuple(projects))
        now = self._clock()

        def job(tx: Transaction) -> None:
            if self._agents.name_taken(tx, name):
                raise Conflict(f"an agent named {name!r} already exists", field="name")
            self._agents.insert(tx, principal, hash_api_key(api_key), now)

        await self._store.db.write(job)
        return principal, api_key

    async def all_agents(self) -> list[dict[str, Any]]:
        return [agent_dict(agent) for agent in self._agents.all()]

    async def revoke(self, name: str) -> dict[str, Any]:
        name = unicodedata.normalize("NFC", name) if isinstance(name, str) else name
        now = self._clock()

        def job(tx: Transaction) -> dict[str, Any]:
            row = self._agents.revocation(tx, name)
            if row is None:
                raise NotFound(f"no agent named {name!r}", field="name")
            agent_id, revoked_at = row
            if revoked_at is None:
                self._agents.revoke(tx, agent_id, now)
                tx.after_commit(self._principals.invalidate)  # before the revocation is acknowledged
                tx.after_commit(lambda: self._revoked(agent_id))
                revoked_at = now
            return {"name": name, "agent_id": agent_id, "revoked_at": revoked_at}

        return await self._store.db.write(job)
