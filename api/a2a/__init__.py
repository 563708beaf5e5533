"""The A2A surface (opt-in): an Agent Card and JSON-RPC ``message/send`` / ``message/stream``.

Agents built on other frameworks talk to the node as to another agent: the card at
``/.well-known/agent-card.json`` lists four skills (remember, recall, catch up, what the
team knows about X), and a message names one of them. Each skill is one or two calls of
the facade (``node.service``) with the principal of the caller's API key, as MCP and REST
make them. The protocol (JSON-RPC parsing, both method generations, SSE) is the A2A SDK's
own (``a2a-sdk``), served as an ASGI app on our server; the SDK is an optional extra, so
importing this package without it says how to install it.
"""

from __future__ import annotations

from node.errors import ConfigError

try:
    import a2a.server.routes  # noqa: F401
    import sse_starlette  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # tests/e2e/test_a2a_surface.py runs `hyphae up --a2a` with the SDK hidden
    raise ConfigError(
        f"the A2A surface needs the A2A SDK ({exc.name} is not installed): "
        "pip install 'hyphae[a2a]', or leave [a2a] enabled = false and --a2a off"
    ) from None

from .app import A2A_PATH, CARD_PATH, make_a2a_mounts
from .card import agent_card

__all__ = ["A2A_PATH", "CARD_PATH", "agent_card", "make_a2a_mounts"]
